"""Verification of a draft tree against the target's logits (DESIGN §4).

Greedy: the longest root-to-node path whose every token equals the target's argmax
at its parent, plus the target's argmax after it (the bonus token).

Sampling: recursive rejection sampling over siblings with deterministic (top-k)
proposals: at a node, try its children in draft order; accept child ``x`` with
probability ``p(x)`` under the current residual ``p``; on rejection set ``p[x] = 0``
and renormalise. If every child is rejected (or the node is a leaf), the bonus
token is drawn from the residual. Each emitted token is then distributed exactly
as the (warped) target distribution: lossless.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .tree import DraftTree


@dataclass
class Verdict:
    path: torch.Tensor  # verify-block indices kept, ascending, starting with 0 (the root)
    tokens: list[int]  # accepted draft tokens then the bonus token
    accepted: int  # number of draft tokens accepted


def warp_logits(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    """transformers' order: temperature, then top-k, then top-p (keeping at least one token)."""
    logits = logits / temperature if temperature != 1.0 else logits.clone()
    vocab = logits.shape[-1]
    if 0 < top_k < vocab:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(logits, descending=False, dim=-1)
        cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1 - top_p)
        remove_sorted[..., -1:] = False
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def target_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float) -> torch.Tensor:
    return warp_logits(logits.double(), temperature, top_k, top_p).softmax(dim=-1)


def verify_greedy(tree: DraftTree, logits: torch.Tensor) -> Verdict:
    """Vectorised over nodes; the only loop is over tree depth."""
    best = logits.argmax(dim=-1)  # [T+1]
    if tree.size == 0:
        return Verdict(path=torch.zeros(1, dtype=torch.long), tokens=[int(best[0])], accepted=0)
    parent_v = tree.parents + 1  # parent's index in the verify block (root = 0)
    match = tree.tokens == best[parent_v]
    ok = torch.zeros(tree.size + 1, dtype=torch.bool)
    ok[0] = True
    for level in tree.levels:  # node indices per depth, shallow first
        ok[level + 1] = match[level] & ok[parent_v[level]]
    depth_v = torch.cat((torch.zeros(1, dtype=torch.long), tree.depths))
    score = torch.where(ok, depth_v, torch.full_like(depth_v, -1))
    last = int(score.argmax())
    path = tree.ancestors[last].nonzero().flatten()
    tokens = [int(t) for t in tree.tokens[path[1:] - 1]] + [int(best[last])]
    return Verdict(path=path, tokens=tokens, accepted=len(tokens) - 1)


def verify_sampling(
    tree: DraftTree,
    logits: torch.Tensor,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator,
    reject_rule: str = "residual",
) -> Verdict:
    """Recursive rejection sampling. ``reject_rule="keep"`` (no residual) exists only so
    tests can show the distribution test catches a wrong rule."""
    probs = target_probs(logits, temperature, top_k, top_p)  # [T+1, V] float64
    cur = 0
    path = [0]
    tokens: list[int] = []
    parent_v = tree.parents + 1
    while True:  # one iteration per depth; siblings are tried in draft-score order
        p = probs[cur].clone()
        accepted_child = -1
        for child in ((parent_v == cur).nonzero().flatten() + 1).tolist():
            x = int(tree.tokens[child - 1])
            total = float(p.sum())
            px = float(p[x]) / total if total > 0 else 0.0
            if float(torch.rand((), generator=generator, dtype=torch.float64)) < px:
                accepted_child = child
                break
            if reject_rule == "residual":
                p[x] = 0.0
        if accepted_child < 0:
            total = p.sum()
            if total <= 0:  # numerically exhausted: fall back to the unmodified target
                p = probs[cur]
            tok = int(torch.multinomial(p.float() / p.sum().float(), 1, generator=generator))
            tokens.append(tok)
            break
        path.append(accepted_child)
        tokens.append(int(tree.tokens[accepted_child - 1]))
        cur = accepted_child
    return Verdict(path=torch.tensor(path, dtype=torch.long), tokens=tokens, accepted=len(tokens) - 1)


def sample_token(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, generator: torch.Generator | None) -> int:
    """One token from the warped target distribution (temperature 0 = argmax)."""
    if temperature <= 0:
        return int(logits.argmax())
    p = target_probs(logits, temperature, top_k, top_p)
    return int(torch.multinomial(p.float(), 1, generator=generator))
