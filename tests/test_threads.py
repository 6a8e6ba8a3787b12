"""`specconvert.threads`: runtime.threads auto = affinity capped by the cgroup CPU quota (fake cgroup files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specconvert import threads


@pytest.fixture
def two_cpu_host(monkeypatch):
    """A host of 2 CPUs, no cgroup quota and no OMP_NUM_THREADS; torch's thread count is restored after."""
    import torch

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(threads, "cgroup_cpu_quota", lambda *a, **k: None)
    monkeypatch.setattr(threads, "affinity_cpus", lambda: 2)
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _tree(root: Path, files: dict[str, str], membership: str) -> tuple[Path, Path]:
    cg = root / "cgroup"
    for rel, text in files.items():
        path = cg / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    proc = root / "proc-self-cgroup"
    proc.write_text(membership)
    return cg, proc


QUOTA_CASES = [
    # id, cgroup files, /proc/self/cgroup, expected quota in CPUs
    ("v2-unlimited", {"cpu.max": "max 100000\n"}, "0::/\n", None),
    ("v2-container-root", {"cpu.max": "200000 100000\n"}, "0::/\n", 2.0),
    ("v2-fractional", {"cpu.max": "150000 100000\n"}, "0::/\n", 1.5),
    ("v2-own-cgroup", {"cpu.max": "max 100000", "user.slice/job/cpu.max": "100000 100000"}, "0::/user.slice/job\n", 1.0),
    ("v2-parent-is-tighter", {"a/cpu.max": "50000 100000", "a/b/cpu.max": "400000 100000"}, "0::/a/b\n", 0.5),
    ("v2-no-file", {}, "0::/x\n", None),
    ("v2-garbage", {"cpu.max": "lots\n"}, "0::/\n", None),
    ("v2-zero-period", {"cpu.max": "100000 0\n"}, "0::/\n", None),
    ("v1-cpu-cpuacct", {"cpu,cpuacct/docker/id/cpu.cfs_quota_us": "300000", "cpu,cpuacct/docker/id/cpu.cfs_period_us": "100000"},
     "12:memory:/docker/id\n3:cpu,cpuacct:/docker/id\n", 3.0),
    ("v1-unlimited", {"cpu/cpu.cfs_quota_us": "-1", "cpu/cpu.cfs_period_us": "100000"}, "1:cpu:/\n", None),
    ("v1-namespaced-root", {"cpu/cpu.cfs_quota_us": "100000", "cpu/cpu.cfs_period_us": "100000"}, "1:cpu:/\n", 1.0),
    ("hybrid-v1-wins-when-v2-unlimited", {"cpu.max": "max 100000", "cpu/cpu.cfs_quota_us": "200000",
                                          "cpu/cpu.cfs_period_us": "100000"}, "1:cpu:/\n0::/\n", 2.0),
    ("no-proc-file", {}, "", None),
]


@pytest.mark.parametrize("files,membership,expected", [c[1:] for c in QUOTA_CASES], ids=[c[0] for c in QUOTA_CASES])
def test_cgroup_quota(tmp_path, files, membership, expected):
    cg, proc = _tree(tmp_path, files, membership)
    assert threads.cgroup_cpu_quota(cg, proc) == expected


@pytest.mark.parametrize("affinity,quota,expected", [
    (16, None, 16), (16, 2.0, 2), (16, 1.5, 1), (16, 0.5, 1), (2, 8.0, 2), (1, None, 1), (4, 3 - 1e-12, 3),
], ids=["no-quota", "quota-2", "fraction-rounds-down", "under-one-cpu", "affinity-tighter", "single", "float-noise"])
def test_available_cpus(affinity, quota, expected):
    assert threads.available_cpus(affinity, quota) == expected


@pytest.mark.parametrize("setting,env,expected", [
    ("auto", {}, 3), (None, {}, 3), (2, {}, 2), (7, {"OMP_NUM_THREADS": "1"}, 7),
    ("auto", {"OMP_NUM_THREADS": "1"}, 1), ("auto", {"OMP_NUM_THREADS": "x"}, 3), ("auto", {"OMP_NUM_THREADS": "0"}, 3),
], ids=["auto", "unset", "int", "int-beats-env", "env-beats-auto", "bad-env-ignored", "zero-env-ignored"])
def test_resolve(setting, env, expected):
    assert threads.resolve(setting, affinity=8, quota=3.0, env=env, load=(None, None)) == expected


@pytest.mark.parametrize("cpus,load,host,expected", [
    (2, 0.1, 2, 2), (2, 0.6, 2, 1), (2, 6.0, 2, 1), (2, 9.6, 2, 1), (8, 2.0, 8, 6), (2, 30.0, 64, 1),
    (2, 8.0, 64, 2), (4, None, None, 4), (4, 0.0, 0, 4),
], ids=["idle-2", "half-a-core-busy", "loaded-2-core (measured)", "overloaded", "quarter-busy-8", "busy-host-container",
        "quiet-host-container", "no-loadavg", "no-host-count"])
def test_unloaded_cpus(cpus, load, host, expected):
    assert threads.unloaded_cpus(cpus, load, host) == expected


def test_auto_counts_the_load():
    assert threads.resolve("auto", affinity=2, quota=None, detect_quota=False, env={}, load=(6.0, 2)) == 1
    assert threads.resolve("auto", affinity=2, quota=None, detect_quota=False, env={}, load=(0.1, 2)) == 2
    assert threads.resolve(2, affinity=2, quota=None, detect_quota=False, env={}, load=(6.0, 2)) == 2


@pytest.mark.parametrize("bad", [0, -1, "two", True, 1.5])
def test_resolve_refuses(bad):
    with pytest.raises(ValueError, match="auto"):
        threads.resolve(bad, affinity=2, quota=None, detect_quota=False, env={}, load=(None, None))


@pytest.mark.parametrize("text,expected", [(None, None), ("auto", "auto"), (" AUTO ", "auto"), ("1", 1), ("12", 12)])
def test_parse_option(text, expected):
    assert threads.parse_option(text) == expected


@pytest.mark.parametrize("text", ["0", "-2", "two", "1.5", ""])
def test_parse_option_refuses(text):
    with pytest.raises(ValueError, match="use auto or an integer >= 1"):
        threads.parse_option(text)


def test_this_machine_auto_is_within_affinity():
    n = threads.resolve("auto", env={})
    assert 1 <= n <= threads.affinity_cpus()


def test_recipe_threads_field():
    from specconvert.recipe import RuntimeSpec

    assert RuntimeSpec().threads == "auto" and RuntimeSpec(threads=2).threads == 2
    for bad in (0, True, "two", 1.5):
        with pytest.raises(Exception):
            RuntimeSpec(threads=bad)


@pytest.mark.parametrize("before, after, expected", [
    pytest.param("cpu  100 0 100 800 0 0 0 0 0 0", "cpu  200 0 100 900 0 0 0 0 0 0", 0.5, id="half-busy"),
    pytest.param("cpu  100 0 100 800 0", "cpu  100 0 100 1000 0", 0.0, id="idle"),
    pytest.param("cpu  100 0 100 800 50", "cpu  100 0 100 800 250", 0.0, id="iowait-is-idle"),
    pytest.param("cpu  1 2 3", "cpu  1 2 3", None, id="too-short"),
    pytest.param("cpu  100 0 100 800", "cpu  100 0 100 800", None, id="no-time-passed"),
])
def test_busy_share_from_proc_stat(before, after, expected):
    from specconvert.threads import busy_cpus_from_stat

    assert busy_cpus_from_stat(before, after) == expected


def test_host_load_reads_proc_stat_not_the_load_average(tmp_path, monkeypatch):
    from specconvert import threads

    stat = tmp_path / "stat"
    readings = iter(["cpu  0 0 0 100 0\n", "cpu  100 0 0 100 0\n"])  # fully busy in the window
    monkeypatch.setattr(threads.Path, "read_text", lambda self: next(readings))
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.0, 0.0, 0.0))  # an average that says idle
    monkeypatch.setattr(threads.os, "cpu_count", lambda: 2)
    assert threads.host_load(window_s=0, stat=stat) == (2.0, 2)


def test_auto_decides_again_at_each_phase(monkeypatch, two_cpu_host):
    """Issue 20: a burst of load when the command started must not pin the later phases to one thread."""
    import torch

    loads = [(2.0, 2)]  # a pip install at the start, then an idle machine
    monkeypatch.setattr(threads, "host_load", lambda *a, **k: loads.pop() if loads else (0.0, 2))
    assert threads.apply("auto")["intra_op"] == 1
    chosen = threads.apply_for_phase("auto", "training")
    assert chosen["intra_op"] == 2 and chosen["phase"] == "training" and torch.get_num_threads() == 2
    assert threads.apply_for_phase(1, "evaluation")["intra_op"] == 1  # an integer stays what it says


def test_convert_decides_threads_for_synthesis_training_and_evaluation(monkeypatch, tmp_path):
    """The phases of a training convert each call threads.apply_for_phase (none did on 55e493a)."""
    from specconvert import threads
    from tests.training.test_convert_train import recipe
    from tests.tiny_models import write_tiny_target
    from tests.serving.conftest import _cli

    phases = []
    real = threads.apply_for_phase
    monkeypatch.setattr(threads, "apply_for_phase", lambda setting, phase: phases.append(phase) or real(1, phase))
    target = write_tiny_target(tmp_path / "target", logit_scale=30.0, eos_token_id=255)
    path = recipe(tmp_path, target, steps=2, eval_samples=1)
    assert _cli("convert", path) == 0
    assert phases == ["synthesis", "training", "evaluation"]


def test_training_takes_every_cpu_whatever_the_load_and_the_other_phases_follow_it(monkeypatch, two_cpu_host):
    """The head's bits depend on the thread count: a busy core must slow training, not change the head."""
    import torch

    monkeypatch.setattr(threads, "host_load", lambda *a, **k: (1.0, 2))  # one of two cores kept busy
    trained = threads.apply_for_phase("auto", "training")
    assert trained["intra_op"] == 2 and trained["follows_load"] is False and torch.get_num_threads() == 2
    for phase in ("synthesis", "evaluation"):
        assert threads.apply_for_phase("auto", phase)["intra_op"] == 1, phase
    assert threads.apply_for_phase(1, "training")["intra_op"] == 1  # an integer stays what it says
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # and so does the operator's environment
    assert threads.apply_for_phase("auto", "training")["intra_op"] == 1


def test_the_same_seed_trains_the_same_head_on_an_idle_and_a_busy_machine(monkeypatch, tmp_path, two_cpu_host):
    """`auto` trained at 2 threads when idle and at 1 with one of two cores busy: two heads of other bytes (d56ea2c)."""
    import json

    from tests.serving.conftest import _cli
    from tests.tiny_models import write_tiny_target
    from tests.training.test_convert_train import recipe

    target = write_tiny_target(tmp_path / "target", logit_scale=30.0, eos_token_id=255)
    heads, manifests = {}, {}
    for name, busy in (("idle", 0.0), ("busy", 1.0)):
        monkeypatch.setattr(threads, "host_load", lambda *a, busy=busy, **k: (busy, 2))
        path = recipe(tmp_path / name, target, steps=8, eval_samples=1)
        assert _cli("convert", path) == 0
        [manifest] = (tmp_path / name).rglob("convert/manifest.json")
        manifests[name] = json.loads(manifest.read_text())
        heads[name] = (manifest.parent / "draft" / "model.safetensors").read_bytes()
    assert heads["idle"] == heads["busy"]
    assert [manifests[n]["training"]["intra_op_threads"] for n in ("idle", "busy")] == [[2], [2]]
