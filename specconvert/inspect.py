"""What a folder is (target or EAGLE-3 head) and whether a target and a head fit."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from .errors import InputError


def classify(path: Path) -> str:
    """'target' or 'head', from config.json alone."""
    if not path.is_dir():
        raise InputError(f"'{path}' is not a folder", fix="pass a checkpoint folder")
    config_path = path / "config.json"
    if not config_path.is_file():
        raise InputError(f"'{path}' has no config.json", fix="pass a Hugging Face checkpoint or EAGLE-3 head folder")
    try:
        config = json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{config_path} is not valid JSON ({exc.msg})", fix="restore the file") from None
    archs = " ".join(config.get("architectures") or [])
    if "Eagle" in archs or config.get("speculators_model_type") or "draft_vocab_size" in config:
        return "head"
    return "target"


def inspect_paths(paths: list[Path], allow_pickle: bool = False) -> dict[str, Any]:
    from . import heads as layouts

    if not 1 <= len(paths) <= 2:
        raise InputError(f"inspect takes one or two folders, got {len(paths)}", fix="specconvert inspect TARGET_DIR HEAD_DIR")
    items, kinds = [], {}
    for path in paths:
        kind = classify(path)
        if kind in kinds:
            raise InputError(f"both folders are {kind}s", fix="give one target folder and one head folder")
        kinds[kind] = path
        described = layouts.describe_head(path, allow_pickle=allow_pickle) if kind == "head" else layouts.describe_target(path)
        items.append({"kind": kind, "path": str(path), **described})
    report: dict[str, Any] = {"items": items}
    if len(kinds) == 2:
        head = layouts.to_canonical(layouts.read_head(kinds["head"], "auto", allow_pickle=allow_pickle))
        target = layouts.TargetInfo.from_config(json.loads((kinds["target"] / "config.json").read_text()))
        problems = layouts.check_against_target(head, target)
        report["fit"] = {
            "ok": not any(p.severity == "error" for p in problems),
            "problems": [asdict(p) for p in problems],
        }
    return report
