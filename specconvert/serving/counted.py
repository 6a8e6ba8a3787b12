"""Acceptance an engine counted around each request (vLLM's counters): per request, summed, and the
stream-chunk estimator measured against the counters of the same streamed requests.

serve-test records, per speculative request, ``{"prompt_id", "stream", "acceptance": Acceptance,
"tokens", "chunks"}``; these pure functions turn that into the report's numbers.
"""

from __future__ import annotations

from typing import Any

from ..acceptance import combine, from_stream_chunks


def tokens_of(completion: Any) -> int:
    return len(completion.token_ids) if completion.token_ids is not None else int(completion.completion_tokens or 0)


def streamed_chunks(completion: Any) -> int:
    return sum(1 for c in completion.chunks if (c.tokens or c.text))


def per_request_stats(counted: Any) -> dict[str, Any]:
    """An engine counter delta in the per-request statistics shape ``serving.metrics.aggregate`` sums."""
    return {"draft_tokens": counted.draft_tokens or 0, "accepted_tokens": counted.accepted_tokens or 0,
            "acceptance_rate": (counted.accepted_tokens / counted.draft_tokens) if counted.draft_tokens else None,
            "steps": counted.drafts, "acceptance_length": counted.acceptance_length, "accepted_per_step": None,
            "drafted_depth_per_step": None, "estimated": False, "per_position": counted.per_position}


def engine_acceptance(counted: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Counter deltas summed over the non-streamed requests, and the stream-chunk estimate against the counters of
    the streamed requests (the same requests, so the estimator's error is measured, not guessed)."""
    if not counted:
        return None

    def total(items: list[dict[str, Any]]) -> Any:
        return combine([c["acceptance"] for c in items])

    plain = [c for c in counted if not c["stream"]]
    streamed = [c for c in counted if c["stream"]]
    out: dict[str, Any] = {"counters": total(plain) if plain else total(streamed)}
    if streamed:
        measured = total(streamed)
        estimate = from_stream_chunks([c["tokens"] for c in streamed], [c["chunks"] for c in streamed])
        error = (round(estimate.acceptance_length - measured.acceptance_length, 4)
                 if estimate.available and measured.available else None)
        out["stream_estimate"] = {"estimate": estimate.as_dict(), "counters_same_requests": measured.as_dict(),
                                  "error": error,
                                  "relative_error": round(error / measured.acceptance_length, 4) if error is not None else None}
    return out
