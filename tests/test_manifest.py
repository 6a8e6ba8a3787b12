"""Stage directories: atomic swap, manifest last, fingerprint reuse."""

from __future__ import annotations

import hashlib
import json
import os

import pytest

from specconvert.manifest import MANIFEST, compute_fingerprint, read_manifest, stage_dir, up_to_date


def test_stage_written_with_manifest_and_paths_rewritten(tmp_path):
    final = tmp_path / "work" / "convert"
    with stage_dir(final, "convert", {"a": 1}) as run:
        (run.path / "x.txt").write_text("hi")
        run.finish(artifacts={"file": str(run.path / "x.txt")})
    manifest = read_manifest(final)
    assert manifest["stage"] == "convert"
    assert manifest["artifacts"]["file"] == str(final / "x.txt")
    assert (final / "x.txt").read_text() == "hi"
    assert up_to_date(final, compute_fingerprint("convert", {"a": 1}))
    assert not up_to_date(final, compute_fingerprint("convert", {"a": 2}))
    assert [p.name for p in final.parent.iterdir()] == ["convert"]


def test_failure_leaves_previous_stage_untouched_and_no_staging(tmp_path):
    final = tmp_path / "convert"
    with stage_dir(final, "convert", {"v": 1}) as run:
        (run.path / "old.txt").write_text("old")
        run.finish()
    with pytest.raises(RuntimeError):
        with stage_dir(final, "convert", {"v": 2}) as run:
            (run.path / "new.txt").write_text("half")
            raise RuntimeError("mid-stage failure")
    assert (final / "old.txt").is_file() and not (final / "new.txt").exists()
    assert json.loads((final / MANIFEST).read_text())["inputs"] == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["convert"]


def test_failure_on_first_run_leaves_nothing(tmp_path):
    final = tmp_path / "convert"
    with pytest.raises(KeyboardInterrupt):
        with stage_dir(final, "convert", {}) as run:
            (run.path / "a").write_text("x")
            raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_interrupt_between_the_two_renames_puts_the_previous_stage_back(tmp_path, monkeypatch):
    from specconvert import manifest as manifest_module

    final = tmp_path / "engine"
    with stage_dir(final, "build", {"v": 1}) as run:
        (run.path / "old.txt").write_text("old")
        run.finish()

    def interrupt(point):
        if point == "swap":
            raise KeyboardInterrupt

    monkeypatch.setattr(manifest_module, "fault_point", interrupt)
    with pytest.raises(KeyboardInterrupt):
        with stage_dir(final, "build", {"v": 2}) as run:
            run.finish()
    assert (final / "old.txt").read_text() == "old"
    assert read_manifest(final)["inputs"] == {"v": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine"]


def test_a_folder_without_our_manifest_is_never_replaced(tmp_path):
    from specconvert.errors import InputError

    final = tmp_path / "engine"
    final.mkdir()
    (final / "NOTES.md").write_text("mine")
    with pytest.raises(InputError, match="was not made by specconvert"):
        with stage_dir(final, "build", {}) as run:
            run.finish()
    assert [p.name for p in final.iterdir()] == ["NOTES.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["engine"]


def _large(path, content):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path


def test_a_large_files_identity_is_its_content_not_its_mtime(tmp_path, monkeypatch):
    # Weights downloaded again or converted again from the same GGUF are the same bytes with a new mtime:
    # the target's fingerprint (and the synthesized training data keyed by it) must not change.
    monkeypatch.setenv("SPECCONVERT_CACHE", str(tmp_path / "cache"))
    from specconvert.manifest import tree_fingerprint

    content = bytes(range(256)) * (12 << 10)  # 3 MiB: above the size hashed without a memo
    first = _large(tmp_path / "a" / "model.safetensors", content)
    again = _large(tmp_path / "b" / "model.safetensors", content)
    os.utime(again, ns=(first.stat().st_mtime_ns + 10**12,) * 2)
    assert tree_fingerprint(first.parent) == tree_fingerprint(again.parent)

    changed = bytearray(content)
    changed[len(content) // 2 + 7] ^= 1  # one bit in the middle, same size
    _large(again, bytes(changed))
    os.utime(again, ns=(first.stat().st_mtime_ns,) * 2)  # even with the first file's mtime
    assert tree_fingerprint(first.parent) != tree_fingerprint(again.parent)


def test_a_large_files_digest_is_read_once_per_version_and_a_broken_memo_is_ignored(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECCONVERT_CACHE", str(tmp_path / "cache"))
    from specconvert import manifest

    path = _large(tmp_path / "w" / "model.safetensors", b"x" * (3 << 20))
    reads = []
    real = manifest._sha256_file
    monkeypatch.setattr(manifest, "_sha256_file", lambda p, size: reads.append(p) or real(p, size))
    expected = hashlib.sha256(path.read_bytes()).hexdigest()
    assert manifest.file_fingerprint(path) == {"size": 3 << 20, "sha256": expected}
    assert manifest.file_fingerprint(path)["sha256"] == expected
    assert len(reads) == 1  # the second run read the memo, not the file
    memos = list((tmp_path / "cache" / "digests").iterdir())
    assert len(memos) == 1
    memos[0].write_text('{"path": "cut sh')  # a memo cut by a crash
    assert manifest.file_fingerprint(path)["sha256"] == expected and len(reads) == 2
    path.write_bytes(b"y" * (3 << 20))  # a new version: new mtime, so hashed again
    os.utime(path, ns=(path.stat().st_mtime_ns + 10**9,) * 2)
    assert manifest.file_fingerprint(path)["sha256"] == hashlib.sha256(b"y" * (3 << 20)).hexdigest()
    assert len(reads) == 3


# ---------------------------------------------------------------- sealed and movable (issue 37, item 11)


def _sealed_stage(work):
    from specconvert.manifest import seal_tree

    final = work / "convert"
    with stage_dir(final, "convert", {"a": 1}, relative_paths=True) as run:
        (run.path / "target").mkdir()
        (run.path / "target" / "model.safetensors").write_bytes(bytes(range(256)) * 64)
        (run.path / "target" / "config.json").write_text("{}")
        run.finish(artifacts={"target_dir": str(run.path / "target")}, source="/elsewhere/model",
                   sealed={"convert/target": seal_tree(run.path / "target")})
    return final


def test_paths_inside_the_workdir_are_stored_relative_and_read_where_the_workdir_now_is(tmp_path):
    from specconvert.manifest import manifest_hash

    final = _sealed_stage(tmp_path / "a" / "work")
    on_disk = json.loads((final / MANIFEST).read_text())
    assert on_disk["artifacts"]["target_dir"] == "convert/target"
    assert on_disk["source"] == "/elsewhere/model"  # outside the workdir: kept as written
    assert str(tmp_path) not in (final / MANIFEST).read_text()
    before = read_manifest(final)
    assert before["artifacts"]["target_dir"] == str(final / "target")
    (tmp_path / "b").mkdir()
    os.rename(tmp_path / "a" / "work", tmp_path / "b" / "moved")
    after = read_manifest(tmp_path / "b" / "moved" / "convert")
    assert after["artifacts"]["target_dir"] == str(tmp_path / "b" / "moved" / "convert" / "target")
    assert manifest_hash(after) == manifest_hash(before)  # build's record of its convert survives the move


def _flip_middle_byte(path, keep_mtime=False):
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("damage, cheap, needle", [
    pytest.param(lambda p: _flip_middle_byte(p), True, "model.safetensors holds other bytes than when sealed", id="flipped-byte"),
    pytest.param(lambda p: _flip_middle_byte(p, keep_mtime=True), False, "model.safetensors holds other bytes",
                 id="flipped-byte-mtime-restored"),
    pytest.param(lambda p: p.write_bytes(p.read_bytes()[:100]), True, "model.safetensors is 100 bytes, sealed at 16384",
                 id="truncated"),
    pytest.param(lambda p: p.unlink(), True, "model.safetensors is missing", id="deleted"),
])
def test_a_sealed_file_changed_afterwards_is_bad_input(tmp_path, damage, cheap, needle):
    """Sizes always, a hash when the mtime moved; a change that keeps size and mtime needs --verify (full)."""
    from specconvert.errors import InputError
    from specconvert.manifest import check_sealed

    work = tmp_path / "work"
    final = _sealed_stage(work)
    manifest = read_manifest(final)
    check_sealed(work, manifest, "convert")
    check_sealed(work, manifest, "convert", full=True)
    damage(final / "target" / "model.safetensors")
    for full in (False, True):
        if not full and not cheap:
            check_sealed(work, manifest, "convert")  # what a cheap check cannot see
            continue
        with pytest.raises(InputError) as exc:
            check_sealed(work, manifest, "convert", full=full)
        assert exc.value.exit_code == 2
        assert exc.value.message.startswith("convert/target changed after convert sealed it: ") and needle in exc.value.message
        assert "rerun convert" in exc.value.fix


def test_a_copied_workdir_with_new_mtimes_is_hashed_and_accepted(tmp_path):
    """`cp -r` (and CI artifact transfer) gives every file a new mtime: the hashes decide, not the mtimes."""
    import shutil

    from specconvert.manifest import check_sealed

    final = _sealed_stage(tmp_path / "work")
    copy = tmp_path / "copy"
    shutil.copytree(tmp_path / "work", copy, copy_function=shutil.copy)  # copy, not copy2: new mtimes
    os.utime(copy / "convert" / "target" / "model.safetensors", ns=(1, 1))
    check_sealed(copy, read_manifest(copy / "convert"), "convert")
    assert read_manifest(final)["sealed"]["convert/target"]["model.safetensors"]["size"] == 16384
