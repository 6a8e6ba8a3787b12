"""serve-test's engine acceptance: counter deltas per request summed, and the stream-chunk estimate's error
against the counters of the very same streamed requests."""

from __future__ import annotations

import pytest

from specconvert.acceptance import from_counts, unavailable
from specconvert.serving.counted import engine_acceptance


def counted(prompt, stream, drafts, accepted, per_pos, tokens=0, chunks=0):
    return {"prompt_id": prompt, "stream": stream, "tokens": tokens, "chunks": chunks,
            "acceptance": from_counts("vllm counters", drafts=drafts, draft_tokens=3 * drafts, accepted_tokens=accepted,
                                      accepted_per_position=per_pos, requests=1)}


def test_sums_plain_requests_and_measures_the_chunk_estimator_on_streamed_ones():
    out = engine_acceptance([
        counted("a", False, 10, 10, [6, 3, 1]),
        counted("a", True, 10, 10, [6, 3, 1], tokens=21, chunks=11),  # exact: one chunk per step
        counted("b", False, 30, 6, [5, 1, 0]),
        counted("b", True, 30, 6, [5, 1, 0], tokens=37, chunks=36),  # a split chunk: 5 extra steps counted
    ])
    total = out["counters"]
    assert total.acceptance_length == pytest.approx(1 + 16 / 40)
    assert total.per_position == pytest.approx([11 / 40, 4 / 40, 1 / 40])
    assert total.requests == 2
    est = out["stream_estimate"]
    assert est["counters_same_requests"]["acceptance_length"] == pytest.approx(1.4)
    assert est["estimate"]["acceptance_length"] == pytest.approx((20 + 36) / (10 + 35), abs=1e-4)
    assert est["error"] == pytest.approx((20 + 36) / (10 + 35) - 1.4, abs=1e-4)


def test_nothing_counted():
    assert engine_acceptance([]) is None
    out = engine_acceptance([{"prompt_id": "a", "stream": False, "tokens": 4, "chunks": 0,
                              "acceptance": unavailable("vllm counters", "GET /metrics did not answer")}])
    assert not out["counters"].available and "did not answer" in out["counters"].label
