"""bench's acceptance with engine counters (vLLM): counters win over the chunk estimate, which is kept beside
them with its error; without counters nothing changes."""

from __future__ import annotations

import pytest

from specconvert.bench.metrics import Chunk, RequestRecord
from specconvert.acceptance import from_counts
from specconvert.stages.bench import _acceptance


def record(sizes):
    return RequestRecord(index=0, chunks=[Chunk(0.1 * i, n) for i, n in enumerate(sizes)], e2e_s=1.0,
                         output_tokens=sum(sizes))


def test_counters_win_and_the_chunk_estimate_error_is_recorded():
    recs = [record([1, 2, 2, 1]), record([1, 3])]  # chunk estimate: (2+2+1+3)/4 = 2.0
    runs = [from_counts("vllm counters", drafts=3, draft_tokens=9, accepted_tokens=3, accepted_per_position=[2, 1, 0],
                        requests=1),
            from_counts("vllm counters", drafts=1, draft_tokens=3, accepted_tokens=2, accepted_per_position=[1, 1, 0],
                        requests=1)]
    acc = _acceptance(None, recs, 3, runs)
    assert acc["measured_by"] == "measured: vllm counters" and acc["estimate"] is False
    assert acc["acceptance_length"] == pytest.approx(1 + 5 / 4)
    assert acc["per_position"] == pytest.approx([0.75, 0.5, 0.0])
    assert acc["acceptance_rate"] == pytest.approx(5 / 12, abs=1e-4)
    assert acc["chunk_estimate"] == pytest.approx(2.0)
    assert acc["chunk_estimate_error"] == pytest.approx(2.0 - 2.25)


def test_without_counters_the_chunk_estimate_stays():
    acc = _acceptance(None, [record([1, 2, 2])], 3, [])
    assert acc["estimate"] is True and acc["acceptance_length"] == pytest.approx(2.0)
    assert "chunk_estimate" not in acc
