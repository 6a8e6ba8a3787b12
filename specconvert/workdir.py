"""What keeps a workdir safe to share and to interrupt: the lock, the ownership marker, healing.

- One run at a time per workdir: every stage holds an advisory ``flock`` on
  ``<workdir>/.specconvert.lock``; a second run waits (message on stderr) and gives up
  after ``SPECCONVERT_LOCK_TIMEOUT`` seconds (default 600) with exit 4.
- A directory is *ours* when it carries our stage manifest or the marker file
  ``.specconvert-stage`` that staging writes first. Only such directories are ever
  replaced or removed: a user's own ``engine/`` is refused, never deleted.
- A run killed half-way leaves ``.<stage>.staging-*`` or ``.<stage>.old-*`` folders; the
  next run that takes the lock removes the stale ones and puts back a stage directory
  that a kill hid between the two renames of the swap.
- SIGTERM unwinds like Ctrl-C while a stage runs, so its cleanup runs.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from .errors import ExternalFailure, InputError

MARKER = ".specconvert-stage"
LOCK_NAME = ".specconvert.lock"
LOCK_TIMEOUT_ENV = "SPECCONVERT_LOCK_TIMEOUT"
DEFAULT_LOCK_TIMEOUT_S = 600.0
# A marker whose process cannot be checked (another host, or a recycled pid) is stale after this long.
STALE_AFTER_S = 24 * 3600.0
# Test-only fault injection: SPECCONVERT_FAULT=<point>:<kill|term|sleep> (points: staging, swap, cleanup).
FAULT_ENV = "SPECCONVERT_FAULT"

_held: dict[str, tuple[int, int]] = {}  # resolved lock path -> (fd, depth): the lock is re-entrant in a process
_held_guard = threading.Lock()


# ---------------------------------------------------------------------- permissions


def current_umask() -> int:
    """The process umask, read without changing it where Linux allows (os.umask is a set-and-get)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def honour_umask(path: Path, directory: bool) -> None:
    """mkdtemp/mkstemp create 0700/0600 whatever the umask; give the mode a plain mkdir/open would."""
    os.chmod(path, (0o777 if directory else 0o666) & ~current_umask())


# ---------------------------------------------------------------------- ownership


def write_marker(directory: Path, stage: str) -> None:
    """Claim ``directory`` as ours; written first into staging, so it outlives every other file."""
    data = {"tool": "specconvert", "stage": stage, "pid": os.getpid(), "host": socket.gethostname(),
            "started": time.time()}
    (Path(directory) / MARKER).write_text(json.dumps(data) + "\n", encoding="utf-8")


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_ours(directory: Path) -> bool:
    """True for a real directory holding our marker or a manifest written by a specconvert stage."""
    directory = Path(directory)
    if directory.is_symlink() or not directory.is_dir():
        return False
    marker = _read_json(directory / MARKER)
    if marker is not None and marker.get("tool") == "specconvert":
        return True
    manifest = _read_json(directory / "manifest.json")
    return bool(manifest) and "manifest_version" in manifest and "stage" in manifest and "fingerprint" in manifest


def check_replaceable(final_dir: Path) -> None:
    """Refuse (exit 2) to replace a path that specconvert did not make; an empty folder holds nothing to lose."""
    final_dir = Path(final_dir)
    if not os.path.lexists(final_dir):
        return
    if final_dir.is_symlink():
        raise InputError(f"{final_dir} is a symbolic link, and this stage replaces that folder as a whole",
                         fix="remove the link or set `workdir:` to a folder of its own")
    if not final_dir.is_dir():
        raise InputError(f"{final_dir} is a file, where this stage writes its folder",
                         fix="move the file away or set `workdir:` to a folder of its own")
    if is_ours(final_dir) or not any(final_dir.iterdir()):
        return
    raise InputError(f"{final_dir} exists and was not made by specconvert (no manifest.json); it would be replaced",
                     fix="move your files out of it, or set `workdir:` to a folder of its own")


def remove_ours(directory: Path) -> None:
    """Delete a directory of ours, the marker last: a kill half-way leaves it still provably ours."""
    directory = Path(directory)
    for child in directory.iterdir():
        if child.name == MARKER:
            continue
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)
    (directory / MARKER).unlink(missing_ok=True)
    try:
        directory.rmdir()
    except OSError:
        pass


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stale(directory: Path) -> bool:
    """Ours, and its writer is gone: a dead pid on this host, or older than STALE_AFTER_S."""
    marker = _read_json(directory / MARKER)
    if marker is None or marker.get("tool") != "specconvert":
        return False
    started = marker.get("started")
    if isinstance(started, (int, float)) and time.time() - started > STALE_AFTER_S:
        return True
    pid = marker.get("pid")
    if marker.get("host") != socket.gethostname() or not isinstance(pid, int):
        return False
    return pid != os.getpid() and not _pid_alive(pid)


def _leftovers(workdir: Path, kind: str) -> dict[str, list[Path]]:
    """``.<stage>.<kind>-*`` folders below ``workdir``, by stage name."""
    found: dict[str, list[Path]] = {}
    try:
        entries = list(workdir.iterdir())
    except OSError:
        return found
    for entry in entries:
        name = entry.name
        tag = f".{kind}-"
        if name.startswith(".") and tag in name and entry.is_dir() and not entry.is_symlink():
            found.setdefault(name[1:name.index(tag)], []).append(entry)
    return found


def heal(workdir: Path) -> list[str]:
    """Undo what a killed run left in ``workdir`` (call with the lock held). Returns what was done."""
    from . import output

    workdir = Path(workdir)
    done: list[str] = []
    for stage, olds in _leftovers(workdir, "old").items():
        olds = sorted((p for p in olds if is_ours(p)), key=lambda p: p.name)
        final = workdir / stage
        if olds and not os.path.lexists(final):
            # A kill between the two renames of the swap: the previous stage is intact, only hidden.
            newest = olds.pop()
            os.replace(newest, final)
            done.append(f"restored {final} from {newest.name} (a previous run was killed during its swap)")
        for old in olds:
            remove_ours(old)
            done.append(f"removed {old.name} (left by a killed run)")
    for stage, stagings in _leftovers(workdir, "staging").items():
        for staging in stagings:
            if _stale(staging):
                remove_ours(staging)
                done.append(f"removed {staging.name} (left by a killed run)")
    for line in done:
        output.log(f"workdir: {line}")
    return done


# ---------------------------------------------------------------------- the lock


def _lock_timeout() -> float:
    raw = os.environ.get(LOCK_TIMEOUT_ENV, "")
    try:
        return max(0.0, float(raw)) if raw.strip() else DEFAULT_LOCK_TIMEOUT_S
    except ValueError:
        raise InputError(f"{LOCK_TIMEOUT_ENV}={raw!r} is not a number of seconds",
                         fix=f"set {LOCK_TIMEOUT_ENV} to e.g. 600, or unset it") from None


def _secondary_rank() -> bool:
    # torchrun's other ranks train alongside rank 0, which holds the lock for the whole group;
    # taking it again would deadlock the group's collectives.
    try:
        return int(os.environ.get("WORLD_SIZE", "1")) > 1 and int(os.environ.get("RANK", "0")) != 0
    except ValueError:
        return False


def _try_lock(path: Path) -> int | None:
    """An fd holding the flock on ``path``, or None when another process holds it."""
    import fcntl

    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                return None
            raise
        # The holder before us unlinks the file when it is done: a lock on an unlinked inode locks nothing.
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
            return fd
        os.close(fd)


def _holder(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8", errors="replace").split()
    except OSError:
        return "another specconvert run"
    return f"process {text[0]}" + (f" on {text[1]}" if len(text) > 1 else "") if text else "another specconvert run"


def _acquire(path: Path) -> int:
    from . import output

    fd = _try_lock(path)
    if fd is not None:
        return fd
    timeout = _lock_timeout()
    output.warn(f"{path.parent} is in use by {_holder(path)}; waiting up to {timeout:g} s "
                f"({LOCK_TIMEOUT_ENV} changes this)")
    deadline = time.monotonic() + timeout
    while fd is None:
        if time.monotonic() >= deadline:
            raise ExternalFailure(
                f"{path.parent} is still in use by {_holder(path)} after {timeout:g} s",
                fix=f"wait for that run to finish, give this run its own `workdir:`, or raise {LOCK_TIMEOUT_ENV}")
        time.sleep(0.2)
        fd = _try_lock(path)
    return fd


TERMINATED = threading.Event()  # set once a SIGTERM unwound a stage


@contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block SIGTERM raises KeyboardInterrupt, so staging cleanup runs as for Ctrl-C."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        TERMINATED.set()  # for the CLI's one-line message: Typer swallows the exception
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def workdir_lock(workdir: Path) -> Iterator[None]:
    """Hold the workdir for one stage: lock (re-entrant), heal leftovers, SIGTERM unwinds."""
    workdir = Path(workdir)
    if _secondary_rank():
        yield
        return
    # Folders made only to hold the lock go again if the stage writes nothing (e.g. bad input).
    created = [d for d in (workdir, *workdir.parents) if not d.exists()]
    existing = next((d for d in (workdir, *workdir.parents) if d.exists()), None)
    # Ask before creating anything: root passes a mode check the mount would still refuse.
    if existing is not None and existing.is_dir() and not os.access(existing, os.W_OK | os.X_OK):
        raise InputError(f"workdir {workdir} cannot be written ({existing} refuses writes)",
                         fix="set `workdir:` to a folder you can write, or fix its permissions")
    path = workdir / LOCK_NAME
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise InputError(f"workdir {workdir} is a file (or lies below one)",
                         fix="set `workdir:` to a folder, or move the file away") from None
    key = str(path.resolve())
    with _held_guard:
        held = _held.get(key)
        if held is not None:
            _held[key] = (held[0], held[1] + 1)
    if held is None:
        try:
            fd = _acquire(path)
        except PermissionError as exc:
            raise InputError(f"workdir {workdir} is not writable ({exc.strerror})",
                             fix="set `workdir:` to a folder you can write, or fix its permissions") from None
        with _held_guard:
            _held[key] = (fd, 1)
    try:
        with sigterm_as_interrupt():
            if held is None:
                heal(workdir)
            yield
    finally:
        with _held_guard:
            fd, depth = _held[key]
            if depth > 1:
                _held[key] = (fd, depth - 1)
            else:
                del _held[key]
        if held is None:
            # Unlink before unlocking: a waiter then finds its inode gone and retries on a fresh file,
            # and the workdir keeps no lock file once nothing runs.
            try:
                path.unlink()
            except OSError:
                pass
            os.close(fd)
            for folder in created:
                try:
                    folder.rmdir()
                except OSError:
                    break


# ---------------------------------------------------------------------- fault injection (tests only)


def fault_point(point: str) -> None:
    """Die or stall here when SPECCONVERT_FAULT names this point (fault-injection tests)."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec or spec.split(":", 1)[0] != point:
        return
    action = spec.split(":", 1)[1] if ":" in spec else "kill"
    print(f"fault injected at {point}: {action}", file=sys.stderr, flush=True)
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "term":
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)  # the handler raises here
    elif action.startswith("sleep"):
        time.sleep(float(action[5:] or 30))
