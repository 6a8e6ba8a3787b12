"""Draft-vocabulary calibration: which target tokens the head can propose.

The head's ``lm_head`` covers ``draft_vocab_size`` target tokens; ``d2t[i]`` is the
offset from draft id ``i`` to its target id (``target = i + d2t[i]``), the convention
Model Optimizer, EAGLE and TensorRT-LLM share. We keep the tokens the target
predicts most often where the loss is taken (then the rest of the training text,
then the lowest ids), sorted by target id so ``d2t`` is non-decreasing.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass
class DraftVocab:
    used: list[int]  # target ids, ascending; draft id i <-> used[i]
    coverage: float  # share of trained target tokens the draft vocabulary holds
    distinct_trained: int  # distinct target tokens at trained positions

    @property
    def d2t(self) -> list[int]:
        return [target - i for i, target in enumerate(self.used)]

    def as_dict(self) -> dict[str, Any]:
        return {"size": len(self.used), "coverage": round(self.coverage, 4), "distinct_trained_tokens": self.distinct_trained}


def calibrate(sequences: Sequence[Any], target_vocab: int, draft_vocab: int, always: Sequence[int] = ()) -> DraftVocab:
    """Pick ``draft_vocab`` target ids from the training sequences (see module doc)."""
    if draft_vocab > target_vocab:
        raise ValueError(f"draft vocabulary {draft_vocab} is larger than the target's {target_vocab}")
    trained: Counter[int] = Counter()
    seen: Counter[int] = Counter()
    for seq in sequences:
        ids = seq.input_ids
        for j, m in enumerate(seq.loss_mask):
            if m and j + 1 < len(ids):
                trained[ids[j + 1]] += 1
        seen.update(ids)
    chosen: list[int] = []
    taken: set[int] = set()

    def take(token: int) -> None:
        if len(chosen) < draft_vocab and 0 <= token < target_vocab and token not in taken:
            taken.add(token)
            chosen.append(token)

    for token in always:
        take(int(token))
    for token, _ in sorted(trained.items(), key=lambda kv: (-kv[1], kv[0])):
        take(token)
    for token, _ in sorted(seen.items(), key=lambda kv: (-kv[1], kv[0])):
        take(token)
    token = 0
    while len(chosen) < draft_vocab:
        take(token)
        token += 1
    used = sorted(chosen)
    total = sum(trained.values())
    covered = sum(count for token, count in trained.items() if token in taken)
    return DraftVocab(used, covered / total if total else 1.0, len(trained))


def check_d2t(d2t: Sequence[int], target_vocab: int) -> list[str]:
    """Problems with a ``d2t`` table (empty when it is valid)."""
    problems = []
    targets = [i + off for i, off in enumerate(d2t)]
    if any(t < 0 or t >= target_vocab for t in targets):
        problems.append("maps outside the target vocabulary")
    if any(b <= a for a, b in zip(targets, targets[1:])):
        problems.append("target ids are not strictly increasing")
    return problems
