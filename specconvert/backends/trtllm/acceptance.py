"""Acceptance of a running trtllm-serve, from what its version line really serves.

The per-line table lives in ``specconvert/data/trtllm/acceptance_sources.json`` with its
sources cited. :class:`AcceptanceReader` snapshots the server before a run and reads it
after, trying the line's sources in order (iteration stats at ``/metrics``, Prometheus
counters, ``/perf_metrics``) and falling back to the stream-chunk estimate. When nothing
can be measured it returns ``unavailable(...)`` with every reason, so no check passes or
fails on a number that does not exist.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any, Sequence

from ...prometheus import totals
from ...serving.acceptance import Acceptance, from_counts, from_stream_chunks, unavailable
from .versions import in_release_window

PROMETHEUS_DRAFT = "trtllm_spec_decode_num_draft_tokens_total"
PROMETHEUS_ACCEPTED = "trtllm_spec_decode_num_accepted_tokens_total"


@lru_cache(maxsize=None)
def sources_table() -> dict[str, Any]:
    path = resources.files("specconvert") / "data" / "trtllm" / "acceptance_sources.json"
    return json.loads(path.read_text(encoding="utf-8"))


def line_for(version: str) -> dict[str, Any]:
    """The table row of the version line ``version`` (``1.3.0rc20`` -> ``1.3-early``)."""
    lines = sources_table()["lines"]
    for row in lines:
        before = row["before"]
        if in_release_window(version, row["first"]) and (before is None or not in_release_window(version, before)):
            return row
    return lines[0]  # older than every line: versions.spelling_for refuses those before anything is read


# ------------------------------------------------------------------ one parser per source (pure)


def from_iteration_stats(items: Sequence[Any]) -> Acceptance:
    """``GET /metrics`` items -> tau from ``specDecodingStats`` (exact step count)."""
    drafts = accepted = drafted = 0
    for item in items or []:
        spec = item.get("specDecodingStats") if isinstance(item, dict) else None
        if not isinstance(spec, dict):
            continue
        try:
            drafts += int(spec.get("numRequestsWithDraftTokens") or 0)
            accepted += int(spec.get("numAcceptedTokens") or 0)
            drafted += int(spec.get("numDraftTokens") or 0)
        except (TypeError, ValueError):
            continue
    if drafts <= 0:
        why = "no iteration carried specDecodingStats" if items else "GET /metrics returned no iterations"
        return unavailable("trtllm iteration stats", why)
    return from_counts("trtllm iteration stats (/metrics specDecodingStats)", drafts=drafts, draft_tokens=drafted,
                       accepted_tokens=accepted)


def parse_prometheus(text: str) -> dict[str, float]:
    """Prometheus text -> metric name -> value summed over label sets (ranks, models)."""
    return totals(text)


def from_prometheus(before: dict[str, float] | None, after: dict[str, float] | None, max_draft_len: int) -> Acceptance:
    """Counter deltas around a run -> tau, the step count derived from a chain of ``max_draft_len``."""
    source = "trtllm prometheus counters"
    if after is None:
        return unavailable(source, "GET /prometheus/metrics is not served")
    if PROMETHEUS_DRAFT not in after or PROMETHEUS_ACCEPTED not in after:
        return unavailable(source, f"/prometheus/metrics has no {PROMETHEUS_DRAFT} series")
    before = before or {}
    drafted = after[PROMETHEUS_DRAFT] - before.get(PROMETHEUS_DRAFT, 0.0)
    accepted = after[PROMETHEUS_ACCEPTED] - before.get(PROMETHEUS_ACCEPTED, 0.0)
    if drafted <= 0 or max_draft_len <= 0:
        return unavailable(source, "the draft-token counter did not move during the run")
    result = from_counts(f"{source} ({PROMETHEUS_ACCEPTED} / {PROMETHEUS_DRAFT})", drafts=drafted / max_draft_len,
                         draft_tokens=int(drafted), accepted_tokens=int(accepted))
    result.extra["steps_derived_from"] = f"draft tokens / max_draft_len ({max_draft_len})"
    return result


def from_perf_metrics(items: Sequence[Any] | None, max_draft_len: int) -> Acceptance:
    """``GET /perf_metrics`` entries -> tau from ``speculative_decoding`` blocks (absent for EAGLE-3 in practice)."""
    source = "trtllm /perf_metrics"
    if items is None:
        return unavailable(source, "GET /perf_metrics is not served (removed in 1.4)")
    drafted = accepted = requests = 0
    for item in items:
        perf = item.get("perf_metrics") if isinstance(item, dict) else None
        spec = perf.get("speculative_decoding") if isinstance(perf, dict) else None
        if isinstance(spec, dict) and int(spec.get("total_draft_tokens") or 0) > 0:
            drafted += int(spec["total_draft_tokens"])
            accepted += int(spec.get("total_accepted_draft_tokens") or 0)
            requests += 1
    if drafted <= 0 or max_draft_len <= 0:
        return unavailable(source, f"none of {len(items)} entries has a speculative_decoding block "
                           "(TorchSampler never fills it for EAGLE-3)")
    result = from_counts(f"{source} speculative_decoding", drafts=drafted / max_draft_len, draft_tokens=drafted,
                         accepted_tokens=accepted, requests=requests)
    result.extra["steps_derived_from"] = f"draft tokens / max_draft_len ({max_draft_len})"
    return result


def choose(line: dict[str, Any], found: dict[str, Acceptance], stream: Acceptance | None) -> Acceptance:
    """The first measured source of ``line``; else the stream estimate; else unavailable with every reason."""
    reasons = []
    for name in line["sources"]:
        result = stream if name == "stream_chunks" else found.get(name)
        if result is None:
            reasons.append(f"{name}: not read")
            continue
        if result.available:
            if reasons:
                result.extra["not_measured"] = reasons
            return result
        reasons.append(f"{name}: {result.reason}")
    return unavailable(f"trtllm {line['line']}", "; ".join(reasons))


# ------------------------------------------------------------------ the reader (HTTP)


class AcceptanceReader:
    """``await reader.start()`` before the speculative requests, ``await reader.finish(...)`` after.

    Only the speculative server is read. ``/metrics`` and ``/perf_metrics`` drain on read, so
    ``start`` empties them (earlier requests, health probes) and ``finish`` reads this run's share.
    """

    def __init__(self, version: str, max_draft_len: int, base_url: str, timeout_s: float = 10.0,
                 transport: Any = None):
        self.version = version
        self.line = line_for(version)
        self.max_draft_len = max_draft_len
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.transport = transport
        self._prometheus_before: dict[str, float] | None = None

    async def _get(self, client: Any, path: str) -> tuple[int, str]:
        import httpx

        try:
            response = await client.get(path)
        except httpx.HTTPError as exc:
            return 0, f"{type(exc).__name__}"
        return response.status_code, response.text

    def _client(self) -> Any:
        import httpx

        extra = {"transport": self.transport} if self.transport is not None else {}
        return httpx.AsyncClient(base_url=self.base_url, timeout=self.timeout_s, trust_env=False, **extra)

    async def start(self) -> None:
        async with self._client() as client:
            for path in ("/metrics", "/perf_metrics"):
                await self._get(client, path)
            if "prometheus" in self.line["sources"]:
                code, text = await self._get(client, "/prometheus/metrics")
                self._prometheus_before = parse_prometheus(text) if code == 200 else None

    async def finish(self, tokens_per_request: Sequence[int] = (), chunks_per_request: Sequence[int] = ()) -> Acceptance:
        found: dict[str, Acceptance] = {}
        async with self._client() as client:
            if "iteration_stats" in self.line["sources"]:
                code, text = await self._get(client, "/metrics")
                items = _json_list(text) if code == 200 else None
                found["iteration_stats"] = (from_iteration_stats(items) if items is not None else
                                            unavailable("trtllm iteration stats", f"GET /metrics answered {code or 'nothing'}"))
            if "prometheus" in self.line["sources"]:
                code, text = await self._get(client, "/prometheus/metrics")
                found["prometheus"] = from_prometheus(self._prometheus_before, parse_prometheus(text) if code == 200 else None,
                                                      self.max_draft_len)
            if "perf_metrics" in self.line["sources"]:
                code, text = await self._get(client, "/perf_metrics")
                found["perf_metrics"] = from_perf_metrics(_json_list(text) if code == 200 else None, self.max_draft_len)
        stream = from_stream_chunks(list(tokens_per_request), list(chunks_per_request)) if tokens_per_request else \
            unavailable("stream chunks", "no streamed request to estimate from")
        result = choose(self.line, found, stream)
        result.extra["trtllm_line"] = self.line["line"]
        return result


def _json_list(text: str) -> list[Any] | None:
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, list) else None
