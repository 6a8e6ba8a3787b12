"""Stage directories and their manifests (DESIGN §1).

A stage writes into a private staging directory next to its final one; the
manifest is written last, atomically, and only then is the staging directory
swapped into place. A directory without ``manifest.json`` is incomplete and is
never consumed. A stage whose fingerprint matches the existing manifest is
skipped unless forced.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from . import __version__
from ._imports import installed_version
from .errors import InputError

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_TRACKED_LIBS = ("torch", "transformers", "nvidia-modelopt", "tensorrt_llm", "safetensors")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temp file + rename so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=2, sort_keys=False, default=str)
            fh.write("\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def canonical_hash(data: Any) -> str:
    blob = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str).encode()
    return hashlib.sha256(blob).hexdigest()


def file_fingerprint(path: Path, hash_below: int = 1 << 20) -> dict[str, Any]:
    """Identity of an input file: content hash when small, size + mtime when large."""
    st = path.stat()
    entry: dict[str, Any] = {"size": st.st_size}
    if st.st_size <= hash_below:
        entry["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
    else:
        entry["mtime_ns"] = st.st_mtime_ns
    return entry


def tree_fingerprint(root: Path) -> dict[str, Any]:
    """Fingerprint every file below ``root`` (or ``root`` itself when it is a file)."""
    root = Path(root)
    if root.is_file():
        return {root.name: file_fingerprint(root)}
    out: dict[str, Any] = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(".") or "/." in rel:
            continue
        out[rel] = file_fingerprint(path)
    return out


def library_versions() -> dict[str, str | None]:
    versions = {name: installed_version(name) for name in _TRACKED_LIBS}
    versions["python"] = ".".join(map(str, sys.version_info[:3]))
    versions["specconvert"] = __version__
    return versions


def read_manifest(stage_dir: Path) -> dict[str, Any] | None:
    path = Path(stage_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def require_manifest(stage_dir: Path, stage: str, produced_by: str) -> dict[str, Any]:
    """The manifest of an upstream stage, or a clear error saying which command to run first."""
    manifest = read_manifest(stage_dir)
    if manifest is None:
        raise InputError(
            f"{stage_dir} holds no complete '{stage}' stage (no {MANIFEST})",
            fix=f"run `specconvert {produced_by} RECIPE` first",
        )
    return manifest


def manifest_hash(manifest: dict[str, Any]) -> str:
    return canonical_hash({k: v for k, v in manifest.items() if k not in ("timings", "created_at")})


@dataclass
class StageRun:
    """A stage being written: files go under ``path`` (the staging directory)."""

    stage: str
    final_dir: Path
    path: Path
    fingerprint: str
    inputs: dict[str, Any]
    started: float

    def finish(self, **fields: Any) -> dict[str, Any]:
        """Build the manifest (written by :func:`stage_dir` on success)."""
        manifest = {
            "manifest_version": MANIFEST_VERSION,
            "stage": self.stage,
            "fingerprint": self.fingerprint,
            "inputs": self.inputs,
            "versions": library_versions(),
            "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        manifest.update(fields)
        timings = dict(manifest.get("timings") or {})
        timings["total_s"] = round(time.perf_counter() - self.started, 3)
        manifest["timings"] = timings
        self.manifest = manifest
        return manifest


def compute_fingerprint(stage: str, inputs: dict[str, Any]) -> str:
    return canonical_hash({"stage": stage, "inputs": inputs, "specconvert": __version__})


def up_to_date(final_dir: Path, fingerprint: str) -> dict[str, Any] | None:
    manifest = read_manifest(final_dir)
    if manifest and manifest.get("fingerprint") == fingerprint:
        return manifest
    return None


@contextmanager
def stage_dir(final_dir: Path, stage: str, inputs: dict[str, Any]) -> Iterator[StageRun]:
    """Stage into a temporary sibling directory; swap it in only when the body succeeds.

    On any exception the staging directory is removed and the previous stage
    directory (if any) is left untouched, so nothing half-written is ever visible.
    """
    final_dir = Path(final_dir)
    final_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.staging-", dir=final_dir.parent))
    run = StageRun(stage, final_dir, staging, compute_fingerprint(stage, inputs), inputs, time.perf_counter())
    try:
        yield run
        manifest = getattr(run, "manifest", None)
        if manifest is None:
            raise RuntimeError(f"stage {stage} finished without a manifest")
        # Paths in the manifest point into the staging dir; rewrite them to the final dir.
        manifest = json.loads(json.dumps(manifest, default=str).replace(str(staging), str(final_dir)))
        run.manifest = manifest
        write_json_atomic(staging / MANIFEST, manifest)
        _swap_in(staging, final_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _swap_in(staging: Path, final_dir: Path) -> None:
    old = None
    if final_dir.exists() or final_dir.is_symlink():
        old = final_dir.with_name(f".{final_dir.name}.old-{os.getpid()}-{time.time_ns()}")
        os.replace(final_dir, old)
    os.replace(staging, final_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
