"""Tiny EAGLE-3 heads and target configs written to disk, in every layout we read.

Reusable from any test::

    from tests.helpers.heads import write_head, write_target_config, TINY
    head_dir = write_head(tmp_path / "head", "eagle")                       # a valid head
    bad_dir = write_head(tmp_path / "bad", "modelopt", d2t_out_of_range=True)  # a broken one
    target_dir = write_target_config(tmp_path / "target")

The head fits the target written by :func:`write_target_config` with the same
``TINY`` sizes (hidden 64, 8 layers, vocab 256, draft vocab 128, 4 heads, 2 kv
heads, head_dim 16, intermediate 128). Everything is seeded, so two calls with the
same arguments write identical files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

LAYOUTS = ("eagle", "eagle_bin", "modelopt", "speculators", "sharded")

TINY: dict[str, Any] = dict(
    hidden_size=64,
    target_hidden_size=64,
    num_target_layers=8,
    vocab_size=256,
    draft_vocab_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    intermediate_size=128,
    num_layers=1,
    n_aux=3,
    rms_norm_eps=1e-5,
    max_position_embeddings=2048,
)


def default_aux_output_ids(num_target_layers: int) -> list[int]:
    n = num_target_layers
    return sorted({1, max(0, n // 2 - 1), max(0, n - 4)})


def canonical_tensors(seed: int = 0, dtype: str = "float32", **sizes) -> dict:
    """Random head tensors under canonical names (plus ``t2d`` and ``embed_tokens.weight``)."""
    import torch

    s = {**TINY, **sizes}
    gen = torch.Generator().manual_seed(seed)
    dt = getattr(torch, dtype)
    h, th = s["hidden_size"], s["target_hidden_size"]
    q_rows, kv_rows, inter = s["num_attention_heads"] * s["head_dim"], s["num_key_value_heads"] * s["head_dim"], s["intermediate_size"]

    def rnd(*shape):
        return (torch.randn(*shape, generator=gen) * 0.05).to(dt)

    def ones(n):
        return (1.0 + 0.1 * torch.randn(n, generator=gen)).to(dt)

    t = {"fc.weight": rnd(h, s["n_aux"] * th)}
    for i in range(s["num_layers"]):
        p, in_dim = f"layers.{i}.", (2 * h if i == 0 else h)
        t.update({
            p + "self_attn.q_proj.weight": rnd(q_rows, in_dim),
            p + "self_attn.k_proj.weight": rnd(kv_rows, in_dim),
            p + "self_attn.v_proj.weight": rnd(kv_rows, in_dim),
            p + "self_attn.o_proj.weight": rnd(h, q_rows),
            p + "mlp.gate_proj.weight": rnd(inter, h),
            p + "mlp.up_proj.weight": rnd(inter, h),
            p + "mlp.down_proj.weight": rnd(h, inter),
            p + "input_layernorm.weight": ones(h),
            p + "post_attention_layernorm.weight": ones(h),
        })
    t["layers.0.hidden_norm.weight"] = ones(h)
    t["norm.weight"] = ones(h)
    vocab, dv = s["vocab_size"], s["draft_vocab_size"]
    t["lm_head.weight"] = rnd(dv, h)
    used = torch.randperm(vocab, generator=gen)[:dv].sort().values
    t["d2t"] = (used - torch.arange(dv)).to(torch.int64)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[used] = True
    t["t2d"] = t2d
    t["embed_tokens.weight"] = rnd(vocab, th)
    return t


def _llama_fields(s: dict, dtype: str, rope_theta) -> dict:
    cfg = {
        "model_type": "llama",
        "hidden_size": s["hidden_size"],
        "intermediate_size": s["intermediate_size"],
        "num_attention_heads": s["num_attention_heads"],
        "num_key_value_heads": s["num_key_value_heads"],
        "num_hidden_layers": s["num_layers"],
        "rms_norm_eps": s["rms_norm_eps"],
        "max_position_embeddings": s["max_position_embeddings"],
        "vocab_size": s["vocab_size"],
        "hidden_act": "silu",
        "torch_dtype": dtype,
        "tie_word_embeddings": False,
    }
    if s["head_dim"] != s["hidden_size"] // s["num_attention_heads"]:
        cfg["head_dim"] = s["head_dim"]
    if rope_theta is not None:
        cfg["rope_theta"] = rope_theta
    return cfg


def head_config(layout: str, dtype: str = "float32", rope_theta=None, aux_layer_ids="default", **sizes) -> dict:
    """The config.json a head of ``layout`` ships with. ``aux_layer_ids`` is in that layout's own convention."""
    s = {**TINY, **sizes}
    base = "eagle" if layout in ("eagle", "eagle_bin") else ("modelopt" if layout == "sharded" else layout)
    llama = _llama_fields(s, dtype, rope_theta)
    out_ids = default_aux_output_ids(s["num_target_layers"])
    if base == "eagle":
        # the EAGLE official head: no rope_theta (unless asked), no aux ids
        cfg = {"architectures": ["LlamaForCausalLMEagle3"], **llama, "draft_vocab_size": s["draft_vocab_size"]}
        if aux_layer_ids not in ("default", None):
            cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_layer_ids)}
        return cfg
    if base == "modelopt":
        llama.setdefault("rope_theta", 10000.0)
        llama["head_dim"] = s["head_dim"]
        ids = out_ids if aux_layer_ids == "default" else aux_layer_ids
        cfg = {"architectures": ["LlamaForCausalLMEagle3"], **llama, "draft_vocab_size": s["draft_vocab_size"],
               "eagle_config": {"use_aux_hidden_state": True, "use_input_layernorm_in_first_layer": True,
                                "use_last_layernorm": True, "use_mtp_layernorm": False}}
        if ids is not None:
            cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(ids)
        if s["target_hidden_size"] != s["hidden_size"]:
            cfg["target_hidden_size"] = s["target_hidden_size"]
        return cfg
    if base == "speculators":
        ids = [i + 1 for i in out_ids] if aux_layer_ids == "default" else aux_layer_ids  # vLLM input convention
        layer_cfg = {k: v for k, v in llama.items() if k not in ("torch_dtype",)}
        cfg = {
            "speculators_model_type": "eagle3",
            "architectures": ["Eagle3Speculator"],
            "transformer_layer_config": layer_cfg,
            "draft_vocab_size": s["draft_vocab_size"],
            "norm_before_residual": False,
            "target_hidden_size": s["target_hidden_size"] if s["target_hidden_size"] != s["hidden_size"] else None,
            "speculators_config": {
                "algorithm": "eagle3",
                "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
                "verifier": {"name_or_path": "tiny-llama", "architectures": ["LlamaForCausalLM"]},
            },
            "torch_dtype": dtype,
        }
        if ids is not None:
            cfg["eagle_aux_hidden_state_layer_ids"] = list(ids)
        return cfg
    raise ValueError(f"unknown layout {layout}")


def source_name(layout: str, canonical: str) -> str:
    """The name ``canonical`` has in ``layout``."""
    if layout in ("eagle", "eagle_bin") and canonical.startswith("layers.0."):
        return "midlayer." + canonical[len("layers.0."):]
    return canonical


def write_head(
    directory: Path | str,
    layout: str = "modelopt",
    *,
    seed: int = 0,
    dtype: str = "float32",
    rope_theta: float | None = None,
    aux_layer_ids: Any = "default",
    with_t2d: bool | None = None,
    with_embed: bool | None = None,
    with_lm_head: bool = True,
    with_d2t: bool = True,
    shards: int | None = None,
    config_overrides: dict | None = None,
    drop: tuple[str, ...] = (),
    extra: dict | None = None,
    tensor_overrides: dict | None = None,
    d2t_out_of_range: bool = False,
    d2t_duplicate: bool = False,
    t2d_mismatch: bool = False,
    mixed_dtype: bool = False,
    truncate: bool = False,
    corrupt_header: bool = False,
    no_config: bool = False,
    **sizes,
) -> Path:
    """Write a tiny head in ``layout`` (one of :data:`LAYOUTS`) into ``directory``; return the folder.

    Sizes (``hidden_size``, ``target_hidden_size``, ``num_layers``, ``vocab_size``,
    ``draft_vocab_size``, ``num_attention_heads``, ``num_key_value_heads``,
    ``head_dim``, ``intermediate_size``, ``n_aux``, ``num_target_layers``) change the
    tensors and the config together; ``config_overrides`` changes only the config
    (for speculators, keys of ``transformer_layer_config`` go under ``"transformer_layer_config"``),
    which is how a config/weights mismatch is made. ``drop``/``extra``/``tensor_overrides``
    use *source* names (``midlayer.*`` in eagle). The flags make the broken variants.
    """
    import torch

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    s = {**TINY, **sizes}
    canon = canonical_tensors(seed=seed, dtype=dtype, **sizes)
    base = "eagle" if layout in ("eagle", "eagle_bin") else ("modelopt" if layout == "sharded" else layout)
    keep_t2d = with_t2d if with_t2d is not None else base in ("eagle", "speculators")
    keep_embed = with_embed if with_embed is not None else base == "speculators"
    if not keep_t2d:
        canon.pop("t2d")
    if not keep_embed:
        canon.pop("embed_tokens.weight")
    if not with_lm_head:
        canon.pop("lm_head.weight")
    if not with_d2t:
        canon.pop("d2t")
    if d2t_out_of_range:
        canon["d2t"][-1] = s["vocab_size"] + 5 - (s["draft_vocab_size"] - 1)
    if d2t_duplicate:
        canon["d2t"][1] = canon["d2t"][0] - 1  # draft id 1 -> the same target id as draft id 0
    if t2d_mismatch and "t2d" in canon:
        first = int(canon["t2d"].nonzero()[0])
        canon["t2d"][first] = False
        canon["t2d"][int((~canon["t2d"]).nonzero()[-1])] = True  # same count, different ids
    if mixed_dtype:
        canon["norm.weight"] = canon["norm.weight"].to(torch.float16)
    tensors = {source_name(layout, k): v for k, v in canon.items()}
    for name in drop:
        tensors.pop(name)
    tensors.update(extra or {})
    tensors.update(tensor_overrides or {})

    cfg = head_config(layout, dtype=dtype, rope_theta=rope_theta, aux_layer_ids=aux_layer_ids, **sizes)
    for key, value in (config_overrides or {}).items():
        if key == "transformer_layer_config" and isinstance(value, dict):
            cfg[key].update(value)
        elif value is None:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    if not no_config:
        (directory / "config.json").write_text(json.dumps(cfg, indent=2))

    if layout == "eagle_bin":
        torch.save(tensors, directory / "pytorch_model.bin")
        return directory
    n_shards = shards or (2 if layout == "sharded" else 1)
    files = _save_safetensors(directory, tensors, n_shards)
    if truncate:
        data = files[-1].read_bytes()
        files[-1].write_bytes(data[: len(data) - 100])
    if corrupt_header:
        data = bytearray(files[0].read_bytes())
        data[8:12] = b"\xff\xfe{x"
        files[0].write_bytes(bytes(data))
    return directory


def _save_safetensors(directory: Path, tensors: dict, n_shards: int) -> list[Path]:
    from safetensors.torch import save_file

    tensors = {k: v.contiguous() for k, v in tensors.items()}
    if n_shards == 1:
        path = directory / "model.safetensors"
        save_file(tensors, str(path), metadata={"format": "pt"})
        return [path]
    names = sorted(tensors)
    groups = [names[i::n_shards] for i in range(n_shards)]
    files, weight_map = [], {}
    for i, group in enumerate(groups, start=1):
        fname = f"model-{i:05d}-of-{n_shards:05d}.safetensors"
        save_file({k: tensors[k] for k in group}, str(directory / fname), metadata={"format": "pt"})
        files.append(directory / fname)
        weight_map.update({k: fname for k in group})
    total = sum(t.numel() * t.element_size() for t in tensors.values())
    (directory / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    return files


def target_config(**overrides):
    """A tiny ``LlamaConfig`` matching :data:`TINY` (transformers' own class, so 4.x/5 spelling is the installed one)."""
    from transformers import LlamaConfig

    kw = dict(
        hidden_size=TINY["hidden_size"],
        intermediate_size=TINY["intermediate_size"],
        num_hidden_layers=TINY["num_target_layers"],
        num_attention_heads=TINY["num_attention_heads"],
        num_key_value_heads=TINY["num_key_value_heads"],
        head_dim=TINY["head_dim"],
        vocab_size=TINY["vocab_size"],
        max_position_embeddings=TINY["max_position_embeddings"],
        rms_norm_eps=TINY["rms_norm_eps"],
        tie_word_embeddings=False,
    )
    rope_theta = overrides.pop("rope_theta", 10000.0)
    kw.update(overrides)
    cfg = LlamaConfig(**kw)
    # transformers 5 keeps rope in rope_parameters, 4.x in rope_theta
    if isinstance(getattr(cfg, "rope_parameters", None), dict):
        cfg.rope_parameters["rope_theta"] = rope_theta
    else:
        cfg.rope_theta = rope_theta
    cfg.architectures = ["LlamaForCausalLM"]
    return cfg


def write_target_config(directory: Path | str, *, quant: dict | None = None, legacy_json: bool = False, **overrides) -> Path:
    """Save a tiny target's config.json (no weights) into ``directory``; return the folder.

    ``legacy_json`` writes a transformers-4.x style dict (``rope_theta``/``rope_scaling``)
    instead of the installed transformers' spelling; ``quant`` writes ``hf_quant_config.json``
    ``{"producer": ..., "quantization": quant}``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    if legacy_json:
        cfg = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "hidden_size": TINY["hidden_size"], "intermediate_size": TINY["intermediate_size"],
            "num_hidden_layers": TINY["num_target_layers"], "num_attention_heads": TINY["num_attention_heads"],
            "num_key_value_heads": TINY["num_key_value_heads"], "head_dim": TINY["head_dim"],
            "vocab_size": TINY["vocab_size"], "max_position_embeddings": TINY["max_position_embeddings"],
            "rms_norm_eps": TINY["rms_norm_eps"], "rope_theta": 10000.0, "rope_scaling": None,
            "torch_dtype": "bfloat16", "transformers_version": "4.57.3",
        }
        cfg.update(overrides)
        (directory / "config.json").write_text(json.dumps(cfg, indent=2))
    else:
        target_config(**overrides).save_pretrained(directory)
    if quant is not None:
        (directory / "hf_quant_config.json").write_text(
            json.dumps({"producer": {"name": "modelopt", "version": "0.47.0"}, "quantization": quant}, indent=2))
    return directory
