"""The tune/build modules keep the house's import order (STYLE: stages -> tuning -> backends, no circles), read
from their source: a lazy import inside a function counts as much as one at the top."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "specconvert"
OWN = ["stages/build.py", "stages/tune.py", "stages/outputs.py", "tuning/model.py", "tuning/measure.py",
       "tuning/forms.py", "tuning/trtllm.py", "draft_schedule.py", "backends/trtllm/schedule.py", "backends/vllm/schedule.py",
       "backends/sglang/schedule.py"]


def imports(relative: str) -> list[tuple[str, list[str]]]:
    """(absolute module, names) of every import in a package file, top level or inside functions."""
    path = PACKAGE / relative
    package = ["specconvert", *relative.split("/")[:-1]]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found.append((module, [alias.name for alias in node.names]))
        elif isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
    return found


@pytest.mark.parametrize("relative", ["backends/trtllm/schedule.py", "backends/vllm/schedule.py",
                                      "backends/sglang/schedule.py"])
def test_engine_schedules_do_not_import_upward_from_tuning(relative):
    assert not [m for m, _ in imports(relative) if m.startswith("specconvert.tuning")]


def test_build_and_tune_do_not_import_each_other():
    def stages_of(relative):
        out = set()
        for module, names in imports(relative):
            out.add(module)
            out |= {f"{module}.{n}" for n in names}
        return out

    assert not any(m.startswith("specconvert.stages.tune") for m in stages_of("stages/build.py"))
    assert not any(m.startswith("specconvert.stages.build") for m in stages_of("stages/tune.py"))


@pytest.mark.parametrize("relative", OWN)
def test_no_private_name_is_imported_from_another_module(relative):
    private = [(m, n) for m, names in imports(relative) for n in names if n.startswith("_")]
    assert not private, f"{relative} imports private names {private}"
