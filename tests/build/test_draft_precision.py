"""The draft stays in its own precision when the target is quantized (issue 19): the emitted files say so.

TensorRT-LLM reads the draft's quant config from the draft's own folder and copies only the
target's kv_cache_quant_algo; vLLM 0.32 builds the drafter's quant config from the draft's own
config (data/trtllm/draft_precision.json and backends/launch.py cite the sources).
"""

from __future__ import annotations

import json

import pytest
import yaml

FP8 = {"format": "fp8", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"}


def build(cli, project, *sets, version="1.3"):
    args = ["build", project.recipe_path, "--no-load", "--json", "--set", f"runtime.trtllm_version={version}"]
    for item in sets:
        args += ["--set", item]
    return cli(*args)


@pytest.mark.parametrize("version", ["1.2", "1.3", "1.4"])
def test_fp8_target_bf16_draft_every_engine_keeps_the_draft_unquantized(project, cli, version):
    project.write_convert(quantization=FP8)
    result = build(cli, project, "build.kv_cache.enable_block_reuse=false", version=version)
    assert result.code == 0, result.err
    engine = project.engine
    options = yaml.safe_load((engine / "trtllm" / "llm_api_options.yaml").read_text())
    spec = options["speculative_config"]
    assert not {k for k in spec if "quant" in k}, spec
    assert spec.get("speculative_model", spec.get("speculative_model_dir")) == str(project.draft_dir)
    assert not (project.draft_dir / "hf_quant_config.json").exists()
    for name in ("vllm", "sglang"):
        overlay = engine / name / "draft"
        assert "quantization_config" not in json.loads((overlay / "config.json").read_text())
        assert not (overlay / "hf_quant_config.json").exists()
    serve = (engine / "vllm" / "serve.sh").read_text()
    assert "--speculative-config" in serve and "quantization" not in serve
    # the draft's KV cache follows the target's FP8 one in TensorRT-LLM: said, not hidden
    assert any("gives the draft the target's kv_cache_quant_algo" in w for w in result.json()["manifest"]["warnings"])


def test_an_inherited_quant_config_in_the_draft_folder_is_refused(project, cli):
    config = json.loads((project.draft_dir / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8"}  # copied from the target
    (project.draft_dir / "config.json").write_text(json.dumps(config))
    (project.draft_dir / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "FP8"}}))
    project.write_convert(quantization=FP8)
    result = build(cli, project, "build.kv_cache.enable_block_reuse=false")
    assert result.code == 2
    assert "carries a quantization config (hf_quant_config.json, config.json quantization_config)" in result.err
    assert "draft's own folder" in result.err and "Fix:" in result.err
    assert not project.engine.exists()


def test_fp8_kv_bf16_draft_and_chunked_prefill_warns_with_the_fix(project, cli):
    project.write_convert(quantization=FP8)
    result = build(cli, project, "build.kv_cache.enable_block_reuse=false",
                   "build.extra_llm_api_options={enable_chunked_prefill: true}")
    assert result.code == 0, result.err
    warnings = result.json()["manifest"]["warnings"]
    assert any("PR #8910" in w and "enable_chunked_prefill: false" in w for w in warnings)


def test_unquantized_target_has_no_precision_warnings(project, cli):
    result = build(cli, project)
    assert result.code == 0, result.err
    assert not any("kv_cache_quant_algo" in w or "PR #8910" in w for w in result.json()["manifest"]["warnings"])


def test_overlays_drop_an_inherited_quant_config(tmp_path):
    from specconvert.backends import launch

    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "fp8"}, "eagle_config": {}}))
    (draft / "hf_quant_config.json").write_text("{}")
    (draft / "model.safetensors").write_bytes(b"\0")
    for name, update in (("vllm", launch.vllm_overlay_update([1, 3, 4])), ("sglang", launch.sglang_overlay_update([1, 3, 4]))):
        written = launch.write_draft_overlay(draft, tmp_path / name, update)
        assert "quantization_config" not in json.loads((tmp_path / name / "config.json").read_text())
        assert not (tmp_path / name / "hf_quant_config.json").exists() and (tmp_path / name / "model.safetensors").exists()
        assert written["draft_precision"] == {"quantization": None,
                                              "dropped": ["config.json quantization_config", "hf_quant_config.json"]}
