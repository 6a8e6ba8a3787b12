"""The load generator: serve's SSE client (``serving.client.OpenAIClient``) at a fixed concurrency.

The client times every chunk and its own parsing; this module turns each streamed
completion into a :class:`~.metrics.RequestRecord` and keeps ``concurrency``
requests in flight. Every request is bounded by the client's overall deadline
(``request_timeout_s``) and each run by ``run_timeout_s``; a failed or timed-out
request is recorded with its error, never retried, so a run always ends after
``len(payloads)`` requests.

Per-chunk token counts: the chunk's ``token_ids`` when the server sends them (the
reference server; vLLM with ``return_token_ids``), else the final
``usage.completion_tokens`` apportioned over the chunks by text length (an
estimate, recorded as such), else one token per chunk.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .metrics import Chunk, RequestRecord

# Payload keys the client sets itself from its arguments; the rest travels as ``extra``.
_CLIENT_KEYS = {"messages", "prompt", "model", "max_tokens", "temperature", "seed", "stream", "stream_options"}


@dataclass(frozen=True)
class Endpoint:
    """One side of a comparison: where to send, which model, which API."""

    label: str  # "baseline" | "speculative"
    base_url: str
    model: str | None
    api: str  # "chat" | "completions"

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.api == "chat" else "/v1/completions"


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """Split ``total`` tokens over chunks: one per chunk when there are enough, the rest by weight (largest remainder)."""
    count = len(weights)
    if count == 0:
        return []
    if total < count:  # fewer tokens than chunks: the first ``total`` chunks get one each
        return [1 if i < total else 0 for i in range(count)]
    rest = total - count
    weight_sum = sum(weights)
    shares = [rest / count] * count if weight_sum == 0 else [rest * w / weight_sum for w in weights]
    floors = [int(s) for s in shares]
    order = sorted(range(count), key=lambda i: (-(shares[i] - floors[i]), i))
    for i in order[: rest - sum(floors)]:
        floors[i] += 1
    return [1 + f for f in floors]


def to_record(completion: Any, index: int, send_time: float) -> RequestRecord:
    """A streamed :class:`~specconvert.serving.client.Completion` as a bench record."""
    record = RequestRecord(index=index, send_time=send_time, e2e_s=completion.latency_s,
                           usage_tokens=completion.completion_tokens, prompt_tokens=completion.prompt_tokens,
                           client_overhead_s=completion.client_s, events=completion.events,
                           token_ids=completion.token_ids)
    started = time.perf_counter()
    chunks = completion.chunks
    if chunks and all(c.tokens is not None for c in chunks):
        counts = [c.tokens for c in chunks]
        record.token_count_source = "token_ids"
    elif record.usage_tokens is not None:
        counts = apportion(record.usage_tokens, [len(c.text) for c in chunks])
        record.token_count_source = "usage_apportioned"
    else:
        counts = [1] * len(chunks)
        record.token_count_source = "chunks"
    record.chunks = [Chunk(c.t_s, n) for c, n in zip(chunks, counts) if n > 0]
    record.output_tokens = sum(c.tokens for c in record.chunks)
    record.client_overhead_s += time.perf_counter() - started
    return record


async def stream_request(client: Any, endpoint: Endpoint, payload: dict[str, Any], index: int) -> RequestRecord:
    """Send one streaming request through ``client`` (an OpenAIClient); failures become the record's error."""
    from ..serving.client import RequestFailed

    body = {k: payload[k] for k in ("messages", "prompt") if k in payload}
    extra = {k: v for k, v in payload.items() if k not in _CLIENT_KEYS}
    send_time = time.perf_counter()
    try:
        completion = await client.generate(endpoint.path, body, endpoint.model, max_tokens=payload["max_tokens"],
                                           temperature=payload.get("temperature", 0.0), seed=payload.get("seed"),
                                           stream=True, extra=extra or None)
    except RequestFailed as exc:
        return RequestRecord(index=index, send_time=send_time, error=f"{exc.kind}: {exc.message}")
    return to_record(completion, index, send_time)


async def run_load(
    client: Any,
    endpoint: Endpoint,
    payloads: Sequence[dict[str, Any]],
    concurrency: int,
    run_timeout_s: float,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> tuple[list[RequestRecord], float]:
    """Send every payload once with ``concurrency`` requests in flight; return the records and the wall time."""
    records: list[RequestRecord | None] = [None] * len(payloads)
    queue = iter(enumerate(payloads))

    async def worker() -> None:
        for index, payload in queue:  # the shared iterator hands each payload to exactly one worker
            record = await stream_request(client, endpoint, payload, index)
            records[index] = record
            if on_done is not None:
                on_done(record)

    started = time.perf_counter()
    workers = [asyncio.ensure_future(worker()) for _ in range(max(1, min(concurrency, len(payloads))))]
    try:
        await asyncio.wait_for(asyncio.gather(*workers), run_timeout_s)
    except asyncio.TimeoutError:
        pass
    finally:
        for task in workers:
            task.cancel()
    duration = time.perf_counter() - started
    done = [r if r is not None else RequestRecord(index=i, error=f"run stopped after {run_timeout_s:g} s")
            for i, r in enumerate(records)]
    return done, duration


async def drain_metrics(client: Any) -> list[dict[str, Any]] | None:
    """Items of ``GET /perf_metrics`` (drained on read by TensorRT-LLM and the reference server); None when absent."""
    from ..serving.client import RequestFailed

    try:
        items = await client.perf_metrics()
    except RequestFailed:
        return None
    return None if items is None else [item for item in items if isinstance(item, dict)]


async def list_models(client: Any) -> list[str]:
    """Model ids of ``GET /v1/models``; empty when the endpoint does not list them."""
    from ..serving.client import RequestFailed

    try:
        return await client.models()
    except RequestFailed:
        return []
