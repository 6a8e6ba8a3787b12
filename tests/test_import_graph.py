"""The package's import graph (issue 20): no circle between modules, and no arrow against the layer order
cli -> stages -> (training, serving, bench, tuning) -> (heads, backends, manifest, models) -> (reference, recipe,
prompts) -> (output, errors). Every import counts, also one inside a function (read from the AST, so a late
import of torch's users cannot hide a circle), and every package is imported once to prove the graph is real."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "specconvert"

# Higher imports lower, never the reverse. Same-layer imports are allowed between different packages as long as
# no circle forms. Modules not named here take their package's layer.
LAYERS = {
    "specconvert.__main__": 7,
    "specconvert.cli": 7,
    "specconvert.stages": 6,
    "specconvert.doctor": 6,
    "specconvert.inspect": 6,
    "specconvert.training": 5, "specconvert.serving": 5, "specconvert.bench": 5, "specconvert.tuning": 5,
    "specconvert.heads": 4, "specconvert.backends": 4, "specconvert.manifest": 4, "specconvert.models": 4,
    "specconvert.reference": 3, "specconvert.recipe": 3, "specconvert.prompts": 3, "specconvert.acceptance": 3,
    "specconvert.recipe_files": 3,
    "specconvert.workdir": 2, "specconvert.threads": 2, "specconvert.yaml_strict": 2, "specconvert._imports": 2,
    "specconvert.draft_schedule": 2,
    "specconvert.output": 1, "specconvert.errors": 1, "specconvert.line_cache": 1, "specconvert.redact": 1,
    "specconvert": 0,  # the package root: __version__ only
}


# Known and owned elsewhere in issue 20 (the tune step: a module for reading stage outputs, and the engines'
# schedules off tuning/model.py). Each must still exist, so an entry goes the day its fix lands.
PENDING_CIRCLES: list[list[str]] = []
PENDING_UPWARD: list[str] = []


def modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The specconvert modules ``name`` imports anywhere in its file (module level or inside functions)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                stem = ".".join(base + ([node.module] if node.module else []))
            else:
                stem = node.module or ""
            # `from pkg import sub` imports the submodule when there is one
            targets = [f"{stem}.{a.name}" if f"{stem}.{a.name}" in known else stem for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target.startswith("specconvert") and target != name:
                found.add(target)
    return found


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports_of(name, path, set(mods)) for name, path in mods.items()}


def layer(name: str) -> int:
    while name not in LAYERS:
        name = name.rpartition(".")[0]
    return LAYERS[name]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan), each sorted."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while True:
                w = stack.pop()
                on.discard(w)
                part.append(w)
                if w == v:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle():
    found = cycles(graph())
    assert [c for c in found if c not in PENDING_CIRCLES] == []
    assert [c for c in PENDING_CIRCLES if c not in found] == [], "fixed: remove it from PENDING_CIRCLES"


def test_no_upward_import():
    upward = sorted(f"{a} -> {b}" for a, targets in graph().items() for b in targets if layer(b) > layer(a))
    assert [u for u in upward if u not in PENDING_UPWARD] == []
    assert [u for u in PENDING_UPWARD if u not in upward] == [], "fixed: remove it from PENDING_UPWARD"


def private_imports() -> list[str]:
    """``from specconvert.x import _name`` of another module's private name, anywhere in the package."""
    mods = modules()
    out = []
    for name, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("specconvert")):
                for alias in node.names:
                    if alias.name.startswith("_") and not alias.name.startswith("__"):
                        out.append(f"{name}: from {'.' * node.level}{node.module or ''} import {alias.name}")
    return sorted(out)


def test_no_module_imports_another_modules_private_name():
    assert private_imports() == []


def test_the_checks_see_a_circle_and_an_upward_arrow():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert layer("specconvert.backends.vllm.launch") == 4 < layer("specconvert.serving.oracle") == 5


def test_the_graph_reader_sees_late_imports():
    edges = graph()
    assert "specconvert.backends.vllm.counters" in edges["specconvert.stages.bench"]  # imported inside run()
    assert "specconvert.errors" in edges["specconvert.backends.vllm.launch"]


@pytest.mark.parametrize("package", sorted(n for n, p in modules().items() if p.name == "__init__.py"))
def test_each_package_imports(package):
    importlib.import_module(package)
