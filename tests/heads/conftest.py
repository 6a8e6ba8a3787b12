"""Shared fixtures for the head tests; the writers themselves live in tests/helpers/heads.py."""

from __future__ import annotations

import pytest

from tests.helpers.heads import target_config


@pytest.fixture(scope="session")
def tiny_target():
    """TargetInfo of the tiny Llama target every fixture head is built for."""
    from specconvert.heads import TargetInfo

    return TargetInfo.from_config(target_config())


def pytest_collection_modifyitems(config, items):
    """Head reading is version-sensitive (torch/safetensors/transformers): run it in the compat stack too."""
    for item in items:
        if "tests/heads/" in str(item.fspath).replace("\\", "/"):
            item.add_marker(pytest.mark.compat)
