"""Stage folders and manifests honour the umask (issue 11, item 22): mkdtemp/mkstemp make
0700/0600 whatever it is, and a container user then cannot read the bundle."""

from __future__ import annotations

import os
import stat

import pytest

from specconvert.manifest import MANIFEST, stage_dir, write_json_atomic


@pytest.fixture
def umask():
    previous = os.umask(0o022)

    def set_(mask: int) -> None:
        os.umask(mask)

    yield set_
    os.umask(previous)


@pytest.mark.parametrize("mask, folder, file", [
    pytest.param(0o022, 0o755, 0o644, id="umask-022"),
    pytest.param(0o027, 0o750, 0o640, id="umask-027"),
    pytest.param(0o077, 0o700, 0o600, id="umask-077"),
])
def test_stage_folder_and_manifest_modes_follow_the_umask(tmp_path, umask, mask, folder, file):
    umask(mask)
    final = tmp_path / "work" / "engine"
    with stage_dir(final, "build", {}) as run:
        run.finish()
    assert stat.S_IMODE(final.stat().st_mode) == folder
    assert stat.S_IMODE((final / MANIFEST).stat().st_mode) == file
    write_json_atomic(tmp_path / "report.json", {"a": 1})
    assert stat.S_IMODE((tmp_path / "report.json").stat().st_mode) == file
