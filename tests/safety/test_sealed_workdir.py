"""Issue 37, item 11, end to end: convert seals what it wrote; a workdir moved to another place (how CI passes it
from the convert job to the GPU job) builds and serve-tests from its own files; a byte changed there is seen (exit 2).

Tiny target (byte tokenizer) and a random Model Optimizer-layout head, reference backend on CPU.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
PROMPTS = [{"id": "plain", "prompt": "The quick brown fox"}]


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """The original place: sources, recipe and a converted workdir (convert runs once for the module)."""
    from specconvert import output
    from specconvert.cli import main
    from tests.helpers.heads import write_head
    from tests.tiny_models import write_tiny_target

    root = tmp_path_factory.mktemp("sealed-original")
    write_tiny_target(root / "sources" / "target")
    write_head(root / "sources" / "head", "modelopt")
    (root / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    recipe = {
        "schema_version": 1, "name": "tiny-sealed", "workdir": "work",
        "target": {"model": str(root / "sources" / "target"), "dtype": "float32"},
        "draft": {"model": str(root / "sources" / "head")},
        "build": {"max_draft_len": 3},
        "runtime": {"backend": "reference", "device": "cpu"},
        "serve_test": {"prompts": "prompts.jsonl", "max_tokens": 6, "min_acceptance_length": 1.0, "stream": False,
                       "startup_timeout_s": 120, "request_timeout_s": 60},
    }
    (root / "recipe.yaml").write_text(yaml.safe_dump(recipe, sort_keys=False))
    output.set_mode(False, True)
    try:
        main(["convert", str(root / "recipe.yaml")])
    except SystemExit as exc:
        assert not exc.code, exc.code
    return root


@pytest.fixture
def moved(converted, tmp_path, monkeypatch):
    """This test's copy of the recipe, prompts and workdir at another place; the original is kept, so a build that
    read the original's files would pass unnoticed."""
    shutil.copytree(converted / "work", tmp_path / "work", symlinks=True)
    for name in ("recipe.yaml", "prompts.jsonl"):
        shutil.copy(converted / name, tmp_path / name)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    return tmp_path


def _flip_middle_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_the_convert_manifest_holds_no_path_of_the_workdir_and_seals_every_file(converted):
    text = (converted / "work" / "convert" / "manifest.json").read_text()
    manifest = json.loads(text)
    assert manifest["artifacts"] == {"target_dir": "convert/target", "draft_dir": "convert/draft"}
    assert str(converted / "work") not in text
    sealed = manifest["sealed"]
    assert sorted(sealed) == ["convert/draft", "convert/target"]
    assert {"model.safetensors", "config.json"} <= set(sealed["convert/target"]) | set(sealed["convert/draft"])
    on_disk = converted / "work" / "convert" / "target" / "model.safetensors"
    assert sealed["convert/target"]["model.safetensors"]["size"] == on_disk.stat().st_size
    # the copy's seal is the source's digest, read once for the fingerprint: the same bytes
    assert sealed["convert/target"]["model.safetensors"]["sha256"] == \
        manifest["inputs"]["target_files"]["model.safetensors"]["sha256"]


def test_a_moved_workdir_builds_and_serve_tests_from_its_own_files(moved, cli):
    recipe = moved / "recipe.yaml"
    built = cli("build", recipe, "--no-load", "--verify", "--json")
    assert built.code == 0, built.stderr[-2000:]
    artifacts = built.json()["manifest"]["artifacts"]
    assert artifacts["target_dir"] == str(moved / "work" / "convert" / "target")
    assert artifacts["draft_dir"] == str(moved / "work" / "convert" / "draft")
    tested = cli("serve-test", recipe, "--drafter", "oracle", "--json")
    assert tested.code == 0, tested.stderr[-3000:]
    assert tested.json()["status"] == "passed"


def test_a_byte_changed_in_the_moved_copy_is_seen_by_build_and_serve_test(moved, cli):
    recipe = moved / "recipe.yaml"
    assert cli("build", recipe, "--no-load").code == 0
    _flip_middle_byte(moved / "work" / "convert" / "target" / "model.safetensors")
    for args in (["build", recipe, "--no-load"], ["build", recipe, "--no-load", "--force"], ["serve-test", recipe]):
        result = cli(*args)
        assert result.code == 2, (args, result.stderr[-2000:])
        errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "convert/target changed after convert sealed it" in errors[0], result.stderr
        assert "model.safetensors" in errors[0] and "rerun convert" in errors[0] and "Traceback" not in result.stderr
    assert not (moved / "work" / "serve-test").exists()


def test_a_change_that_keeps_size_and_mtime_needs_verify_and_serve_test_hashes_before_a_pass(moved, cli):
    recipe = moved / "recipe.yaml"
    assert cli("build", recipe, "--no-load").code == 0
    weights = moved / "work" / "convert" / "draft" / "model.safetensors"
    st = weights.stat()
    _flip_middle_byte(weights)
    os.utime(weights, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert cli("build", recipe, "--no-load").code == 0  # sizes and mtimes agree: the cheap check cannot tell
    verified = cli("build", recipe, "--no-load", "--verify")
    assert verified.code == 2 and "convert/draft changed after convert sealed it" in verified.stderr, verified.stderr[-2000:]
    tested = cli("serve-test", recipe, "--drafter", "oracle")
    assert tested.code == 2 and "convert/draft changed after convert sealed it" in tested.stderr, tested.stderr[-2000:]
    assert not (moved / "work" / "serve-test").exists()


def test_convert_run_again_remakes_what_changed(converted, moved, cli):
    """'rerun convert' is the fix the error gives: an unchanged recipe must not reuse the damaged folder."""
    recipe = moved / "recipe.yaml"
    _flip_middle_byte(moved / "work" / "convert" / "target" / "model.safetensors")
    again = cli("convert", recipe)
    assert again.code == 0, again.stderr[-2000:]
    assert "converting again" in again.stderr
    assert cli("build", recipe, "--no-load", "--verify").code == 0
