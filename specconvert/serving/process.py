"""A server as a child process: own process group, health wait with a deadline, reaping.

``ServerProcess`` starts a command in a new session (so its whole process tree is
one group that a terminal's Ctrl-C does not reach), logs its output to a file,
waits for ``GET /health`` while watching that the process is still alive, and on
exit — normal, exception, timeout or KeyboardInterrupt — sends SIGTERM to the group,
then SIGKILL after a grace period, until no process of the group is left.

Two guards cover what a ``finally`` cannot, a SIGKILLed parent (issue 37, item 13):

- **The server dies with its parent.** On Linux the child asks the kernel, between fork and
  exec, for SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``). Caveat: the kernel's
  "parent" is the *thread* that forked, so a server started from a worker thread would be
  stopped when that thread ends; only servers started from the main thread (all of ours) get
  the signal, the others rely on the record below. SIGTERM, not SIGKILL, so the server stops
  its own children (vLLM's engine processes) on the way out.
- **A rerun stops an orphan.** Each running server is recorded beside its log
  (``<log>.server.json``: pid, the process's start time from ``/proc/<pid>/stat`` and the boot
  id). Starting a server with the same log first stops the process that record names, and only
  when its start time still matches: a pid the kernel has since given to another process is
  never signalled.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

LOG_TAIL_LINES = 20
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
RECORD_SUFFIX = ".server.json"


class ServerStartError(RuntimeError):
    """The server did not become healthy: it exited, or the deadline passed. ``log_tail`` holds its last lines."""

    def __init__(self, message: str, log_tail: list[str] | None = None, returncode: int | None = None):
        super().__init__(message)
        self.log_tail = list(log_tail or [])
        self.returncode = returncode


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def port_in_use(host: str, port: int) -> bool:
    """True when ``host:port`` cannot be bound (another process listens on it).

    SO_REUSEADDR as uvicorn (and every server) sets it: a connection of a stopped server
    still in TIME-WAIT must not read as a taken port (it did, for ~60 s); a socket that
    listens still refuses the bind on Linux, so a live server is still detected.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of group ``pgid``, read from /proc (Linux)."""
    members = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        # pid (comm) state ppid pgrp ...: comm may hold spaces and parentheses, so split after the last ')'.
        fields = stat[stat.rfind(")") + 2:].split()
        if len(fields) > 2 and fields[2] == str(pgid) and fields[0] != "Z":
            members.append(int(entry.name))
    return members


def group_alive(pgid: int) -> bool:
    """Whether any live process of group ``pgid`` is left (zombies awaiting their parent do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    if Path("/proc").is_dir():
        return bool(group_members(pgid))
    return True


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name: state, ppid, pgrp, ... (None when there is no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()


def process_start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (field 22 of ``/proc/<pid>/stat``); None if it is gone."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def _live(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def record_path(log_path: Path) -> Path:
    """Where the server logging to ``log_path`` is recorded while it runs."""
    log_path = Path(log_path)
    return log_path.with_name(log_path.name + RECORD_SUFFIX)


def write_record(path: Path, pid: int, command: Sequence[str]) -> None:
    """Record a running server (pid, start time, boot id), atomically, so a later run can find it."""
    record = {"pid": pid, "start_time": process_start_time(pid), "boot_id": _boot_id(), "command": list(command)}
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, path)


def stop_orphan(path: Path, grace_s: float = 10.0) -> int | None:
    """Stop the server ``path`` records if it is still that process; return its pid (None: nothing stopped).

    The process is signalled only when its start time and the boot id match the record's, so
    a recycled pid is left alone. The record is removed either way.
    """
    try:
        record: dict[str, Any] = json.loads(Path(path).read_text())
        pid, started = int(record["pid"]), record["start_time"]
    except (OSError, ValueError, KeyError, TypeError):
        Path(path).unlink(missing_ok=True)
        return None
    try:
        if (pid == os.getpid() or started is None or process_start_time(pid) != started
                or record.get("boot_id") != _boot_id()):
            return None
        fields = _stat_fields(pid)
        group = fields is not None and fields[2] == str(pid)  # started in its own session: stop its children too
        kill = (lambda sig: os.killpg(pid, sig)) if group else (lambda sig: os.kill(pid, sig))
        try:
            kill(signal.SIGTERM)
            deadline = time.monotonic() + grace_s
            while _live(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _live(pid) or (group and group_members(pid)):
                kill(signal.SIGKILL)
        except ProcessLookupError:
            pass
        return pid
    finally:
        Path(path).unlink(missing_ok=True)


def _die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` that has the kernel SIGTERM the child when this process dies (Linux, main thread only).

    PR_SET_PDEATHSIG fires when the *thread* that forked exits, so from a worker thread it would stop the
    server as soon as that thread ended: there, None (the orphan record is the only guard).
    """
    if not sys.platform.startswith("linux") or threading.current_thread() is not threading.main_thread():
        return None
    import ctypes

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here: the child only calls it
    except (OSError, AttributeError):
        return None
    parent = os.getpid()
    option, sig, zero = ctypes.c_int(PR_SET_PDEATHSIG), ctypes.c_ulong(signal.SIGTERM), ctypes.c_ulong(0)

    def preexec() -> None:
        prctl(option, sig, zero, zero, zero)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec


def tail(path: Path, lines: int = LOG_TAIL_LINES) -> list[str]:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [line for line in text.splitlines() if line.strip()][-lines:]


class ServerProcess:
    """Run ``command`` as a server; use as a context manager, or call :meth:`start` / :meth:`stop`."""

    def __init__(self, command: Sequence[str], base_url: str, log_path: Path, env: dict[str, str] | None = None,
                 health_path: str = "/health", grace_s: float = 10.0, name: str = "server"):
        self.command = [str(c) for c in command]
        self.base_url = base_url.rstrip("/")
        self.log_path = Path(log_path)
        self.env = env
        self.health_path = health_path
        self.grace_s = grace_s
        self.name = name
        self.proc: subprocess.Popen | None = None
        self.pgid: int | None = None

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> "ServerProcess":
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        record = record_path(self.log_path)
        orphan = stop_orphan(record, self.grace_s)
        if orphan is not None:
            from ..output import warn

            warn(f"stopped {self.name} process {orphan}, left running by an earlier run that was killed")
        log = open(self.log_path, "ab", buffering=0)
        try:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True, preexec_fn=_die_with_parent())
        finally:
            log.close()  # the child holds its own descriptor
        self.pgid = self.proc.pid  # a new session's leader: its pid is the group id
        write_record(record, self.proc.pid, self.command)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> list[str]:
        return tail(self.log_path, lines)

    def wait_healthy(self, timeout_s: float, poll_s: float = 0.25) -> float:
        """Block until ``GET /health`` answers 200; return the seconds it took. Raises :class:`ServerStartError`."""
        import httpx

        started = time.monotonic()
        deadline = started + timeout_s
        with httpx.Client(timeout=httpx.Timeout(min(5.0, max(timeout_s, 0.1)))) as client:
            while True:
                if self.proc is None:
                    raise ServerStartError(f"{self.name} was never started")
                code = self.proc.poll()
                if code is not None:
                    raise ServerStartError(
                        f"{self.name} exited with code {code} during startup", self.log_tail(), returncode=code)
                try:
                    response = client.get(self.base_url + self.health_path)
                    if response.status_code == 200:
                        return time.monotonic() - started
                except httpx.HTTPError:
                    pass
                if time.monotonic() >= deadline:
                    raise ServerStartError(
                        f"{self.name} did not answer GET {self.health_path} within {timeout_s:g} s", self.log_tail())
                time.sleep(min(poll_s, max(0.0, deadline - time.monotonic())))

    def stop(self) -> int | None:
        """SIGTERM the group, SIGKILL what is left after the grace period; reap. Returns the leader's exit code."""
        if self.proc is None:
            return None
        pgid = self.pgid
        if self.proc.poll() is None or (pgid is not None and group_alive(pgid)):
            _signal_group(pgid, signal.SIGTERM)
            deadline = time.monotonic() + self.grace_s
            while time.monotonic() < deadline:
                self.proc.poll()
                if pgid is None or not group_alive(pgid):
                    break
                time.sleep(0.05)
            else:
                _signal_group(pgid, signal.SIGKILL)
        try:
            self.proc.wait(timeout=max(self.grace_s, 5.0))
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL cannot be ignored
            self.proc.kill()
            self.proc.wait()
        # Children of the leader are reparented to init, which reaps them; wait until they are gone.
        deadline = time.monotonic() + 5.0
        while pgid is not None and group_alive(pgid) and time.monotonic() < deadline:
            _signal_group(pgid, signal.SIGKILL)
            time.sleep(0.05)
        record = record_path(self.log_path)
        if pgid is not None and not group_alive(pgid):
            record.unlink(missing_ok=True)
        return self.proc.returncode

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def port_taken(log_tail: Sequence[str]) -> bool:
    """Whether a server's last log lines say its port was taken (uvicorn, vLLM and trtllm-serve alike)."""
    return any("address already in use" in line.lower() or "errno 98" in line.lower() for line in log_tail)


def start_healthy(command_for_port: Callable[[int], Sequence[str]], url_for_port: Callable[[int], str], log_path: Path,
                  timeout_s: float, *, env_for_port: Callable[[int], dict[str, str] | None] = lambda port: None,
                  name: str = "server", port: int | None = None, host: str = "127.0.0.1",
                  on_start: Callable[[ServerProcess, list[str], str], None] | None = None,
                  on_retry: Callable[[int], None] | None = None) -> tuple[ServerProcess, str, float]:
    """Start a server and wait until ``/health`` answers: the one start loop of serve-test, bench and tune.

    Without a fixed ``port`` a free one is picked; another process can take it before the server binds it,
    so a start that fails on a taken port is retried once on another (``on_retry(port)`` says so).
    ``on_start(server, command, url)`` runs as each process starts (to log and record it). Returns the
    running server, its URL and the seconds it took; on failure the server is stopped and
    :class:`ServerStartError` raised.
    """
    attempts = 1 if port is not None else 2
    for attempt in range(attempts):
        chosen = port or free_port(host)
        url = url_for_port(chosen)
        command = [str(word) for word in command_for_port(chosen)]
        server = ServerProcess(command, url, log_path, env=env_for_port(chosen), name=name).start()
        try:
            if on_start is not None:
                on_start(server, command, url)
            return server, url, server.wait_healthy(timeout_s)
        except ServerStartError as exc:
            server.stop()
            taken = port_taken(exc.log_tail)
            if taken and attempt + 1 < attempts:
                if on_retry is not None:
                    on_retry(chosen)
                continue
            if taken:
                raise ServerStartError(f"{exc} (port {chosen} is in use)", exc.log_tail, exc.returncode) from None
            raise
        except BaseException:
            server.stop()
            raise
    raise AssertionError("unreachable")


def _signal_group(pgid: int | None, sig: int) -> None:
    if pgid is None:
        return
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def sigterm_unwinds():
    """Within the block, SIGTERM raises KeyboardInterrupt in the main thread (so children are reaped).

    The same handler the stages use (``workdir.sigterm_as_interrupt``), so the CLI says so in one line.
    """
    from ..workdir import sigterm_as_interrupt

    return sigterm_as_interrupt()
