"""Checks on what the user hands a stage, run before any heavy work.

Owns the workdir (a folder we can write, not a file, not inside a source checkpoint)
and the target folder as files (``config.json`` readable as a JSON object, sizes that
make sense, every safetensors shard whole). Each failure is an :class:`InputError`
naming the path and the fix, so nothing is loaded and nothing is written first.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..errors import InputError

_SAFETENSORS_INDEX = "model.safetensors.index.json"
# Sizes a causal LM cannot do without; 0 or a negative number is as bad as a missing key.
_REQUIRED_SIZES = ("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads")


def check_workdir(workdir: Path, sources: list[tuple[str, Path]]) -> None:
    """``workdir`` must be (or become) a writable folder outside every source folder.

    A workdir inside the target folder would make the tool's outputs part of the target's
    fingerprint: the stage would never be reused and would nest one level deeper per run.
    """
    workdir = Path(workdir)
    fix_elsewhere = "set workdir (recipe key `workdir`) to a folder outside the checkpoint folders"
    real = workdir.resolve()
    for key, source in sources:
        src = Path(source).resolve()
        if real == src or real.is_relative_to(src):
            raise InputError(
                f"workdir {workdir} is inside the {key} folder {src}; its outputs would become inputs",
                fix=fix_elsewhere,
            )
    existing = workdir
    while not existing.exists() and not existing.is_symlink():
        if existing.parent == existing:
            break
        existing = existing.parent
    # A workdir that is a file (or below one) is refused earlier, by workdir.workdir_lock.
    if existing.exists() and not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"workdir {workdir} cannot be written ({existing} is read-only for this user)",
                         fix="set workdir to a writable folder (recipe key `workdir`, or --set workdir=DIR)")


def read_target_config(folder: Path, key: str = "target.model") -> dict[str, Any]:
    """The target's ``config.json`` as a dict, or an :class:`InputError` saying what is wrong with it."""
    path = Path(folder) / "config.json"
    fix = "restore config.json from the checkpoint's source (it must be the JSON object transformers saves)"
    try:
        data = json.loads(path.read_bytes().decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{key}: {path} is not UTF-8 text", fix=fix) from None
    except json.JSONDecodeError as exc:
        raise InputError(f"{key}: {path} is not valid JSON (line {exc.lineno}: {exc.msg})", fix=fix) from None
    if not isinstance(data, dict):
        raise InputError(f"{key}: {path} holds a JSON {type(data).__name__}, not an object", fix=fix)
    text = data["text_config"] if isinstance(data.get("text_config"), dict) and "hidden_size" not in data else data
    for name in _REQUIRED_SIZES:
        value = text.get(name)
        if value is None:
            continue  # TargetInfo names every missing key at once
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputError(f"{key}: {path} has {name} = {json.dumps(value)}; a causal LM needs a positive integer",
                             fix=f"restore {name} in config.json from the checkpoint's source")
    return data


def check_target_weights(folder: Path, key: str = "target.model") -> list[Path]:
    """Prove every safetensors shard of the target whole (header and size), before it is loaded.

    Uses the head reader's check (:func:`specconvert.heads.reading.check_safetensors_file`):
    a truncated download otherwise passes convert and fails much later, or not at all.
    """
    from ..heads.reading import check_safetensors_file

    folder = Path(folder)
    index = folder / _SAFETENSORS_INDEX
    if index.is_file():
        try:
            weight_map = json.loads(index.read_bytes().decode("utf-8"))["weight_map"]
            listed = sorted(set(weight_map.values()))
        except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError):
            raise InputError(f"{key}: {index} is not a valid shard index",
                             fix="restore the index file from the checkpoint's source") from None
        missing = [name for name in listed if not (folder / name).is_file()]
        if missing:
            raise InputError(f"{key}: {index.name} lists shards missing from {folder}: {', '.join(missing)}",
                             fix="download every shard the index names")
    files = sorted(p for p in folder.glob("*.safetensors") if p.is_file())
    for file in files:
        check_safetensors_file(file)
    return files
