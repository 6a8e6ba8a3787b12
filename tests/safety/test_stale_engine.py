"""A bundle built from an older convert is refused by serve, serve-test and bench (issue 11, item 8)."""

from __future__ import annotations

import pytest

from specconvert.manifest import require_current_engine
from specconvert.errors import InputError

STALE = "was built from an older convert"


@pytest.mark.parametrize("command", [
    pytest.param(["serve"], id="serve"),
    pytest.param(["serve-test"], id="serve-test"),
    pytest.param(["bench"], id="bench"),
])
def test_entry_points_refuse_an_engine_older_than_convert(project, cli, command):
    assert cli("build", project.recipe_path, "--no-load").code == 0
    project.write_convert(aux_layer_ids=[0, 2, 5])  # `convert --set draft.aux_layers=[0,2,5]`, no rebuild
    result = cli(*command, project.recipe_path)
    assert result.code == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert STALE in line and "Fix: run `specconvert build RECIPE`" in line
    assert not (project.workdir / command[0]).exists()


def test_current_engine_passes_and_missing_convert_is_not_stale(project, cli):
    assert cli("build", project.recipe_path, "--no-load").code == 0
    assert require_current_engine(project.workdir)["stage"] == "build"
    (project.workdir / "convert" / "manifest.json").unlink()  # CI restored only engine/
    assert require_current_engine(project.workdir)["stage"] == "build"


def test_no_engine_says_run_build(project):
    with pytest.raises(InputError, match="holds no complete 'build' stage") as info:
        require_current_engine(project.workdir)
    assert info.value.fix == "run `specconvert build RECIPE` first"
