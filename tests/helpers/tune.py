"""A tiny target, a Model Optimizer head and three chat prompts: what tune's stage tests convert and measure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml


def write_tiny_tune_recipe(root: Path, name: str, runtime: dict[str, Any], bench: dict[str, Any],
                           **sections: Any) -> tuple[Path, Path]:
    """Write the target, head, prompts and recipe under ``root``; returns (recipe path, prompts path)."""
    from tests.helpers.heads import write_head
    from tests.tiny_models import write_tiny_target

    write_tiny_target(root / "target")
    write_head(root / "head", "modelopt")
    prompts = root / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": t}]})
                                 for t in ("Name three colours.", "Hi!", "Count to five.")) + "\n")
    recipe = {"schema_version": 1, "name": name, "workdir": "work",
              "target": {"model": str(root / "target"), "dtype": "float32"}, "draft": {"model": str(root / "head")},
              "build": {"max_draft_len": 2, "max_batch_size": 16}, "runtime": runtime, "bench": bench,
              "tune": {"prompts": str(prompts), "num_prompts": 3, "max_tokens": 12, "plots": False}}
    recipe.update({key: (value(prompts) if callable(value) else value) for key, value in sections.items()})
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path, prompts
