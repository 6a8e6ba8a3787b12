"""Training checkpoints on disk: safetensors for every tensor, JSON for everything else.

A checkpoint lives in ``<workdir>/cache/train``, a folder CI caches restore from
elsewhere, so reading one must never run code. Pickle (``torch.load`` with
``weights_only=False``) would run whatever a planted file asks for; safetensors holds
only raw tensors, and the scalar state (step, elapsed time, history, best score,
optimizer hyper-parameters and param-group structure) is JSON in the file's own
metadata. One file, written to a temporary name and renamed, so a checkpoint is
either complete or absent.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

FORMAT = "specconvert-train-checkpoint-v2"
_HEAD, _BEST, _OPTIM = "head.", "best.", "optimizer."


class UnreadableCheckpoint(ValueError):
    """The file is not a checkpoint this version wrote (cut, foreign or tampered)."""


def save(path: Path, state: dict[str, Any], head: dict[str, Any], best: dict[str, Any] | None,
         optimizer: dict[str, Any]) -> None:
    """Write ``state`` (JSON-able), the head, the best head and the optimizer's ``state_dict()`` atomically."""
    from safetensors.torch import save_file

    tensors: dict[str, Any] = {}
    for prefix, group in ((_HEAD, head), (_BEST, best or {})):
        for name, value in group.items():
            tensors[prefix + name] = value.detach().cpu().contiguous().clone()
    optim_json = _split_optimizer(optimizer, tensors)
    meta = {"format": FORMAT, "state": json.dumps({**state, "optimizer": optim_json, "has_best": best is not None})}
    tmp = path.with_name(path.name + ".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(tmp), metadata=meta)
    os.replace(tmp, path)


def read_state(path: Path) -> dict[str, Any]:
    """The JSON state only (cheap: reads the header, not the tensors)."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
    except (SafetensorError, OSError, ValueError) as exc:
        raise UnreadableCheckpoint(f"not a safetensors file ({type(exc).__name__})") from None
    if meta.get("format") != FORMAT:
        raise UnreadableCheckpoint(f"format {meta.get('format')!r}, expected {FORMAT}")
    try:
        state = json.loads(meta["state"])
    except (KeyError, ValueError) as exc:
        raise UnreadableCheckpoint(f"state is not JSON ({type(exc).__name__})") from None
    if not isinstance(state, dict):
        raise UnreadableCheckpoint("state is not a JSON object")
    return state


def load(path: Path) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any] | None, dict[str, Any]]:
    """(state, head, best head or None, optimizer state_dict) of a checkpoint :func:`save` wrote."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    state = read_state(path)
    try:
        tensors = load_file(str(path))
    except (SafetensorError, OSError, ValueError) as exc:
        raise UnreadableCheckpoint(f"tensors unreadable ({type(exc).__name__})") from None
    head = {k[len(_HEAD):]: v for k, v in tensors.items() if k.startswith(_HEAD)}
    best = {k[len(_BEST):]: v for k, v in tensors.items() if k.startswith(_BEST)} if state.get("has_best") else None
    try:
        optimizer = _join_optimizer(state.pop("optimizer"), tensors)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise UnreadableCheckpoint(f"optimizer state malformed ({type(exc).__name__})") from None
    return state, head, best, optimizer


def _split_optimizer(sd: dict[str, Any], tensors: dict[str, Any]) -> dict[str, Any]:
    """Tensors of ``optimizer.state_dict()`` into ``tensors``; the rest as JSON-able data."""
    import torch

    per_param: dict[str, dict[str, Any]] = {}
    for index, values in sd["state"].items():
        scalars = {}
        for name, value in values.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{_OPTIM}{index}.{name}"] = value.detach().cpu().contiguous().clone()
            else:
                scalars[name] = value
        per_param[str(index)] = scalars
    groups = []
    for group in sd["param_groups"]:
        # betas is a tuple in torch's optimizers; JSON would make it a list
        tuples = sorted(k for k, v in group.items() if isinstance(v, tuple))
        groups.append({"values": {k: list(v) if isinstance(v, tuple) else v for k, v in group.items()}, "tuples": tuples})
    return {"state": per_param, "param_groups": groups}


def _join_optimizer(data: dict[str, Any], tensors: dict[str, Any]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {int(i): dict(scalars) for i, scalars in data["state"].items()}
    for key, value in tensors.items():
        if key.startswith(_OPTIM):
            index, name = key[len(_OPTIM):].split(".", 1)
            state.setdefault(int(index), {})[name] = value
    groups = []
    for group in data["param_groups"]:
        values = dict(group["values"])
        for name in group["tuples"]:
            values[name] = tuple(values[name])
        groups.append(values)
    return {"state": state, "param_groups": groups}
