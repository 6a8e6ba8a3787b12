"""Fixtures: the scripted stand-in server (a test double) on a loopback port."""

from __future__ import annotations

import pytest

from .standin import Script, StandInServer

# Small, fast load (plots only where a test looks at them): 2 levels x 2 pairs x 4 requests of 7 tokens against a server with 10-20 ms steps.
FAST = ["--set", "bench.plots=false", "--set", "bench.num_requests=4", "--set", "bench.concurrency=[1,2]", "--set", "bench.max_tokens=7",
        "--set", "bench.warmup_requests=1", "--set", "bench.prompts=builtin:bench-smoke"]


@pytest.fixture
def standin():
    script = Script(ttft_s=0.02, gap_s=0.015, spec_chunk=3)
    with StandInServer(script) as server:
        yield server


@pytest.fixture
def plain_standin():
    """A third-party-like endpoint: no /perf_metrics, no token ids in chunks (text + usage only)."""
    script = Script(ttft_s=0.02, gap_s=0.015, spec_chunk=3, metrics=False)
    with StandInServer(script) as server:
        yield server
