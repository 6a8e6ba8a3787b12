"""Shared fixtures: run the real CLI entry point and capture what a user sees."""

from __future__ import annotations

import json
import logging
import os
import sys
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


class _CurrentStderr:
    """A stream that writes to whatever ``sys.stderr`` is at the time (each test's capture, then the terminal)."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


@pytest.fixture(autouse=True, scope="session")
def _library_logs_follow_stderr():
    """transformers binds its one log handler to the ``sys.stderr`` of the moment it is first used. In a test run
    that is some test's capture, closed when that test ends, and a later test's warning then prints "--- Logging
    error ---" with a traceback into what that test asserts on (tests/inputs/test_bad_inputs.py failed so on two
    pytest-xdist workers, whose order differs from one process's). One process of the CLI never meets this."""
    from transformers.utils import logging as transformers_logging

    logger = transformers_logging.get_logger("transformers")  # configures the library's handler now
    for handler in logging.getLogger("transformers").handlers + logger.handlers:
        if isinstance(handler, logging.StreamHandler):
            handler.setStream(_CurrentStderr())
    yield


@pytest.fixture(autouse=True, scope="session")
def _isolated_cache(tmp_path_factory):
    """Keep converted GGUF folders in the user's cache (expensive) but nothing else outside tmp."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    yield


def write_recipe(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path
