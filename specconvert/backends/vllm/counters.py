"""vLLM's speculative-decoding counters (Prometheus, ``GET /metrics``) -> one :class:`Acceptance`.

Names as vLLM 0.32 registers them (``vllm/v1/spec_decode/metrics.py``, ``SpecDecodingProm``):
``vllm:spec_decode_num_drafts``, ``…num_draft_tokens``, ``…num_accepted_tokens`` and
``…num_accepted_tokens_per_pos{position}``, labelled ``engine`` and ``model_name``. The
Prometheus client exports counters with a ``_total`` suffix, so the served names are
``vllm:spec_decode_num_drafts_total`` etc. The counters only grow: a run's acceptance is the
difference of two snapshots, tau = 1 + accepted / drafts, position i's rate = accepted_i / drafts.
"""

from __future__ import annotations

from typing import Any

from ...acceptance import Acceptance, from_counts, unavailable
from .. import prometheus

SOURCE = "vllm counters"
PREFIX = "vllm:spec_decode_"
DRAFTS = PREFIX + "num_drafts_total"
DRAFT_TOKENS = PREFIX + "num_draft_tokens_total"
ACCEPTED = PREFIX + "num_accepted_tokens_total"
PER_POS = PREFIX + "num_accepted_tokens_per_pos_total"
NAMES = (DRAFTS, DRAFT_TOKENS, ACCEPTED, PER_POS)



class Snapshot(dict):
    """``{(counter name, position or None): value}``, summed over engines and model names."""


def parse(text: str) -> Snapshot:
    """The spec-decode counters of one Prometheus exposition text (other metrics ignored)."""
    snap = Snapshot()
    for name, labels, value in prometheus.samples(text):
        if name not in NAMES:
            continue
        position = int(labels["position"]) if name == PER_POS and labels.get("position", "").isdigit() else None
        snap[(name, position)] = snap.get((name, position), 0.0) + value
    return snap


def delta(before: Snapshot | None, after: Snapshot | None, requests: int = 0) -> Acceptance:
    """Acceptance of what happened between two snapshots.

    Only a difference measures the run: without the "before" scrape the absolute counters would
    count every earlier request too, and a counter that went down means the server restarted
    between the scrapes (vLLM's counters only grow while a process lives). Both are
    ``unavailable`` with the reason, never a number and never "speculation did not run".
    """
    if after is None:
        return unavailable(SOURCE, "GET /metrics did not answer after the run")
    if not any(name == DRAFTS for name, _ in after):
        return unavailable(SOURCE, f"GET /metrics has no {DRAFTS} (speculative decoding is not configured)")
    if before is None:
        return unavailable(SOURCE, "GET /metrics did not answer before the run, so the counters' change over the "
                           "run is unknown (the absolute counters include earlier requests)")

    def diff(key: tuple[str, int | None]) -> float:
        return after.get(key, 0.0) - before.get(key, 0.0)

    fell = sorted(f"{name}{'' if pos is None else f'{{position={pos}}}'}"
                  for name, pos in set(before) | set(after) if diff((name, pos)) < 0)
    if fell:
        return unavailable(SOURCE, f"counters went down during the run ({', '.join(fell)}): the server restarted "
                           "between the scrapes, so the run's change is unknown")
    positions = sorted(p for name, p in after if name == PER_POS and p is not None)
    per_pos = [diff((PER_POS, p)) for p in range(positions[-1] + 1)] if positions else None
    return from_counts(SOURCE, drafts=diff((DRAFTS, None)), draft_tokens=int(diff((DRAFT_TOKENS, None))),
                       accepted_tokens=int(diff((ACCEPTED, None))), accepted_per_position=per_pos, requests=requests)


async def snapshot(client: Any) -> Snapshot | None:
    """Read the counters from an :class:`serving.client.OpenAIClient`'s server; None when /metrics fails."""
    text = await client.prometheus()
    return None if text is None else parse(text)
