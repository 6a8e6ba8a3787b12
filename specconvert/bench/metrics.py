"""Benchmark arithmetic: per-request latencies, run summaries, acceptance, paired speedups.

Pure functions over plain records, no I/O, so every number in report.json can be
checked exactly against scripted timings. Definitions (also in docs/bench.md):

- TTFT: request sent -> first chunk that carries at least one output token.
- E2E: request sent -> end of the stream (``[DONE]`` or connection end).
- TPOT: (E2E - TTFT) / (output_tokens - 1); undefined for fewer than 2 tokens.
- ITL: one sample per token-carrying chunk after the first: the gap since the
  previous token-carrying chunk divided by the tokens in this chunk (speculative
  servers send several tokens per chunk, so a raw gap would overstate latency).
- Percentiles: linear interpolation between closest ranks (NumPy's default).
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

PERCENTILES = (50, 90, 99)


@dataclass
class Chunk:
    """One token-carrying SSE chunk: seconds since the request was sent, tokens in it."""

    t: float
    tokens: int


@dataclass
class RequestRecord:
    """What the client saw of one streamed request (times in seconds, relative to its send time)."""

    index: int
    chunks: list[Chunk] = field(default_factory=list)
    e2e_s: float | None = None
    send_time: float = 0.0  # absolute (perf_counter) send time, for run duration
    output_tokens: int = 0
    usage_tokens: int | None = None
    token_count_source: str = "token_ids"  # token_ids | logprobs | usage_apportioned | chunks
    client_overhead_s: float = 0.0
    events: int = 0
    error: str | None = None
    prompt_tokens: int | None = None
    token_ids: list[int] | None = None  # the output's token ids, when the server returns them

    @property
    def ok(self) -> bool:
        return self.error is None and self.e2e_s is not None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Percentile ``q`` (0-100) by linear interpolation between closest ranks; None when empty."""
    data = sorted(values)
    if not data:
        return None
    if len(data) == 1:
        return float(data[0])
    pos = (len(data) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(data) - 1)
    return float(data[low] + (data[high] - data[low]) * (pos - low))


def distribution(values: Iterable[float]) -> dict[str, Any]:
    """count, mean, min, max and p50/p90/p99 of some samples (None fields when empty)."""
    data = [float(v) for v in values]
    out: dict[str, Any] = {"count": len(data), "mean": statistics.fmean(data) if data else None,
                           "min": min(data) if data else None, "max": max(data) if data else None}
    for q in PERCENTILES:
        out[f"p{q}"] = percentile(data, q)
    return out


def ttft(record: RequestRecord) -> float | None:
    return record.chunks[0].t if record.chunks else None


def tpot(record: RequestRecord) -> float | None:
    first = ttft(record)
    if first is None or record.e2e_s is None or record.output_tokens < 2:
        return None
    return (record.e2e_s - first) / (record.output_tokens - 1)


def itl_samples(record: RequestRecord) -> list[float]:
    return [(cur.t - prev.t) / cur.tokens for prev, cur in zip(record.chunks, record.chunks[1:]) if cur.tokens > 0]


def request_metrics(record: RequestRecord) -> dict[str, Any]:
    """One line of requests.jsonl."""
    return {
        "index": record.index,
        "ok": record.ok,
        "error": record.error,
        "ttft_s": ttft(record),
        "tpot_s": tpot(record),
        "e2e_s": record.e2e_s,
        "output_tokens": record.output_tokens,
        "usage_completion_tokens": record.usage_tokens,
        "prompt_tokens": record.prompt_tokens,
        "token_count_source": record.token_count_source,
        "chunks": len(record.chunks),
        "chunk_times_s": [round(c.t, 6) for c in record.chunks],
        "chunk_tokens": [c.tokens for c in record.chunks],
        "itl_s": itl_samples(record),
        "client_overhead_s": record.client_overhead_s,
        "sse_events": record.events,
    }


def summarize_run(records: Sequence[RequestRecord], duration_s: float | None = None) -> dict[str, Any]:
    """Latency distributions and throughputs of one run (successful requests only)."""
    ok = [r for r in records if r.ok]
    if duration_s is None and ok:
        duration_s = max(r.send_time + r.e2e_s for r in ok) - min(r.send_time for r in ok)
    total_tokens = sum(r.output_tokens for r in ok)
    per_user = [r.output_tokens / r.e2e_s for r in ok if r.e2e_s and r.e2e_s > 0]
    itl = [s for r in ok for s in itl_samples(r)]
    summary = {
        "requests": len(records),
        "succeeded": len(ok),
        "failed": len(records) - len(ok),
        "duration_s": duration_s,
        "output_tokens": total_tokens,
        "ttft_s": distribution(v for v in (ttft(r) for r in ok) if v is not None),
        "tpot_s": distribution(v for v in (tpot(r) for r in ok) if v is not None),
        "itl_s": distribution(itl),
        "e2e_s": distribution(r.e2e_s for r in ok),
        "output_tokens_per_s": (total_tokens / duration_s) if duration_s else None,
        "output_tokens_per_s_per_user": distribution(per_user),
        "requests_per_s": (len(ok) / duration_s) if duration_s else None,
        "tokens_per_chunk": chunk_token_stats(ok),
        "client_overhead": client_overhead(ok),
    }
    return summary


def chunk_token_stats(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Tokens per decode chunk (every token-carrying chunk after the first, which holds the prefill token)."""
    sizes = [c.tokens for r in records for c in r.chunks[1:]]
    sources = sorted({r.token_count_source for r in records})
    return {"mean": statistics.fmean(sizes) if sizes else None, "chunks": len(sizes), "count_sources": sources}


def client_overhead(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Time the client spent parsing and bookkeeping, per chunk and as a share of latency."""
    events = sum(r.events for r in records)
    spent = sum(r.client_overhead_s for r in records)
    e2e = sum(r.e2e_s for r in records if r.e2e_s)
    itl = [s for r in records for s in itl_samples(r)]
    per_event = spent / events if events else None
    mean_itl = statistics.fmean(itl) if itl else None
    return {
        "total_s": spent,
        "per_event_s": per_event,
        "fraction_of_e2e": (spent / e2e) if e2e else None,
        # A decode step's cost is what one chunk's gap measures: the client must stay far below it.
        "fraction_of_mean_itl": (per_event / mean_itl) if per_event is not None and mean_itl else None,
    }


# --------------------------------------------------------------------------- acceptance


def acceptance_from_server(items: Sequence[dict[str, Any]], max_draft_len: int | None = None) -> dict[str, Any] | None:
    """Acceptance over the speculative requests of a ``/perf_metrics`` drain; None when it holds none.

    Parsed by serve's ``serving.metrics`` (so serve-test and bench agree): the reference server's
    ``specconvert`` block gives exact per-step counts (per-position rates too); TensorRT-LLM's
    ``speculative_decoding`` totals give an exact rate, and a length that assumes ``max_draft_len``
    drafted tokens per step (``estimate: true``). trtllm-serve never fills that block for EAGLE-3
    (TorchSampler) and 1.4 has no ``/perf_metrics``: read a trtllm-serve through
    ``backends.trtllm.acceptance.AcceptanceReader`` and :func:`acceptance_from_reader` instead. Without ``max_draft_len`` (``--url`` without a
    recipe) the steps are counted as ``last_iter - first_iter`` (the first iteration is the prefill).
    """
    from ..serving.metrics import aggregate, request_stats

    stats = []
    for item in items:
        if (item.get("specconvert") or {}).get("speculative") is False:
            continue  # a baseline request on the same reference server
        entry = request_stats(item, max_draft_len or 0)
        if entry and not entry.get("steps") and entry.get("estimated"):
            perf = item.get("perf_metrics") or {}
            first, last = perf.get("first_iter"), perf.get("last_iter")
            if isinstance(first, int) and isinstance(last, int) and last > first:
                steps = last - first
                entry = {**entry, "steps": steps, "acceptance_length": 1 + entry["accepted_tokens"] / steps}
        if entry:
            stats.append(entry)
    total = aggregate(stats)
    if not total["requests"]:
        return None
    out = {
        "source": "server",
        "estimate": bool(total["estimated"]),
        "acceptance_length": total["acceptance_length"],
        "acceptance_rate": total["acceptance_rate"],
        "per_position": total["per_position_acceptance"],
        "steps": total["steps"],
        "requests": total["requests"],
    }
    if out["estimate"]:
        out["note"] = ("acceptance rate exact (server totals); acceptance length estimated from them, "
                       + (f"assuming {max_draft_len} draft tokens per step" if max_draft_len else
                          "counting last_iter - first_iter verify steps per request"))
    return out


def acceptance_from_reader(acc: Any) -> dict[str, Any] | None:
    """An ``acceptance.Acceptance`` (e.g. a TensorRT-LLM line's reader) in bench's acceptance shape;
    None when it measured nothing, so the caller falls back to :func:`acceptance_from_chunks`."""
    if acc is None or not acc.available:
        return None
    return {
        "source": acc.label,
        "estimate": acc.kind != "measured" or "steps_derived_from" in acc.extra,
        "acceptance_length": round(acc.acceptance_length, 4),
        "acceptance_rate": (round(acc.accepted_tokens / acc.draft_tokens, 4)
                            if acc.draft_tokens and acc.accepted_tokens is not None else None),
        "per_position": acc.per_position,
        "steps": None if acc.drafts is None else round(acc.drafts, 2),
        "requests": acc.requests,
        **({"note": f"steps derived from {acc.extra['steps_derived_from']}"} if "steps_derived_from" in acc.extra else {}),
    }


def acceptance_from_chunks(records: Sequence[RequestRecord]) -> dict[str, Any]:
    """Estimate: mean tokens per decode chunk (right when the server streams one chunk per step)."""
    stats = chunk_token_stats([r for r in records if r.ok])
    return {
        "source": "tokens_per_chunk",
        "estimate": True,
        "acceptance_length": stats["mean"],
        "acceptance_rate": None,
        "per_position": None,
        "steps": stats["chunks"],
        "note": "estimated from tokens per streamed chunk; exact only when the server sends one chunk per "
        "decoding step and the per-chunk token counts are exact (count sources: " + ", ".join(stats["count_sources"]) + ")",
    }


# --------------------------------------------------------------------------- speedup


def ratio_summary(ratios: Sequence[float], seed: int = 0, resamples: int = 2000) -> dict[str, Any]:
    """Median, min-max and a percentile-bootstrap 95% interval of the median, over per-pair ratios."""
    data = [float(r) for r in ratios if r is not None and math.isfinite(r)]
    if not data:
        return {"pairs": 0, "median": None, "min": None, "max": None, "ci95": None, "ratios": []}
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(data, k=len(data))) for _ in range(resamples))
    return {
        "pairs": len(data),
        "median": statistics.median(data),
        "min": min(data),
        "max": max(data),
        "ci95": [percentile(medians, 2.5), percentile(medians, 97.5)],
        "ratios": data,
    }


def pair_ratios(baseline: dict[str, Any], speculative: dict[str, Any]) -> dict[str, float | None]:
    """Speculative over baseline, oriented so > 1 means speculation is better."""

    def div(a: Any, b: Any) -> float | None:
        return (a / b) if a is not None and b not in (None, 0) else None

    return {
        "output_tokens_per_s": div(speculative["output_tokens_per_s"], baseline["output_tokens_per_s"]),
        "e2e_mean": div(baseline["e2e_s"]["mean"], speculative["e2e_s"]["mean"]),
        "tpot_mean": div(baseline["tpot_s"]["mean"], speculative["tpot_s"]["mean"]),
        "ttft_mean": div(baseline["ttft_s"]["mean"], speculative["ttft_s"]["mean"]),
    }


def speedups(pairs: Sequence[tuple[dict[str, Any], dict[str, Any]]], seed: int = 0) -> dict[str, Any]:
    """Per-metric ratio summaries over the (baseline, speculative) run pairs of one concurrency level."""
    per_pair = [pair_ratios(b, s) for b, s in pairs]
    keys = ("output_tokens_per_s", "e2e_mean", "tpot_mean", "ttft_mean")
    return {key: ratio_summary([p[key] for p in per_pair if p[key] is not None], seed=seed) for key in keys}


# --------------------------------------------------------------------------- lossless against plain decoding


def lossless(pairs: Sequence[tuple[Sequence[RequestRecord], Sequence[RequestRecord]]],
             temperature: float = 0.0) -> dict[str, Any]:
    """Whether an arm's outputs equal plain decoding's, token id for token id.

    ``pairs``: (baseline records, arm records) of the same level and repeat; requests are matched by payload index,
    so each pair compares the same prompt and seed. Greedy only: a sampled request's output differs by design.
    ``lossless`` is None when nothing could be compared (no token ids, failed requests), else whether every compared
    request matched; ``divergences`` names the first few (request index, first differing position).
    """
    if temperature > 0:
        return {"lossless": None, "compared": 0, "identical": 0, "divergences": [],
                "why": f"sampled requests (temperature {temperature:g}): outputs differ by design"}
    compared = identical = 0
    divergences: list[dict[str, Any]] = []
    for base_records, arm_records in pairs:
        base = {r.index: r for r in base_records if r.ok and r.token_ids is not None}
        for record in arm_records:
            other = base.get(record.index)
            if other is None or not record.ok or record.token_ids is None:
                continue
            compared += 1
            if record.token_ids == other.token_ids:
                identical += 1
                continue
            position = next((i for i, (a, b) in enumerate(zip(record.token_ids, other.token_ids)) if a != b),
                            min(len(record.token_ids), len(other.token_ids)))
            if len(divergences) < 5:
                divergences.append({"request": record.index, "position": position})
    out: dict[str, Any] = {"lossless": (identical == compared) if compared else None, "compared": compared,
                           "identical": identical, "divergences": divergences}
    if not compared:
        out["why"] = "no request pair carried token ids on both sides"
    return out


# --------------------------------------------------------------------------- per category / per input length


def chunk_acceptance(records: Sequence[RequestRecord], max_draft_len: int | None = None) -> dict[str, Any]:
    """tau and per-position acceptance of some requests from their stream chunks (one chunk per engine step: a chunk
    of n tokens accepted n - 1 drafts, at positions 0..n-2). An estimate, per request set, which run-level engine
    counters cannot give; ``max_draft_len`` sizes the per-position list (else the longest chunk's)."""
    sizes = [c.tokens for r in records if r.ok for c in r.chunks[1:]]
    if not sizes:
        return {"acceptance_length": None, "per_position": None, "steps": 0, "requests": 0}
    depth = max_draft_len or max(max(sizes) - 1, 0)
    per_position = [sum(1 for n in sizes if n - 1 > i) / len(sizes) for i in range(depth)] if depth else []
    return {"acceptance_length": statistics.fmean(sizes), "per_position": per_position, "steps": len(sizes),
            "requests": len([r for r in records if r.ok])}


def user_rate(records: Sequence[RequestRecord]) -> float | None:
    """Output tokens per second of request time over some requests (sum of tokens / sum of E2E)."""
    ok = [r for r in records if r.ok and r.e2e_s]
    seconds = sum(r.e2e_s for r in ok)
    return sum(r.output_tokens for r in ok) / seconds if seconds else None


def grouped(arms: dict[str, Sequence[RequestRecord]], group_of: Sequence[Any],
            draft_lens: dict[str, int | None] | None = None) -> dict[str, Any]:
    """Per group (a prompt's category, or its input length), per arm: tau and per-position acceptance from the stream
    chunks, and the speedup = the arm's tokens per second of request time / the baseline's, over the same requests.

    ``arms``: label -> the records of one level (repeats pooled; ``baseline`` among them for speedups);
    ``group_of[i]``: the group of payload ``i`` (None: left out)."""
    draft_lens = draft_lens or {}
    groups = [g for g in dict.fromkeys(group_of) if g is not None]
    out: dict[str, Any] = {}
    for group in groups:
        entry: dict[str, Any] = {"requests": sum(1 for g in group_of if g == group), "arms": {}}
        counted = [r.prompt_tokens for records in arms.values() for r in records
                   if group_of[r.index] == group and r.prompt_tokens]
        entry["prompt_tokens_mean"] = statistics.fmean(counted) if counted else None  # as the server counted them
        base = user_rate([r for r in arms.get("baseline", []) if group_of[r.index] == group])
        for label, records in arms.items():
            mine = [r for r in records if group_of[r.index] == group]
            rate = user_rate(mine)
            arm: dict[str, Any] = {"output_tokens_per_s_per_user": rate}
            if label != "baseline":
                arm.update(chunk_acceptance(mine, draft_lens.get(label)))
                arm["speedup"] = (rate / base) if rate and base else None
            entry["arms"][label] = arm
        out[str(group)] = entry
    return out
