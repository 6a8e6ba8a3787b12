"""Real vLLM servers (marker ``vllm``): which Python runs them, and when their absence fails the run.

- ``SPECCONVERT_VLLM_PYTHON`` set (``make test-vllm`` and ``.ci/run`` set it): the run asked for real
  servers, so a Python that cannot import vLLM is a FAILURE of every test, never a skip that a CI log
  would show as green;
- unset: the repository's ``.venv-vllm`` when it imports vLLM, else the tests are skipped (a plain
  ``pytest`` on a machine without vLLM).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = "SPECCONVERT_VLLM_PYTHON"


def import_error(python: str) -> str | None:
    """Why ``python`` cannot import vllm (None: it can). A real import, so a broken install shows too."""
    from specconvert.backends.vllm.launch import can_import_vllm

    if not can_import_vllm(python):
        return "no vllm package found"
    try:
        done = subprocess.run([python, "-c", "import vllm"], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if done.returncode != 0:
        return "`import vllm` failed: " + (done.stderr.strip().splitlines() or ["(no message)"])[-1]
    return None


@pytest.fixture(scope="session")
def vllm_python() -> str:
    explicit = os.environ.get(ENV)
    python = explicit or str(REPO / ".venv-vllm" / "bin" / "python")
    why = import_error(python)
    if why is None:
        return python
    if explicit:
        pytest.fail(f"{ENV}={explicit}: {why}; this run asked for real vLLM servers, so it fails rather than "
                    "skipping (run `make .venv-vllm`, or point the variable at a Python with vLLM)", pytrace=False)
    pytest.skip(f"no vLLM at {python} ({why}; run `make .venv-vllm`, or set {ENV})")
