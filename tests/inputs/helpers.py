"""What the bad-input tests share: a hash of a user's tree, a tiny world to break."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def tree_state(root: Path, skip: tuple[Path, ...] = ()) -> dict[str, tuple]:
    """Every entry below ``root`` (files, folders, links) with its mode and content hash.

    Two equal states mean nothing was created, removed, edited or chmod-ed there.
    """
    root = Path(root)
    skipped = {Path(s).resolve() for s in skip}
    state: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        here = Path(dirpath)
        dirnames[:] = [d for d in dirnames if (here / d).resolve() not in skipped or (here / d).is_symlink()]
        for name in dirnames + filenames:
            path = here / name
            if path.resolve() in skipped and not path.is_symlink():
                continue
            st = path.lstat()
            if path.is_symlink():
                entry = ("link", os.readlink(path))
            elif path.is_dir():
                entry = ("dir", st.st_mode)
            else:
                entry = ("file", st.st_mode, hashlib.sha256(path.read_bytes()).hexdigest())
            state[str(path.relative_to(root))] = entry
    return state


def files_under(folder: Path) -> list[str]:
    """Files (not empty folders) below ``folder``; [] when it does not exist."""
    folder = Path(folder)
    if folder.is_file() or folder.is_symlink():
        return [str(folder)]
    return sorted(str(p) for p in folder.rglob("*") if not p.is_dir()) if folder.exists() else []
