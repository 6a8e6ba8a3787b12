"""Acceptance of a head on held-out prompts, measured with the reference decoder.

For each draft shape (the chain of ``build.max_draft_len`` and a dynamic tree) the
same prompts are decoded greedily with the head and without speculation; we report
tau (tokens per target forward), per-position acceptance, tokens/s of both runs and
whether every speculative output equals the plain one (it must: greedy is lossless).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

from .data import prompt_ids


def _aggregate(results: Sequence[Any]) -> dict[str, Any]:
    """One summary over all prompts: the decoder's own summary of their steps taken together."""
    from ..reference.decoder import summarise

    total = summarise([], [step for r in results for step in r.step_records], sum(r.wall_time_s for r in results))
    return {"acceptance_length": round(total.acceptance_length, 4),
            "per_position_acceptance": [round(x, 4) for x in total.per_position_acceptance],
            "target_forwards": total.steps, "tokens": len(total.token_ids),
            "tokens_per_second": round(total.tokens_per_second, 3)}


def measure(target_dir: Path, draft_dir: Path, aux_layer_ids: list[int], prompts: str, items: Sequence[dict[str, Any]],
            max_new_tokens: int, shapes: dict[str, dict[str, Any]], device: str = "cpu", dtype: str = "float32",
            on_prompt: Callable[[], None] | None = None) -> dict[str, Any]:
    """tau and per-position acceptance per shape (``{"chain-3": {"max_draft_len": 3}, "tree": {"tree": {...}}}``)
    over the samples ``items`` of the prompt set named ``prompts``."""
    from ..reference.decoder import DecodeSettings, ReferenceDecoder

    decoder = ReferenceDecoder.from_dirs(target_dir, draft_dir, aux_layer_ids, device=device, dtype=dtype, norm_layout="eagle3")
    stop = decoder.eos_token_ids
    encoded = [prompt_ids(s, decoder.tokenizer) for s in items]
    t0 = time.perf_counter()
    plain = []
    for ids in encoded:
        plain.append(decoder.generate(ids, max_new_tokens, DecodeSettings(speculative=False, stop_token_ids=stop)))
        if on_prompt:
            on_prompt()
    report: dict[str, Any] = {"prompts": prompts, "samples": len(encoded), "max_new_tokens": max_new_tokens,
                              "baseline_tokens_per_second": _aggregate(plain)["tokens_per_second"], "shapes": {}}
    for name, shape in shapes.items():
        settings = DecodeSettings(max_draft_len=int(shape.get("max_draft_len", 3)), tree=shape.get("tree"), stop_token_ids=stop)
        runs = []
        for ids in encoded:
            runs.append(decoder.generate(ids, max_new_tokens, settings))
            if on_prompt:
                on_prompt()
        entry = _aggregate(runs)
        entry["identical_to_plain"] = all(a.token_ids == b.token_ids for a, b in zip(runs, plain))
        base = report["baseline_tokens_per_second"]
        entry["speedup_vs_plain"] = round(entry["tokens_per_second"] / base, 3) if base else None
        entry["shape"] = shape
        report["shapes"][name] = entry
    report["eval_s"] = round(time.perf_counter() - t0, 2)
    return report
