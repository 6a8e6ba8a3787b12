"""Fault injection (issue 11, item 14): a build killed or terminated at chosen moments of
its stage swap loses nothing, and the next run heals what was left behind.

Each case runs the real CLI in a child process with SPECCONVERT_FAULT=<point>:<action>
(test-only hook in specconvert/workdir.py): ``staging`` is inside the staging folder
before the body, ``swap`` between the two renames, ``cleanup`` after the swap before
the previous stage folder is removed.
"""

from __future__ import annotations

import signal

import pytest

from tests.safety.conftest import child_pids, run_cli, tree_hash


def leftovers(workdir):
    return sorted(p.name for p in workdir.iterdir() if p.name.startswith("."))


@pytest.mark.parametrize(
    "fault, code",
    [
        pytest.param("staging:term", 130, id="sigterm-while-staging"),
        pytest.param("swap:term", 130, id="sigterm-between-renames"),
    ],
)
def test_sigterm_cleans_up_like_ctrl_c(project, fault, code):
    assert run_cli("build", project.recipe_path, "--no-load").returncode == 0
    before = tree_hash(project.workdir)
    result = run_cli("build", project.recipe_path, "--no-load", "--force", env={"SPECCONVERT_FAULT": fault})
    assert result.returncode == code, result.stderr
    if code == 130:  # unwound, not killed: one line says so (issue 11 item 23)
        assert [line for line in result.stderr.splitlines() if line.startswith("interrupted")], result.stderr
    assert tree_hash(project.workdir) == before  # previous engine intact, no staging, no lock file
    assert leftovers(project.workdir) == []
    assert child_pids() == []


@pytest.mark.parametrize(
    "fault, left",
    [
        pytest.param("staging:kill", ".engine.staging-", id="sigkill-while-staging"),
        pytest.param("swap:kill", ".engine.old-", id="sigkill-between-renames"),
        pytest.param("cleanup:kill", ".engine.old-", id="sigkill-before-old-removed"),
    ],
)
def test_sigkill_leftovers_are_healed_by_the_next_run(project, fault, left):
    assert run_cli("build", project.recipe_path, "--no-load").returncode == 0
    before = tree_hash(project.engine)
    result = run_cli("build", project.recipe_path, "--no-load", "--force", env={"SPECCONVERT_FAULT": fault})
    assert result.returncode == -signal.SIGKILL
    stray = [name for name in leftovers(project.workdir) if name.startswith(left)]
    assert len(stray) == 1, leftovers(project.workdir)
    if fault == "swap:kill":
        assert not project.engine.exists()  # the crash hid engine/: only the next run can bring it back

    again = run_cli("build", project.recipe_path, "--no-load")
    assert again.returncode == 0, again.stderr
    assert "workdir: " in again.stderr  # says what it healed
    assert leftovers(project.workdir) == []
    assert "up to date" in again.stderr  # the healed stage is whole: reused, not rebuilt
    after = tree_hash(project.engine)
    if fault == "cleanup:kill":  # the new engine had already replaced the old one
        assert set(after) == set(before)
    else:
        assert after == before
    assert child_pids() == []


def test_live_staging_of_another_process_is_left_alone(project, tmp_path):
    """A staging folder whose writer is alive is not stale, even when we hold the lock."""
    import json
    import os
    import socket
    import time

    live = project.workdir / ".engine.staging-live"
    live.mkdir(parents=True)
    (live / ".specconvert-stage").write_text(json.dumps(
        {"tool": "specconvert", "stage": "build", "pid": os.getppid(), "host": socket.gethostname(),
         "started": time.time()}))
    user = project.workdir / ".engine.staging-notours"  # no marker: not provably ours
    user.mkdir()
    (user / "keep.txt").write_text("mine")
    assert run_cli("build", project.recipe_path, "--no-load").returncode == 0
    assert live.is_dir() and (user / "keep.txt").read_text() == "mine"


def test_convert_killed_between_renames_is_restored_by_the_next_run(tmp_path, cli):
    """The reported case: `.convert.old-*` left and no convert/ after a kill during the swap."""
    import yaml

    from tests.tiny_models import write_tiny_target

    target = write_tiny_target(tmp_path / "target")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "tiny", "workdir": "work", "target": {"model": str(target), "dtype": "float32"},
                                      "draft": {"init": "random"}}))
    workdir = tmp_path / "work"
    assert cli("convert", recipe).code == 0
    before = tree_hash(workdir / "convert")
    killed = run_cli("convert", recipe, "--force", env={"SPECCONVERT_FAULT": "swap:kill"}, timeout=300)
    assert killed.returncode == -signal.SIGKILL
    assert not (workdir / "convert").exists()
    assert [name.split("-")[0] for name in leftovers(workdir)] == [".convert.old", ".convert.staging", ".specconvert.lock"]

    again = cli("convert", recipe)
    assert again.code == 0, again.stderr
    assert "restored" in again.stderr and "inputs unchanged" in again.stderr
    assert tree_hash(workdir / "convert") == before
    assert leftovers(workdir) == []
    assert child_pids() == []
