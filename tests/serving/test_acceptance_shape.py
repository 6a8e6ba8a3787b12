"""The one acceptance shape: labels name their source; nothing is invented when nothing was measured."""

import pytest

from specconvert import acceptance as A


def test_counts_give_tau_and_per_position():
    acc = A.from_counts("vllm counters", drafts=36, draft_tokens=108, accepted_tokens=11,
                        accepted_per_position=[8, 2, 1], requests=1)
    assert acc.label == "measured: vllm counters"
    assert acc.acceptance_length == pytest.approx(1 + 11 / 36)
    assert acc.per_position == pytest.approx([8 / 36, 2 / 36, 1 / 36])
    assert acc.as_dict()["source"] == "measured: vllm counters"


def test_no_drafts_is_unavailable_not_tau_one():
    acc = A.from_counts("vllm counters", drafts=0, draft_tokens=0, accepted_tokens=0)
    assert not acc.available and acc.acceptance_length is None
    assert acc.label.startswith("unavailable: ")


def test_stream_chunks_discount_the_prefill_chunk():
    # 9 tokens in 4 chunks: 1 prefill token, then 8 tokens over 3 steps.
    acc = A.from_stream_chunks([9], [4])
    assert acc.kind == A.ESTIMATED and acc.acceptance_length == pytest.approx(8 / 3)
    assert not A.from_stream_chunks([1], [1]).available
