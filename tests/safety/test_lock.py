"""One run at a time per workdir (issue 11, item 9): a second run waits, then gives up with exit 4."""

from __future__ import annotations

import time

import pytest

from specconvert.errors import ExternalFailure
from specconvert.workdir import LOCK_NAME, workdir_lock
from tests.safety.conftest import child_pids, run_cli, start_cli


def _wait_for(path, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def test_second_run_waits_then_times_out_with_exit_4(project):
    holder = start_cli("build", project.recipe_path, "--no-load", env={"SPECCONVERT_FAULT": "staging:sleep4"})
    try:
        _wait_for(project.workdir / LOCK_NAME)
        impatient = run_cli("build", project.recipe_path, "--no-load", "--force",
                            env={"SPECCONVERT_LOCK_TIMEOUT": "0.5"})
        assert impatient.returncode == 4, impatient.stderr
        assert "is in use by process" in impatient.stderr and "waiting up to 0.5 s" in impatient.stderr
        last = impatient.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and "still in use" in last and "SPECCONVERT_LOCK_TIMEOUT" in last

        patient = run_cli("build", project.recipe_path, "--no-load", "--force", env={"SPECCONVERT_LOCK_TIMEOUT": "60"})
        assert patient.returncode == 0, patient.stderr
        assert "waiting up to 60 s" in patient.stderr
    finally:
        out, err = holder.communicate(timeout=60)
    assert holder.returncode == 0, err
    assert not (project.workdir / LOCK_NAME).exists()
    assert not [p for p in project.workdir.iterdir() if p.name.startswith(".")]
    assert child_pids() == []


def test_lock_is_reentrant_in_process_and_leaves_no_file(tmp_path):
    work = tmp_path / "new" / "work"
    with workdir_lock(work):
        with workdir_lock(work):  # convert holds it around training, stage_dir takes it again
            assert (work / LOCK_NAME).exists()
        assert (work / LOCK_NAME).exists()
    # nothing was written: the folders made for the lock go again
    assert not (tmp_path / "new").exists()


def test_bad_timeout_value_is_refused(tmp_path, monkeypatch):
    import specconvert.workdir as wd

    monkeypatch.setenv("SPECCONVERT_LOCK_TIMEOUT", "soon")
    monkeypatch.setattr(wd, "_try_lock", lambda path: None)
    with pytest.raises(Exception) as info:
        with workdir_lock(tmp_path):
            pass
    assert "SPECCONVERT_LOCK_TIMEOUT='soon'" in str(info.value)
    monkeypatch.setenv("SPECCONVERT_LOCK_TIMEOUT", "0")
    with pytest.raises(ExternalFailure):
        with workdir_lock(tmp_path):
            pass
