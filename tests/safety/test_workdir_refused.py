"""Issue 37, item 12: a workdir that would spill stage folders, caches and a lock into the home directory,
the filesystem root or over the recipe's own repository is refused at validation (exit 2, nothing written)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml


def _repo_recipe(tmp_path: Path, workdir: str) -> Path:
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "recipes").mkdir()
    recipe = repo / "recipes" / "r.yaml"
    recipe.write_text(yaml.safe_dump({"name": "r", "workdir": workdir, "target": {"model": "m"}, "draft": {"init": "random"}}))
    return recipe


@pytest.mark.parametrize("workdir, needle", [
    pytest.param("~", "is your home directory", id="tilde"),
    pytest.param(str(Path.home()), "is your home directory", id="home-absolute"),
    pytest.param("/", "is the filesystem root", id="root"),
    pytest.param("..", "holds the recipe's repository", id="repository-root"),
    pytest.param("../..", "holds the recipe's repository", id="parent-of-repository"),
])
def test_a_workdir_over_home_root_or_the_repository_is_refused(tmp_path, cli, workdir, needle):
    recipe = _repo_recipe(tmp_path, workdir)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    result = cli("recipe", "validate", recipe)
    assert result.code == 2, (result.stdout, result.stderr)
    assert "workdir:" in result.stderr and needle in result.stderr, result.stderr
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize("workdir", ["../runs/r", "work", "/tmp/elsewhere-not-created"])
def test_a_workdir_inside_the_repository_or_elsewhere_validates(tmp_path, cli, workdir):
    result = cli("recipe", "validate", _repo_recipe(tmp_path, workdir))
    assert result.code == 0, result.stderr
