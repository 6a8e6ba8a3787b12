"""The arithmetic of tuning: predicted tokens/s per draft length, and the choice of a schedule.

Pure functions of measured numbers, tested without a model (STYLE: "a new stage is a unit").

The model. A linear EAGLE-3 chain of length k proposes the same first k tokens whatever
the longest chain is (greedy drafting is a prefix), so with ``p[i]`` = the share of steps
whose position i was accepted (measured once, on the longest chain K),

    tokens per step  E(k) = 1 + p[0] + ... + p[k-1]

and with ``T(k, b)`` = the wall time of one engine step drafting k tokens at concurrency b
(measured), each request advances ``E(k) / T(k, b)`` tokens/s and the engine
``b * E(k) / T(k, b)``. k = 0 is plain decoding: E(0) = 1.

The choice. Per concurrency level the best k wins only by a margin over a shorter one
(the measurement noise on a shared machine is a few percent), and the schedule written
into an engine is made monotone in batch size and free of one-level islands, so an
engine that picks K per step from the instantaneous batch size does not flap between
draft lengths at a boundary (the threshold thrash users report, vLLM #49548).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from ..draft_schedule import Segment


def tokens_per_step(per_position: Sequence[float | None], k: int) -> float:
    """E(k) = 1 + sum of the first k per-position acceptance rates (missing rates count as 0)."""
    if k < 0:
        raise ValueError("draft length must be >= 0")
    if k > len(per_position):
        raise ValueError(f"per-position acceptance was measured for {len(per_position)} positions, not {k}")
    return 1.0 + sum(float(p or 0.0) for p in per_position[:k])


def interpolate_step_costs(plain_s: float, full_s: float, max_k: int) -> dict[int, float]:
    """T(k) for k = 0..max_k when only T(0) and T(max_k) were measured: linear in k.

    A verify of k+1 tokens plus k draft forwards grows about linearly in k on a
    memory-bound step (DESIGN §5: 1/4/16 tokens cost 87/136/154 ms on this CPU).
    """
    if max_k < 1:
        raise ValueError("max_k must be >= 1")
    return {k: plain_s + (full_s - plain_s) * k / max_k for k in range(max_k + 1)}


@dataclass(frozen=True)
class Prediction:
    concurrency: int
    draft_len: int
    tokens_per_step: float
    step_s: float
    tokens_per_second: float  # whole engine, all concurrent requests

    def as_dict(self) -> dict[str, float | int]:
        return {"concurrency": self.concurrency, "draft_len": self.draft_len,
                "tokens_per_step": round(self.tokens_per_step, 4), "step_s": round(self.step_s, 6),
                "tokens_per_second": round(self.tokens_per_second, 3)}


def predict(per_position: Sequence[float | None], step_s: Mapping[tuple[int, int], float],
            requests_per_step: Mapping[int, float] | None = None) -> list[Prediction]:
    """Predicted engine tokens/s for every measured (draft_len, concurrency) step cost.

    ``step_s[(k, b)]`` is one engine step's wall time. ``requests_per_step[b]`` is how many
    requests one step advances at concurrency b: b for a batching engine (the default),
    1 for one that serves requests one at a time (the reference server).
    """
    out = []
    for (k, b), t in sorted(step_s.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        if t <= 0:
            raise ValueError(f"step time for draft length {k} at concurrency {b} must be > 0")
        e = tokens_per_step(per_position, k)
        n = (requests_per_step or {}).get(b, b)
        out.append(Prediction(b, k, e, t, n * e / t))
    return out


def best_per_level(rates: Mapping[tuple[int, int], float], margin: float = 0.03) -> dict[int, int]:
    """Per concurrency level, the draft length to use given tokens/s per (draft_len, concurrency).

    Shorter wins ties: a longer draft must beat the best shorter one by ``margin``
    (relative) to be chosen, since on a shared machine smaller gaps are noise, and a
    shorter draft costs less when the workload's acceptance is lower than measured.
    """
    levels = sorted({b for _, b in rates})
    choice: dict[int, int] = {}
    for b in levels:
        ks = sorted(k for k, lb in rates if lb == b)
        best = ks[0]
        for i, k in enumerate(ks[1:], 1):
            # every shorter length, chosen or not: {0: 100, 1: 102.9, 2: 103.1} keeps 0, since 2 is
            # within the margin of 1 (a rule against the current best alone would take 2)
            best_shorter = max(rates[(j, b)] for j in ks[:i])
            if rates[(k, b)] > best_shorter * (1 + margin):
                best = k
        choice[b] = best
    return choice


def vllm_choice(choice: Mapping[int, int], rates: Mapping[tuple[int, int], float], idle: Mapping[int, float],
                margin: float) -> dict[int, int]:
    """vLLM's own per-level choice: a 0 inside its schedule still runs the drafter (``idle``: measured tokens/s of
    that server), so where plain decoding won, the schedule takes the best of that idle 0 and every chain length.
    Where plain decoding wins at every level the bundle serves the target alone, a true 0."""
    if not idle or all(k == 0 for k in choice.values()):
        return dict(choice)
    out = {}
    for b, k in choice.items():
        if k != 0 or b not in idle:
            out[b] = k
            continue
        options = {(0, b): idle[b], **{(kk, bb): r for (kk, bb), r in rates.items() if bb == b and kk > 0}}
        out[b] = best_per_level(options, margin)[b]
    return out


def schedule(choice: Mapping[int, int]) -> list[Segment]:
    """Batch-size segments from per-level choices, smoothed against thrash.

    - Monotone: the draft length never grows with the batch size (a larger batch makes
      the target more compute-bound, so a longer draft paying there but not below is
      measurement noise); a later level asking for more keeps the previous length.
      This also rules out islands, where an engine would flap K up and down as the
      batch crosses two nearby boundaries.
    - Boundaries sit half-way (geometric mean) between measured levels, so a switch
      happens only once the batch is well past the level where the other length won.
    The last segment is unbounded. Levels must include 1 (every engine starts at batch 1).
    """
    levels = sorted(choice)
    if not levels or levels[0] != 1:
        raise ValueError("tuning needs concurrency 1 among the measured levels")
    ks = [choice[b] for b in levels]
    for i in range(1, len(ks)):
        ks[i] = min(ks[i], ks[i - 1])
    segments: list[Segment] = []
    start = 1
    for i, (b, k) in enumerate(zip(levels, ks)):
        if i + 1 < len(levels) and ks[i + 1] == k:
            continue
        end = None
        if i + 1 < len(levels):
            nxt = levels[i + 1]
            end = min(max(b, int((b * nxt) ** 0.5)), nxt - 1)
        segments.append(Segment(start, end, k))
        if end is not None:
            start = end + 1
    return segments
