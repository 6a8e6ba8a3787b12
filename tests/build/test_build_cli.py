"""`specconvert build` through the real CLI entry point: bundle contents, goldens, exit codes,
--json shape, skip/re-run caching, and nothing half-written on failure."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
import yaml

from conftest import AUX_IDS, normalise

GOLDEN = Path(__file__).parent / "golden"


@pytest.mark.parametrize("version", ["1.2", "1.3"])
@pytest.mark.parametrize("name", ["llm_api_options.yaml", "baseline.yaml"])
def test_golden_options(project, cli, version, name):
    result = cli("build", project.recipe_path, "--no-load", "--set", f"runtime.trtllm_version={version}")
    assert result.code == 0, result.err
    written = normalise((project.engine / "trtllm" / name).read_text(), project)
    assert written == (GOLDEN / f"{version}_{name}").read_text()


def test_bundle_layout_and_pointers(project, cli):
    result = cli("build", project.recipe_path, "--no-load")
    assert result.code == 0, result.err
    engine = project.engine
    for rel in ("trtllm/llm_api_options.yaml", "trtllm/baseline.yaml", "trtllm/serve.sh", "trtllm/bench.sh",
                "trtllm/dataset.jsonl", "vllm/serve.sh", "sglang/serve.sh", "reference/settings.json", "manifest.json"):
        assert (engine / rel).is_file(), rel
    for script in ("trtllm/serve.sh", "trtllm/bench.sh", "vllm/serve.sh", "sglang/serve.sh"):
        assert os.stat(engine / script).st_mode & stat.S_IXUSR, script
    # The bundle points at the models instead of copying them.
    assert not any(p.name == "model.safetensors" and not p.is_symlink() for p in engine.rglob("*"))
    serve = (engine / "trtllm" / "serve.sh").read_text()
    assert f"trtllm-serve {project.target_dir}" in serve
    assert '--host "$HOST" --port "$PORT"' in serve
    assert 'then HOST=127.0.0.1; fi' in serve and 'then PORT=8000; fi' in serve
    assert "--extra_llm_api_options" in serve and "--backend pytorch" in serve
    bench = (engine / "trtllm" / "bench.sh").read_text()
    assert " latency " in bench and '--dataset "$HERE/dataset.jsonl"' in bench and "--report_json" in bench
    rows = [json.loads(line) for line in (engine / "trtllm" / "dataset.jsonl").read_text().splitlines()]
    assert len(rows) >= 4 and all(set(r) == {"task_id", "prompt", "output_tokens"} for r in rows)
    assert [r["task_id"] for r in rows] == list(range(len(rows)))
    settings = json.loads((engine / "reference" / "settings.json").read_text())
    assert settings["target_dir"] == str(project.target_dir) and settings["draft_dir"] == str(project.draft_dir)
    assert settings["aux_layer_ids"] == AUX_IDS and settings["max_draft_len"] == 3 and settings["tree"] is None
    assert settings["dtype"] == "bfloat16" and settings["device"] == "auto"


def test_manifest_records_decisions(project, cli):
    assert cli("build", project.recipe_path, "--no-load", "--set", "runtime.trtllm_version=1.2").code == 0
    manifest = project.manifest()
    decisions = manifest["decisions"]
    assert decisions["trtllm_version"] == "1.2" and decisions["trtllm_version_source"] == "recipe"
    assert decisions["decoding_type"] == "Eagle" and decisions["draft_model_key"] == "speculative_model_dir"
    assert decisions["aux_layer_ids"] == AUX_IDS
    assert decisions["option_names_file"].endswith("options/1.2.json")
    assert "speculative_config.speculative_model_dir" in decisions["keys_written"]["trtllm/llm_api_options.yaml"]
    assert not any(k.startswith("speculative_config") for k in decisions["keys_written"]["trtllm/baseline.yaml"])
    assert manifest["loaded"] is False and manifest["load_skipped_reason"] == "--no-load"
    assert manifest["artifacts"]["trtllm_options"] == str(project.engine / "trtllm" / "llm_api_options.yaml")


def test_sglang_and_vllm_aux_layer_conventions(project, cli):
    """TRT-LLM and SGLang's config take output-of-layer ids (SGLang adds 1 itself and captures the
    input of those layers); vLLM's top-level key is used directly as input-of-layer ids (+1)."""
    # Make the head's own list differ from the convert decision, so the overlay must rewrite it.
    config = json.loads((project.draft_dir / "config.json").read_text())
    config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = [9, 9, 9]
    (project.draft_dir / "config.json").write_text(json.dumps(config))
    assert cli("build", project.recipe_path, "--no-load").code == 0
    plus_one = [i + 1 for i in AUX_IDS]

    sglang_draft = project.engine / "sglang" / "draft"
    sglang_config = json.loads((sglang_draft / "config.json").read_text())
    assert sglang_config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == AUX_IDS
    assert sglang_config["eagle_config"]["use_aux_hidden_state"] is True  # the rest of the config survives
    # What SGLang then captures: the input of layer i+1, i.e. the output of layer i.
    from specconvert.backends import launch

    assert launch.sglang_captured_layers(sglang_config["eagle_config"]["eagle_aux_hidden_state_layer_ids"]) == plus_one

    vllm_draft = project.engine / "vllm" / "draft"
    vllm_config = json.loads((vllm_draft / "config.json").read_text())
    assert vllm_config["eagle_aux_hidden_state_layer_ids"] == plus_one
    for overlay in (sglang_draft, vllm_draft):
        link = overlay / "model.safetensors"
        assert link.is_symlink() and link.resolve() == (project.draft_dir / "model.safetensors").resolve()
    # The original head is untouched; TRT-LLM gets the output convention explicitly.
    original = json.loads((project.draft_dir / "config.json").read_text())
    assert original["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [9, 9, 9]
    options = yaml.safe_load((project.engine / "trtllm" / "llm_api_options.yaml").read_text())
    assert options["speculative_config"]["eagle3_layers_to_capture"] == AUX_IDS

    sglang = (project.engine / "sglang" / "serve.sh").read_text()
    assert "--speculative-algorithm EAGLE3" in sglang and f"--speculative-draft-model-path {sglang_draft}" in sglang
    assert "--speculative-num-steps 3 --speculative-eagle-topk 1" in sglang and "--speculative-num-draft-tokens 4" in sglang
    vllm = (project.engine / "vllm" / "serve.sh").read_text()
    assert '"method": "eagle3"' in vllm and f'"model": "{vllm_draft}"' in vllm and '"num_speculative_tokens": 3' in vllm
    decisions = project.manifest()["decisions"]
    assert decisions["vllm_aux_layer_ids"] == plus_one
    assert decisions["sglang_config_aux_layer_ids"] == AUX_IDS and decisions["sglang_captured_layers"] == plus_one


def test_multi_gpu_settings_reach_options_and_scripts(project, cli):
    result = cli("build", project.recipe_path, "--no-load", "--set", "build.tensor_parallel_size=4",
                 "--set", "build.moe_expert_parallel_size=2")
    assert result.code == 0, result.err
    options = yaml.safe_load((project.engine / "trtllm" / "llm_api_options.yaml").read_text())
    assert options["tensor_parallel_size"] == 4 and options["moe_expert_parallel_size"] == 2
    assert "--tp_size 4 --ep_size 2" in (project.engine / "trtllm" / "serve.sh").read_text()
    assert "--tp-size 4 --ep-size 2" in (project.engine / "sglang" / "serve.sh").read_text()
    assert "--tensor-parallel-size 4 --enable-expert-parallel" in (project.engine / "vllm" / "serve.sh").read_text()


def test_host_port_and_cuda_graphs_off(project, cli):
    result = cli("build", project.recipe_path, "--no-load", "--set", "runtime.port=9123",
                 "--set", "runtime.host=0.0.0.0", "--set", "build.cuda_graphs=false")
    assert result.code == 0, result.err
    serve = (project.engine / "trtllm" / "serve.sh").read_text()
    assert 'then HOST=0.0.0.0; fi' in serve and 'then PORT=9123; fi' in serve
    options = yaml.safe_load((project.engine / "trtllm" / "llm_api_options.yaml").read_text())
    assert "cuda_graph_config" in options and options["cuda_graph_config"] is None


def test_json_output_is_one_document(project, cli):
    result = cli("build", project.recipe_path, "--no-load", "--json")
    assert result.code == 0, result.err
    doc = result.json()
    assert doc["schema_version"] == 1 and doc["kind"] == "build" and doc["skipped"] is False
    assert doc["engine_dir"] == str(project.engine)
    assert doc["manifest"]["stage"] == "build" and doc["manifest"]["loaded"] is False
    assert doc["manifest"]["fingerprint"] == project.manifest()["fingerprint"]


def test_without_tensorrt_llm_the_bundle_is_written_but_not_loaded(project, cli):
    result = cli("build", project.recipe_path, "--json")  # backend trtllm, nothing installed here
    assert result.code == 0, result.err
    manifest = result.json()["manifest"]
    assert manifest["loaded"] is False
    assert manifest["load_skipped_reason"] == "tensorrt_llm not installed"
    assert (project.engine / "trtllm" / "llm_api_options.yaml").is_file()
    assert manifest["decisions"]["trtllm_version_source"] == "newest-known"
    assert any("newest known version" in w for w in manifest["warnings"])


def test_skip_when_unchanged_and_force_redoes(project, cli):
    first = cli("build", project.recipe_path, "--no-load", "--json")
    assert first.code == 0 and first.json()["skipped"] is False
    marker = project.engine / "trtllm" / "marker"
    marker.write_text("kept while skipped")
    second = cli("build", project.recipe_path, "--no-load", "--json")
    assert second.code == 0 and second.json()["skipped"] is True
    assert second.json()["manifest"]["created_at"] == first.json()["manifest"]["created_at"]
    assert marker.exists()
    forced = cli("build", project.recipe_path, "--no-load", "--force", "--json")
    assert forced.code == 0 and forced.json()["skipped"] is False
    assert not marker.exists()


@pytest.mark.parametrize("change", ["recipe", "convert", "load"])
def test_changed_inputs_rebuild(project, cli, change):
    assert cli("build", project.recipe_path, "--no-load").code == 0
    args = ["build", project.recipe_path, "--json", "--no-load"]
    if change == "recipe":
        args += ["--set", "build.max_draft_len=5"]
    elif change == "convert":
        project.write_convert(decisions={"aux_layer_ids": [2, 3, 5]})
    else:
        args.remove("--no-load")
    result = cli(*args)
    assert result.code == 0, result.err
    assert result.json()["skipped"] is False


def test_failure_mid_stage_leaves_previous_bundle_intact(project, cli, monkeypatch):
    assert cli("build", project.recipe_path, "--no-load").code == 0
    before = (project.engine / "manifest.json").read_text()
    from specconvert.backends import launch

    def boom():
        raise OSError("disk full (simulated)")

    monkeypatch.setattr(launch, "bench_dataset", boom)
    result = cli("build", project.recipe_path, "--no-load", "--force")
    assert result.code == 1 and "disk full" in result.err
    assert (project.engine / "manifest.json").read_text() == before
    assert sorted(p.name for p in project.workdir.iterdir()) == ["convert", "engine"]  # no staging left


def test_failure_on_first_build_writes_nothing(project, cli, monkeypatch):
    from specconvert.backends import launch

    monkeypatch.setattr(launch, "bench_dataset", lambda: (_ for _ in ()).throw(OSError("simulated")))
    assert cli("build", project.recipe_path, "--no-load").code == 1
    assert sorted(p.name for p in project.workdir.iterdir()) == ["convert"]


def test_missing_convert_stage_says_what_to_run(project, cli):
    (project.workdir / "convert" / "manifest.json").unlink()
    result = cli("build", project.recipe_path)
    assert result.code == 2
    assert "specconvert convert" in result.err
    assert not project.engine.exists()


def test_broken_convert_manifest_lists_every_problem(project, cli):
    project.write_convert(artifacts={"target_dir": "/nonexistent/target"}, decisions={"aux_layer_ids": [1, 99]})
    result = cli("build", project.recipe_path)
    assert result.code == 2
    assert "/nonexistent/target is not a directory" in result.err
    assert "outside the target's 8 layers" in result.err
    assert not project.engine.exists()


def test_bad_recipe_key_is_exit_2(project, cli):
    result = cli("build", project.recipe_path, "--set", "build.max_draft_lenn=3")
    assert result.code == 2 and "did you mean 'build.max_draft_len'" in result.err
