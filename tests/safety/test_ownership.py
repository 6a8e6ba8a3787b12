"""Only folders specconvert made are ever replaced (issue 11, item 1).

Each row puts something of the user's where a stage writes its folder, runs the real
CLI, and checks the exit code, the one-line cause, and that no byte of the tree changed.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from tests.safety.conftest import tree_hash


def _user_engine_dir(project):
    (project.engine).mkdir()
    (project.engine / "NOTES.md").write_text("my notes\n")


def _user_engine_symlink(project):
    elsewhere = project.root / "bigdisk"
    elsewhere.mkdir()
    (elsewhere / "data.bin").write_bytes(b"\2" * 8)
    project.engine.symlink_to(elsewhere)


def _user_engine_file(project):
    project.engine.write_text("not a folder\n")


def _foreign_manifest(project):
    # a web-app manifest.json is not ours: it lacks our stage/fingerprint keys
    project.engine.mkdir()
    (project.engine / "manifest.json").write_text('{"name": "my app", "icons": []}')
    (project.engine / "index.html").write_text("<html></html>")


@pytest.mark.parametrize(
    "setup, cause",
    [
        pytest.param(_user_engine_dir, "exists and was not made by specconvert", id="user-folder"),
        pytest.param(_foreign_manifest, "exists and was not made by specconvert", id="foreign-manifest.json"),
        pytest.param(_user_engine_symlink, "is a symbolic link", id="symlink"),
        pytest.param(_user_engine_file, "is a file", id="file"),
    ],
)
def test_build_refuses_a_folder_it_did_not_make(project, cli, setup, cause):
    setup(project)
    before = tree_hash(project.root)
    result = cli("build", project.recipe_path, "--no-load")
    assert result.code == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: {project.engine} ") and cause in line and "Fix: " in line
    assert tree_hash(project.root) == before


def test_build_replaces_an_empty_folder_and_a_stage_from_before_markers(project, cli):
    project.engine.mkdir()
    assert cli("build", project.recipe_path, "--no-load").code == 0
    (project.engine / ".specconvert-stage").unlink()  # what an older specconvert left: manifest, no marker
    assert cli("build", project.recipe_path, "--no-load", "--force").code == 0
    assert (project.engine / "manifest.json").is_file()
    assert sorted(p.name for p in project.workdir.iterdir()) == ["convert", "engine"]


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> Path:
    from tests.tiny_models import write_tiny_target

    return write_tiny_target(tmp_path_factory.mktemp("tiny") / "target")


def test_convert_with_workdir_dot_keeps_the_users_convert_folder(tmp_path, cli, tiny_target):
    """The reported case: `workdir: .` in a project that has its own convert/ and engine/."""
    (tmp_path / "convert").mkdir()
    (tmp_path / "convert" / "convert_weights.py").write_text("print('mine')\n")
    (tmp_path / "engine").mkdir()
    (tmp_path / "engine" / "NOTES.md").write_text("notes\n")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "dot", "workdir": ".", "target": {"model": str(tiny_target), "dtype": "float32"},
                                      "draft": {"init": "random"}}))
    before = tree_hash(tmp_path)
    result = cli("convert", recipe)
    assert result.code == 2, result.stderr
    assert f"error: {tmp_path / 'convert'} exists and was not made by specconvert" in result.stderr
    assert tree_hash(tmp_path) == before
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]
