"""Bad inputs to `specconvert convert`, one row each (issue 11, items 2, 11, 12, 19, 20, 24).

Every row must end the same way: exit 2 (or the code in the row), a first line that
starts with ``error:`` and names the cause, no traceback, no file written under the
workdir, and the user's tree (target, head, prompts, recipe) unchanged byte for byte
and mode for mode.
"""

from __future__ import annotations

import errno
import json
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest

from tests.inputs.helpers import files_under, tree_state
from tests.tiny_models import write_tiny_target

pytestmark = pytest.mark.compat


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    return write_tiny_target(tmp_path_factory.mktemp("tiny") / "target")


@dataclass
class World:
    """A user's folder: a tiny target, a recipe beside it, a default workdir ``runs/tiny``."""

    root: Path
    target: Path
    monkeypatch: pytest.MonkeyPatch
    target_spec: str = ""
    draft: str = "  init: random"
    extra: str = ""

    @property
    def workdir(self) -> Path:
        return self.root / "runs"

    def recipe(self) -> Path:
        path = self.root / "recipe.yaml"
        path.write_text(
            f"name: tiny\ntarget:\n  model: {json.dumps(self.target_spec or str(self.target))}\n  dtype: float32\n"
            f"draft:\n{self.draft}\n{self.extra}",
            encoding="utf-8",
        )
        return path

    def config(self, **changes) -> None:
        data = json.loads((self.target / "config.json").read_text())
        data.update(changes)
        (self.target / "config.json").write_text(json.dumps(data))

    def calib(self, name: str, content: bytes | None) -> None:
        from specconvert.stages import convert

        def too_late(*args, **kwargs):
            raise RuntimeError("the target was loaded before the calibration prompts were checked")

        self.monkeypatch.setattr(convert, "_load_target", too_late)
        if content is not None:
            (self.root / name).write_bytes(content)
        self.extra = f"quantize:\n  format: fp8\n  calib_prompts: {name}\n  calib_samples: 2\n"


# ---------------------------------------------------------------- the rows: setup(world) -> extra argv


def config_text(text: bytes):
    return lambda w: (w.target / "config.json").write_bytes(text)


def truncate_weights(w: World):
    weights = w.target / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])


def index_names_missing_shard(w: World):
    (w.target / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"lm_head.weight": "model-00002-of-00002.safetensors"}}))


def link_outside(w: World):
    secret = w.root / "elsewhere" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("not the model's\n")
    (w.target / "notes.txt").symlink_to(secret)


def broken_link(w: World):
    (w.target / "tokenizer_extra.json").symlink_to(w.root / "gone.json")


def workdir_in_target(w: World):
    return ["--set", f"workdir={w.target / 'runs'}"]


def workdir_in_head(w: World):
    from tests.helpers.heads import write_head

    head = write_head(w.root / "head", "modelopt")
    w.draft = f"  model: {head}"
    return ["--set", f"workdir={head / 'runs'}"]


def workdir_is_file(w: World):
    (w.root / "runs").write_text("my notes, not a folder\n")


def workdir_read_only(w: World):
    # root ignores mode bits, so make the check see what a normal user on a read-only mount would
    from specconvert.stages import preflight

    real_access = preflight.os.access
    w.monkeypatch.setattr(preflight.os, "access", lambda p, mode: False if Path(p) == w.root else real_access(p, mode))


def disk_full(w: World):
    from specconvert.models import copying

    def full(src, dst):
        Path(dst).write_bytes(b"\0" * 10)  # some bytes made it before the disk filled
        raise OSError(errno.ENOSPC, "No space left on device", str(dst))

    w.monkeypatch.setattr(copying, "clone_file", full)


def head_with_nan(w: World):
    import torch

    from tests.helpers.heads import canonical_tensors, write_head

    bad = canonical_tensors()["fc.weight"].clone()
    bad[0, 0] = float("nan")
    head = write_head(w.root / "head", "modelopt", tensor_overrides={"fc.weight": bad})
    assert torch.isnan(bad).any()
    w.draft = f"  model: {head}"


def recipe_is_folder(w: World):
    (w.root / "recipes").mkdir()
    return "replace-recipe", [str(w.root / "recipes")]


def builtin_traversal(w: World):
    import os

    from specconvert import prompts

    (w.root / "private.jsonl").write_text('{"text": "not a shipped set"}\n')
    w.calib("builtin:" + os.path.relpath(w.root / "private", prompts._BUILTIN_DIR), None)


def gguf_spec(spec: str):
    def setup(w: World):
        w.target_spec = spec
    return setup


def calib(name: str, content: bytes | None):
    return lambda w: w.calib(name, content)


@dataclass
class Row:
    id: str
    setup: Callable[[World], object]
    message: str
    code: int = 2
    argv: tuple[str, ...] = ()


ROWS = [
    Row("target-config-invalid-json", config_text(b'{"hidden_size": 64,'), "is not valid json"),
    Row("target-config-a-list", config_text(b"[1, 2, 3]"), "holds a json list, not an object"),
    Row("target-config-not-utf8", config_text(b'{"model_type": "\xff\xfe"}'), "is not utf-8 text"),
    Row("target-zero-layers", lambda w: w.config(num_hidden_layers=0), "num_hidden_layers = 0"),
    Row("target-shard-truncated", truncate_weights, "model.safetensors is truncated"),
    Row("target-index-names-missing-shard", index_names_missing_shard, "lists shards missing"),
    Row("target-symlink-leaves-folder", link_outside, "outside the checkpoint folder"),
    Row("target-symlink-broken", broken_link, "is a broken symlink"),
    Row("workdir-inside-target", workdir_in_target, "is inside the target folder"),
    Row("workdir-inside-head", workdir_in_head, "is inside the draft folder"),
    Row("workdir-is-a-file", workdir_is_file, "is a file"),
    Row("workdir-read-only", workdir_read_only, "cannot be written"),
    Row("disk-full-while-copying", disk_full, "no space left on the device"),
    Row("calib-prompts-missing", calib("missing.jsonl", None), "does not exist"),
    Row("calib-prompts-not-utf8", calib("calib.txt", b"caf\xe9 au lait\n"), "is not utf-8 text"),
    Row("calib-messages-a-string", calib("calib.jsonl", b'{"messages": "hello"}\n'), "'messages' is a json string"),
    Row("calib-builtin-traversal", builtin_traversal, "no built-in set"),
    Row("gguf-not-a-gguf-file", gguf_spec("gguf://json/__init__.py"), "is not a gguf file"),
    Row("gguf-dotted-package-not-imported", gguf_spec("gguf://this.zen/x.gguf"), "not the name of a top-level"),
    Row("gguf-module-not-package-not-run", gguf_spec("gguf://this/x.gguf"), "is a single module"),
    Row("gguf-path-leaves-package", gguf_spec("gguf://json/../../../../etc/hostname"), "leaves the package folder"),
    Row("head-weights-nan", head_with_nan, "holds nan or inf"),
    Row("recipe-is-a-folder", recipe_is_folder, "is a folder, not a recipe file"),
    Row("set-value-not-yaml", lambda w: None, "is not valid yaml", argv=("--set", "draft.aux_layers=[1, 3")),
]


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input_is_refused_cleanly(cli, tmp_path, template, monkeypatch, capsys, row):
    monkeypatch.setenv("SPECCONVERT_CACHE", str(tmp_path / "cache"))
    world = World(root=tmp_path / "user", target=tmp_path / "user" / "target", monkeypatch=monkeypatch)
    world.root.mkdir()
    shutil.copytree(template, world.target)
    had_this = "this" in sys.modules
    returned = row.setup(world)
    recipe = world.recipe()
    argv = ["convert", str(recipe), *row.argv]
    if isinstance(returned, tuple) and returned[0] == "replace-recipe":
        argv = ["convert", *returned[1]]
    elif isinstance(returned, list):
        argv += returned
    inside = {"workdir-inside-target": world.target / "runs", "workdir-inside-head": world.root / "head" / "runs"}
    workdir = inside.get(row.id, world.workdir)
    # a workdir that is the user's file is part of what must stay unchanged
    skip = () if row.id == "workdir-is-a-file" else (workdir,)
    before = tree_state(world.root, skip=skip)

    result = cli(*argv)

    # warnings (draft.init: random) may come first; the error is one line, the first that says error
    first = next((line for line in result.stderr.splitlines() if line.startswith("error:")), result.stderr)
    assert result.code == row.code, result.stderr
    assert first.startswith("error: ") and row.message in first.lower(), first
    assert "Traceback" not in result.stderr and "unexpected" not in first
    if row.id != "workdir-is-a-file":
        assert files_under(workdir) == [], "nothing may be written under the workdir"
    assert tree_state(world.root, skip=skip) == before, "the user's files must be unchanged"
    # The one thing a refused run may leave in the cache: a whole digest record of a large input file it read
    # (manifest.file_fingerprint), so the next run need not hash the weights again. Nothing half-written.
    assert [f for f in files_under(tmp_path / "cache") if "/digests/" not in f] == []
    for memo in (tmp_path / "cache" / "digests").glob("*"):
        assert set(json.loads(memo.read_text())) == {"path", "size", "mtime_ns", "inode", "sha256"}
    if not had_this:
        assert "this" not in sys.modules, "a gguf:// spec must not import (run) a package"


def test_row_count():
    """The lead reports 'bad inputs N/N refused cleanly' from this number."""
    assert len(ROWS) == len({r.id for r in ROWS}) == 24
