"""A tuned draft shape in SGLang's own flags.

SGLang 0.5.23 has no batch-size schedule: one `--speculative-num-steps` for every batch
(`--speculative-adaptive` adapts on a moving average of acceptance instead, top-k 1).
With `--speculative-eagle-topk 1` it forces `--speculative-num-draft-tokens` to steps + 1
(DESIGN §3). So the tuned bundle gets the draft length that wins at the most measured
concurrency levels (ties go to the lower concurrency), and no speculative flags when
that length is 0.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Mapping


def speculative_settings(choice: Mapping[int, int]) -> dict[str, Any]:
    """``{"speculate", "flags": [...], "draft_len", "notes"}`` from per-concurrency choices."""
    counts = Counter(choice.values())
    best = max(counts.values())
    k = next(choice[b] for b in sorted(choice) if counts[choice[b]] == best)
    notes = []
    if len(counts) > 1:
        notes.append("SGLang has no batch-size schedule: draft length "
                     f"{k} won at {best} of {len(choice)} measured concurrency levels")
    if k == 0:
        return {"speculate": False, "flags": [], "draft_len": 0,
                "notes": notes + ["speculation does not pay here: serve the target alone"]}
    flags = ["--speculative-algorithm", "EAGLE3", "--speculative-num-steps", str(k),
             "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", str(k + 1)]
    return {"speculate": True, "flags": flags, "draft_len": k, "notes": notes}
