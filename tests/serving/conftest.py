"""Fixtures for the serving tests: one tiny converted + built bundle per session, copied per test;
a `trtllm-serve` TEST DOUBLE on PATH; process-table helpers to prove nothing is left running."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

HERE = Path(__file__).parent
PROMPTS = [
    {"id": "chat-a", "messages": [{"role": "user", "content": "Name three colours."}]},
    {"id": "chat-b", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}]},
    {"id": "plain", "prompt": "The quick brown fox"},
]


def _cli(*args) -> int:
    from specconvert import output
    from specconvert.cli import main

    output.set_mode(False, True)
    try:
        main([str(a) for a in args])
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


@pytest.fixture(scope="session")
def built_bundle(tmp_path_factory):
    """A tiny target (byte tokenizer) + a random Model Optimizer-layout head, through the real convert and build."""
    from tests.helpers.heads import write_head
    from tests.tiny_models import write_tiny_target

    root = tmp_path_factory.mktemp("serving-bundle")
    write_tiny_target(root / "target")
    write_head(root / "head", "modelopt")
    recipe = {
        "schema_version": 1, "name": "tiny-serve", "workdir": "work",
        "target": {"model": str(root / "target"), "dtype": "float32"},
        "draft": {"model": str(root / "head")},
        "build": {"max_draft_len": 3},
        "runtime": {"backend": "reference", "device": "cpu"},
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert _cli("convert", path) == 0
    assert _cli("build", path, "--no-load") == 0
    return root, recipe


@dataclass
class Project:
    root: Path
    recipe_path: Path
    recipe: dict

    @property
    def out(self) -> Path:
        return self.root / "work" / "serve-test"

    def write(self, **serve_test) -> Path:
        data = dict(self.recipe)
        data["serve_test"] = {**data.get("serve_test", {}), **serve_test}
        self.recipe = data
        self.recipe_path.write_text(yaml.safe_dump(data, sort_keys=False))
        return self.recipe_path

    def report(self) -> dict:
        return json.loads((self.out / "report.json").read_text())


@pytest.fixture
def project(built_bundle, tmp_path, monkeypatch) -> Project:
    """This test's copy of the recipe and work directory (the engine points at the shared convert output)."""
    root, recipe = built_bundle
    shutil.copytree(root / "work" / "engine", tmp_path / "work" / "engine", symlinks=True)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    # Servers started by serve-test inherit this: one thread per torch process on shared CI cores.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(HERE.parent.parent), os.environ.get("PYTHONPATH", "")]))
    p = Project(tmp_path, tmp_path / "recipe.yaml", dict(recipe))
    p.write(prompts=str(prompts), max_tokens=10, min_acceptance_length=1.0, startup_timeout_s=90, request_timeout_s=60)
    return p


@pytest.fixture
def fake_trtllm_serve(tmp_path, monkeypatch):
    """Put the `trtllm-serve` TEST DOUBLE (tests/serving/fake_trtllm_serve.py) first on PATH; returns its argv log."""
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    exe = bin_dir / "trtllm-serve"
    exe.write_text(f"#!{sys.executable}\n" + (HERE / "fake_trtllm_serve.py").read_text())
    exe.chmod(0o755)
    argv_log = tmp_path / "trtllm-serve-argv.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_TRTLLM_ARGV_LOG", str(argv_log))
    return argv_log


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """The vLLM TEST DOUBLE (tests/serving/fake_vllm.py) as a `runtime.vllm_python`; returns (python, argv log)."""
    exe = tmp_path / "fake-vllm-python"
    exe.write_text(f"#!{sys.executable}\n" + (HERE / "fake_vllm.py").read_text())
    exe.chmod(0o755)
    log = tmp_path / "fake-vllm-argv.jsonl"
    monkeypatch.setenv("FAKE_VLLM_ARGV_LOG", str(log))
    return exe, log


def live_group_members(pgid: int) -> list[int]:
    """Non-zombie processes whose process group is ``pgid`` (from /proc)."""
    from specconvert.serving.process import group_members

    return group_members(pgid)


def assert_reaped(pids: list[int], timeout_s: float = 5.0) -> None:
    """Every server process group is gone: no live member left, leader included."""
    deadline = time.monotonic() + timeout_s
    left = []
    while time.monotonic() < deadline:
        left = [p for pid in pids for p in live_group_members(pid)]
        if not left:
            return
        time.sleep(0.1)
    raise AssertionError(f"processes left running: {left}")


def occupied_port():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(1)
    return sock
