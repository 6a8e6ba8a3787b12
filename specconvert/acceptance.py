"""One shape for acceptance, whatever an engine serves (DESIGN §2, STYLE "acceptance has one shape").

Each engine backend turns its own metrics into an :class:`Acceptance`: the reference
server's ``/perf_metrics``, vLLM's Prometheus counters, TensorRT-LLM's per-line sources,
or the engine-agnostic stream-chunk estimate. Reports print ``label`` so nobody has to
guess which source a number came from; when nothing can be measured, the record says so
and why, and carries no number (a check then neither passes nor fails on it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

MEASURED = "measured"
ESTIMATED = "estimated"
UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class Acceptance:
    """Acceptance of one run (or one request), from one named source.

    ``acceptance_length`` (tau) is tokens per target forward: 1 + accepted / drafts.
    ``per_position[i]`` is the share of drafts whose position ``i`` was accepted.
    """

    kind: str  # MEASURED | ESTIMATED | UNAVAILABLE
    source: str  # e.g. "vllm counters", "reference /perf_metrics", "stream chunks"
    acceptance_length: float | None = None
    per_position: list[float | None] | None = None
    drafts: float | None = None  # verification steps that drafted
    draft_tokens: int | None = None
    accepted_tokens: int | None = None
    requests: int = 0
    reason: str = ""  # why a value is estimated or unavailable
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """``measured: vllm counters`` / ``estimated: stream chunks`` / ``unavailable: <why>``."""
        return f"{self.kind}: {self.reason or self.source}" if self.kind == UNAVAILABLE else f"{self.kind}: {self.source}"

    @property
    def available(self) -> bool:
        return self.kind != UNAVAILABLE and self.acceptance_length is not None

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "source": self.label,
            "kind": self.kind,
            "acceptance_length": _round(self.acceptance_length),
            "per_position_acceptance": [_round(p) for p in self.per_position] if self.per_position is not None else None,
            "drafts": _round(self.drafts),
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
            "requests": self.requests,
        }
        if self.reason:
            out["reason"] = self.reason
        out.update(self.extra)
        return out


def _round(x: float | None) -> float | None:
    return None if x is None else round(float(x), 4)


def unavailable(source: str, reason: str) -> Acceptance:
    """Nothing can be measured from ``source``; ``reason`` says why (shown to the user)."""
    return Acceptance(kind=UNAVAILABLE, source=source, reason=reason)


def from_counts(source: str, *, drafts: float, draft_tokens: int | None, accepted_tokens: int,
                accepted_per_position: Sequence[float] | None = None, requests: int = 0,
                kind: str = MEASURED, reason: str = "") -> Acceptance:
    """Counters (or their deltas around a run) -> tau = 1 + accepted / drafts, per-position rates."""
    if drafts <= 0:
        return unavailable(source, f"{source} counted no drafts (speculation did not run)")
    per_pos = [a / drafts for a in accepted_per_position] if accepted_per_position is not None else None
    return Acceptance(kind=kind, source=source, acceptance_length=1 + accepted_tokens / drafts, per_position=per_pos,
                      drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted_tokens, requests=requests,
                      reason=reason)


def from_stream_chunks(tokens_per_request: Sequence[int], chunks_per_request: Sequence[int]) -> Acceptance:
    """Engine-agnostic estimate: each SSE chunk after the first is one engine iteration.

    The first token-carrying chunk holds the prefill's token; each later chunk holds the
    1 + accepted tokens of one verification step, so tau ~= (tokens - 1) / (chunks - 1)
    summed over requests. It over-counts steps when an engine splits one step's tokens
    across chunks (e.g. detokenizer holding back a partial UTF-8 character), so it is an
    estimate, labelled as one.
    """
    tokens = sum(max(t - 1, 0) for t, c in zip(tokens_per_request, chunks_per_request) if c > 1)
    steps = sum(c - 1 for c in chunks_per_request if c > 1)
    if steps <= 0:
        return unavailable("stream chunks", "no request streamed more than one chunk")
    return Acceptance(kind=ESTIMATED, source="stream chunks", acceptance_length=tokens / steps, drafts=steps,
                      accepted_tokens=tokens - steps, requests=len(tokens_per_request),
                      reason="tokens / SSE chunks; one chunk per engine iteration assumed")


def combine(parts: Sequence[Acceptance]) -> Acceptance | None:
    """Counter deltas of several runs (same source) as one: drafts, tokens and per-position counts add up."""
    got = [a for a in parts if a.available and a.drafts]
    if not got:
        return parts[0] if parts else None
    width = max(len(a.per_position or []) for a in got)
    per_pos = ([sum((a.per_position or [0.0] * width)[i] * a.drafts for a in got) for i in range(width)]
               if width and all(a.per_position is not None for a in got) else None)
    return from_counts(got[0].source, drafts=sum(a.drafts for a in got),
                       draft_tokens=sum(a.draft_tokens or 0 for a in got),
                       accepted_tokens=sum(a.accepted_tokens or 0 for a in got),
                       accepted_per_position=per_pos, requests=sum(a.requests for a in got), kind=got[0].kind)
