"""EAGLE-3 combination rules: each one raises or warns, before anything is written."""

from __future__ import annotations

import json

import pytest
import yaml


def build(cli, project, *sets, version="1.3"):
    args = ["build", project.recipe_path, "--no-load", "--json", "--set", f"runtime.trtllm_version={version}"]
    for item in sets:
        args += ["--set", item]
    return cli(*args)


def options(project):
    return yaml.safe_load((project.engine / "trtllm" / "llm_api_options.yaml").read_text())


@pytest.mark.parametrize(
    "setting, message, fix",
    [
        ("build.pipeline_parallel_size=2", "pipeline parallelism", "build.pipeline_parallel_size: 1"),
        ("build.sampler=trtllm", "TRTLLMSampler is not combinable", "build.sampler: torch"),
        ("build.extra_llm_api_options={batched_logits_processor: my.module.Proc}", "logits post-processors",
         "remove batched_logits_processor"),
        ("build.extra_llm_api_options={speculative_config: {decoding_type: MTP, max_draft_len: 1}}",
         "MTP cannot be combined", "remove speculative_config"),
    ],
)
def test_incompatible_features_are_input_errors(project, cli, setting, message, fix):
    result = build(cli, project, setting)
    assert result.code == 2, result.err
    assert message in result.err and fix in result.err
    # --json: stdout holds the error document only (issue 35), nothing of a bundle
    doc = json.loads(result.out)
    assert doc["kind"] == "error" and doc["exit_code"] == 2 and message in doc["error"]
    assert not project.engine.exists()


def test_all_problems_listed_at_once(project, cli):
    result = build(cli, project, "build.pipeline_parallel_size=2", "build.sampler=trtllm")
    assert result.code == 2
    assert "(and 1 more)" in result.err
    assert "pipeline parallelism" in result.err and "TRTLLMSampler" in result.err


def test_torch_sampler_is_written(project, cli):
    # sampler_type exists up to 1.3.0rc24 only (see test_sampler_type_is_written_only_where_it_exists)
    assert build(cli, project, "build.sampler=torch", "runtime.trtllm_version=1.2").code == 0
    assert options(project)["sampler_type"] == "TorchSampler"


def test_fp8_kv_with_bf16_draft_turns_block_reuse_off_with_warning(project, cli):
    project.write_convert(quantization={"format": "fp8", "kv_cache_quant_algo": "FP8"})
    result = build(cli, project)
    assert result.code == 0, result.err
    assert options(project)["kv_cache_config"]["enable_block_reuse"] is False
    baseline = yaml.safe_load((project.engine / "trtllm" / "baseline.yaml").read_text())
    assert baseline["kv_cache_config"]["enable_block_reuse"] is False
    manifest = result.json()["manifest"]
    assert manifest["decisions"]["fixes"] == {"build.kv_cache.enable_block_reuse": False}
    assert any("block reuse turned off" in w for w in manifest["warnings"])
    assert "block reuse turned off" in result.err


def test_fp8_kv_from_recipe_counts_too(project, cli):
    result = build(cli, project, "build.kv_cache.dtype=fp8")
    assert result.code == 0, result.err
    kv = options(project)["kv_cache_config"]
    assert kv == {"free_gpu_memory_fraction": 0.85, "enable_block_reuse": False, "dtype": "fp8"}


def test_fp8_kv_with_explicit_block_reuse_is_an_error(project, cli):
    project.write_convert(quantization={"format": "fp8", "kv_cache_quant_algo": "FP8"})
    result = build(cli, project, "build.kv_cache.enable_block_reuse=true")
    assert result.code == 2
    assert "build.kv_cache.enable_block_reuse: false" in result.err
    assert not project.engine.exists()


def test_fp8_kv_with_fp16_draft_keeps_block_reuse(project, cli):
    project.write_convert(quantization={"format": "fp8", "kv_cache_quant_algo": "FP8"}, draft={"dtype": "float16"})
    assert build(cli, project).code == 0
    assert options(project)["kv_cache_config"]["enable_block_reuse"] is True


def test_sampling_on_1_2_warns_greedy_only(project, cli):
    result = build(cli, project, "build.temperature=0.7", version="1.2")
    assert result.code == 0
    assert any("greedy only" in w for w in result.json()["manifest"]["warnings"])
    on_1_3 = build(cli, project, "build.temperature=0.7", version="1.3")
    assert not any("greedy only" in w for w in on_1_3.json()["manifest"]["warnings"])


def test_max_seq_len_beyond_draft_context_warns(project, cli):
    project.write_convert(draft={"max_position_embeddings": 2048})
    result = build(cli, project)
    assert any("exceeds the draft's max_position_embeddings (2048)" in w for w in result.json()["manifest"]["warnings"])
    fits = build(cli, project, "build.max_seq_len=2048")
    assert not any("max_position_embeddings" in w for w in fits.json()["manifest"]["warnings"])


@pytest.mark.parametrize("version", ["1.2", "1.3"])
def test_tree_on_chain_only_versions_warns_and_writes_chain(project, cli, version):
    result = build(cli, project, "build.tree={top_k: 4, depth: 5, total_tokens: 16}", version=version)
    assert result.code == 0, result.err
    spec = options(project)["speculative_config"]
    assert spec["max_draft_len"] == 3 and "use_dynamic_tree" not in spec
    manifest = result.json()["manifest"]
    assert manifest["decisions"]["trtllm_drafting"] == "chain of 3"
    assert any("drafts one chain" in w and "reference backend" in w for w in manifest["warnings"])
    # The tree still applies to SGLang and the reference backend.
    sglang = (project.engine / "sglang" / "serve.sh").read_text()
    assert "--speculative-num-steps 5 --speculative-eagle-topk 4" in sglang and "--speculative-num-draft-tokens 16" in sglang


def test_tree_on_1_4_writes_dynamic_tree(project, cli):
    result = build(cli, project, "build.tree={top_k: 4, depth: 5, total_tokens: 16}", version="1.4.0rc4")
    assert result.code == 0, result.err
    spec = options(project)["speculative_config"]
    assert spec["use_dynamic_tree"] is True and spec["dynamic_tree_max_topK"] == 4
    assert spec["max_draft_len"] == 5 and spec["max_total_draft_tokens"] == 15
    assert result.json()["manifest"]["decisions"]["trtllm_drafting"] == "dynamic_tree"


def test_extra_option_unknown_to_version_is_input_error_with_hint(project, cli):
    result = build(cli, project, "build.extra_llm_api_options={enable_chunked_prefil: true}")
    assert result.code == 2
    assert "did you mean 'enable_chunked_prefill'" in result.err and not project.engine.exists()
    ok = build(cli, project, "build.extra_llm_api_options={enable_chunked_prefill: true}")
    assert ok.code == 0 and options(project)["enable_chunked_prefill"] is True


def test_extra_option_cannot_override_generated_keys(project, cli):
    result = build(cli, project, "build.extra_llm_api_options={max_batch_size: 64}")
    assert result.code == 2 and "generated from the recipe" in result.err


def test_perf_metrics_are_emitted_for_every_version(project, cli):
    # trtllm-serve serves /perf_metrics (what serve-test and bench read) only with both keys set.
    for version in ("1.2", "1.3.0rc27", "1.4.0rc4"):
        assert build(cli, project, "build.extra_llm_api_options={return_perf_metrics: false}", version=version).code == 2
    assert build(cli, project, version="1.2").code == 0
    written = options(project)
    assert written["return_perf_metrics"] is True and written["perf_metrics_max_requests"] > 0


def _vllm_context(project) -> str:
    argv = (project.engine / "vllm" / "serve.sh").read_text()
    return argv.split("--max-model-len ", 1)[1].split()[0]


def test_every_engine_of_the_bundle_gets_build_max_seq_len(project, cli):
    """A GPU recipe asking for 8192 tokens gets them on vLLM too, not vLLM's former 2048 default (issue 20, item 13)."""
    result = build(cli, project, "build.max_seq_len=8192")
    assert result.code == 0, result.err
    assert options(project)["max_seq_len"] == 8192 and _vllm_context(project) == "8192"
    assert "--context-length 8192" in (project.engine / "sglang" / "serve.sh").read_text()
    assert not any("vllm_max_model_len" in w for w in result.json()["manifest"]["warnings"])


def test_a_vllm_only_context_cap_warns(project, cli):
    result = build(cli, project, "build.max_seq_len=8192", "runtime.vllm_max_model_len=1024")
    assert result.code == 0, result.err
    assert _vllm_context(project) == "1024" and options(project)["max_seq_len"] == 8192
    warning = [w for w in result.json()["manifest"]["warnings"] if "vllm_max_model_len" in w]
    assert warning and "differs from build.max_seq_len: 8192" in warning[0] and "1024 tokens" in warning[0]
    assert "runtime.vllm_max_model_len: 1024 differs" in result.err
