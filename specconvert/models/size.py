"""How large a model is, from its ``config.json`` alone (nothing loaded): parameters and bytes per dtype.

Used to decide, before loading anything, whether a model fits where it would run (serve-test's
oracle). The count follows the Llama-family layout transformers builds from these keys
(embeddings, per layer q/k/v/o and a gated MLP or routed experts, norms, an untied lm_head);
it is an estimate, within a few percent for Llama/Qwen/Mistral-style checkpoints.
"""

from __future__ import annotations

import json
import math
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
    shape = model_shape(config)
    if shape is None:
        return None
    c = _text_config(config)
    hidden, layers, vocab = shape["hidden"], shape["layers"], shape["vocab"]
    heads, kv_heads, head_dim = shape["heads"], shape["kv_heads"], shape["head_dim"]
    attention = hidden * head_dim * (2 * heads + 2 * kv_heads)  # q and o, k and v
    experts = int(c.get("num_local_experts") or c.get("num_experts") or c.get("n_routed_experts") or 0)
    if experts:
        per_expert = 3 * hidden * int(c.get("moe_intermediate_size") or c.get("intermediate_size") or 0)
        shared = int(c.get("n_shared_experts") or 0) * per_expert
        mlp = experts * per_expert + shared + hidden * experts  # experts, shared experts, router
    else:
        mlp = 3 * hidden * shape["intermediate"]
    norms = 2 * hidden
    embeddings = vocab * hidden * (1 if c.get("tie_word_embeddings") else 2)
    return layers * (attention + mlp + norms) + embeddings + hidden


def dtype_bytes(dtype: str | None, config: dict[str, Any] | None = None) -> int:
    """Bytes per parameter of ``dtype``; ``auto``/None = the config's ``torch_dtype``/``dtype`` (float32 if absent)."""
    if dtype in (None, "auto"):
        dtype = str((config or {}).get("torch_dtype") or (config or {}).get("dtype") or "float32")
    return DTYPE_BYTES.get(str(dtype).replace("torch.", ""), 4)


# --------------------------------------------------------------------------- the memory model of `specconvert plan`
#
# Everything below estimates bytes from config.json alone. `specconvert plan` prints these figures and the
# stages that place work on GPUs (convert's calibration, benchmarks/gpu_smoke.py's comparison) use the same
# functions, so there is one estimate of each quantity, not one per caller.

CUDA_CONTEXT_GIB = 1.0  # CUDA context + allocator slack per process and GPU (torch holds ~0.5-1 GiB before any tensor)
HOST_PROCESS_GIB = 3.0  # a Python process with torch, transformers and their libraries, before any model
LOAD_BUFFER_GIB = 5.0  # one checkpoint shard read at a time while loading (transformers' default max_shard_size 5 GB)
# Bytes per weight of a quantized linear layer: the value plus its share of scales (INT4-AWQ: one bf16 scale per
# 128 weights; NVFP4: one FP8 scale per 16 weights plus a per-tensor scale). Embeddings, norms and lm_head stay
# in the model's dtype (Model Optimizer's FP8/INT4/NVFP4 configs leave lm_head out, `*lm_head*` disabled).
QUANT_WEIGHT_BYTES = {"none": None, "fp8": 1.0, "int4_awq": 0.5 + 2 / 128, "nvfp4": 0.5 + 1 / 16}
KV_DTYPE_BYTES = {"fp8": 1, "bfloat16": 2, "float16": 2}


def model_shape(config: dict[str, Any]) -> dict[str, int] | None:
    """The sizes the memory model needs (hidden, layers, heads, kv_heads, head_dim, intermediate, vocab); None when missing."""
    c = _text_config(config)
    try:
        hidden, layers, vocab = int(c["hidden_size"]), int(c["num_hidden_layers"]), int(c["vocab_size"])
    except (KeyError, TypeError, ValueError):
        return None
    heads = int(c.get("num_attention_heads") or 1)
    return {
        "hidden": hidden,
        "layers": layers,
        "heads": heads,
        "kv_heads": int(c.get("num_key_value_heads") or heads),
        "head_dim": int(c.get("head_dim") or hidden // heads),
        "intermediate": int(c.get("intermediate_size") or 4 * hidden),
        "vocab": vocab,
    }


def parameter_groups(config: dict[str, Any]) -> dict[str, int] | None:
    """``parameter_count`` split by what quantization does to it: ``linear`` (quantized), ``embeddings``,
    ``lm_head`` and ``norms`` (kept in the model's dtype). The groups sum to ``parameter_count(config)``."""
    total = parameter_count(config)
    shape = model_shape(config)
    if total is None or shape is None:
        return None
    c = _text_config(config)
    embeddings = shape["vocab"] * shape["hidden"]
    lm_head = 0 if c.get("tie_word_embeddings") else embeddings
    norms = shape["layers"] * 2 * shape["hidden"] + shape["hidden"]
    return {"linear": total - embeddings - lm_head - norms, "embeddings": embeddings, "lm_head": lm_head, "norms": norms}


def weight_bytes(config: dict[str, Any], dtype: str | None, quantize: str = "none") -> int | None:
    """Bytes of the target's weights in ``dtype`` (``auto``: the config's), linear layers at ``quantize``'s width."""
    groups = parameter_groups(config)
    if groups is None:
        return None
    width = dtype_bytes(dtype, config)
    linear_width = QUANT_WEIGHT_BYTES.get(quantize) or width
    return int(groups["linear"] * linear_width + (groups["embeddings"] + groups["lm_head"] + groups["norms"]) * width)


def kv_bytes_per_token(config: dict[str, Any], value_bytes: float) -> int:
    """Key + value cache of one token over every layer (``value_bytes`` per element); 0 when sizes are missing."""
    shape = model_shape(config)
    if shape is None:
        return 0
    return int(2 * shape["layers"] * shape["kv_heads"] * shape["head_dim"] * value_bytes)


def kv_value_bytes(kv_dtype: str, config: dict[str, Any], dtype: str | None = None) -> int:
    """Bytes per KV element for ``build.kv_cache.dtype`` (``auto``: the serving dtype, 16-bit at most)."""
    if kv_dtype in KV_DTYPE_BYTES:
        return KV_DTYPE_BYTES[kv_dtype]
    return min(dtype_bytes(dtype, config), 2)


def eagle3_head_parameters(target_config: dict[str, Any], draft_vocab_size: int | None = None,
                           head_config: dict[str, Any] | None = None) -> int | None:
    """Parameters of an EAGLE-3 head: ``fc`` (3H -> H), decoder layers whose first attention reads 2H
    (embedding + feature), their MLPs and norms, the final norm and a ``lm_head`` over the draft vocabulary.

    ``head_config`` (the head's own ``config.json``) gives its sizes where it states them; everything else
    comes from the target, which is how a fresh head is built (``EagleArch.for_target``)."""
    shape = model_shape(target_config)
    if shape is None:
        return None
    h = dict(head_config or {})
    hidden = shape["hidden"]
    heads = int(h.get("num_attention_heads") or shape["heads"])
    kv_heads = int(h.get("num_key_value_heads") or shape["kv_heads"])
    head_dim = int(h.get("head_dim") or hidden // heads)
    intermediate = int(h.get("intermediate_size") or shape["intermediate"])
    layers = int(h.get("num_hidden_layers") or 1)
    vocab = int(draft_vocab_size or h.get("draft_vocab_size") or shape["vocab"])
    fc = 3 * hidden * hidden
    first_attention = 2 * hidden * head_dim * (heads + 2 * kv_heads) + heads * head_dim * hidden
    later_attention = hidden * head_dim * (2 * heads + 2 * kv_heads)
    mlp = 3 * hidden * intermediate
    norms = 3 * hidden  # input_layernorm, hidden_norm (first layer), post_attention_layernorm
    decoder = first_attention + mlp + norms + (layers - 1) * (later_attention + mlp + 2 * hidden)
    return fc + decoder + hidden + vocab * hidden


def forward_activation_bytes(config: dict[str, Any], tokens: int, value_bytes: float, logits: bool = True) -> int:
    """Transient peak of one no-grad forward over ``tokens`` tokens (all sequences together): the float32 logits
    (transformers upcasts them), one layer's MLP (gate, up, activation) and a few hidden-sized buffers. SDPA
    attention keeps no tokens x tokens matrix, so none is counted."""
    shape = model_shape(config)
    if shape is None:
        return 0
    per_token = 3 * shape["intermediate"] * value_bytes + 6 * shape["hidden"] * value_bytes
    if logits:
        per_token += shape["vocab"] * 4
    return int(tokens * per_token)


def head_training_bytes(head_params: int, param_bytes: int, tokens: int, target_config: dict[str, Any],
                        draft_vocab_size: int | None, ttt_steps: int, value_bytes: float) -> int:
    """One rank training an EAGLE-3 head: weights, gradients and AdamW's two moments at ``param_bytes`` each,
    plus the activations autograd keeps for ``ttt_steps`` draft positions over ``tokens`` tokens (the draft
    logits in float32 for the loss, the layer's MLP and attention inputs, the 3H features)."""
    shape = model_shape(target_config)
    if shape is None:
        return 0
    vocab = int(draft_vocab_size or shape["vocab"])
    per_token_step = vocab * 4 * 2 + (3 * shape["intermediate"] + 12 * shape["hidden"]) * value_bytes
    # the target's features (3H + the final H) and its logits over the draft vocabulary, inputs to the loss
    inputs = tokens * (4 * shape["hidden"] + vocab) * value_bytes
    return int(4 * head_params * param_bytes + inputs + ttt_steps * tokens * per_token_step)


def training_rank_bytes(target_config: dict[str, Any], held_weight_bytes: float, tokens: int, head_params: int,
                        param_bytes: int, draft_vocab_size: int | None, ttt_steps: int, value_bytes: float) -> int:
    """Peak of one training rank (CUDA context left out): the target weights it holds (whole, or its FSDP
    shard), the target's decoder forward over ``tokens`` (feature extraction runs the decoder without the
    lm_head: no full-vocabulary logits) and the head's training (:func:`head_training_bytes`)."""
    forward = forward_activation_bytes(target_config, tokens, value_bytes, logits=False)
    head = head_training_bytes(head_params, param_bytes, tokens, target_config, draft_vocab_size, ttt_steps, value_bytes)
    return int(held_weight_bytes + forward + head)


def gib(n_bytes: float) -> float:
    """Bytes as GiB, for printing (two decimals)."""
    return round(n_bytes / GIB, 2)


def calibration_placement(weight_bytes: float, activation_bytes: float, free_bytes: list[int]) -> tuple[int, float]:
    """Where convert calibrates a target of ``weight_bytes``: (GPUs used, peak bytes per GPU).

    One GPU when the weights, one forward's activations and the CUDA context fit its ``free_bytes``; else
    every GPU, the layers spread evenly by a device map (transformers ``device_map="auto"``, which balances
    the weights over the GPUs ``max_memory`` allows), each GPU also holding the activations of the layer it runs.
    """
    reserve = activation_bytes + CUDA_CONTEXT_GIB * GIB
    if not free_bytes or weight_bytes + reserve <= free_bytes[0]:
        return (1 if free_bytes else 0), weight_bytes + reserve
    return len(free_bytes), weight_bytes / len(free_bytes) + reserve


def calibration_gpus_needed(weight_bytes: float, activation_bytes: float, gpu_bytes: float) -> int:
    """GPUs of ``gpu_bytes`` each that calibration needs for ``weight_bytes`` spread evenly."""
    room = gpu_bytes - activation_bytes - CUDA_CONTEXT_GIB * GIB
    return max(1, math.ceil(weight_bytes / room)) if room > 0 else 0


def calibration_max_memory(activation_bytes: float, free_bytes: list[int]) -> dict[int, int]:
    """``max_memory`` for the device map: each GPU's free bytes less what calibration needs beside the weights
    (one forward's activations and the CUDA context), so the weights never take the room the forward needs."""
    reserve = activation_bytes + CUDA_CONTEXT_GIB * GIB
    return {i: max(int(free - reserve), 0) for i, free in enumerate(free_bytes)}

# A serving process's GPU memory beyond weights and KV cache (CUDA context, activation workspace, CUDA graphs,
# sampler buffers): an allowance, not a measurement; the GPU smoke script is where it gets checked.
SERVER_OVERHEAD_BYTES = 3 * GIB


def server_floor_bytes(target_config: dict[str, Any], dtype: str | None, tensor_parallel_size: int,
                       context_tokens: int, draft_params: int = 0) -> int | None:
    """The least GPU memory (per GPU) one serving process of the target needs to start: its weights (and a draft's
    ``draft_params``) at ``dtype`` and the KV cache of one sequence of ``context_tokens``, split over
    ``tensor_parallel_size`` GPUs, plus :data:`SERVER_OVERHEAD_BYTES`. None when the config lacks the sizes."""
    weights = weight_bytes(target_config, dtype)
    if weights is None or model_shape(target_config) is None:
        return None
    per_token = kv_bytes_per_token(target_config, dtype_bytes(dtype, target_config))
    split = max(int(tensor_parallel_size), 1)
    draft = int(draft_params) * dtype_bytes(dtype, target_config)
    return (weights + draft + per_token * int(context_tokens)) // split + SERVER_OVERHEAD_BYTES
