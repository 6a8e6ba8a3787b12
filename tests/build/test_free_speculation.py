"""`bench.baselines: [ngram]`: build writes each engine's n-gram launch (no head) beside the bundle, in the spelling
of the TensorRT-LLM release it targets; without it nothing changes."""

from __future__ import annotations

import json
import shlex

import pytest
import yaml

from specconvert.backends.trtllm.options import unknown_keys


@pytest.mark.parametrize("version", ["1.2", "1.3.0rc27", "1.4.0rc4"])
def test_ngram_launches_for_every_engine(project, cli, version):
    result = cli("build", project.recipe_path, "--no-load", "--set", f"runtime.trtllm_version={version}",
                 "--set", "bench.baselines=[ngram]", "--set", "bench.ngram.prompt_lookup_max=3")
    assert result.code == 0, result.err
    engine = project.engine
    options = yaml.safe_load((engine / "trtllm" / "ngram.yaml").read_text())
    baseline = yaml.safe_load((engine / "trtllm" / "baseline.yaml").read_text())
    # the baseline's settings plus NGram decoding, as far as the head drafts (build.max_draft_len 3)
    assert options["speculative_config"] == {"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 3}
    assert {k: v for k, v in options.items() if k != "speculative_config"} == baseline
    family = version[:3]
    assert unknown_keys(options, family, version) == []
    vllm = (engine / "vllm" / "serve-ngram.sh").read_text()
    config = json.loads(shlex.split(vllm[vllm.index("--speculative-config"):])[1])
    assert config == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3, "prompt_lookup_min": 2}
    command = vllm[vllm.index("set -euo"):]  # the header names the bundle's draft; the command must not load it
    assert "eagle3" not in command and str(project.draft_dir) not in command
    sglang = (engine / "sglang" / "serve-ngram.sh").read_text()
    assert "--speculative-algorithm NGRAM" in sglang and "--speculative-num-draft-tokens 4" in sglang
    assert "--speculative-ngram-max-match-window-size 3" in sglang and "--speculative-draft-model-path" not in sglang
    artifacts = project.manifest()["artifacts"]
    assert artifacts["trtllm_ngram"].endswith("trtllm/ngram.yaml")


def test_the_ngram_data_rejects_an_eagle_key(project):
    # the NGram key set is its own: an EAGLE-only key under decoding_type NGram is caught as a spelling error
    bad = {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 3, "eagle3_layers_to_capture": [1]}}
    assert unknown_keys(bad, "1.4", "1.4.0rc4") == ["speculative_config.eagle3_layers_to_capture"]


def test_without_baselines_no_ngram_files(project, cli):
    assert cli("build", project.recipe_path, "--no-load").code == 0
    assert not (project.engine / "trtllm" / "ngram.yaml").exists()
    assert not (project.engine / "vllm" / "serve-ngram.sh").exists()
    assert "trtllm_ngram" not in project.manifest()["artifacts"]


def test_changing_the_arms_rebuilds(project, cli):
    assert cli("build", project.recipe_path, "--no-load").code == 0
    result = cli("build", project.recipe_path, "--no-load", "--set", "bench.baselines=[ngram]")
    assert result.code == 0 and (project.engine / "trtllm" / "ngram.yaml").is_file()
