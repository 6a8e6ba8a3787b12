"""Stage directories and their manifests (DESIGN §1).

A stage writes into a private staging directory next to its final one; the
manifest is written last, atomically, and only then is the staging directory
swapped into place. A directory without ``manifest.json`` is incomplete and is
never consumed. A stage whose fingerprint matches the existing manifest is
skipped unless forced. Only a directory specconvert made is ever replaced, and a
stage holds the workdir's lock while it runs (``workdir.py``).

Sealed and movable (issue 37, item 11):

- A stage can **seal** folders it wrote (``convert/target``, ``convert/draft``): the manifest's
  ``sealed`` records each file's size, sha256 and mtime. :func:`check_sealed` is what later stages
  run: sizes always, a file's hash when its mtime moved (a digest remembered per file version,
  so a copied workdir is hashed once), every hash with ``full`` (``--verify``). Any difference is
  bad input (exit 2) naming the file: the folder changed after the stage sealed it.
- A stage can write its paths **relative to the workdir** (``stage_dir(..., relative_paths=True)``):
  every string that is a path inside the workdir is stored relative to it and listed under
  ``relative_paths``; :func:`read_manifest` turns them back into paths under the workdir where
  the manifest now lies, so a workdir copied or moved (CI artifacts) reads its own files.
  :func:`manifest_hash` leaves those values out, so the hash does not change with the move.
"""

from __future__ import annotations

import hashlib
import json
import os
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
from .workdir import MARKER, check_replaceable, fault_point, honour_umask, remove_ours, workdir_lock, write_marker

MANIFEST = "manifest.json"
MANIFEST_VERSION = 1
_TRACKED_LIBS = ("torch", "transformers", "nvidia-modelopt", "tensorrt_llm", "safetensors")


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON through a temp file + rename so readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        honour_umask(Path(tmp), directory=False)
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
    """Identity of an input file: its size and the sha256 of its content.

    Content, not mtime: weights downloaded again, restored from a CI cache or converted again from
    the same GGUF get a new mtime but are the same bytes, and what is keyed by them (the training
    data synthesized from the target: hours on an 8B one) must stay valid. A large file's digest
    is read once per version of the file and remembered under the cache root, keyed by its path,
    size, mtime and inode, so a later run reads only its stat.
    """
    st = path.stat()
    if st.st_size <= hash_below:
        return {"size": st.st_size, "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    return {"size": st.st_size, "sha256": _remembered_digest(path, st)}


def _remembered_digest(path: Path, st: os.stat_result) -> str:
    from .models.sources import cache_root

    resolved = path.resolve()
    memo = cache_root() / "digests" / f"{hashlib.sha256(str(resolved).encode()).hexdigest()[:24]}.json"
    stamp = {"path": str(resolved), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "inode": st.st_ino}
    try:
        known = json.loads(memo.read_text(encoding="utf-8"))
        if isinstance(known, dict) and {k: known.get(k) for k in stamp} == stamp and isinstance(known.get("sha256"), str):
            return known["sha256"]
    except (OSError, ValueError):
        pass  # no memo yet, or one cut short: hash again
    digest = _sha256_file(path, st.st_size)
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(memo, {**stamp, "sha256": digest})
    except OSError:
        pass  # a read-only cache costs a hash per run, nothing else
    return digest


def _sha256_file(path: Path, size: int) -> str:
    from . import output

    h = hashlib.sha256()
    chunk = 16 << 20
    with output.progress() as bar, path.open("rb") as fh:
        task = bar.add_task(f"hashing {path.name} (once per version of the file)", total=max(1, -(-size // chunk)))
        while block := fh.read(chunk):
            h.update(block)
            bar.advance(task)
    return h.hexdigest()


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
    """A stage's manifest, its workdir-relative paths made paths under the workdir it lies in now."""
    path = Path(stage_dir) / MANIFEST
    if not path.is_file():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if isinstance(manifest, dict) and isinstance(manifest.get(RELATIVE_PATHS), list):
        workdir = Path(stage_dir).resolve().parent
        for pointer in manifest[RELATIVE_PATHS]:
            _set_at(manifest, pointer, lambda rel: str(workdir / rel) if isinstance(rel, str) else rel)
    return manifest


RELATIVE_PATHS = "relative_paths"
SEALED = "sealed"


def _set_at(data: Any, pointer: Any, change: Any) -> None:
    """Replace the value at ``pointer`` (a list of keys and indices) by ``change(value)``; a stale pointer is ignored."""
    if not isinstance(pointer, list) or not pointer:
        return
    node = data
    for key in pointer[:-1]:
        try:
            node = node[key]
        except (KeyError, IndexError, TypeError):
            return
    try:
        node[pointer[-1]] = change(node[pointer[-1]])
    except (KeyError, IndexError, TypeError):
        return


def make_relative(data: Any, workdir: Path) -> tuple[Any, list[list[Any]]]:
    """``data`` with every string that is a path inside ``workdir`` made relative to it, and where each was."""
    root = str(Path(workdir))
    pointers: list[list[Any]] = []

    def walk(node: Any, at: list[Any]) -> Any:
        if isinstance(node, str) and (node == root or node.startswith(root + os.sep)):
            pointers.append(at)
            return Path(node).relative_to(root).as_posix() if node != root else "."
        if isinstance(node, dict):
            return {k: walk(v, at + [k]) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v, at + [i]) for i, v in enumerate(node)]
        return node

    return walk(data, []), pointers


def seal_tree(root: Path, known: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Size, sha256 and mtime of every file below ``root`` (hidden ones left out, as the fingerprint does).

    ``known`` maps a relative path to a ``{size, sha256}`` already read for the same bytes (the
    source checkpoint's fingerprint, for a copy of it): used when the size agrees, so sealing a
    copied target reads nothing again.
    """
    sealed: dict[str, dict[str, Any]] = {}
    root = Path(root)
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(".") or "/." in rel:
            continue
        st = path.stat()
        given = (known or {}).get(rel) or {}
        if given.get("size") == st.st_size and isinstance(given.get("sha256"), str):
            digest = given["sha256"]
        else:
            digest = file_fingerprint(path)["sha256"]
        sealed[rel] = {"size": st.st_size, "sha256": digest, "mtime_ns": st.st_mtime_ns}
    return sealed


def check_sealed(workdir: Path, manifest: dict[str, Any], stage: str, full: bool = False) -> None:
    """Refuse (exit 2) when a folder ``stage`` sealed changed since: a file missing, resized or with other bytes.

    Sizes are always compared; a file's hash when its mtime moved (or every hash with ``full``).
    A manifest without ``sealed`` (written before sealing existed, or by hand) is not checked.
    """
    problems: list[str] = []
    for folder, files in (manifest.get(SEALED) or {}).items():
        root = Path(workdir) / folder
        for rel, record in (files or {}).items():
            path = root / rel
            try:
                st = path.stat()
            except OSError:
                problems.append(f"{folder}: {rel} is missing")
                continue
            if st.st_size != record.get("size"):
                problems.append(f"{folder}: {rel} is {st.st_size} bytes, sealed at {record.get('size')}")
                continue
            if not full and st.st_mtime_ns == record.get("mtime_ns"):
                continue
            digest = _sha256_file(path, st.st_size) if full else file_fingerprint(path)["sha256"]
            if digest != record.get("sha256"):
                problems.append(f"{folder}: {rel} holds other bytes than when sealed (sha256 {digest[:12]}…, "
                                f"sealed {str(record.get('sha256'))[:12]}…)")
    if problems:
        folders = sorted({p.split(":", 1)[0] for p in problems})
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise InputError(f"{', '.join(folders)} changed after {stage} sealed it: {problems[0].split(': ', 1)[1]}{more}",
                         fix=f"rerun {stage} (`specconvert {stage} RECIPE`) to make it again", problems=problems)


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
    """The manifest's identity: timings and where the workdir lies (its relative paths' values) left out."""
    data = {k: v for k, v in manifest.items() if k not in ("timings", "created_at")}
    if isinstance(data.get(RELATIVE_PATHS), list):
        data = json.loads(json.dumps(data, default=str))
        for pointer in data[RELATIVE_PATHS]:
            _set_at(data, pointer, lambda _: "<in the workdir>")
    return canonical_hash(data)


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


def rewrite_paths(data: Any, old: Path, new: Path) -> Any:
    """``data`` with every string's ``old`` path prefix replaced by ``new``, walked structurally.

    Text replacement on serialised JSON misses paths that JSON escapes (non-ASCII, quotes,
    backslashes, newlines); walking the object sees each string as it is.
    """
    old_s, new_s = str(old), str(new)
    if isinstance(data, str):
        return data.replace(old_s, new_s)
    if isinstance(data, Path):
        return Path(str(data).replace(old_s, new_s))
    if isinstance(data, dict):
        return {rewrite_paths(k, old, new): rewrite_paths(v, old, new) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [rewrite_paths(v, old, new) for v in data]
    return data


def require_current_engine(workdir: Path, verify: bool = False) -> dict[str, Any]:
    """The engine manifest, refused (exit 2) when ``convert/`` changed after ``engine/`` was built.

    The build records ``inputs.convert_manifest``, the hash of the convert manifest it read;
    serving a bundle whose draft no longer matches it (e.g. other aux layers) fails silently.
    The folders convert sealed are checked too (every hash with ``verify``).
    """
    workdir = Path(workdir)
    engine = require_manifest(workdir / "engine", "build", "build")
    built_from = (engine.get("inputs") or {}).get("convert_manifest")
    convert = read_manifest(workdir / "convert")
    # Without convert/ (a CI job restoring only engine/) there is nothing newer to compare with.
    if convert is not None and built_from is not None and built_from != manifest_hash(convert):
        raise InputError(f"{workdir / 'engine'} was built from an older convert (convert/ changed since)",
                         fix="run `specconvert build RECIPE`")
    if convert is not None:
        check_sealed(workdir, convert, "convert", full=verify)
    return engine


@contextmanager
def stage_dir(final_dir: Path, stage: str, inputs: dict[str, Any], relative_paths: bool = False) -> Iterator[StageRun]:
    """Stage into a temporary sibling directory; swap it in only when the body succeeds.

    Holds the workdir lock throughout. On any exception (SIGTERM included) the staging
    directory is removed and the previous stage directory (if any) is left untouched,
    so nothing half-written is ever visible. A directory specconvert did not make is
    refused before anything is written. With ``relative_paths`` the manifest on disk holds
    paths inside the workdir relative to it (``run.manifest`` keeps them absolute).
    """
    final_dir = Path(final_dir)
    with workdir_lock(final_dir.parent):
        check_replaceable(final_dir)
        staging = Path(tempfile.mkdtemp(prefix=f".{final_dir.name}.staging-", dir=final_dir.parent))
        try:
            write_marker(staging, stage)
            honour_umask(staging, directory=True)
            fault_point("staging")
            run = StageRun(stage, final_dir, staging, compute_fingerprint(stage, inputs), inputs, time.perf_counter())
            yield run
            manifest = getattr(run, "manifest", None)
            if manifest is None:
                raise RuntimeError(f"stage {stage} finished without a manifest")
            # Paths in the manifest point into the staging dir; rewrite them to the final dir.
            manifest = rewrite_paths(json.loads(json.dumps(manifest, default=str)), staging, final_dir)
            run.manifest = manifest
            if relative_paths:
                stored, pointers = make_relative(manifest, final_dir.parent)
                run.manifest = {**manifest, RELATIVE_PATHS: pointers}  # what read_manifest will return
                write_json_atomic(staging / MANIFEST, {**stored, RELATIVE_PATHS: pointers})
            else:
                write_json_atomic(staging / MANIFEST, manifest)
            _swap_in(staging, final_dir)
        except BaseException:
            if staging.exists():
                remove_ours(staging)
            raise


def _swap_in(staging: Path, final_dir: Path) -> None:
    """Two renames; a kill between them leaves ``.<name>.old-*`` that the next run puts back."""
    old = None
    if os.path.lexists(final_dir):
        check_replaceable(final_dir)
        old = final_dir.with_name(f".{final_dir.name}.old-{os.getpid()}-{time.time_ns()}")
        if not (final_dir / MARKER).exists():  # a stage from before markers: claim it so a crash stays healable
            write_marker(final_dir, final_dir.name)
        os.replace(final_dir, old)
    try:
        fault_point("swap")
        os.replace(staging, final_dir)
    except BaseException:
        if old is not None and not os.path.lexists(final_dir):
            os.replace(old, final_dir)
        raise
    if old is not None:
        fault_point("cleanup")
        remove_ours(old)
