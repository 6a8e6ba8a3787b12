"""Each engine's native schedule gives, batch size by batch size, what the tuned segments say."""

import pytest

from specconvert.backends.sglang import schedule as sglang
from specconvert.backends.trtllm import schedule as trt
from specconvert.backends.vllm import schedule as vllm
from specconvert.draft_schedule import Segment, draft_len_at
from specconvert.tuning.model import schedule

SEGMENTS = schedule({1: 3, 4: 2, 16: 0})  # 1..2 -> 3, 3..8 -> 2, 9.. -> 0


def test_trtllm_schedule_matches_segments_with_the_zero_floor():
    out = trt.speculative_settings(SEGMENTS, max_batch_size=64, version="1.4.0")
    assert out["max_draft_len"] == 3
    sched = out["draft_len_schedule"]
    assert sched[min(sched)] == out["max_draft_len"]  # llm_args: smallest key maps to max_draft_len
    # Floor 1 instead of 0 (PR #16888), else exactly the segments, up to max_batch_size.
    for b in range(1, 65):
        assert trt.draft_len_at(sched, 3, b) == max(draft_len_at(SEGMENTS, b), 1)
    assert any("16888" in n for n in out["notes"])


def test_trtllm_schedule_may_turn_speculation_off_when_allowed():
    out = trt.speculative_settings(SEGMENTS, max_batch_size=64, version="1.4.0", allow_zero=True)
    assert out["draft_len_schedule"] == {2: 3, 8: 2}
    assert [trt.draft_len_at(out["draft_len_schedule"], 3, b) for b in (1, 2, 3, 8, 9, 64)] == [3, 3, 2, 2, 0, 0]


@pytest.mark.parametrize("version, has_schedule", [("1.2.1", False), ("1.2", False), ("1.3.0rc7", False),
                                                   ("1.3.0rc8", True), ("1.3.0rc27", True), ("1.3", True), ("1.4.0", True)])
def test_trtllm_lines_without_one_model_schedule_get_one_length(version, has_schedule):
    out = trt.speculative_settings(SEGMENTS, max_batch_size=64, version=version)
    assert (out["draft_len_schedule"] is not None) == has_schedule
    assert out["max_draft_len"] == 3


@pytest.mark.parametrize("version, keys", [("1.2.1", "lower_bound"), ("1.2", "lower_bound"), ("1.3.0rc7", "lower_bound"),
                                          ("1.3.0rc8", "upper_bound"), ("1.3", "upper_bound"), ("1.4.0rc4", "upper_bound")])
def test_trtllm_schedule_key_semantics_are_data_with_release_windows(version, keys):
    """llm_args.py read the keys as lower bounds with key 1 required, then as upper bounds (data/trtllm/draft_len_schedule.json)."""
    window = trt.semantics(version)
    assert window["keys"] == keys and window["key_1_required"] == (keys == "lower_bound")
    assert window["urls"] and "llm_args.py" in window["source"]


def test_trtllm_writes_and_reads_each_key_semantics():
    upper = trt.speculative_settings(SEGMENTS, 64, "1.4.0")
    assert upper["draft_len_schedule"] == {2: 3, 8: 2, 64: 1} and upper["draft_len_schedule_keys"] == "upper_bound"
    # a release reading lower bounds on the one-model path: keys are where each length starts, key 1 first
    lower_window = {**trt.semantics("1.2.1"), "eagle3_one_model": True}
    lower = trt.speculative_settings(SEGMENTS, 64, "1.2.1", window=lower_window)
    assert lower["draft_len_schedule"] == {1: 3, 3: 2, 9: 1} and lower["draft_len_schedule_keys"] == "lower_bound"
    for b in range(1, 65):
        want = max(draft_len_at(SEGMENTS, b), 1)
        assert trt.draft_len_at(upper["draft_len_schedule"], 3, b, "upper_bound") == want
        assert trt.draft_len_at(lower["draft_len_schedule"], 3, b, "lower_bound") == want


def test_trtllm_no_speculation_at_batch_one():
    out = trt.speculative_settings([Segment(1, None, 0)], max_batch_size=8, version="1.4.0")
    assert out["speculate"] is False


def test_vllm_entries_match_segments():
    out = vllm.speculative_settings(SEGMENTS, max_num_seqs=32)
    assert out["num_speculative_tokens"] == 3
    entries = out["num_speculative_tokens_per_batch_size"]
    assert entries[0][0] == 1 and entries == [[1, 2, 3], [3, 8, 2], [9, 32, 0]]
    for b in range(1, 33):
        assert vllm.draft_len_at(entries, 3, b) == draft_len_at(SEGMENTS, b)


def test_vllm_schedule_notes_that_data_parallelism_drops_it():
    """vLLM 0.32 falls back to num_speculative_tokens with --data-parallel-size > 1 (vllm/config/vllm.py)."""
    notes = vllm.speculative_settings(SEGMENTS, max_num_seqs=32)["notes"]
    assert any("--data-parallel-size" in n and "num_speculative_tokens=3" in n for n in notes)
    assert vllm.speculative_settings([Segment(1, None, 2)], 8)["notes"] == []  # no schedule, nothing dropped


def test_vllm_single_length_and_off():
    assert vllm.speculative_settings([Segment(1, None, 2)], 8)["num_speculative_tokens_per_batch_size"] is None
    assert vllm.speculative_settings([Segment(1, None, 0)], 8)["speculate"] is False


def test_sglang_takes_the_most_common_winner():
    out = sglang.speculative_settings({1: 3, 2: 2, 4: 2})
    assert out["draft_len"] == 2 and out["flags"][-1] == "3"  # num_draft_tokens = steps + 1 with top-k 1
    assert sglang.speculative_settings({1: 0, 4: 0})["speculate"] is False
