"""Workdir paths JSON escapes (non-ASCII, quotes, backslashes, newlines) survive the stage swap
(issue 11, item 3): the manifest must point at the final folder, never at the staging one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specconvert.manifest import read_manifest, rewrite_paths, stage_dir

HOSTILE = [
    pytest.param("ünïcødé-модель", id="non-ascii"),
    pytest.param('quote"and\\backslash', id="quote-backslash"),
    pytest.param("new\nline", id="newline"),
    pytest.param("plain", id="plain"),
]


@pytest.mark.parametrize("name", HOSTILE)
def test_stage_manifest_paths_point_at_the_final_folder(tmp_path, name):
    final = tmp_path / name / "convert"
    with stage_dir(final, "convert", {}) as run:
        (run.path / "draft").mkdir()
        run.finish(artifacts={"draft_dir": str(run.path / "draft"), "nested": [{"p": str(run.path)}]},
                   note=f"wrote {run.path / 'draft'} today")
    manifest = read_manifest(final)
    assert manifest["artifacts"]["draft_dir"] == str(final / "draft")
    assert Path(manifest["artifacts"]["draft_dir"]).is_dir()
    assert manifest["artifacts"]["nested"] == [{"p": str(final)}]
    assert manifest["note"] == f"wrote {final / 'draft'} today"
    assert ".staging-" not in json.dumps(manifest, ensure_ascii=False)


def test_rewrite_paths_is_structural_and_leaves_other_values():
    old, new = Path('/w/"é"/.convert.staging-x'), Path('/w/"é"/convert')
    data = {"a": f"{old}/t", "b": [1, None, True, f"{old}"], "c": {"d": "unrelated"}, str(old): 2.5}
    assert rewrite_paths(data, old, new) == {"a": f"{new}/t", "b": [1, None, True, str(new)], "c": {"d": "unrelated"},
                                             str(new): 2.5}


@pytest.fixture(scope="module")
def tiny_target(tmp_path_factory) -> Path:
    from tests.tiny_models import write_tiny_target

    return write_tiny_target(tmp_path_factory.mktemp("tiny") / "target")


@pytest.mark.parametrize("name", [HOSTILE[0], HOSTILE[1]])
def test_convert_then_build_in_a_hostile_workdir(tmp_path, cli, tiny_target, name):
    workdir = tmp_path / name
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "tiny", "workdir": str(workdir),
                                      "target": {"model": str(tiny_target), "dtype": "float32"},
                                      "draft": {"init": "random"}, "runtime": {"backend": "reference"}},
                                     allow_unicode=True), encoding="utf-8")
    converted = cli("convert", recipe, "--json")
    assert converted.code == 0, converted.stderr
    artifacts = converted.json()["manifest"]["artifacts"]
    assert artifacts == {"target_dir": str(workdir / "convert" / "target"), "draft_dir": str(workdir / "convert" / "draft")}
    assert all(Path(p).is_dir() for p in artifacts.values())
    built = cli("build", recipe, "--no-load", "--json")
    assert built.code == 0, built.stderr
    settings = json.loads((workdir / "engine" / "reference" / "settings.json").read_text(encoding="utf-8"))
    assert settings["draft_dir"] == artifacts["draft_dir"]
    assert sorted(p.name for p in workdir.iterdir()) == ["convert", "engine"]
    again = cli("convert", recipe)  # the stage is recognised as complete and reused
    assert again.code == 0 and "inputs unchanged" in again.stderr
