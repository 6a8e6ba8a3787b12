"""Putting a source checkpoint into the workdir without ever sharing a file with it.

``convert/target`` used to hold hard links to the user's checkpoint: one inode, so an
edit or a ``chmod`` in the workdir reached the original (and, through a resolved
Hugging Face cache path, the cache's blob). Here every file gets its own inode:
a copy-on-write clone (``FICLONE``) where the filesystem offers one (btrfs, XFS,
bcachefs, overlayfs on those: instant, no extra space until written), otherwise a plain
copy. Writing to the clone or the copy never writes through to the source.

Symlinks inside the source are followed only when they stay inside the source folder
or the Hugging Face hub cache (where snapshots link to ``../../blobs``); a link to
``/etc/hostname`` is refused before anything is written.
"""

from __future__ import annotations

import errno
import os
import shutil
import sys
import time
from pathlib import Path

from ..errors import InputError

# linux/fs.h: _IOW(0x94, 9, int). The same number on every Linux architecture.
_FICLONE = 0x40049409
# Errors that mean "no reflink here", after which a plain copy is the answer.
_NO_REFLINK = {errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EBADF, errno.EPERM}


def hub_cache_roots() -> list[Path]:
    """Where the Hugging Face hub keeps blobs (symlink targets of snapshot files)."""
    roots = []
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(name):
            roots.append(Path(os.environ[name]).expanduser())
    hf_home = os.environ.get("HF_HOME")
    base = Path(hf_home).expanduser() if hf_home else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "huggingface"
    roots.append(base / "hub")
    return [r.resolve() for r in roots]


def _allowed_roots(src: Path) -> list[Path]:
    roots = [src.resolve()]
    # A snapshot folder of a hub cache (models--owner--name/snapshots/REV) links into its repo's blobs/.
    if src.parent.name == "snapshots" and src.parent.parent.name.startswith(("models--", "datasets--")):
        roots.append(src.parent.parent.resolve())
    return roots + hub_cache_roots()


def _inside(path: Path, roots: list[Path]) -> bool:
    return any(path == root or path.is_relative_to(root) for root in roots)


def source_files(src: Path, key: str) -> list[tuple[Path, Path]]:
    """(absolute source path, path relative to ``src``) of every file to take, links checked.

    Hidden entries (``.cache``, ``.git``) are left out, as the fingerprint leaves them out.
    Raises :class:`InputError` for a symlink that resolves outside the source folder and
    the hub cache, or that is dangling.
    """
    src = Path(src)
    roots = _allowed_roots(src)
    files: list[tuple[Path, Path]] = []
    for dirpath, dirnames, filenames in os.walk(src, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for name in list(dirnames) + sorted(filenames):
            if name.startswith("."):
                continue
            path = here / name
            rel = path.relative_to(src)
            if path.is_symlink():
                resolved = path.resolve()
                if not resolved.exists():
                    raise InputError(f"{key}: {path} is a broken symlink (to {os.readlink(path)})",
                                     fix="restore the file it points to, or remove the link from the checkpoint folder")
                if not _inside(resolved, roots):
                    raise InputError(
                        f"{key}: {path} is a symlink to {resolved}, outside the checkpoint folder {src}",
                        fix="replace the link with the file itself, or remove it from the checkpoint folder",
                    )
                if resolved.is_dir():
                    raise InputError(f"{key}: {path} links to a folder ({resolved})",
                                     fix="replace the linked folder with its files")
            if name in dirnames:
                continue
            if path.is_file():
                files.append((path, rel))
    return files


def clone_file(src: Path, dst: Path) -> str:
    """Give ``dst`` the bytes of ``src`` in a new inode: ``"reflink"`` when the filesystem clones, else ``"copy"``."""
    with open(src, "rb") as fin, open(dst, "xb") as fout:
        if sys.platform.startswith("linux"):  # FICLONE is a Linux ioctl
            import fcntl

            try:
                fcntl.ioctl(fout.fileno(), _FICLONE, fin.fileno())
                return "reflink"
            except OSError as exc:
                if exc.errno not in _NO_REFLINK:
                    raise
        _copy_bytes(fin, fout)
    return "copy"


def _copy_bytes(fin, fout) -> None:
    """In-kernel copy (``copy_file_range``: no round trip through Python, and NFS/XFS may share
    extents server-side), else a plain buffered copy."""
    copy_range = getattr(os, "copy_file_range", None)
    if copy_range is not None:
        try:
            while copy_range(fin.fileno(), fout.fileno(), 64 * 1024 * 1024):
                pass
            return
        except OSError as exc:
            if exc.errno not in _NO_REFLINK:
                raise
            fin.seek(0)
            fout.seek(0)
            fout.truncate()
    shutil.copyfileobj(fin, fout, length=16 * 1024 * 1024)


def copy_tree(files: list[tuple[Path, Path]], dst: Path) -> dict[str, object]:
    """Clone or copy every file of :func:`source_files` below ``dst``; return what it cost.

    The copies take the process's umask, not the source's mode, so a read-only source
    gives writable copies and a ``chmod`` of a copy leaves the source as it was.
    """
    dst.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    counts = {"reflink": 0, "copy": 0}
    total = 0
    for path, rel in files:
        target = dst / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        counts[clone_file(path, target)] += 1
        total += target.stat().st_size
    seconds = time.perf_counter() - started
    method = "reflink" if counts["reflink"] and not counts["copy"] else ("copy" if not counts["reflink"] else "mixed")
    return {
        "method": method,
        "files": len(files),
        "bytes": total,
        "seconds": round(seconds, 3),
    }
