"""The user's checkpoint never shares a file with the workdir (issue 11 item 2).

``convert/target`` used to be hard links: editing its config.json or chmod-ing a weight
changed the source checkpoint, and for a hub-cache source the cache's blob.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pytest

from tests.conftest import write_recipe
from tests.inputs.helpers import tree_state
from tests.tiny_models import write_tiny_target

pytestmark = pytest.mark.compat


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return write_tiny_target(tmp_path_factory.mktemp("tiny") / "target")


def _recipe(tmp_path: Path, target: Path) -> Path:
    return write_recipe(tmp_path / "recipe.yaml",
                        f"name: tiny\ntarget:\n  model: {target}\n  dtype: float32\ndraft:\n  init: random\n")


def _edit_everything(target_dir: Path) -> None:
    """What a user or a later step may do to convert/target: rewrite, append, chmod."""
    config = target_dir / "config.json"
    with open(config, "w") as fh:  # Python open('w') truncates the same inode, as vim's default does not
        json.dump({"edited": True}, fh)
    with open(target_dir / "model.safetensors", "r+b") as fh:
        fh.write(b"\0" * 8)
    os.chmod(target_dir / "model.safetensors", 0o600)
    os.chmod(target_dir / "tokenizer.json", 0o777)


def test_edits_and_chmod_under_convert_target_leave_the_source_unchanged(cli, tmp_path, template):
    source = tmp_path / "user" / "target"
    shutil.copytree(template, source)
    os.chmod(source / "model.safetensors", 0o444)  # a read-only source gives a writable copy
    before = tree_state(source)

    result = cli("convert", _recipe(tmp_path, source), "--json")
    assert result.code == 0, result.stderr
    manifest = result.json()["manifest"]
    target_dir = Path(manifest["artifacts"]["target_dir"])
    assert target_dir != source and target_dir.is_relative_to(tmp_path / "runs")
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (target_dir / name).read_bytes() == (source / name).read_bytes(), name

    _edit_everything(target_dir)
    assert tree_state(source) == before
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (target_dir / name).stat().st_ino != (source / name).stat().st_ino, name
    assert manifest["target"]["copy"]["method"] in ("copy", "reflink")
    assert manifest["target"]["copy"]["files"] == len([p for p in source.iterdir() if p.is_file()])


def test_hub_cache_snapshot_links_are_followed_but_blobs_stay_untouched(cli, tmp_path, template, monkeypatch):
    """A hub snapshot's files are symlinks to ../../blobs: allowed, and the blobs must never be written."""
    hub = tmp_path / "hf" / "hub"
    repo = hub / "models--someone--tiny"
    snapshot = repo / "snapshots" / "0123abcd"
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for file in sorted(template.iterdir()):
        blob = repo / "blobs" / f"blob-{file.name}"
        shutil.copyfile(file, blob)
        (snapshot / file.name).symlink_to(Path("../../blobs") / blob.name)
    monkeypatch.setenv("HF_HUB_CACHE", str(hub))
    before = tree_state(repo)

    result = cli("convert", _recipe(tmp_path, snapshot), "--json")
    assert result.code == 0, result.stderr
    target_dir = Path(result.json()["manifest"]["artifacts"]["target_dir"])
    assert not (target_dir / "config.json").is_symlink()
    _edit_everything(target_dir)
    assert tree_state(repo) == before


@pytest.mark.parametrize("failure", [errno.EOPNOTSUPP, errno.EXDEV, errno.EINVAL], ids=["eopnotsupp", "exdev", "einval"])
def test_clone_falls_back_to_a_copy_when_the_filesystem_cannot_reflink(tmp_path, monkeypatch, failure):
    import fcntl

    from specconvert.models.copying import clone_file

    def refuse(fd, request, arg=0):
        raise OSError(failure, os.strerror(failure))

    monkeypatch.setattr(fcntl, "ioctl", refuse)
    src = tmp_path / "w.safetensors"
    src.write_bytes(os.urandom(3 * 1024 * 1024 + 7))
    assert clone_file(src, tmp_path / "copy") == "copy"
    assert (tmp_path / "copy").read_bytes() == src.read_bytes()
    assert (tmp_path / "copy").stat().st_ino != src.stat().st_ino


def test_clone_reports_a_reflink_and_never_overwrites(tmp_path, monkeypatch):
    import fcntl

    from specconvert.models import copying

    calls = []
    monkeypatch.setattr(fcntl, "ioctl", lambda fd, request, arg=0: calls.append(request))
    src = tmp_path / "w.bin"
    src.write_bytes(b"weights")
    assert copying.clone_file(src, tmp_path / "clone") == "reflink"
    assert calls == [copying._FICLONE]
    with pytest.raises(FileExistsError):  # "xb": a clone never writes into an existing file
        copying.clone_file(src, tmp_path / "clone")


def test_no_hard_links_anywhere_in_the_package():
    """A pre-stop hook greps for the call too; this says why in the failure message."""
    root = Path(__file__).resolve().parents[2] / "specconvert"
    offenders = [str(p) for p in root.rglob("*.py") if "os.link(" in p.read_text(encoding="utf-8")]
    assert offenders == [], "hard links share the user's inode: an edit in the workdir reaches the source"


def test_copy_without_copy_file_range_still_copies_every_byte(tmp_path, monkeypatch):
    import fcntl

    from specconvert.models.copying import clone_file

    def refuse(*args):
        raise OSError(errno.ENOSYS, "not here")

    monkeypatch.setattr(fcntl, "ioctl", refuse)
    monkeypatch.setattr(os, "copy_file_range", refuse, raising=False)
    src = tmp_path / "w.safetensors"
    src.write_bytes(os.urandom(17 * 1024 * 1024 + 3))
    assert clone_file(src, tmp_path / "copy") == "copy"
    assert (tmp_path / "copy").read_bytes() == src.read_bytes()
