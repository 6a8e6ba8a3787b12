"""Issue 37, item 13: a server dies with the process that started it, and a rerun stops an orphan it finds recorded.

The server double is a sleep-forever script; no model, no port. Linux only (/proc, prctl).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG and /proc are Linux")

SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(60)"]


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def _wait_gone(pid: int, bound_s: float = 20.0) -> bool:
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_server_dies_when_its_parent_is_sigkilled(tmp_path):
    """SIGKILL cannot be caught: before PR_SET_PDEATHSIG the server double outlived convert as an orphan."""
    parent = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from specconvert.serving.process import ServerProcess
        server = ServerProcess({SLEEPER!r}, "http://127.0.0.1:9", Path({str(tmp_path / 'server.log')!r})).start()
        print(server.pid, flush=True)
        while True:
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    child = None
    try:
        child = int(proc.stdout.readline())
        assert _alive(child)
        proc.kill()
        proc.wait()
        assert _wait_gone(child), f"server {child} outlived its SIGKILLed parent"
    finally:
        proc.kill()
        if child is not None and _alive(child):
            os.killpg(child, signal.SIGKILL)


def _orphan(tmp_path: Path) -> int:
    """A sleeper in its own session whose parent has exited (what a SIGKILLed convert leaves)."""
    starter = (f"import subprocess; p = subprocess.Popen({SLEEPER!r}, start_new_session=True, "
               "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(p.pid)")
    out = subprocess.run([sys.executable, "-c", starter], capture_output=True, text=True, check=True)
    pid = int(out.stdout.strip())
    assert _alive(pid)
    return pid


def test_a_rerun_stops_the_orphan_its_record_names(tmp_path):
    from specconvert.serving.process import record_path, write_record, stop_orphan

    pid = _orphan(tmp_path)
    log = tmp_path / "server.log"
    try:
        write_record(record_path(log), pid, ["sleeper"])
        assert stop_orphan(record_path(log)) == pid
        assert _wait_gone(pid)
        assert not record_path(log).exists()
    finally:
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_an_orphan_record_whose_start_time_differs_kills_nothing(tmp_path):
    """The pid was recycled: the process behind it now is not the server, so it must live."""
    from specconvert.serving.process import record_path, write_record, stop_orphan

    pid = _orphan(tmp_path)
    log = tmp_path / "server.log"
    try:
        write_record(record_path(log), pid, ["sleeper"])
        record = json.loads(record_path(log).read_text())
        record["start_time"] += 1
        record_path(log).write_text(json.dumps(record))
        assert stop_orphan(record_path(log)) is None
        time.sleep(0.2)
        assert _alive(pid)
        assert not record_path(log).exists()  # a stale record is dropped, not kept to be tried again
    finally:
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)


def test_starting_a_server_stops_the_orphan_of_the_same_log(tmp_path):
    """The rerun's path: ServerProcess.start finds the record beside its log and stops what it names first."""
    from specconvert.serving.process import ServerProcess, record_path, write_record

    pid = _orphan(tmp_path)
    log = tmp_path / "server.log"
    write_record(record_path(log), pid, ["sleeper"])
    server = ServerProcess(SLEEPER, "http://127.0.0.1:9", log)
    try:
        server.start()
        assert _wait_gone(pid)
        assert json.loads(record_path(log).read_text())["pid"] == server.pid
    finally:
        server.stop()
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
    assert not record_path(log).exists()
