"""tune with ``bench.baselines: [ngram]``: n-gram prompt lookup measured beside the head on vLLM, chosen where it
measures best, and then served by the bundle, with the oracle and the lossless check applied to what is served."""

from __future__ import annotations

import json

import pytest
import yaml

from specconvert.tuning import forms
from tests.serving.conftest import _cli, fake_vllm  # noqa: F401  (fixture)

WINDOW = {"num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}


def _measured(ngram: dict[int, float]) -> forms.Measurement:
    rates = {(0, 1): 10.0, (1, 1): 12.0, (2, 1): 13.0, (0, 4): 30.0, (1, 4): 31.0, (2, 4): 29.0}
    return forms.Measurement(rates, {}, {"ngram": ngram}, {"ngram": WINDOW})


def test_ngram_is_served_where_it_beats_the_head_at_every_level():
    decision = forms.decide(_measured({1: 15.0, 4: 40.0}), 0.03, ["ngram"])
    assert decision.served == "ngram" and decision.free_choice == {1: "ngram", 4: "ngram"}
    engines = forms.engine_forms(decision, "1.2", 16, False)
    assert engines["vllm"]["method"] == "ngram" and engines["vllm"]["num_speculative_tokens"] == 3
    assert engines["vllm"]["prompt_lookup_min"] == 2 and engines["trtllm"]["method"] == "ngram"
    assert "NGRAM" in engines["sglang"]["flags"] and "every concurrency" in engines["vllm"]["notes"][0]
    # the head's choice still travels (the reference server keeps it)
    assert decision.choice == {1: 2, 4: 1} and engines["reference"]["max_draft_len"] == 2


def test_ngram_winning_at_some_levels_keeps_the_head_and_says_where():
    decision = forms.decide(_measured({1: 15.0, 4: 29.0}), 0.03, ["ngram"])
    assert decision.served == "eagle3" and decision.free_choice == {1: "ngram"}
    engines = forms.engine_forms(decision, "1.2", 16, False)
    assert "method" not in engines["vllm"] and engines["vllm"]["num_speculative_tokens"] == 2
    assert decision.choice == {1: 2, 4: 1}  # at 4 the head's chain 1 (31 tok/s) stays: n-gram's 29 is below it
    assert any("concurrency 1 only" in n and "serve-ngram.sh" in n for n in engines["vllm"]["notes"])


def test_ngram_within_the_margin_or_no_longer_listed_is_not_chosen():
    assert forms.decide(_measured({1: 13.2, 4: 30.5}), 0.03, ["ngram"]).free_choice == {}  # within 3 %
    assert forms.decide(_measured({1: 15.0, 4: 40.0}), 0.03, []).served == "eagle3"  # bench.baselines dropped it


def test_the_measurement_round_trips_and_older_manifests_still_read():
    measured = _measured({1: 15.0, 4: 40.0})
    again = forms.Measurement.from_dict(json.loads(json.dumps(measured.as_dict())))
    assert again.free == measured.free and again.free_settings == measured.free_settings
    old = {"tokens_per_second": [[0, 1, 10.0]], "drafter_idle_tokens_per_second": []}
    assert forms.Measurement.from_dict(old).free == {} and "free_tokens_per_second" not in forms.Measurement.from_dict(
        old).as_dict()


@pytest.fixture(scope="module")
def ngram_recipe(tmp_path_factory):
    from tests.helpers.tune import write_tiny_tune_recipe

    root = tmp_path_factory.mktemp("tune-ngram")
    path, _ = write_tiny_tune_recipe(
        root, "tiny-ngram", {"backend": "vllm", "device": "cpu", "trtllm_version": "1.2", "vllm_threads": 1},
        {"concurrency": [1, 4], "baselines": ["ngram"],
         "ngram": {"num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}},
        serve_test=lambda prompts: {"prompts": str(prompts), "max_tokens": 12, "min_acceptance_length": 1.0,
                                    "oracle": {"enabled": "on"}})
    assert _cli("convert", path) == 0
    return root, path


def test_tune_chooses_ngram_on_vllm_and_the_bundle_serves_it(ngram_recipe, fake_vllm, monkeypatch, capsys):  # noqa: F811
    """Through the vLLM TEST DOUBLE: the head accepts nothing (FAKE_VLLM_ACCEPT=0), prompt lookup accepts 3 on every
    other step (2.5 tokens per step), so n-gram wins at both levels; build then writes it for every engine, and
    serve-test checks what is served: lossless against plain decoding, and the oracle replaying prompt lookup,
    which the double's lookup (a fixed pattern, not a search) fails."""
    from specconvert.backends.vllm import memory

    root, path = ngram_recipe
    exe, log = fake_vllm
    monkeypatch.setattr(memory, "available_gib", lambda *a, **k: 64.0)
    monkeypatch.setenv("FAKE_VLLM_ACCEPT", "0")
    monkeypatch.setenv("FAKE_VLLM_NGRAM_ACCEPT", "3")
    python = f"runtime.vllm_python={exe}"
    assert _cli("tune", path, "--set", python) == 0
    report = json.loads((root / "work" / "tune" / "report.json").read_text())
    starts = [json.loads(line)["argv"] for line in log.read_text().splitlines()]
    ngram_argv = next(a for a in starts if a[a.index("--served-model-name") + 1] == "tiny-ngram-ngram")
    assert json.loads(ngram_argv[ngram_argv.index("--speculative-config") + 1]) == {"method": "ngram", **WINDOW}
    free = report["free_speculation"]["ngram"]
    assert report["served"] == "ngram" and free["served"] and free["chosen_at"] == [1, 4]
    assert free["runs"]["1"]["identical_to_plain"] is True  # compared with plain decoding like every candidate
    assert free["runs"]["1"]["acceptance_length"] == pytest.approx(2.5, abs=0.3)
    assert any("ngram measured best at every concurrency" in line for line in report["verdict"])
    assert "n-gram prompt lookup" in (root / "work" / "tune" / "report.md").read_text()

    assert _cli("build", path, "--no-load", "--set", python) == 0
    engine = root / "work" / "engine"
    manifest = json.loads((engine / "manifest.json").read_text())
    assert manifest["decisions"]["speculation"] == "ngram"
    serve = (engine / "vllm" / "serve.sh").read_text()
    assert '"method": "ngram"' in serve and "vllm/draft" not in serve.split("--speculative-config")[1]
    trt = yaml.safe_load((engine / "trtllm" / "llm_api_options.yaml").read_text())
    assert trt["speculative_config"] == {"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 4}
    assert "--speculative-algorithm NGRAM" in " ".join((engine / "sglang" / "serve.sh").read_text().split())
    assert manifest["decisions"]["trtllm_drafting"].startswith("NGram")

    capsys.readouterr()
    code = _cli("serve-test", path, "--set", python)
    result = json.loads((root / "work" / "serve-test" / "report.json").read_text())
    oracle = result["oracle"]
    assert oracle["decoding"]["method"] == "ngram" and "replayed" in oracle["reference"]["source"]
    assert oracle["status"] == "disagrees" and code == 1, oracle["message"]
    assert "proposer" in oracle["message"]
    assert result["summary"]["exact_match"] == 3  # the lossless check ran on the n-gram server's outputs


def test_the_ngram_oracle_agrees_with_counters_that_match_the_replay_and_fails_others(ngram_recipe):
    """``_ngram_oracle`` on the bundle built above: engine counters equal to prompt lookup replayed on the prompt and
    output agree; counters that accepted one token more per draft disagree, with the n-gram causes, not the head's."""
    from types import SimpleNamespace

    from specconvert.acceptance import from_counts
    from specconvert.recipe import load_recipe
    from specconvert.reference.decoder import load_tokenizer
    from specconvert.reference.ngram import Replay
    from specconvert.serving.client import Completion
    from specconvert.serving.verdict import Outcome
    from specconvert.stages import serve_test as st

    root, path = ngram_recipe
    if not (root / "work" / "engine" / "manifest.json").exists():
        pytest.skip("needs the bundle the test above builds")
    recipe = load_recipe(path)
    tok = load_tokenizer(root / "work" / "convert" / "target")
    prompt_ids = tok.encode("Count to five.")  # a completion prompt (the tiny tokenizer has no chat template)
    output = [5, 6, 7, 5, 6, 7, 5, 6, 8, 5, 6, 7]  # repeats: prompt lookup finds them
    replay = Replay(3)
    replay.add(prompt_ids, output, 2, 4, 4096)
    assert replay.drafts > 0
    config = {"method": "ngram", **WINDOW}
    server = SimpleNamespace(phase=f"vllm ({st.SPECULATIVE})", command=["--speculative-config", json.dumps(config)])
    completion = Completion(text="", token_ids=output, finish_reason="length", prompt_tokens=None,
                            completion_tokens=len(output), latency_s=0.1, ttft_s=0.1, stream=False)

    def verdict(accepted_extra: int) -> dict:
        counted = from_counts("vllm counters", drafts=replay.drafts, draft_tokens=replay.draft_tokens,
                              accepted_tokens=replay.accepted + accepted_extra * replay.drafts,
                              accepted_per_position=None, requests=1)
        serve = SimpleNamespace(servers=[server], results={(st.SPECULATIVE, "p0", False): Outcome(completion=completion)},
                                counted=[{"stream": False, "prompt_id": "p0", "acceptance": counted}])
        assert st._served_ngram(serve) == config
        return st._ngram_oracle(recipe, [st.Prompt("p0", prompt="Count to five.")], serve, config)

    agree = verdict(0)
    assert agree["passed"] is True and agree["delta"] == 0.0 and agree["prompts"][0]["drafting_steps"] == replay.drafts
    off = verdict(1)
    assert off["passed"] is False and off["causes"] == ["template"] and "proposer" in off["message"]
