"""Reading an EAGLE-3 head folder from disk, whatever its layout.

Owns: finding the weight files (single or sharded safetensors, or a pickle that
is loaded only when allowed), proving a safetensors file is whole before it is
read, and telling the three known layouts apart. Nothing here interprets the
architecture; see :mod:`specconvert.heads.layouts` for that.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._imports import require
from ..errors import InputError

if TYPE_CHECKING:
    import torch

LAYOUTS = ("eagle", "modelopt", "speculators")
FORMATS = ("auto",) + LAYOUTS

_SAFETENSORS_INDEX = "model.safetensors.index.json"
_PICKLE_INDEX = "pytorch_model.bin.index.json"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
_NOT_WEIGHTS = ("training_args", "optimizer", "scheduler", "rng_state", "trainer_state")
# A safetensors header larger than this is not a head checkpoint (the format caps it at 100 MB).
_MAX_HEADER_BYTES = 100 * 1024 * 1024

_FORMAT_FIX = "set `draft.format` to one of eagle, modelopt, speculators (or auto)"
_PICKLE_FIX = "pass --allow-pickle to load it with torch.load(weights_only=True), or convert it to safetensors"


@dataclass
class HeadCheckpoint:
    """A head as found on disk: raw config, raw tensor names, no renaming."""

    path: Path
    layout: str  # "eagle" | "modelopt" | "speculators"
    config: dict
    tensors: dict[str, "torch.Tensor"]
    weight_files: list[Path]
    notes: list[str] = field(default_factory=list)


def read_head(path: Path | str, format: str = "auto", allow_pickle: bool = False) -> HeadCheckpoint:
    """Read a head folder: ``config.json`` plus safetensors (single or sharded) or, if allowed, a pickle.

    Raises :class:`InputError` (one line, cause and fix) on anything unreadable.
    """
    if format not in FORMATS:
        raise InputError(f"unknown head format '{format}'", fix=_FORMAT_FIX)
    path = Path(path)
    if not path.exists():
        raise InputError(f"head folder {path} does not exist", fix="set `draft.model` to an existing folder")
    if not path.is_dir():
        raise InputError(
            f"head path {path} is a file, not a folder",
            fix="point `draft.model` at the folder holding config.json and the weights",
        )
    config = _read_config(path / "config.json")
    files, kind = _find_weight_files(path)
    notes: list[str] = []
    if kind == "pickle":
        if not allow_pickle:
            names = ", ".join(f.name for f in files)
            raise InputError(f"head {path} has only pickle weights ({names}); pickles are refused by default",
                             fix=_PICKLE_FIX)
        tensors = _load_pickles(files)
        notes.append(f"weights loaded from pickle ({', '.join(f.name for f in files)}) with weights_only=True")
    else:
        tensors = _load_safetensors(files)
    _check_finite(path, tensors)
    layout = _detect_layout(path, config, tensors, format)
    return HeadCheckpoint(path=path, layout=layout, config=config, tensors=tensors, weight_files=files, notes=notes)


# ---------------------------------------------------------------- files


def _read_config(cfg_path: Path) -> dict:
    if not cfg_path.is_file():
        raise InputError(f"{cfg_path} is missing", fix="the head folder needs the config.json it was saved with")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InputError(f"{cfg_path} is not valid JSON ({exc})", fix="restore config.json from the head's source") from exc
    if not isinstance(config, dict):
        raise InputError(f"{cfg_path} does not hold a JSON object", fix="restore config.json from the head's source")
    return config


def _find_weight_files(path: Path) -> tuple[list[Path], str]:
    """(files, "safetensors" | "pickle"). Sharded checkpoints are read through their index."""
    index = path / _SAFETENSORS_INDEX
    if index.is_file():
        return _shards_from_index(index), "safetensors"
    single = sorted(p for p in path.glob("*.safetensors") if p.is_file())
    if single:
        return single, "safetensors"
    pindex = path / _PICKLE_INDEX
    if pindex.is_file():
        return _shards_from_index(pindex), "pickle"
    if (path / "pytorch_model.bin").is_file():
        return [path / "pytorch_model.bin"], "pickle"
    # trainer folders also hold pickles that are not weights (training_args.bin, optimizer.pt, rng_state.pth)
    pickles = sorted(p for p in path.iterdir()
                     if p.is_file() and p.suffix in _PICKLE_SUFFIXES and not p.name.startswith(_NOT_WEIGHTS))
    if pickles:
        return pickles, "pickle"
    raise InputError(
        f"no weight files in {path} (looked for *.safetensors, {_SAFETENSORS_INDEX}, pytorch_model.bin, *.pt)",
        fix="download the head's weights into that folder",
    )


def _shards_from_index(index: Path) -> list[Path]:
    try:
        data = json.loads(index.read_text(encoding="utf-8"))
        weight_map = data["weight_map"]
        names = sorted(set(weight_map.values()))
    except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise InputError(f"{index} is not a valid shard index ({exc})", fix="restore the index file from the head's source") from exc
    files = [index.parent / n for n in names]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise InputError(f"{index.name} lists shards that are missing: {', '.join(missing)}",
                         fix="download every shard the index names")
    return files


def check_safetensors_file(file: Path) -> dict[str, Any]:
    """Prove that ``file`` is a whole safetensors file; return its parsed header.

    safetensors itself reports a cut-off file only when a tensor is read (or, for
    some cuts, not at all), so the header length, the header JSON and the final
    data offset are checked against the file size here first.
    """
    size = file.stat().st_size
    fix = f"re-download {file.name}"
    if size < 8:
        raise InputError(f"{file} is truncated ({size} bytes, not even a header length)", fix=fix)
    with file.open("rb") as fh:
        (header_len,) = struct.unpack("<Q", fh.read(8))
        if header_len > _MAX_HEADER_BYTES or 8 + header_len > size:
            raise InputError(
                f"{file} is truncated or not safetensors (header of {header_len} bytes in a {size}-byte file)", fix=fix
            )
        raw = fh.read(header_len)
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{file} has a corrupt safetensors header ({exc.__class__.__name__})", fix=fix) from exc
    if not isinstance(header, dict):
        raise InputError(f"{file} has a corrupt safetensors header (not a JSON object)", fix=fix)
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            begin, stop = info["data_offsets"]
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{file} has a corrupt safetensors header (tensor '{name}')", fix=fix) from exc
        end = max(end, int(stop))
    expected = 8 + header_len + end
    if size < expected:
        raise InputError(f"{file} is truncated: {size} bytes, the header needs {expected}", fix=fix)
    if size > expected:
        raise InputError(f"{file} is corrupt: {size - expected} bytes after the last tensor", fix=fix)
    return header


def _load_safetensors(files: list[Path]) -> dict[str, "torch.Tensor"]:
    require("torch", "read the draft head")
    safetensors = require("safetensors", "read the draft head")
    from safetensors import safe_open

    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        check_safetensors_file(file)
        try:
            with safe_open(str(file), framework="pt", device="cpu") as fh:
                for name in fh.keys():
                    if name in tensors:
                        raise InputError(f"tensor '{name}' appears in more than one shard ({file.name})",
                                         fix="restore the head's shards from its source")
                    tensors[name] = fh.get_tensor(name)
        except safetensors.SafetensorError as exc:
            raise InputError(f"{file} cannot be read as safetensors ({exc})", fix=f"re-download {file.name}") from exc
    return tensors


def _load_pickles(files: list[Path]) -> dict[str, "torch.Tensor"]:
    import pickle

    torch = require("torch", "read the draft head")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        try:
            state = torch.load(file, weights_only=True, map_location="cpu")
        except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, ValueError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else exc.__class__.__name__
            raise InputError(f"{file} cannot be loaded safely with torch.load(weights_only=True): {first}",
                             fix=f"re-download {file.name}, or convert it to safetensors where you trust it") from exc
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
            raise InputError(f"{file} does not hold a flat dict of tensors", fix="convert it to safetensors")
        for name, tensor in state.items():
            if name in tensors:
                raise InputError(f"tensor '{name}' appears in more than one file ({file.name})",
                                 fix="keep one copy of the head's weights in the folder")
            tensors[name] = tensor
    return tensors


def _check_finite(path: Path, tensors: dict[str, "torch.Tensor"]) -> None:
    """NaN or Inf in a head is a broken checkpoint: say so now, not later as a failed lossless check.

    (The export casts and compares with ``torch.equal``, and NaN never equals itself.)
    """
    torch = require("torch", "read the draft head")
    checked = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
    bad = sorted(name for name, t in tensors.items() if t.dtype in checked and not bool(torch.isfinite(t).all()))
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise InputError(f"head {path}: tensor '{bad[0]}'{more} holds NaN or Inf values",
                         fix="re-download the head, or retrain it; a head with NaN weights cannot draft")


# ---------------------------------------------------------------- layout


def _looks_like(layout: str, config: dict, names: set[str]) -> bool:
    if layout == "speculators":
        return "speculators_model_type" in config
    if layout == "eagle":
        return any(n.startswith("midlayer.") for n in names)
    # modelopt: numbered decoder layers, and no speculators config
    return any(n.startswith("layers.") for n in names) and "speculators_model_type" not in config


def _detect_layout(path: Path, config: dict, tensors: dict, format: str) -> str:
    names = set(tensors)
    spec_type = config.get("speculators_model_type")
    if spec_type is not None and spec_type != "eagle3":
        raise InputError(f"head {path} is a speculators '{spec_type}' model, not EAGLE-3",
                         fix="use an EAGLE-3 head (speculators_model_type: eagle3)")
    if "fc.weight" not in names:
        raise InputError(f"head {path} has no fc.weight, so it is not an EAGLE-3 head (tensors: {_sample(names)})",
                         fix="point `draft.model` at an EAGLE-3 head")
    if format != "auto":
        if not _looks_like(format, config, names):
            raise InputError(f"head {path} does not match draft.format '{format}' (tensors: {_sample(names)})",
                             fix=f"{_FORMAT_FIX}; auto detects it")
        return format
    for layout in ("speculators", "eagle", "modelopt"):
        if _looks_like(layout, config, names):
            return layout
    raise InputError(f"cannot tell the layout of head {path} (tensors: {_sample(names)})", fix=_FORMAT_FIX)


def _sample(names: set[str], limit: int = 12) -> str:
    ordered = sorted(names)
    text = ", ".join(ordered[:limit])
    return text + (f", … ({len(ordered) - limit} more)" if len(ordered) > limit else "")
