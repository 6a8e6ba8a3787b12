"""Real vLLM servers (marker ``vllm``): skipped unless a Python with vLLM is found.

``SPECCONVERT_VLLM_PYTHON`` (set by ``make test-vllm``) or the repository's ``.venv-vllm``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def vllm_python() -> str:
    from specconvert.backends.vllm.launch import can_import_vllm

    python = os.environ.get("SPECCONVERT_VLLM_PYTHON") or str(REPO / ".venv-vllm" / "bin" / "python")
    if not can_import_vllm(python):
        pytest.skip(f"no vLLM at {python} (run `make .venv-vllm`, or set SPECCONVERT_VLLM_PYTHON)")
    return python
