"""The recipes shipped inside the package: find one by name, list them, copy one into a project.

They live in ``specconvert/recipes/`` (the repository's top-level ``recipes`` is a link to it), so a
``pip install`` carries them and ``specconvert convert smollm2-135m-eagle3-cpu`` works from any directory.
A shipped recipe is read as if it sat in ``./recipes/`` of the current directory: its work directory
(``../runs/NAME``) is ``./runs/NAME`` there, never a folder inside the installed package.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from .errors import InputError

RECIPES_DIR = Path(__file__).resolve().parent / "recipes"
_NAME_LINE = re.compile(r"^name:\s*(\S+)\s*$", re.MULTILINE)
_WORKDIR_LINE = re.compile(r"^workdir:.*\n?", re.MULTILINE)


@dataclass(frozen=True)
class Shipped:
    id: str  # the path under recipes/ without .yaml, e.g. llama3.1-8b/instruct_eagle3-public_bf16_1gpu
    name: str  # the recipe's `name:` key
    path: Path
    description: str  # the header comment's first line


def shipped() -> list[Shipped]:
    """Every shipped recipe, sorted by id."""
    found = []
    for path in sorted(RECIPES_DIR.rglob("*.yaml")):
        text = path.read_text(encoding="utf-8")
        name = _NAME_LINE.search(text)
        found.append(Shipped(path.relative_to(RECIPES_DIR).with_suffix("").as_posix(),
                             name.group(1) if name else path.stem, path, _description(text)))
    return found


def _description(text: str) -> str:
    """The first comment line of the header: what the recipe is."""
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        words = line.lstrip("#").strip()
        if words:
            return words
    return ""


def lookup(argument: str) -> Shipped | None:
    """The shipped recipe an argument names: its id, its `name:`, or `recipes/<id>.yaml` as in the docs."""
    key = argument.strip().removeprefix("./").removeprefix("recipes/").removesuffix(".yaml")
    for recipe in shipped():
        if key in (recipe.id, recipe.name):
            return recipe
    return None


def find(argument: str | Path) -> Path:
    """The recipe file a command argument means: an existing path as given, else a shipped recipe it names.

    Anything else comes back unchanged, for ``load_recipe`` to report as missing.
    """
    path = Path(argument)
    if path.exists():
        return path
    recipe = lookup(str(argument))
    return path if recipe is None else recipe.path


def base_dir(path: Path) -> Path:
    """Where a recipe's relative paths start: its folder, or for a shipped one ``./recipes/<folder>``."""
    real = path.resolve()
    if real.is_relative_to(RECIPES_DIR):
        return Path.cwd() / "recipes" / real.parent.relative_to(RECIPES_DIR)
    return real.parent


def new(name: str, source: str, folder: Path) -> Path:
    """Copy a recipe to ``folder/NAME.yaml``, named NAME, its work directory ``./runs/NAME`` (of the current directory).

    The header's ``recipes/<id>.yaml`` commands are rewritten to the copy's path. Refuses to overwrite.
    """
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
        raise InputError(f"recipe name '{name}' is not a valid name", fix="use letters, digits, '.', '_' and '-', e.g. my-llama-eagle3")
    origin = lookup(source)
    source_path = Path(source) if Path(source).is_file() else (origin.path if origin else None)
    if source_path is None:
        known = ", ".join(r.id for r in shipped())
        raise InputError(f"--from {source}: no such recipe file or shipped recipe", fix=f"use one of: {known}")
    out = folder / f"{name}.yaml"
    if out.exists():
        raise InputError(f"{out} already exists", fix="choose another NAME or --dir, or delete that file first")
    if not folder.is_dir():
        raise InputError(f"--dir {folder}: no such folder", fix="create it first, or pass an existing folder")
    text = source_path.read_text(encoding="utf-8")
    # the work directory is ./runs/NAME of the folder the command runs in, wherever --dir puts the file
    workdir = f"workdir: {Path(os.path.relpath(Path.cwd() / 'runs' / name, folder.resolve())).as_posix()}"
    text = _WORKDIR_LINE.sub("", text, count=1)
    text = _NAME_LINE.sub(f"name: {name}\n{workdir}", text, count=1) if _NAME_LINE.search(text) else (
        f"name: {name}\n{workdir}\n" + text)
    shown = os.path.relpath(out) if not os.path.relpath(out).startswith("..") else str(out)
    if origin is not None:
        text = text.replace(f"recipes/{origin.id}.yaml", shown)
    text = _rebase_files(text, source_path, out.parent)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, out)
    return out


# keys whose values name a file relative to the recipe (prompt sets, texts); models and workdir are handled above
_FILE_VALUE = re.compile(r"^(?P<lead>\s*(?:-\s+|(?:prompts|texts|eval_prompts|calib_prompts|model|vllm_python):\s+))"
                         r"(?P<value>[^\s#\[\]{}'\"]+)", re.MULTILINE)


def _rebase_files(text: str, source: Path, target_dir: Path) -> str:
    """Relative file paths that exist beside the source recipe are rewritten to reach the same files from the copy."""
    inside_package = source.resolve().is_relative_to(RECIPES_DIR)
    base = source.resolve().parent if inside_package else Path(os.path.abspath(source)).parent

    def rebase(match: re.Match) -> str:
        value = match.group("value")
        if ":" in value or value.startswith(("/", "~")):
            return match.group(0)
        where = Path(os.path.normpath(base / value))
        if not where.exists():
            return match.group(0)  # a hub id, or a file made later: nothing to keep valid
        # into the installed package: absolute; between the user's folders: relative, as they wrote it
        return match.group("lead") + (str(where) if inside_package else os.path.relpath(where, target_dir.resolve()))

    return _FILE_VALUE.sub(rebase, text)
