"""The oracle's verdict and the lossless diagnosis: pure functions, canned inputs."""

from __future__ import annotations

import pytest

from specconvert.serving import oracle
from specconvert.acceptance import from_counts, unavailable

TOL = oracle.OracleTolerance(acceptance_length=0.2, per_position=0.1)


def acc(tau_accepted: int, per_pos: list[int], drafts: int = 100):
    return from_counts("x", drafts=drafts, draft_tokens=3 * drafts, accepted_tokens=tau_accepted,
                       accepted_per_position=per_pos)


@pytest.mark.parametrize("engine, reference, passed, first_cause", [
    pytest.param(acc(150, [70, 50, 30]), acc(145, [68, 48, 29]), True, None, id="agree"),
    pytest.param(acc(10, [8, 2, 0]), acc(150, [70, 50, 30]), False, "d2t", id="engine-accepts-nothing"),
    pytest.param(acc(90, [50, 30, 10]), acc(150, [70, 50, 30]), False, "aux_layers", id="engine-accepts-less"),
    pytest.param(acc(150, [70, 50, 30]), acc(100, [50, 30, 20]), False, "template", id="engine-accepts-more"),
    pytest.param(acc(150, [85, 35, 30]), acc(150, [70, 50, 30]), False, "aux_layers", id="same-tau-other-positions"),
])
def test_compare(engine, reference, passed, first_cause):
    verdict = oracle.compare(engine, reference, TOL)
    assert verdict["passed"] is passed
    assert (verdict["causes"][0] if verdict["causes"] else None) == first_cause
    if not passed:
        assert "Likely causes" in verdict["message"]


def test_compare_without_engine_numbers_fails_and_says_so():
    verdict = oracle.compare(unavailable("vllm counters", "GET /metrics did not answer"), acc(150, [70, 50, 30]), TOL)
    assert verdict["passed"] is False and verdict["status"] == "unavailable"
    assert "GET /metrics did not answer" in verdict["message"]


CHAT = {"content": [
    {"token": "A", "logprob": -0.1, "top_logprobs": [{"token": "A", "logprob": -0.1}]},
    {"token": "token_id:42", "logprob": -0.70, "top_logprobs": [
        {"token": "token_id:7", "logprob": -0.72}, {"token": "token_id:42", "logprob": -0.70},
        {"token": "token_id:9", "logprob": -3.0}]},
]}
COMPLETIONS = {"tokens": ["A", " b"], "top_logprobs": [{"A": -0.1}, {" b": -0.2, " c": -1.5}]}


@pytest.mark.parametrize("logprobs, index, expected", [
    pytest.param(CHAT, 1, [("token_id:42", -0.70), ("token_id:7", -0.72), ("token_id:9", -3.0)], id="chat-sorted"),
    pytest.param(COMPLETIONS, 1, [(" b", -0.2), (" c", -1.5)], id="completions"),
    pytest.param(CHAT, 5, None, id="past-the-end"),
    pytest.param(None, 0, None, id="no-logprobs"),
    pytest.param({"content": None, "top_logprobs": None}, 0, None, id="nulls"),
])
def test_top_logprobs_at(logprobs, index, expected):
    assert oracle.top_logprobs_at(logprobs, index) == expected


@pytest.mark.parametrize("tops, spec_token, tie_margin, margin, kind", [
    pytest.param([("token_id:42", -0.70), ("token_id:7", -0.72)], 7, 0.05, 0.02, "tie", id="near-tie-by-id"),
    pytest.param([("token_id:42", -0.10), ("token_id:7", -2.10)], 7, 0.05, 2.0, "divergence", id="real-by-id"),
    pytest.param([(" b", -0.2), (" c", -0.21)], " c", 0.05, 0.01, "tie", id="near-tie-by-text"),
    # Not listed: 0.01 is only a lower bound on the lead, below the tie margin, so nothing decides it.
    pytest.param([("token_id:42", -0.1), ("token_id:7", -0.11)], 999, 0.05, 0.01, "unknown",
                 id="speculative-token-not-listed-lower-bound-below-margin"),
    pytest.param([("token_id:42", -0.1), ("token_id:7", -2.1)], 999, 0.05, 2.0, "divergence",
                 id="speculative-token-not-listed-lower-bound-above-margin"),
    # The probe's own best is the speculative token: the baseline itself flipped between two runs.
    pytest.param([("token_id:7", -0.70), ("token_id:42", -0.72)], 7, 0.05, 0.0, "tie", id="baseline-flipped"),
    pytest.param([("token_id:42", -0.70), ("token_id:7", -0.72)], 7, 0.0, 0.02, "divergence", id="zero-threshold"),
])
def test_divergence_margin_and_class(tops, spec_token, tie_margin, margin, kind):
    got = oracle.divergence_margin(tops, spec_token)
    assert got["margin"] == pytest.approx(margin)
    assert oracle.classify_divergence(got, tie_margin) == kind


def test_unknown_without_logprobs():
    assert oracle.classify_divergence(None, 0.05) == "unknown"


def test_a_single_listed_token_is_unknown_not_a_divergence():
    """Issue 20 item 1: one top entry says nothing about the speculative token (margin None): never 'divergence'."""
    got = oracle.divergence_margin([("token_id:42", -0.1)], 7)
    assert got["margin"] is None and "only its best token" in got["note"]
    assert oracle.classify_divergence(got, 0.05) == "unknown"
    chat_one = {"content": [{"token": "token_id:42", "logprob": -0.1}]}  # no top_logprobs: the chosen token only
    assert oracle.diagnose(chat_one, 0, 7, 0.05)["class"] == "unknown"


def test_diagnose_reads_vllm_token_id_spelling():
    got = oracle.diagnose(CHAT, 1, 7, 0.05)
    assert got["class"] == "tie" and got["token_index"] == 1
    assert got["top_logprobs"][0] == ["token_id:42", -0.7]
    assert oracle.diagnose({"content": []}, 0, 7, 0.05)["class"] == "unknown"


def test_files_that_depart_from_the_head_fail_even_when_tau_agrees():
    """The aux list one layer early moved the overfit head's tau by only 0.16 in one CI run: within tolerance."""
    found = [{"cause": "aux_layers", "detail": "config.json: eagle_aux_hidden_state_layer_ids [1, 15, 26], expected [2, 16, 27]"}]
    verdict = oracle.compare(acc(285, [97, 95, 93]), acc(295, [99, 98, 96]), oracle.OracleTolerance(0.2, 0.1), found)
    assert not verdict["passed"] and verdict["caught_by"] == ["engine files"]
    assert verdict["causes"][0] == "aux_layers" and "found in the engine's files" in verdict["message"]
    clean = oracle.compare(acc(285, [97, 95, 93]), acc(295, [99, 98, 96]), oracle.OracleTolerance(0.2, 0.1), [])
    assert clean["passed"] and clean["caught_by"] == []


@pytest.mark.parametrize("engine_pos, reference_pos, status, note", [
    # Issue 20 item 2: lists of different lengths are an error, never cut by zip.
    pytest.param([70, 50, 30], [70, 50], "mismatch", None, id="engine-drafted-a-position-the-reference-did-not"),
    pytest.param([70, 50], [70, 50, 30], "mismatch", None, id="reference-longer"),
    # vLLM counts num_speculative_tokens positions; a schedule drafting 2 at batch 1 leaves the third at 0.
    pytest.param([70, 50, 0], [70, 50], "agrees", "drafted nothing at this batch size", id="trailing-undrafted"),
])
def test_per_position_lists_must_cover_the_same_positions(engine_pos, reference_pos, status, note):
    engine = from_counts("x", drafts=100, draft_tokens=300, accepted_tokens=150, accepted_per_position=engine_pos)
    reference = from_counts("x", drafts=100, draft_tokens=200, accepted_tokens=150, accepted_per_position=reference_pos)
    verdict = oracle.compare(engine, reference, TOL)
    assert verdict["status"] == status
    if status == "mismatch":
        assert verdict["passed"] is False and "did not decode the same setting" in verdict["message"]
    else:
        assert verdict["passed"] and note in verdict["message"] and len(verdict["per_position_delta"]) == 2


def test_parameters_and_footprint_come_from_the_config_alone():
    from specconvert.models.size import parameter_count

    from .test_oracle_setting import LLAMA_8B

    assert parameter_count(LLAMA_8B) == pytest.approx(8.03e9, rel=0.005)  # Llama-3.1-8B: 8,030,261,248
    assert parameter_count({"hidden_size": 64}) is None
    fp = oracle.estimate(LLAMA_8B, 0, 2, "bfloat16", "cuda", prompts=8, max_tokens=64, depth=3)
    assert 15 < fp.need_gib < 17 and fp.tokens == 512 and fp.forwards == 8 * 65
    assert oracle.estimate(LLAMA_8B, 0, 4, "float32", "cpu", 8, 64, 3).need_gib > 30
