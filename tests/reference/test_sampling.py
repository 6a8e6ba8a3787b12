"""Sampling is lossless: emitted tokens follow the (warped) target distribution."""

from __future__ import annotations

import pytest
import torch

from specconvert.reference import DecodeSettings, DraftTree
from specconvert.reference.acceptance import verify_sampling, warp_logits

N = 10000
TV_BOUND = 0.03  # sampling noise for these sizes is ~0.008; the wrong rule below is off by ~0.18


def _tv(samples: torch.Tensor, p: torch.Tensor) -> float:
    emp = torch.bincount(samples, minlength=p.numel()).double() / samples.numel()
    return 0.5 * float((emp - p).abs().sum())


def _setup():
    # Root's children: tokens 0 and 1 (the draft's top-2); node(0)'s children: tokens 2 and 3.
    tree = DraftTree.build(torch.tensor([0, 1, 2, 3]), torch.tensor([-1, -1, 0, 0]), torch.tensor([1, 1, 2, 2]))
    p_root = torch.tensor([0.40, 0.25, 0.15, 0.10, 0.06, 0.04], dtype=torch.float64)
    p_node0 = torch.tensor([0.05, 0.05, 0.10, 0.50, 0.20, 0.10], dtype=torch.float64)
    p_other = torch.full((6,), 1 / 6, dtype=torch.float64)
    logits = torch.stack([p_root, p_node0, p_other, p_other, p_other]).log().float()
    return tree, logits, p_root, p_node0


def _draw(rule: str):
    tree, logits, _, _ = _setup()
    gen = torch.Generator().manual_seed(0)
    firsts, seconds = [], []
    for _ in range(N):
        v = verify_sampling(tree, logits, 1.0, 0, 1.0, gen, reject_rule=rule)
        firsts.append(v.tokens[0])
        if v.tokens[0] == 0 and len(v.tokens) > 1:
            seconds.append(v.tokens[1])
    return torch.tensor(firsts), torch.tensor(seconds)


def test_rejection_sampling_is_lossless():
    _, _, p_root, p_node0 = _setup()
    firsts, seconds = _draw("residual")
    assert _tv(firsts, p_root) < TV_BOUND
    assert seconds.numel() > 0.3 * N
    assert _tv(seconds, p_node0) < TV_BOUND  # after accepting token 0, the next token ~ p(. | 0)


def test_sanity_a_wrong_rule_fails_the_same_bound():
    """Without zeroing rejected tokens (no residual), draft tokens are over-sampled."""
    _, _, p_root, _ = _setup()
    firsts, _ = _draw("keep")
    assert _tv(firsts, p_root) > TV_BOUND


@pytest.mark.parametrize(("temperature", "top_k", "top_p"), [(0.7, 0, 1.0), (1.3, 5, 1.0), (1.0, 0, 0.8), (0.9, 20, 0.9)])
def test_warping_matches_transformers(temperature, top_k, top_p):
    from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1)) * 3
    ref = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        ref = TopKLogitsWarper(top_k)(None, ref)
    if top_p < 1:
        ref = TopPLogitsWarper(top_p)(None, ref)
    got = warp_logits(logits, temperature, top_k, top_p)
    assert torch.equal(torch.isinf(got), torch.isinf(ref))
    torch.testing.assert_close(got.softmax(-1), ref.softmax(-1))


@pytest.mark.slow
def test_decoder_sampling_distribution_matches_target(oracle_dec):
    """End to end on the tiny target: the second token (the first one decided by tree
    verification) follows the target's next-token distribution given the first."""
    prompt = [50, 60, 70]
    target = oracle_dec.target
    settings = DecodeSettings(tree=dict(top_k=3, depth=2, total_tokens=7), temperature=1.5, top_k=3)
    counts: dict[int, list[int]] = {}
    for seed in range(450):
        settings.seed = seed
        toks = oracle_dec.generate(prompt, 2, settings).token_ids
        counts.setdefault(toks[0], []).append(toks[1])
    first, seconds = max(counts.items(), key=lambda kv: len(kv[1]))
    assert len(seconds) > 150
    target.reset()
    logits = target.forward(torch.tensor(prompt + [first]), torch.arange(4), logits_to_keep=1).logits[-1]
    p = warp_logits(logits.double(), 1.5, 3, 1.0).softmax(-1)
    assert _tv(torch.tensor(seconds), p) < 0.1  # 3 categories, >150 samples: noise ~0.04


def test_seeded_sampling_is_reproducible_and_top1_is_greedy(eagle_dec):
    prompt = [9, 8, 7, 6]
    s = DecodeSettings(max_draft_len=3, temperature=0.8, top_p=0.9, seed=123)
    a = eagle_dec.generate(prompt, 16, s).token_ids
    assert a == eagle_dec.generate(prompt, 16, s).token_ids
    greedy = eagle_dec.generate(prompt, 16, DecodeSettings(max_draft_len=3)).token_ids
    top1 = eagle_dec.generate(prompt, 16, DecodeSettings(max_draft_len=3, temperature=1.0, top_k=1, seed=5)).token_ids
    assert top1 == greedy
