"""Prompt lookup replayed on a greedy output (``specconvert.reference.ngram``): the draft vLLM 0.32's proposer
makes, and what greedy verification accepts of it. Checked here by hand; against vLLM's own proposer function on
20,000 random sequences in ``make test-vllm`` (tests/vllm/test_vllm_ngram.py)."""

from __future__ import annotations

import pytest

from specconvert.reference.ngram import Replay, propose


def test_the_longest_suffix_with_an_earlier_occurrence_is_matched():
    # suffix [1, 2] occurs at 0 (followed by 3, 4) and [2] alone at 3 (followed by 9): the longer match wins
    assert propose([1, 2, 3, 4, 2, 9, 1, 2], 1, 3, 2) == [3, 4]


def test_the_earliest_of_equally_long_matches_is_taken():
    assert propose([5, 7, 5, 8, 5], 1, 2, 1) == [7]


def test_the_draft_stops_where_the_tokens_end_and_at_max_model_len():
    assert propose([1, 2, 1], 1, 3, 5) == [2, 1]  # the match at 0 is followed by two tokens only
    assert propose([1, 2, 3, 1, 2], 1, 3, 5, max_model_len=6) == [3]  # one token of context left


def test_no_draft_below_the_minimum_match():
    assert propose([1, 2, 3, 4, 3], 2, 3, 2) == []  # only [3] recurs: shorter than prompt_lookup_min
    assert propose([1, 2, 3, 4, 3], 1, 3, 2) == [4, 3]
    assert propose([7], 1, 3, 2) == []


def test_replay_counts_drafting_steps_and_accepted_positions():
    prompt = [10, 11, 12, 13, 14]
    output = [10, 11, 12, 99, 13, 14, 10]
    replay = Replay(k=3)
    replay.add(prompt, output, 1, 3)
    # out[0] is the prefill's. Then: [10] recurs at 0 -> draft 11 12 13, two accepted, 99 is the step's own token;
    # [99] never recurs -> no draft, one token (13); [13] recurs at 3 -> draft 14 10 11, two accepted, the output ends
    assert (replay.drafts, replay.accepted, replay.steps) == (2, 4, 3)
    assert replay.accepted_per_position == [2, 2, 0]
    assert replay.acceptance_length == pytest.approx(3.0)  # vLLM's counters' tau: drafting steps only
    assert replay.tokens_per_step == pytest.approx(6 / 3)  # the last step's bonus token lies past the output
    acc = replay.acceptance()
    assert acc.available and acc.per_position == pytest.approx([1.0, 1.0, 0.0]) and acc.requests == 1
