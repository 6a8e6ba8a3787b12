"""One evaluation of a head: greedy decoding of the same prompts with and without speculation.

Called by convert (held-out tau after training), by the quantization check (the same
prompts on the unquantized and the quantized target) and usable by the oracle. It takes
a ready :class:`ReferenceDecoder` (whatever target it wraps: a folder or an in-memory,
fake-quantized model) and a set of draft shapes, and returns the one acceptance shape:
tau, per-position acceptance, tokens/s, and whether every speculative output equals the
same target's own plain greedy output (greedy is lossless, so it must).
"""

from __future__ import annotations

import time
from typing import Any, Callable, Sequence

from .decoder import DecodeSettings, ReferenceDecoder, summarise


def aggregate(results: Sequence[Any]) -> dict[str, Any]:
    """One summary over all prompts: the decoder's own summary of their steps taken together."""
    total = summarise([], [step for r in results for step in r.step_records], sum(r.wall_time_s for r in results))
    return {"acceptance_length": round(total.acceptance_length, 4),
            "per_position_acceptance": [round(x, 4) for x in total.per_position_acceptance],
            "target_forwards": total.steps, "tokens": len(total.token_ids),
            "tokens_per_second": round(total.tokens_per_second, 3)}


def evaluate(decoder: ReferenceDecoder, encoded: Sequence[Sequence[int]], max_new_tokens: int,
             shapes: dict[str, dict[str, Any]], on_prompt: Callable[[], None] | None = None) -> dict[str, Any]:
    """tau and per-position acceptance per shape (``{"chain-3": {"max_draft_len": 3}, "tree": {"tree": {...}}}``)
    over the prompts ``encoded`` (token ids); the plain run is the lossless reference."""
    stop = decoder.eos_token_ids
    t0 = time.perf_counter()
    plain = []
    for ids in encoded:
        plain.append(decoder.generate(ids, max_new_tokens, DecodeSettings(speculative=False, stop_token_ids=stop)))
        if on_prompt:
            on_prompt()
    report: dict[str, Any] = {"samples": len(encoded), "max_new_tokens": max_new_tokens,
                              "baseline_tokens_per_second": aggregate(plain)["tokens_per_second"], "shapes": {}}
    for name, shape in shapes.items():
        settings = DecodeSettings(max_draft_len=int(shape.get("max_draft_len", 3)), tree=shape.get("tree"), stop_token_ids=stop)
        runs = []
        for ids in encoded:
            runs.append(decoder.generate(ids, max_new_tokens, settings))
            if on_prompt:
                on_prompt()
        entry = aggregate(runs)
        # per prompt: [verification steps, draft tokens accepted]; the quantization gate's paired bootstrap resamples them
        entry["per_prompt"] = [[len(r.accepted_per_step), int(sum(r.accepted_per_step))] for r in runs]
        entry["identical_to_plain"] = all(a.token_ids == b.token_ids for a, b in zip(runs, plain))
        base = report["baseline_tokens_per_second"]
        entry["speedup_vs_plain"] = round(entry["tokens_per_second"] / base, 3) if base else None
        entry["shape"] = shape
        report["shapes"][name] = entry
    report["eval_s"] = round(time.perf_counter() - t0, 2)
    return report
