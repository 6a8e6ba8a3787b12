"""What `specconvert inspect` shows about a head folder or a target folder.

Owns the two summaries; reads config.json (and, for heads, the weights) but never
builds a model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import InputError
from .layouts import layer_indices, rope_from_config, to_canonical
from .reading import read_head


def describe_head(path: Path | str, format: str = "auto", allow_pickle: bool = False) -> dict[str, Any]:
    """Layout, sizes, aux layers, dtype, vocabularies and files of a head folder."""
    ckpt = read_head(path, format=format, allow_pickle=allow_pickle)
    head = to_canonical(ckpt)
    a = head.arch
    return {
        "path": str(ckpt.path),
        "layout": ckpt.layout,
        "architectures": ckpt.config.get("architectures"),
        "hidden_size": a.hidden_size,
        "target_hidden_size": a.target_hidden_size,
        "num_layers": a.num_layers,
        "layers_in_weights": len(layer_indices(head.tensors)),
        "num_attention_heads": a.num_attention_heads,
        "num_key_value_heads": a.num_key_value_heads,
        "head_dim": a.head_dim,
        "intermediate_size": a.intermediate_size,
        "vocab_size": a.vocab_size,
        "draft_vocab_size": a.draft_vocab_size,
        "n_aux": a.n_aux,
        "aux_layer_ids": a.aux_layer_ids,
        "aux_layer_ids_source": a.aux_layer_ids_source,
        "dtype": a.dtype,
        "rope_theta": a.rope_theta,
        "rope_scaling": a.rope_scaling,
        "max_position_embeddings": a.max_position_embeddings,
        "has_lm_head": a.has_lm_head,
        "has_d2t": a.has_d2t,
        "has_t2d": "t2d" in head.dropped,
        "has_embed_tokens": "embed_tokens.weight" in head.dropped,
        "num_parameters": sum(int(t.numel()) for t in head.tensors.values() if t.is_floating_point()),
        "files": _files(ckpt.weight_files),
        "notes": a.notes,
    }


def describe_target(path: Path | str) -> dict[str, Any]:
    """Architecture, sizes, dtype and quantization of a target folder, from its JSON files only."""
    path = Path(path)
    cfg_path = path / "config.json"
    if not path.is_dir():
        raise InputError(f"target folder {path} does not exist", fix="set `target.model` to an existing folder")
    if not cfg_path.is_file():
        raise InputError(f"{cfg_path} is missing", fix="the target folder needs its config.json")
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{cfg_path} is not valid JSON ({exc})", fix="restore config.json from the model's source") from exc
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) and "hidden_size" not in cfg else cfg
    theta, scaling = rope_from_config(text)
    weights = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in (".safetensors", ".bin", ".pt", ".gguf"))
    return {
        "path": str(path),
        "architectures": cfg.get("architectures"),
        "model_type": cfg.get("model_type"),
        "num_hidden_layers": text.get("num_hidden_layers"),
        "hidden_size": text.get("hidden_size"),
        "vocab_size": text.get("vocab_size"),
        "num_attention_heads": text.get("num_attention_heads"),
        "num_key_value_heads": text.get("num_key_value_heads") or text.get("num_attention_heads"),
        "head_dim": text.get("head_dim") or (text["hidden_size"] // text["num_attention_heads"]
                                             if text.get("hidden_size") and text.get("num_attention_heads") else None),
        "max_position_embeddings": text.get("max_position_embeddings"),
        "rope_theta": theta,
        "rope_scaling": scaling,
        "tie_word_embeddings": cfg.get("tie_word_embeddings"),
        "dtype": cfg.get("dtype") or cfg.get("torch_dtype") or text.get("dtype") or text.get("torch_dtype"),
        "quantization": _quantization(path, cfg),
        "files": _files(weights),
    }


def _quantization(path: Path, cfg: dict) -> dict[str, Any] | None:
    hf_quant = path / "hf_quant_config.json"
    if hf_quant.is_file():
        try:
            data = json.loads(hf_quant.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise InputError(f"{hf_quant} is not valid JSON ({exc})", fix="re-export the quantized checkpoint") from exc
        q = data.get("quantization") or {}
        return {"source": "hf_quant_config.json", "producer": data.get("producer"), "quant_algo": q.get("quant_algo"),
                "kv_cache_quant_algo": q.get("kv_cache_quant_algo"),
                "exclude_modules": q.get("exclude_modules")}
    qc = cfg.get("quantization_config")
    if isinstance(qc, dict):
        return {"source": "config.json quantization_config", "quant_method": qc.get("quant_method"),
                "quant_algo": qc.get("quant_algo"), "kv_cache_quant_algo": qc.get("kv_cache_quant_algo")}
    return None


def _files(files) -> list[dict[str, Any]]:
    return [{"name": Path(f).name, "bytes": Path(f).stat().st_size} for f in files]
