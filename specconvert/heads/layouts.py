"""Third-party EAGLE-3 heads mapped to the canonical (Model Optimizer 0.47 export) layout.

Owns: normalising a head's config into :class:`HeadArch` and renaming its tensors
into canonical names, without changing a single value (``source_names`` records
where each canonical tensor came from, for the lossless proof).

Layouts (tensor names; config):
- ``eagle`` (EAGLE official, SpecForge before it renamed): ``midlayer.*``, ``fc``,
  ``norm``, ``lm_head``, ``d2t``, ``t2d``; config ``LlamaForCausalLMEagle3`` with
  ``draft_vocab_size``, often no ``rope_theta`` (Llama default 10000).
- ``modelopt``: ``layers.{i}.*`` (``layers.0.hidden_norm``), ``fc``, ``norm``,
  ``lm_head?``, ``d2t?``; aux ids in ``eagle_config.eagle_aux_hidden_state_layer_ids``.
- ``speculators`` (vLLM's speculators): config with ``speculators_model_type: eagle3``,
  the decoder architecture in ``transformer_layer_config`` (a LlamaConfig *diff*
  dict, so unset fields mean Llama defaults), ``draft_vocab_size``,
  ``target_hidden_size``, ``norm_before_residual``, top-level
  ``eagle_aux_hidden_state_layer_ids``; tensors like ``modelopt`` plus ``t2d`` and
  ``embed_tokens.weight``.

Aux layer id conventions, as the runtimes read them (checked against their sources):
- output convention (id i = output of decoder layer i, 0-based): Model Optimizer,
  TensorRT-LLM ``eagle3_layers_to_capture``, and the ``eagle_config`` ids SGLang
  reads (SGLang adds +1 internally because it captures at the *input* of a layer).
- input convention (id i = input of layer i = output of layer i-1; id N = last
  layer's output): vLLM's top-level ``eagle_aux_hidden_state_layer_ids`` and
  speculators (default ``[2, N//2, N-3]``).
``HeadArch.aux_layer_ids`` is always in the output convention.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from .reading import HeadCheckpoint, read_head

if TYPE_CHECKING:
    import torch

__all__ = ["HeadArch", "CanonicalHead", "HeadCheckpoint", "read_head", "to_canonical", "LLAMA_DEFAULTS"]

# transformers' LlamaConfig defaults: what an absent key means in a Llama-style
# head config (EAGLE official omits rope_theta; speculators saves a diff dict).
LLAMA_DEFAULTS: dict[str, Any] = {
    "hidden_size": 4096,
    "intermediate_size": 11008,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 2048,
    "vocab_size": 32000,
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
}

_LAYER_RE = re.compile(r"^layers\.(\d+)\.")
# Tensors the canonical layout does not carry; kept aside for the checks.
_DROPPED = ("t2d", "embed_tokens.weight", "fc.bias")


@dataclass
class HeadArch:
    """Normalised architecture facts of a head. ``aux_layer_ids`` is in the output convention."""

    hidden_size: int
    target_hidden_size: int
    num_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    vocab_size: int
    draft_vocab_size: int
    hidden_act: str
    attention_bias: bool
    mlp_bias: bool
    aux_layer_ids: list[int] | None
    n_aux: int
    dtype: str
    has_lm_head: bool
    has_d2t: bool
    # where values came from when the config did not state them, conversions made
    notes: list[str] = field(default_factory=list)
    # the raw ids and the key they were read from, before conversion to the output convention
    aux_layer_ids_source: str | None = None
    norm_before_residual: bool = False
    layout: str = ""


@dataclass
class CanonicalHead:
    """A head under canonical names. ``dropped`` holds source tensors that are not emitted (t2d, embed_tokens, fc.bias)."""

    arch: HeadArch
    tensors: dict[str, "torch.Tensor"]
    source_names: dict[str, str]
    dropped: dict[str, "torch.Tensor"] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)  # source names that fit no canonical slot


def to_canonical(ckpt: HeadCheckpoint) -> CanonicalHead:
    """Rename ``ckpt``'s tensors to canonical names and normalise its config. Values are never changed.

    Does not judge the head: run :func:`specconvert.heads.checks.check_head` or
    ``check_against_target`` on the result.
    """
    tensors: dict[str, torch.Tensor] = {}
    source_names: dict[str, str] = {}
    dropped: dict[str, torch.Tensor] = {}
    unexpected: list[str] = []
    for src, tensor in ckpt.tensors.items():
        name = _canonical_name(src, ckpt.layout)
        if name in _DROPPED:
            dropped[name] = tensor
        elif not _is_canonical(name):
            unexpected.append(src)
        else:
            if name in tensors:  # e.g. both midlayer.x and layers.0.x
                unexpected.append(src)
                continue
            tensors[name] = tensor
            source_names[name] = src
    arch = _arch(ckpt, tensors)
    d2t = tensors.get("d2t")
    torch = _torch()
    if d2t is not None and d2t.dtype != torch.int64 and not d2t.is_floating_point() and d2t.dtype != torch.bool:
        # the canonical d2t is int64; widening an integer tensor keeps every value (torch.equal still holds)
        arch.notes.append(f"d2t stored as {str(d2t.dtype).replace('torch.', '')}; widened to int64")
        tensors["d2t"] = d2t.to(torch.int64)
    return CanonicalHead(arch=arch, tensors=tensors, source_names=source_names, dropped=dropped,
                         unexpected=sorted(unexpected))


def _torch():
    from .._imports import require

    return require("torch", "read the draft head")


def _canonical_name(src: str, layout: str) -> str:
    name = src
    for prefix in ("model.", "eagle_module."):  # some exporters keep the module prefix
        if name.startswith(prefix):
            name = name[len(prefix):]
    if layout == "eagle" and name.startswith("midlayer."):
        name = "layers.0." + name[len("midlayer."):]
    return name


_CANONICAL_TOP = {"fc.weight", "norm.weight", "lm_head.weight", "d2t"}
_CANONICAL_LAYER = {
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias", "self_attn.o_proj.bias",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "mlp.gate_proj.bias", "mlp.up_proj.bias", "mlp.down_proj.bias",
    "input_layernorm.weight", "post_attention_layernorm.weight",
}


def _is_canonical(name: str) -> bool:
    if name in _CANONICAL_TOP:
        return True
    match = _LAYER_RE.match(name)
    if not match:
        return False
    rest = name[match.end():]
    return rest in _CANONICAL_LAYER or (rest == "hidden_norm.weight" and match.group(1) == "0")


def layer_indices(names) -> list[int]:
    """Sorted decoder-layer indices present among canonical tensor names."""
    return sorted({int(m.group(1)) for n in names if (m := _LAYER_RE.match(n))})


# ---------------------------------------------------------------- config


def _arch(ckpt: HeadCheckpoint, tensors: dict) -> HeadArch:
    notes = list(ckpt.notes)
    cfg = dict(ckpt.config)
    if ckpt.layout == "speculators":
        layer_cfg = cfg.get("transformer_layer_config") or {}
        merged = dict(layer_cfg)
        for key in ("draft_vocab_size", "target_hidden_size"):
            if cfg.get(key) is not None:
                merged[key] = cfg[key]
        cfg = merged

    def get(key: str):
        if cfg.get(key) is not None:
            return cfg[key]
        value = LLAMA_DEFAULTS[key]
        notes.append(f"{key} absent from the head config: Llama default {value}")
        return value

    hidden = int(cfg["hidden_size"]) if cfg.get("hidden_size") else _shape0(tensors, "norm.weight", notes, "hidden_size")
    heads = int(get("num_attention_heads"))
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    head_dim = int(cfg.get("head_dim") or hidden // heads)
    vocab = int(get("vocab_size"))
    draft_vocab = cfg.get("draft_vocab_size")
    if draft_vocab is None:
        draft_vocab = tensors["lm_head.weight"].shape[0] if "lm_head.weight" in tensors else vocab
        notes.append(f"draft_vocab_size absent from the head config: {draft_vocab} from "
                     f"{'lm_head.weight' if 'lm_head.weight' in tensors else 'vocab_size'}")
    target_hidden = int(cfg.get("target_hidden_size") or hidden)
    fc_in = int(tensors["fc.weight"].shape[1]) if "fc.weight" in tensors else 0
    n_aux = fc_in // target_hidden if target_hidden else 0
    rope_theta, rope_scaling = rope_from_config(cfg)
    if rope_theta is None:
        rope_theta = LLAMA_DEFAULTS["rope_theta"]
        notes.append("rope_theta absent from the head config: Llama default 10000.0")
    aux, aux_source = _aux_from_config(ckpt.config, ckpt.layout)
    num_layers = cfg.get("num_hidden_layers")
    if num_layers is None:
        num_layers = len(layer_indices(tensors)) or 1
        notes.append(f"num_hidden_layers absent from the head config: {num_layers} from the tensors")
    norm_before_residual = bool(ckpt.config.get("norm_before_residual", False))
    return HeadArch(
        hidden_size=hidden,
        target_hidden_size=target_hidden,
        num_layers=int(num_layers),
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=int(get("intermediate_size")),
        rms_norm_eps=float(get("rms_norm_eps")),
        rope_theta=float(rope_theta),
        rope_scaling=rope_scaling,
        max_position_embeddings=int(get("max_position_embeddings")),
        vocab_size=vocab,
        draft_vocab_size=int(draft_vocab),
        hidden_act=str(get("hidden_act")),
        attention_bias=bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        aux_layer_ids=aux,
        n_aux=n_aux,
        dtype=_float_dtype(tensors),
        has_lm_head="lm_head.weight" in tensors,
        has_d2t="d2t" in tensors,
        notes=notes,
        aux_layer_ids_source=aux_source,
        norm_before_residual=norm_before_residual,
        layout=ckpt.layout,
    )


def _shape0(tensors: dict, name: str, notes: list[str], key: str) -> int:
    if name in tensors:
        notes.append(f"{key} absent from the head config: {tensors[name].shape[0]} from {name}")
        return int(tensors[name].shape[0])
    return 0


def rope_from_config(cfg: dict) -> tuple[float | None, dict | None]:
    """(rope_theta, rope_scaling) from a config dict in transformers 4.x or 5 spelling.

    transformers 5 folds both into ``rope_parameters`` (possibly per attention type);
    4.x has ``rope_theta`` and ``rope_scaling``. A ``default`` rope type means no scaling.
    """
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params and isinstance(params["full_attention"], dict):
        params = params["full_attention"]
    theta = cfg.get("rope_theta")
    scaling = cfg.get("rope_scaling")
    if isinstance(params, dict):
        if theta is None:
            theta = params.get("rope_theta")
        if scaling is None:
            scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    return (float(theta) if theta is not None else None), normalise_rope_scaling(scaling)


def normalise_rope_scaling(scaling: Any) -> dict | None:
    """``None`` for no scaling; else a dict with ``rope_type`` (4.x wrote ``type``), without rope_theta."""
    if not isinstance(scaling, dict) or not scaling:
        return None
    out = {k: v for k, v in scaling.items() if k != "rope_theta"}
    if "type" in out and "rope_type" not in out:
        out["rope_type"] = out.pop("type")
    else:
        out.pop("type", None)
    if out.get("rope_type", "default") == "default" and len(out) <= 1:
        return None
    return out


def _aux_from_config(config: dict, layout: str) -> tuple[list[int] | None, str | None]:
    """Aux ids the head states, converted to the output convention, and a note on where they came from."""
    nested = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    top = config.get("eagle_aux_hidden_state_layer_ids")
    if layout == "speculators" and top:
        # speculators targets vLLM, which captures at a layer's input: id i = output of layer i-1
        return [int(i) - 1 for i in top], f"eagle_aux_hidden_state_layer_ids {list(top)} (input convention, minus 1)"
    if nested:
        return [int(i) for i in nested], f"eagle_config.eagle_aux_hidden_state_layer_ids {list(nested)} (output convention)"
    if top:
        # vLLM reads a top-level list as capture-at-input ids
        return [int(i) - 1 for i in top], f"eagle_aux_hidden_state_layer_ids {list(top)} (vLLM input convention, minus 1)"
    return None, None


def _float_dtype(tensors: dict) -> str:
    kinds = sorted({str(t.dtype).replace("torch.", "") for t in tensors.values() if t.is_floating_point()})
    if not kinds:
        return "none"
    return kinds[0] if len(kinds) == 1 else "mixed(" + ",".join(kinds) + ")"
