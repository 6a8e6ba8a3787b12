"""`make test-vllm` cannot pass without vLLM (issue 20, item 10): with SPECCONVERT_VLLM_PYTHON set, a Python
that lacks vLLM, or whose vLLM does not import, fails the real-engine suite instead of skipping it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _broken_vllm_python(tmp_path: Path) -> str:
    """A Python whose `vllm` package is found but raises on import (a half-installed environment)."""
    (tmp_path / "site" / "vllm").mkdir(parents=True)
    (tmp_path / "site" / "vllm" / "__init__.py").write_text("raise ImportError('libtorch_cpu.so: cannot open')\n")
    shim = tmp_path / "python"
    shim.write_text(f"#!/bin/sh\nPYTHONPATH={tmp_path / 'site'} exec {sys.executable} \"$@\"\n")
    shim.chmod(0o755)
    return str(shim)


@pytest.mark.parametrize("kind", ["missing", "broken"])
def test_the_vllm_suite_fails_when_the_named_python_has_no_working_vllm(tmp_path, kind):
    python = sys.executable if kind == "missing" else _broken_vllm_python(tmp_path)
    env = {**os.environ, "SPECCONVERT_VLLM_PYTHON": python, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "vllm", "-p", "no:cacheprovider",
                           "-x", "tests/vllm"], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    out = done.stdout + done.stderr
    assert done.returncode != 0, out[-2000:]
    assert "SPECCONVERT_VLLM_PYTHON=" in out and "fails rather than skipping" in out
    assert ("no vllm package found" if kind == "missing" else "cannot open") in out
    assert " skipped" not in out.splitlines()[-1]
