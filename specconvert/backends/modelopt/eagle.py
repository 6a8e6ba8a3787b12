"""EAGLE-3 through NVIDIA Model Optimizer: attach, load an imported head, export.

A thin adapter over ``modelopt.torch.speculative`` that hides the two generations
we support (DESIGN §3):

- **new** (0.43+, e.g. 0.47): ``mtsp.convert`` fills hidden/vocab/positions from the
  target; the module is ``eagle_module.{fc, layers.N.*, norm, lm_head?, d2t}``;
  ``export_speculative_decoding`` writes the canonical layout.
- **old** (0.37, the one TensorRT-LLM 1.2.1 pins): hidden/vocab/positions must be set
  by hand; the module is ``eagle_module.{fc, layers.N.*, hidden_norm,
  input_embeds_norm, norm, eagle_lm_head, d2t}``; we export the state dict ourselves
  in the canonical layout.

Every function here takes plain data (dicts, tensors) and returns plain data, so the
convert stage never touches Model Optimizer's internals directly.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..._imports import installed_version, require
from ...errors import EnvironmentMissing, InputError


def modelopt_version() -> str:
    version = installed_version("nvidia-modelopt")
    if version is None:
        raise EnvironmentMissing("nvidia-modelopt is not installed", fix="pip install 'nvidia-modelopt>=0.37' requests")
    return version


def generation(version: str | None = None) -> str:
    """'new' for Model Optimizer >= 0.43 (export_speculative_decoding), else 'old'."""
    version = version or modelopt_version()
    major, minor = (int(x) for x in version.split(".")[:2])
    return "new" if (major, minor) >= (0, 43) else "old"


def default_aux_layer_ids(num_layers: int) -> list[int]:
    """Model Optimizer's and TensorRT-LLM's default: outputs of layers {1, N//2-1, N-4}."""
    return sorted({1, num_layers // 2 - 1, num_layers - 4} & set(range(num_layers))) if num_layers >= 4 else list(range(num_layers))


@dataclass
class EagleArch:
    """The head architecture handed to ``mtsp.convert`` (canonical names)."""

    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    num_hidden_layers: int = 1
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    hidden_act: str = "silu"
    attention_bias: bool = False
    mlp_bias: bool = False
    draft_vocab_size: int | None = None
    has_lm_head: bool = True

    @classmethod
    def for_target(cls, target_config: Any, draft_vocab_size: int | None = None, num_layers: int = 1) -> "EagleArch":
        """A fresh head sized to the target (Model Optimizer's default is 8B-sized)."""
        heads = target_config.num_attention_heads
        head_dim = getattr(target_config, "head_dim", None) or target_config.hidden_size // heads
        return cls(
            intermediate_size=target_config.intermediate_size,
            num_attention_heads=heads,
            num_key_value_heads=getattr(target_config, "num_key_value_heads", None) or heads,
            head_dim=head_dim,
            num_hidden_layers=num_layers,
            rms_norm_eps=getattr(target_config, "rms_norm_eps", 1e-5),
            rope_theta=_rope_theta(target_config) or 10000.0,
            hidden_act=getattr(target_config, "hidden_act", "silu"),
            draft_vocab_size=draft_vocab_size or target_config.vocab_size,
            has_lm_head=True,
        )


def _rope_theta(config: Any) -> float | None:
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        for attr in ("rope_parameters", "rope_scaling"):
            params = getattr(config, attr, None)
            if isinstance(params, dict) and params.get("rope_theta") is not None:
                return float(params["rope_theta"])
    return float(theta) if theta is not None else None


def convert_config(arch: EagleArch, aux_layer_ids: list[int], target_config: Any, gen: str) -> dict:
    """The ``("eagle", cfg)`` config for ``mtsp.convert``, deep-copied from Model Optimizer's default."""
    from modelopt.torch.speculative.config import EAGLE3_DEFAULT_CFG

    cfg = copy.deepcopy(EAGLE3_DEFAULT_CFG)["config"]
    arch_cfg = cfg["eagle_architecture_config"]
    rope_scaling = copy.deepcopy(arch.rope_scaling) if arch.rope_scaling else {"rope_type": "default"}
    rope_scaling.setdefault("rope_theta", arch.rope_theta)
    arch_cfg.update(
        {
            "intermediate_size": arch.intermediate_size,
            "num_attention_heads": arch.num_attention_heads,
            "num_key_value_heads": arch.num_key_value_heads,
            "head_dim": arch.head_dim,
            "num_hidden_layers": arch.num_hidden_layers,
            "rms_norm_eps": arch.rms_norm_eps,
            "rope_theta": arch.rope_theta,
            "rope_scaling": rope_scaling,
            "hidden_act": arch.hidden_act,
            "attention_bias": arch.attention_bias,
            "mlp_bias": arch.mlp_bias,
            "draft_vocab_size": arch.draft_vocab_size or target_config.vocab_size,
            "has_lm_head": arch.has_lm_head,
            "eagle_aux_hidden_state_layer_ids": list(aux_layer_ids),
        }
    )
    if gen == "old":
        # 0.37 does not fill these from the target ("EAGLE module hidden size 4096 must match ...").
        arch_cfg["hidden_size"] = target_config.hidden_size
        arch_cfg["vocab_size"] = target_config.vocab_size
        arch_cfg["max_position_embeddings"] = target_config.max_position_embeddings
    else:
        cfg["eagle_use_torch_compile"] = False  # CPU-safe; compile is a training-speed option
        # We write rope settings into the exported config ourselves (see export_draft).
        cfg["eagle_export_rope_scaling"] = {}
    return cfg


def attach_eagle(model: Any, arch: EagleArch, aux_layer_ids: list[int], training: dict[str, Any] | None = None) -> Any:
    """``mtsp.convert`` the target in place with an EAGLE-3 head of ``arch``.

    ``training`` adds Model Optimizer training options, e.g. ``{"eagle_offline": True,
    "eagle_ttt_steps": 3}`` (offline: the target's layers are dropped and its outputs
    are passed in as ``base_model_outputs``).
    """
    mtsp = require("modelopt.torch.speculative", purpose="attach an EAGLE-3 head")
    gen = generation()
    if not getattr(model.config, "architectures", None):
        model.config.architectures = [type(model).__name__]
    cfg = convert_config(arch, aux_layer_ids, model.config, gen)
    cfg.update(training or {})
    try:
        mtsp.convert(model, [("eagle", cfg)])
    except (AssertionError, ValueError, TypeError) as exc:
        raise InputError(
            f"Model Optimizer could not attach an EAGLE-3 head to this target: {str(exc).splitlines()[0]}",
            fix="check that the target is a supported decoder-only architecture (Llama family first)",
        ) from exc
    got = list(getattr(model.eagle_config, "eagle_aux_hidden_state_layer_ids", []))
    if got != list(aux_layer_ids):
        raise InputError(f"Model Optimizer chose aux layers {got}, expected {aux_layer_ids}", fix="report this as a bug")
    return model


# canonical name -> module state-dict name, per generation (only names that differ)
_OLD_NAMES = {
    "layers.0.hidden_norm.weight": "hidden_norm.weight",
    "layers.0.input_layernorm.weight": "input_embeds_norm.weight",
    "lm_head.weight": "eagle_lm_head.weight",
}


def module_name(canonical: str, gen: str) -> str:
    return _OLD_NAMES.get(canonical, canonical) if gen == "old" else canonical


def canonical_name(module: str, gen: str) -> str:
    if gen == "old":
        for canon, old in _OLD_NAMES.items():
            if module == old:
                return canon
    return module


def head_state(model: Any) -> dict[str, Any]:
    """The EAGLE module's tensors under canonical names (buffers included: d2t)."""
    gen = generation()
    state = model.eagle_module.state_dict()
    return {canonical_name(k, gen): v for k, v in state.items() if not k.endswith("inv_freq")}


def load_head(model: Any, tensors: dict[str, Any]) -> None:
    """Load canonical head tensors into ``model.eagle_module``; every parameter must be covered.

    The module takes the tensors' own dtype first, so loading copies them bit for bit
    (the module was built in the target's dtype; loading an fp32 head into a bf16
    module would round it on the way in). Cast the tensors beforehand to change dtype
    (``heads.dtype.cast_for_export``), where the cast is checked and recorded.
    """
    torch = require("torch")
    gen = generation()
    module = model.eagle_module
    expected = {k: v for k, v in module.state_dict().items() if not k.endswith("inv_freq")}
    incoming = {module_name(k, gen): v for k, v in tensors.items()}
    missing = sorted(set(expected) - set(incoming))
    unexpected = sorted(set(incoming) - set(expected))
    if missing or unexpected:
        raise InputError(
            f"head tensors do not fit the EAGLE-3 module: missing {missing[:6]}, unexpected {unexpected[:6]}",
            fix="check draft.format and that the head was trained for this target",
        )
    for name, value in incoming.items():
        if tuple(expected[name].shape) != tuple(value.shape):
            raise InputError(
                f"head tensor {name} has shape {tuple(value.shape)}, the module expects {tuple(expected[name].shape)}",
                fix="the head's config.json disagrees with its weights; check draft.model",
            )
    if any(t.is_meta for t in module.parameters()) or any(t.is_meta for t in module.buffers()):
        module.to_empty(device="cpu")
    dtypes = {v.dtype for v in incoming.values() if v.is_floating_point()}
    if len(dtypes) > 1:
        raise InputError(f"head tensors have several floating dtypes {sorted(map(str, dtypes))}",
                         fix="cast the head to one dtype before converting")
    if dtypes:
        # casts floating parameters and buffers only: d2t stays int64 (rotary inv_freq is never exported)
        module.to(dtypes.pop())
    with torch.no_grad():
        module.load_state_dict(incoming, strict=False)


def export_draft(model: Any, out_dir: Path, dtype: Any, config_overrides: dict[str, Any]) -> None:
    """Write the canonical draft folder: ``config.json`` + ``model.safetensors``.

    The head must already be in ``dtype`` (``load_head`` of tensors cast and checked
    by ``heads.dtype.cast_for_export``): a cast here would change the tensors
    unrecorded. Model Optimizer's exporter writes each tensor in the dtype it holds
    (0.47: ``EagleExporter.export`` in ``modelopt/torch/export/plugins/hf_spec_export.py``
    saves ``model.state_dict()`` as is). ``config_overrides`` replaces keys of the
    exported config: rope settings and ``torch_dtype`` must describe the tensors, not
    Model Optimizer's defaults.
    """
    torch = require("torch")
    gen = generation()
    out_dir = Path(out_dir)
    stray = sorted({str(v.dtype) for k, v in head_state(model).items() if v.is_floating_point() and v.dtype != dtype})
    if stray:
        raise ValueError(f"EAGLE module holds {stray}, export dtype is {dtype}: cast the tensors before load_head")
    out_dir.mkdir(parents=True, exist_ok=True)
    if gen == "new":
        from modelopt.torch.export.unified_export_hf import export_speculative_decoding

        export_speculative_decoding(model, export_dir=out_dir)
        config = json.loads((out_dir / "config.json").read_text())
    else:
        from safetensors.torch import save_file

        state = {k: v.detach().contiguous().clone() for k, v in head_state(model).items()}
        save_file(state, str(out_dir / "model.safetensors"))
        config = _old_export_config(model)
    config.update(config_overrides)
    config["torch_dtype"] = str(dtype).replace("torch.", "")
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    del torch


def _old_export_config(model: Any) -> dict[str, Any]:
    """The canonical config for Model Optimizer 0.37 (which has no speculative exporter)."""
    ec = model.eagle_config
    get = lambda key, default=None: getattr(ec, key, None) if getattr(ec, key, None) is not None else getattr(model.config, key, default)  # noqa: E731
    return {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_act": get("hidden_act", "silu"),
        "hidden_size": get("hidden_size"),
        "intermediate_size": get("intermediate_size"),
        "num_attention_heads": get("num_attention_heads"),
        "num_key_value_heads": get("num_key_value_heads"),
        "num_hidden_layers": get("num_hidden_layers"),
        "head_dim": get("head_dim"),
        "rms_norm_eps": get("rms_norm_eps"),
        "max_position_embeddings": get("max_position_embeddings"),
        "vocab_size": get("vocab_size"),
        "draft_vocab_size": get("draft_vocab_size"),
        "attention_bias": get("attention_bias", False),
        "mlp_bias": get("mlp_bias", False),
        "tie_word_embeddings": False,
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(get("eagle_aux_hidden_state_layer_ids", [])),
            "use_aux_hidden_state": True,
            "use_input_layernorm_in_first_layer": True,
            "use_last_layernorm": True,
        },
    }
