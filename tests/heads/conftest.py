"""Shared fixtures for the head tests; the writers themselves live in tests/helpers/heads.py."""

from __future__ import annotations

import pytest

from tests.helpers.heads import target_config


@pytest.fixture(scope="session")
def tiny_target():
    """TargetInfo of the tiny Llama target every fixture head is built for."""
    from specconvert.heads import TargetInfo

    return TargetInfo.from_config(target_config())
