"""Metric arithmetic on scripted records: every expected value is worked out by hand."""

from __future__ import annotations

import pytest

from specconvert.bench import metrics as M
from specconvert.bench.loadgen import apportion


def record(times, sizes, e2e, index=0, send=0.0, overhead=0.0):
    chunks = [M.Chunk(t, n) for t, n in zip(times, sizes)]
    return M.RequestRecord(index=index, chunks=chunks, e2e_s=e2e, send_time=send, output_tokens=sum(sizes),
                           client_overhead_s=overhead, events=len(sizes))


def test_percentile_interpolates_between_closest_ranks():
    data = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert M.percentile(data, 50) == 3.0
    assert M.percentile(data, 90) == pytest.approx(4.0 + 0.6 * 6.0)  # pos 3.6
    assert M.percentile(data, 99) == pytest.approx(4.0 + 0.96 * 6.0)  # pos 3.96
    assert M.percentile([7.0], 99) == 7.0
    assert M.percentile([], 50) is None
    assert M.percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5  # unsorted input


def test_ttft_tpot_and_itl_divide_each_gap_by_the_tokens_in_its_chunk():
    # first token at 100 ms, then chunks of 3, 3 and 2 tokens at 160, 220, 300 ms; stream ends at 310 ms.
    rec = record([0.100, 0.160, 0.220, 0.300], [1, 3, 3, 2], e2e=0.310)
    assert M.ttft(rec) == pytest.approx(0.100)
    assert rec.output_tokens == 9
    assert M.tpot(rec) == pytest.approx((0.310 - 0.100) / 8)
    assert M.itl_samples(rec) == pytest.approx([0.060 / 3, 0.060 / 3, 0.080 / 2])


def test_tpot_is_undefined_for_a_single_token():
    assert M.tpot(record([0.05], [1], e2e=0.06)) is None


def test_run_summary_throughputs_and_distributions():
    recs = [record([0.1, 0.2], [1, 3], e2e=0.25, index=0, send=10.0),
            record([0.2, 0.4], [1, 1], e2e=0.5, index=1, send=10.0),
            M.RequestRecord(index=2, error="HTTP 500: boom")]
    s = M.summarize_run(recs, duration_s=2.0)
    assert (s["requests"], s["succeeded"], s["failed"]) == (3, 2, 1)
    assert s["output_tokens"] == 6
    assert s["output_tokens_per_s"] == pytest.approx(3.0)
    assert s["requests_per_s"] == pytest.approx(1.0)
    assert s["ttft_s"]["mean"] == pytest.approx(0.15)
    assert s["ttft_s"]["p50"] == pytest.approx(0.15)
    assert s["e2e_s"]["max"] == pytest.approx(0.5)
    assert s["tpot_s"]["count"] == 2
    assert s["tpot_s"]["mean"] == pytest.approx(((0.25 - 0.1) / 3 + (0.5 - 0.2) / 1) / 2)
    assert s["output_tokens_per_s_per_user"]["mean"] == pytest.approx((4 / 0.25 + 2 / 0.5) / 2)
    assert s["itl_s"]["count"] == 2
    assert sorted([s["itl_s"]["min"], s["itl_s"]["max"]]) == pytest.approx([0.1 / 3, 0.2])
    assert s["tokens_per_chunk"]["mean"] == pytest.approx(2.0)  # decode chunks: 3 and 1


def test_run_duration_defaults_to_first_send_to_last_completion():
    recs = [record([0.1], [1], e2e=1.0, send=5.0), record([0.1], [1], e2e=0.5, send=5.8)]
    assert M.summarize_run(recs)["duration_s"] == pytest.approx(1.3)


def test_client_overhead_shares():
    rec = record([0.1, 0.2, 0.3], [1, 2, 2], e2e=0.4, overhead=0.0003)
    over = M.client_overhead([rec])
    assert over["per_event_s"] == pytest.approx(0.0001)
    assert over["fraction_of_e2e"] == pytest.approx(0.0003 / 0.4)
    assert over["fraction_of_mean_itl"] == pytest.approx(0.0001 / 0.05)


def test_acceptance_from_reference_server_blocks_is_exact_per_position():
    items = [
        {"specconvert": {"speculative": True, "accepted_per_step": [3, 0, 1], "drafted_depth_per_step": [3, 3, 3]}},
        {"specconvert": {"speculative": True, "accepted_per_step": [2], "drafted_depth_per_step": [2]}},
        {"specconvert": {"speculative": False, "accepted_per_step": [9], "drafted_depth_per_step": [9]}},  # baseline
    ]
    acc = M.acceptance_from_server(items)
    assert acc["estimate"] is False and acc["source"] == "server"
    assert acc["steps"] == 4
    assert acc["acceptance_length"] == pytest.approx((4 + 1 + 2 + 3) / 4)
    assert acc["acceptance_rate"] is None  # the items carry no drafted totals (TensorRT-LLM's block is absent)
    # position 1: accepted in 3 of 4 steps; 2: steps 3,2 of 4 (a>1: 3, 2) -> 2/4; 3: tried by the 3 depth-3 steps, a>2 once.
    assert acc["per_position"] == pytest.approx([3 / 4, 2 / 4, 1 / 3], abs=1e-4)  # serve rounds to 4 places


def test_acceptance_from_trtllm_totals_is_an_exact_rate_and_an_estimated_length():
    items = [{"request_id": 1, "perf_metrics": {"first_iter": 10, "last_iter": 15, "speculative_decoding": {
        "acceptance_rate": 0.5, "total_accepted_draft_tokens": 6, "total_draft_tokens": 12}}}]
    acc = M.acceptance_from_server(items, max_draft_len=3)
    assert acc["acceptance_length"] == pytest.approx(1 + 6 / 4)  # 12 drafted / 3 per step = 4 steps
    assert acc["acceptance_rate"] == pytest.approx(0.5)
    assert acc["per_position"] is None
    assert acc["estimate"] is True and "assuming 3 draft tokens per step" in acc["note"]
    # --url without a recipe: no max_draft_len, so the steps are the request's decode iterations (15 - 10).
    acc = M.acceptance_from_server(items)
    assert acc["acceptance_length"] == pytest.approx(1 + 6 / 5)
    assert "last_iter - first_iter" in acc["note"]
    assert M.acceptance_from_server([{"request_id": 2, "perf_metrics": {}}]) is None


def test_acceptance_estimate_from_chunks_is_labelled():
    acc = M.acceptance_from_chunks([record([0.1, 0.2, 0.3], [1, 4, 2], e2e=0.3)])
    assert acc["estimate"] is True and acc["source"] == "tokens_per_chunk"
    assert acc["acceptance_length"] == pytest.approx(3.0)
    assert "estimate" in acc["note"]


def test_ratio_summary_and_pair_orientation():
    base = {"output_tokens_per_s": 100.0, "e2e_s": {"mean": 2.0}, "tpot_s": {"mean": 0.02}, "ttft_s": {"mean": 0.1}}
    fast = {"output_tokens_per_s": 250.0, "e2e_s": {"mean": 1.0}, "tpot_s": {"mean": 0.008}, "ttft_s": {"mean": 0.1}}
    ratios = M.pair_ratios(base, fast)
    assert ratios["output_tokens_per_s"] == pytest.approx(2.5)
    assert ratios["e2e_mean"] == pytest.approx(2.0)
    assert ratios["tpot_mean"] == pytest.approx(2.5)
    summary = M.ratio_summary([1.2, 1.5, 1.4], seed=0)
    assert summary["median"] == pytest.approx(1.4)
    assert (summary["min"], summary["max"], summary["pairs"]) == (1.2, 1.5, 3)
    low, high = summary["ci95"]
    assert 1.2 <= low <= 1.4 <= high <= 1.5
    assert M.ratio_summary([])["median"] is None


def test_apportion_spreads_usage_over_chunks_by_text_length():
    assert apportion(10, [1, 1, 1, 1]) == [3, 3, 2, 2]  # 1 each, then 6 by equal weight, ties to the first
    assert apportion(7, [1, 3, 3]) == [1, 3, 3]
    assert apportion(2, [5, 5, 5]) == [1, 1, 0]
    assert sum(apportion(13, [2, 7, 1, 9])) == 13
