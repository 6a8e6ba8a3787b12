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


def ngram_flags(draft_len: int, ngram: Any) -> list[str]:
    """SGLang's n-gram speculation (no head), the free arm of `bench.baselines`.

    ``--speculative-algorithm NGRAM`` with ``--speculative-num-draft-tokens`` (the drafted tokens plus the verified
    one, as for EAGLE's chain) and the match window ``--speculative-ngram-{min,max}-match-window-size``
    (ServerArgs fields ``speculative_ngram_min_match_window_size``/``..._max_...``, defaults 1 and 12, in
    ``python/sglang/srt/server_args.py`` of the 0.5 line; SGLang's docs, advanced_features/speculative_decoding.md:
    NGRAM is CUDA-only). The BFS breadth, branch length and capacity keep SGLang's defaults.
    """
    return ["--speculative-algorithm", "NGRAM", "--speculative-num-draft-tokens", str(int(draft_len) + 1),
            "--speculative-ngram-min-match-window-size", str(int(ngram.prompt_lookup_min)),
            "--speculative-ngram-max-match-window-size", str(int(ngram.prompt_lookup_max))]
