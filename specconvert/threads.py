"""How many CPU threads torch may use: ``runtime.threads`` (``auto`` or an integer) → intra-op threads.

torch's default is one thread per core of the machine, blind to the process's CPU affinity and
to a container's CPU quota; on a loaded 2-core CI machine that made the speculative path ~20×
slower (92 s vs 4.6 s, issue 11 item 18). ``auto`` counts the CPUs this process may really use:
the affinity mask (``os.sched_getaffinity``, which covers cpusets and ``taskset``), capped by
the cgroup CPU quota (v2 ``cpu.max``, v1 ``cpu.cfs_quota_us / cpu.cfs_period_us``, the tightest
along the process's cgroup path). A fractional quota rounds down (1.5 CPUs → 1 thread: a
second thread would only be throttled), never below 1.

Then the load: CPUs other processes keep busy are not ours either. Measured on a 2-core
machine at load average 6-9, SmolLM2 bf16 decoded at 0.56 tok/s with 2 threads and 4.97 tok/s
with 1 (torch's intra-op threads wait for each other at every op, and one of them is always
descheduled). So ``auto`` takes the share of the host that other processes leave idle, measured over a
quarter second of /proc/stat (the load average would still count the pipeline's previous steps):
``round(cpus × (1 − min(1, busy / host_cpus)))``, at least 1. It is measured when a command starts
and again at the start of each phase of a long one (:func:`apply_for_phase`: synthesis, training,
evaluation), so a short burst of other work at the start (a ``pip install``) does not pin a
30-minute convert to one of two idle cores. The reading is the host's (not namespaced), hence compared with the host's CPU count. Inter-op threads are 1: the reference
decoder runs one graph at a time, extra pools only compete for the same cores. An explicit
``OMP_NUM_THREADS`` in the environment is the operator's choice and wins over ``auto``
(torch's default honours it too); an integer setting wins over both.

The exception is the phase whose result *is* the artifact. torch's CPU kernels split their
reductions by the intra-op thread count, so the same seed and steps train another head at another
count (measured with the demo recipe on 48 prompts: 1 and 2 threads trained heads of other
bytes; two runs at 2 threads, one of them with the other core kept busy, the same bytes). In
training (:data:`SAME_BITS_PHASES`) ``auto`` therefore takes every CPU this process may use,
whatever the load: a busy machine trains slower (measured: 60 steps in 138 s at 2 threads
against 79 s at 1, one of two cores kept busy; 43 s idle), never a different head. An integer
``runtime.threads`` or ``OMP_NUM_THREADS`` still decides, and is what makes two machines with
the same CPU kernels train the same head. Synthesis keeps following the load: its output is
token ids, which a last-bit change of a logit moves only at a near-tie (SmolLM2's 51 in-process
answers to 48 prompts were the same tokens at 1 and 2 threads), while decoding on a thread that
waits for a descheduled one is the ~10x case above.

Everything but :func:`apply` is pure (paths injectable) so it is tested with fake cgroup files.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any, Iterable

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_SELF_CGROUP = Path("/proc/self/cgroup")


def affinity_cpus() -> int:
    """CPUs in this process's affinity mask (``os.cpu_count()`` where the OS has no affinity call)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None


def _ancestors(root: Path, cgroup_path: str) -> Iterable[Path]:
    """``root/a/b``, ``root/a``, ``root``: a limit set on any ancestor applies (the tightest wins)."""
    parts = [p for p in cgroup_path.strip().split("/") if p]
    for i in range(len(parts), -1, -1):
        yield root.joinpath(*parts[:i])


def _v2_quota(text: str | None) -> float | None:
    # "max 100000" = no limit; "150000 100000" = 1.5 CPUs.
    if not text:
        return None
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(quota_text: str | None, period_text: str | None) -> float | None:
    try:
        quota, period = int(quota_text or ""), int(period_text or "")
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None  # quota -1 = no limit


def cgroup_cpu_quota(cgroup_root: Path = CGROUP_ROOT, proc_self_cgroup: Path = PROC_SELF_CGROUP) -> float | None:
    """The CPU quota (in CPUs, may be fractional) of this process's cgroup, or None when unlimited/unknown."""
    membership = _read(proc_self_cgroup) or ""
    quotas: list[float] = []
    for line in membership.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2: "0::/path"
            # Inside a container the namespaced path is often "/" with the limit on the mount's root file.
            for directory in _ancestors(cgroup_root, path):
                q = _v2_quota(_read(directory / "cpu.max"))
                if q is not None:
                    quotas.append(q)
        elif "cpu" in controllers.split(","):  # cgroup v1: "N:cpu,cpuacct:/path"
            for mount in (cgroup_root / controllers, cgroup_root / "cpu", cgroup_root / "cpu,cpuacct"):
                for directory in _ancestors(mount, path):
                    q = _v1_quota(_read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us"))
                    if q is not None:
                        quotas.append(q)
    return min(quotas) if quotas else None


def available_cpus(affinity: int | None = None, quota: float | None = None) -> int:
    """CPUs this process may use: the affinity count capped by the quota rounded down, at least 1."""
    cpus = affinity if affinity is not None else affinity_cpus()
    if quota is not None:
        cpus = min(cpus, max(1, math.floor(quota + 1e-9)))
    return max(1, cpus)


def unloaded_cpus(cpus: int, load: float | None, host_cpus: int | None) -> int:
    """Of ``cpus``, the share the host's load average leaves idle (rounded, at least 1)."""
    if load is None or not host_cpus or host_cpus < 1:
        return max(1, cpus)
    busy = min(1.0, max(0.0, load) / host_cpus)
    return max(1, min(cpus, round(cpus * (1.0 - busy))))


def busy_cpus_from_stat(before: str, after: str) -> float | None:
    """CPUs kept busy between two readings of /proc/stat's first line (``cpu  user nice system idle iowait ...``)."""
    def fields(line: str) -> list[int]:
        parts = line.split()
        return [int(x) for x in parts[1:]] if parts and parts[0] == "cpu" else []

    a, b = fields(before), fields(after)
    if len(a) < 4 or len(a) != len(b):
        return None
    total = sum(b) - sum(a)
    idle = (b[3] - a[3]) + ((b[4] - a[4]) if len(b) > 4 else 0)  # idle + iowait
    return None if total <= 0 else max(0.0, (total - idle) / total)


def host_load(window_s: float = 0.25, stat: Path = Path("/proc/stat")) -> tuple[float | None, int | None]:
    """(CPUs other processes keep busy now, host CPU count); (None, None) where it cannot be read.

    Measured over a short window from /proc/stat rather than taken from the 1-minute load
    average: that average still counts the steps a pipeline ran just before (a pip install,
    the previous stage) and would leave a now idle machine at one thread. Falls back to the
    load average where /proc/stat is missing.
    """
    import time

    cpus = os.cpu_count()
    try:
        before = stat.read_text().splitlines()[0]
        time.sleep(window_s)
        after = stat.read_text().splitlines()[0]
        share = busy_cpus_from_stat(before, after)
        if share is not None and cpus:
            return share * cpus, cpus
    except (OSError, IndexError, ValueError):
        pass
    try:
        return os.getloadavg()[0], cpus
    except (AttributeError, OSError):
        return None, None


def resolve(setting: int | str | None, affinity: int | None = None, quota: float | None = None,
            detect_quota: bool = True, env: dict[str, str] | None = None,
            load: tuple[float | None, int | None] | None = None) -> int:
    """Intra-op threads for ``runtime.threads`` / ``--threads`` (``auto``, None or an int >= 1).

    ``load`` = (CPUs other processes keep busy, host CPUs), as :func:`host_load` measures it; None measures it
    now (``(None, None)``: ignore load).
    """
    if setting is None or setting == "auto":
        omp = (os.environ if env is None else env).get("OMP_NUM_THREADS", "").strip()
        if omp.isdigit() and int(omp) >= 1:
            return int(omp)
        if quota is None and detect_quota:
            quota = cgroup_cpu_quota()
        load_avg, host_cpus = host_load() if load is None else load
        return unloaded_cpus(available_cpus(affinity, quota), load_avg, host_cpus)
    if isinstance(setting, bool) or not isinstance(setting, int) or setting < 1:
        raise ValueError(f"threads must be 'auto' or an integer >= 1, not {setting!r}")
    return setting


def parse_option(value: str | None) -> int | str | None:
    """``--threads`` text → ``auto`` or an int (None = not given); ValueError with the accepted forms."""
    if value is None:
        return None
    text = value.strip().lower()
    if text == "auto":
        return "auto"
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(f"--threads {value}: use auto or an integer >= 1")


# Phases whose output is the head's bits: ``auto`` ignores the load there (module doc).
SAME_BITS_PHASES = ("training",)


def apply(setting: int | str | None, follow_load: bool = True) -> dict[str, Any]:
    """Set torch's intra-op threads from ``setting`` and inter-op threads to 1; returns what was set.

    ``follow_load=False``: ``auto`` takes every CPU this process may use even when others keep some
    busy (the load is still measured and reported). Call before the first torch computation:
    inter-op threads can only be set once, before any parallel work starts (torch raises
    afterwards; that is recorded, not fatal).
    """
    import torch

    load_avg, host_cpus = host_load()
    threads = resolve(setting, load=(load_avg, host_cpus) if follow_load else (None, None))
    torch.set_num_threads(threads)
    interop = 1
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:  # already set, or parallel work already ran in this process
        interop = torch.get_num_interop_threads()
    return {"setting": "auto" if setting in (None, "auto") else setting, "intra_op": threads, "inter_op": interop,
            "busy_cpus_at_start": None if load_avg is None else round(load_avg, 2), "host_cpus": host_cpus,
            "follows_load": follow_load}


def apply_for_phase(setting: int | str | None, phase: str) -> dict[str, Any]:
    """:func:`apply` again as a phase of a long command starts (``synthesis``, ``training``, ``evaluation``).

    ``auto`` measures the host's load anew instead of keeping what it saw when the command started,
    except in :data:`SAME_BITS_PHASES`, where it takes every CPU this process may use so that the
    load cannot change the head (module doc). Logged."""
    from . import output

    same_bits = phase in SAME_BITS_PHASES
    chosen = apply(setting, follow_load=not same_bits)
    if chosen["setting"] == "auto":
        busy = chosen["busy_cpus_at_start"]
        seen = f"{busy:g} of {chosen['host_cpus']} host CPUs busy" if busy is not None else ""
        if same_bits:
            why = "every CPU this process may use, whatever the load: the head's bits depend on the thread count"
            slower = (f"; {seen}, so slower, the same head (an integer runtime.threads trades that for speed)"
                      if busy is not None and busy >= 0.5 else "")
            output.log(f"threads for {phase}: {chosen['intra_op']} (auto: {why}{slower})")
        else:
            output.log(f"threads for {phase}: {chosen['intra_op']} (auto" + (f"; {seen})" if seen else ")"))
    return {**chosen, "phase": phase}
