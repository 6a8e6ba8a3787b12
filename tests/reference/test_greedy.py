"""Greedy speculative decoding is token-for-token transformers' greedy ``generate``."""

from __future__ import annotations

import pytest
import torch

from specconvert.reference import DecodeSettings

from .conftest import EOS, MAX_POS, hf_greedy

SETTINGS = {
    "chain3": DecodeSettings(max_draft_len=3, stop_token_ids=(EOS,)),
    "chain1": DecodeSettings(max_draft_len=1, stop_token_ids=(EOS,)),
    "tree": DecodeSettings(tree=dict(top_k=3, depth=4, total_tokens=12), stop_token_ids=(EOS,)),
    "wide": DecodeSettings(tree=dict(top_k=4, depth=3, total_tokens=20), stop_token_ids=(EOS,)),
}


def _prompts(n=22, seed=0):
    g = torch.Generator().manual_seed(seed)
    prompts = [[int(torch.randint(3, 256, (1,), generator=g))]]  # one-token prompt
    prompts.append(torch.randint(3, 256, (MAX_POS - 10,), generator=g).tolist())  # near the context limit
    while len(prompts) < n:
        length = int(torch.randint(2, 40, (1,), generator=g))
        prompts.append(torch.randint(3, 256, (length,), generator=g).tolist())
    return prompts


PROMPTS = _prompts()


@pytest.fixture(scope="module")
def expected(eagle_dec):
    model = eagle_dec.target.model
    return [hf_greedy(model, p, 10 if len(p) > MAX_POS - 20 else 24) for p in PROMPTS]


def _max_new(prompt):
    return 10 if len(prompt) > MAX_POS - 20 else 24


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_random_head_matches_generate(eagle_dec, expected, name):
    for prompt, ref in zip(PROMPTS, expected):
        res = eagle_dec.generate(prompt, _max_new(prompt), SETTINGS[name])
        assert res.token_ids == ref, f"prompt of {len(prompt)} tokens diverged"


@pytest.mark.parametrize("name", ["chain3", "tree"])
def test_oracle_matches_generate(oracle_dec, expected, name):
    for prompt, ref in zip(PROMPTS, expected):
        assert oracle_dec.generate(prompt, _max_new(prompt), SETTINGS[name]).token_ids == ref


@pytest.mark.parametrize("name", ["chain3", "tree", "wide"])
def test_partly_wrong_oracle_matches_generate(oracle_dec, expected, name):
    """Wrong tokens at varying depths: partial acceptance and non-contiguous cache gathers."""
    oracle_dec._oracle.corrupt_every = 3
    try:
        seen = set()
        for prompt, ref in zip(PROMPTS[:8], expected[:8]):
            res = oracle_dec.generate(prompt, _max_new(prompt), SETTINGS[name])
            assert res.token_ids == ref
            seen.update(res.accepted_per_step)
        assert len(seen) >= 2  # both full and partial acceptance happened
    finally:
        oracle_dec._oracle.corrupt_every = 0


def test_baseline_matches_generate(eagle_dec, expected):
    base = DecodeSettings(speculative=False, stop_token_ids=(EOS,))
    for prompt, ref in zip(PROMPTS, expected):
        res = eagle_dec.generate(prompt, _max_new(prompt), base)
        assert res.token_ids == ref and res.accepted_per_step == []


@pytest.mark.parametrize(("settings", "depth"), [
    (DecodeSettings(max_draft_len=3), 3),
    (DecodeSettings(max_draft_len=5), 5),
    (DecodeSettings(tree=dict(top_k=3, depth=4, total_tokens=16)), 4),
])
def test_oracle_reaches_max_acceptance(oracle_dec, settings, depth):
    res = oracle_dec.generate(PROMPTS[3], 1 + 6 * (depth + 1), settings)
    assert res.accepted_per_step == [depth] * 6
    assert res.acceptance_length == depth + 1
    assert res.per_position_acceptance == [1.0] * depth
    assert res.steps == 6 and len(res.token_ids) == 1 + 6 * (depth + 1)


def test_random_head_accepts_little(eagle_dec):
    res = eagle_dec.generate(PROMPTS[4], 24, SETTINGS["chain3"])
    assert res.acceptance_length < 1.5
    assert len(res.per_position_acceptance) == 3


def test_max_tokens_and_stop_tokens(oracle_dec, expected):
    prompt, ref = PROMPTS[5], expected[5]
    for n in (1, 2, 5, 7):
        assert oracle_dec.generate(prompt, n, SETTINGS["chain3"]).token_ids == ref[:n]
    stop = ref[6]
    first = ref.index(stop)
    res = oracle_dec.generate(prompt, 24, DecodeSettings(max_draft_len=3, stop_token_ids=(stop,)))
    assert res.token_ids == ref[: first + 1] and res.finish_reason == "stop"


def test_stream_steps_add_up(oracle_dec, expected):
    steps = list(oracle_dec.stream(PROMPTS[6], 24, SETTINGS["chain3"]))
    assert steps[0].kind == "prefill" and len(steps[0].token_ids) == 1
    assert [t for s in steps for t in s.token_ids] == expected[6]
    assert all(len(s.token_ids) <= s.accepted + 1 for s in steps[1:])
    assert all(s.verify_time_s > 0 for s in steps)
