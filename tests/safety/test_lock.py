"""One run at a time per workdir (issue 11, item 9): a second run waits, then gives up with exit 4."""

from __future__ import annotations

import pytest

from specconvert.errors import ExternalFailure
from specconvert.workdir import LOCK_NAME, workdir_lock
from tests.safety.conftest import child_pids, run_cli, start_cli

HOLDER = """
import sys
from specconvert.workdir import workdir_lock
with workdir_lock(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.readline()
"""


def test_second_run_waits_then_times_out_with_exit_4(project):
    import subprocess
    import sys

    from tests.safety.conftest import _env

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(project.workdir)], env=_env(None),
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    patient = None
    try:
        assert holder.stdout.readline().strip() == "locked"
        impatient = run_cli("build", project.recipe_path, "--no-load", env={"SPECCONVERT_LOCK_TIMEOUT": "0.5"})
        assert impatient.returncode == 4, impatient.stderr
        assert f"is in use by process {holder.pid}" in impatient.stderr and "waiting up to 0.5 s" in impatient.stderr
        last = impatient.stderr.strip().splitlines()[-1]
        assert last.startswith("error: ") and "still in use" in last and "SPECCONVERT_LOCK_TIMEOUT" in last
        assert not project.engine.exists()

        patient = start_cli("build", project.recipe_path, "--no-load", env={"SPECCONVERT_LOCK_TIMEOUT": "120"})
        assert "waiting up to 120 s" in patient.stderr.readline()  # it waits while the holder runs
        assert patient.poll() is None and not project.engine.exists()
    finally:
        holder.communicate("go\n", timeout=30)
    out, err = patient.communicate(timeout=120)
    assert patient.returncode == 0, err
    assert (project.engine / "manifest.json").is_file()
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


@pytest.mark.parametrize("workdir", [
    pytest.param("afile", id="workdir-is-a-file"),
    pytest.param("afile/work", id="workdir-below-a-file"),
])
def test_unusable_workdir_is_bad_input(tmp_path, workdir):
    from specconvert.errors import InputError

    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match="is a file"):
        with workdir_lock(tmp_path / workdir):
            pass
    assert (tmp_path / "afile").read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]


class _Stop(Exception):
    pass


@pytest.mark.parametrize("stage, out_elsewhere", [("bench", False), ("bench", True), ("serve-test", False)],
                         ids=["bench", "bench-out-elsewhere", "serve-test"])
def test_bench_and_serve_test_lock_the_workdir_before_reading_the_engine(tmp_path, monkeypatch, stage, out_elsewhere):
    """Issue 20, item 12: the first read of engine/ happens with the workdir lock held, wherever --out points."""
    import yaml

    from specconvert.recipe import load_recipe
    from specconvert.stages import bench as bench_stage, serve_test

    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "workdir": "work", "target": {"model": "m"},
                                    "draft": {"init": "random"}}))
    recipe = load_recipe(path)
    held = []

    def first_read(workdir, verify=False):
        held.append((workdir / LOCK_NAME).exists())
        raise _Stop

    module = bench_stage if stage == "bench" else serve_test
    monkeypatch.setattr(module, "require_current_engine", first_read)
    with pytest.raises(_Stop):
        if stage == "bench":
            out = tmp_path / "elsewhere" / "bench" if out_elsewhere else recipe.workdir_path / "bench"
            bench_stage.run(recipe.bench, out, tmp_path, recipe=recipe, recipe_path=path)
        else:
            serve_test.run(recipe, path)
    assert held == [True]
    assert not (recipe.workdir_path / LOCK_NAME).exists()  # and let go afterwards


def test_bench_of_a_url_leaves_the_workdir_alone(tmp_path, monkeypatch):
    """--url reads nothing of the bundle, so a read-only or absent workdir is no reason to fail."""
    import yaml

    from specconvert.recipe import load_recipe
    from specconvert.stages import bench as bench_stage

    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "workdir": "work", "target": {"model": "m"},
                                    "draft": {"init": "random"}}))
    recipe = load_recipe(path)

    def measured(*args, **kwargs):
        assert not recipe.workdir_path.exists()
        raise _Stop

    monkeypatch.setattr(bench_stage, "stage_dir", measured)
    with pytest.raises(_Stop):
        bench_stage.run(recipe.bench.model_copy(update={"prompts": "synthetic"}), tmp_path / "out" / "bench", tmp_path,
                        recipe=recipe, recipe_path=path, url="http://127.0.0.1:9")
