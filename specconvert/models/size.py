"""How large a model is, from its ``config.json`` alone (nothing loaded): parameters and bytes per dtype.

Used to decide, before loading anything, whether a model fits where it would run (serve-test's
oracle). The count follows the Llama-family layout transformers builds from these keys
(embeddings, per layer q/k/v/o and a gated MLP or routed experts, norms, an untied lm_head);
it is an estimate, within a few percent for Llama/Qwen/Mistral-style checkpoints.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

GIB = 1024 ** 3
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2, "float8_e4m3fn": 1, "int8": 1}


def read_config(folder: str | Path) -> dict[str, Any]:
    """``folder/config.json`` as a dict ({} when absent or unreadable)."""
    path = Path(folder) / "config.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _text_config(config: dict[str, Any]) -> dict[str, Any]:
    # Multimodal wrappers keep the language model's sizes under text_config / llm_config.
    for key in ("text_config", "llm_config", "language_config"):
        if isinstance(config.get(key), dict) and config[key].get("hidden_size"):
            return {**config, **config[key]}
    return config


def parameter_count(config: dict[str, Any]) -> int | None:
    """Parameters of a decoder-only transformer described by ``config`` (None when the sizes are missing)."""
    c = _text_config(config)
    try:
        hidden, layers, vocab = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    heads = int(c.get("num_attention_heads") or 1)
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or hidden // heads)
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q and o, k and v
    experts = int(c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts") or 0)
    if experts:
        per_expert = 3 * hidden * int(c.get("moe_intermediate_size") or c.get("intermediate_size") or 0)
        shared = int(c.get("n_shared_experts") or 0) * per_expert
        mlp = experts * per_expert + shared + hidden * experts  # experts, shared experts, router
    else:
        mlp = 3 * hidden * int(c.get("intermediate_size") or 4 * hidden)
    norms = 2 * hidden
    embeddings = vocab * hidden * (1 if c.get("tie_word_embeddings") else 2)
    return layers * (attention + mlp + norms) + embeddings + hidden


def dtype_bytes(dtype: str | None, config: dict[str, Any] | None = None) -> int:
    """Bytes per parameter of ``dtype``; ``auto``/None = the config's ``torch_dtype``/``dtype`` (float32 if absent)."""
    if dtype in (None, "auto"):
        dtype = str((config or {}).get("torch_dtype") or (config or {}).get("dtype") or "float32")
    return DTYPE_BYTES.get(str(dtype).replace("torch.", ""), 4)


# A serving process's GPU memory beyond weights and KV cache (CUDA context, activation workspace, CUDA graphs,
# sampler buffers): an allowance, not a measurement; the GPU smoke script is where it gets checked.
SERVER_OVERHEAD_BYTES = 3 * GIB


def kv_bytes_per_token(config: dict[str, Any], dtype: str | None = None) -> int | None:
    """KV-cache bytes one token takes in every layer (keys and values at ``dtype``; None when sizes are missing)."""
    c = _text_config(config)
    try:
        hidden, layers = int(c["hidden_size"]), int(c["num_hidden_layers"])
    except (KeyError, TypeError, ValueError):
        return None
    heads = int(c.get("num_attention_heads") or 1)
    kv_heads = int(c.get("num_key_value_heads") or heads)
    head_dim = int(c.get("head_dim") or hidden // heads)
    return 2 * layers * kv_heads * head_dim * dtype_bytes(dtype, config)


def server_floor_bytes(target_config: dict[str, Any], dtype: str | None, tensor_parallel_size: int,
                       context_tokens: int, draft_params: int = 0) -> int | None:
    """The least GPU memory (per GPU) one serving process of the target needs to start: its weights (and a draft's
    ``draft_params``) at ``dtype`` and the KV cache of one sequence of ``context_tokens``, split over
    ``tensor_parallel_size`` GPUs, plus :data:`SERVER_OVERHEAD_BYTES`. None when the config lacks the sizes."""
    params, per_token = parameter_count(target_config), kv_bytes_per_token(target_config, dtype)
    if params is None or per_token is None:
        return None
    width = dtype_bytes(dtype, target_config)
    split = max(int(tensor_parallel_size), 1)
    return ((params + draft_params) * width + per_token * int(context_tokens)) // split + SERVER_OVERHEAD_BYTES
