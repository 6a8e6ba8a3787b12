"""Speculative statistics from ``/perf_metrics`` entries (TensorRT-LLM's shape, or ours with extras).

TensorRT-LLM reports per request ``speculative_decoding.{total_draft_tokens,
total_accepted_draft_tokens, acceptance_rate}``. The acceptance length tau (tokens
per target forward) needs the number of verification steps, which it does not
report: for a chain of ``max_draft_len`` every step drafts ``max_draft_len`` tokens
(fewer only near ``max_tokens``), so steps ~= total_draft_tokens / max_draft_len and
tau ~= 1 + accepted / steps (marked ``estimated``). The reference server adds a
``specconvert`` block with the exact per-step counts.
"""

from __future__ import annotations

from typing import Any


def request_stats(entry: dict[str, Any], max_draft_len: int) -> dict[str, Any] | None:
    """Speculative statistics of one perf_metrics entry; None when it reports none."""
    ours = entry.get("specconvert") if isinstance(entry, dict) else None
    perf = entry.get("perf_metrics") if isinstance(entry, dict) else None
    spec = perf.get("speculative_decoding") if isinstance(perf, dict) else None
    if isinstance(ours, dict) and isinstance(ours.get("accepted_per_step"), list):
        accepted = [int(a) for a in ours["accepted_per_step"]]
        depths = [int(d) for d in ours.get("drafted_depth_per_step") or [max_draft_len] * len(accepted)]
        steps = len(accepted)
        drafted = int(spec["total_draft_tokens"]) if isinstance(spec, dict) else 0
        return {
            "draft_tokens": drafted,
            "accepted_tokens": sum(accepted),
            "acceptance_rate": (sum(accepted) / drafted) if drafted else None,
            "steps": steps,
            "acceptance_length": (sum(a + 1 for a in accepted) / steps) if steps else None,
            "accepted_per_step": accepted,
            "drafted_depth_per_step": depths,
            "estimated": False,
        }
    if isinstance(spec, dict):
        try:
            drafted = int(spec["total_draft_tokens"])
            accepted = int(spec["total_accepted_draft_tokens"])
        except (KeyError, TypeError, ValueError):
            return None
        steps = drafted / max_draft_len if max_draft_len else 0
        return {
            "draft_tokens": drafted,
            "accepted_tokens": accepted,
            "acceptance_rate": spec.get("acceptance_rate"),
            "steps": steps,
            "acceptance_length": (1 + accepted / steps) if steps else None,
            "accepted_per_step": None,
            "drafted_depth_per_step": None,
            "estimated": True,
        }
    return None


def aggregate(stats: list[dict[str, Any]]) -> dict[str, Any]:
    """Overall tau (total tokens over total steps), acceptance rate, and per-position acceptance."""
    stats = [s for s in stats if s and s.get("steps")]
    steps = sum(s["steps"] for s in stats)
    accepted = sum(s["accepted_tokens"] for s in stats)
    drafted = sum(s["draft_tokens"] for s in stats)
    exact = [s for s in stats if s.get("accepted_per_step") is not None]
    max_depth = max((d for s in exact for d in s["drafted_depth_per_step"]), default=0)
    per_position = []
    for i in range(max_depth):
        tried = [a for s in exact for a, d in zip(s["accepted_per_step"], s["drafted_depth_per_step"]) if d > i]
        per_position.append(round(sum(1 for a in tried if a > i) / len(tried), 4) if tried else None)
    return {
        "acceptance_length": round((steps + accepted) / steps, 4) if steps else None,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
        "per_position_acceptance": per_position if exact and len(exact) == len(stats) else None,
        "requests": len(stats),
        "steps": round(steps, 2),
        "accepted_draft_tokens": accepted,
        "draft_tokens": drafted,
        "estimated": any(s.get("estimated") for s in stats),
    }
