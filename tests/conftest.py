"""Shared fixtures: run the real CLI entry point and capture what a user sees."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@dataclass
class CliResult:
    code: int
    stdout: str
    stderr: str

    def json(self):
        return json.loads(self.stdout)


@pytest.fixture
def cli(capsys, monkeypatch):
    """Call ``specconvert.cli.main`` in process, returning exit code and output."""
    from specconvert import output
    from specconvert.cli import main

    monkeypatch.setenv("SPECCONVERT_DEBUG", "0")

    def run(*args: str) -> CliResult:
        output.set_mode(False, False)
        capsys.readouterr()
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        out, err = capsys.readouterr()
        return CliResult(code, out, err)

    return run


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Keep converted GGUF folders in the user's cache (expensive) but nothing else outside tmp."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    yield


def write_recipe(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path
