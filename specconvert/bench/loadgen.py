"""The async load generator: stream OpenAI-compatible requests at a fixed concurrency and time every chunk.

httpx is imported by the functions that use it. Each request is bounded by
``request_timeout_s`` (whole request, not just one read) and each run by
``run_timeout_s``; a request that fails or times out is recorded with its error,
never retried, so a run always ends after ``len(payloads)`` requests.

Per-chunk token counts, best source first: the chunk's ``token_ids`` (the reference
server, vLLM's ``return_token_ids``), its ``logprobs`` entries, else the final
``usage.completion_tokens`` apportioned over the chunks by text length (an estimate).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from .metrics import Chunk, RequestRecord


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


def _chunk_tokens(choice: dict[str, Any], chat: bool) -> tuple[int | None, str, str]:
    """(tokens or None when unknown, how they were counted, text) of one streamed choice."""
    text = ((choice.get("delta") or {}).get("content") if chat else choice.get("text")) or ""
    ids = choice.get("token_ids")
    if isinstance(ids, list):
        return len(ids), "token_ids", text
    logprobs = choice.get("logprobs")
    if isinstance(logprobs, dict):
        entries = logprobs.get("content") if chat else logprobs.get("tokens")
        if isinstance(entries, list):
            return len(entries), "logprobs", text
    return None, "usage_apportioned", text


def apportion(total: int, weights: Sequence[int]) -> list[int]:
    """Split ``total`` tokens over chunks: at least one per chunk when there are enough, the rest by weight."""
    count = len(weights)
    if count == 0:
        return []
    if total < count:  # fewer tokens than chunks: the first ``total`` chunks get one each
        return [1 if i < total else 0 for i in range(count)]
    base = [1] * count
    rest = total - count
    weight_sum = sum(weights)
    if rest == 0:
        return base
    if weight_sum == 0:
        shares = [rest / count] * count
    else:
        shares = [rest * w / weight_sum for w in weights]
    floors = [int(s) for s in shares]
    left = rest - sum(floors)
    order = sorted(range(count), key=lambda i: (-(shares[i] - floors[i]), i))
    for i in order[:left]:
        floors[i] += 1
    return [b + f for b, f in zip(base, floors)]


async def stream_request(client: Any, endpoint: Endpoint, payload: dict[str, Any], index: int) -> RequestRecord:
    """Send one streaming request and record when each token-carrying chunk arrived."""
    import httpx

    chat = endpoint.api == "chat"
    record = RequestRecord(index=index)
    pending: list[tuple[float, int | None, str]] = []  # (t, tokens or None, text)
    sources: set[str] = set()
    record.send_time = sent = time.perf_counter()
    try:
        async with client.stream("POST", endpoint.base_url + endpoint.path, json=payload) as response:
            if response.status_code != 200:
                body = (await response.aread()).decode("utf-8", "replace")
                record.error = f"HTTP {response.status_code}: {_error_message(body)}"
                return record
            async for line in response.aiter_lines():
                arrived = time.perf_counter()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    record.client_overhead_s += time.perf_counter() - arrived
                    break
                record.events += 1
                try:
                    event = json.loads(data)
                except json.JSONDecodeError:
                    record.error = f"malformed SSE event: {data[:120]}"
                    break
                if isinstance(event, dict) and event.get("error"):
                    record.error = f"server error: {_error_message(json.dumps(event))}"
                    break
                usage = event.get("usage") if isinstance(event, dict) else None
                if isinstance(usage, dict):
                    if usage.get("completion_tokens") is not None:
                        record.usage_tokens = int(usage["completion_tokens"])
                    if usage.get("prompt_tokens") is not None:
                        record.prompt_tokens = int(usage["prompt_tokens"])
                for choice in (event.get("choices") or []) if isinstance(event, dict) else []:
                    tokens, source, text = _chunk_tokens(choice, chat)
                    if tokens == 0 or (tokens is None and not text):
                        continue  # role-only or empty keep-alive chunk
                    pending.append((arrived - sent, tokens, text))
                    sources.add(source)
                record.client_overhead_s += time.perf_counter() - arrived
            record.e2e_s = time.perf_counter() - sent
    except httpx.HTTPError as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:300]
        return record
    finished = time.perf_counter()
    if any(tokens is None for _, tokens, _ in pending):
        if record.usage_tokens is not None:
            counts = apportion(record.usage_tokens, [len(text) for _, _, text in pending])
            record.token_count_source = "usage_apportioned"
        else:
            counts = [1] * len(pending)
            record.token_count_source = "chunks"
    else:
        counts = [tokens or 0 for _, tokens, _ in pending]
        record.token_count_source = sorted(sources)[0] if sources else "token_ids"
    record.chunks = [Chunk(t, n) for (t, _, _), n in zip(pending, counts) if n > 0]
    record.output_tokens = sum(c.tokens for c in record.chunks)
    record.client_overhead_s += time.perf_counter() - finished
    return record


def _error_message(body: str) -> str:
    try:
        data = json.loads(body)
        err = data.get("error", data) if isinstance(data, dict) else data
        if isinstance(err, dict):
            return str(err.get("message") or err)[:300]
        return str(err)[:300]
    except (json.JSONDecodeError, AttributeError):
        return body.strip()[:300]


async def run_load(
    client: Any,
    endpoint: Endpoint,
    payloads: Sequence[dict[str, Any]],
    concurrency: int,
    request_timeout_s: float,
    run_timeout_s: float,
    on_done: Callable[[RequestRecord], None] | None = None,
) -> tuple[list[RequestRecord], float]:
    """Send every payload once with ``concurrency`` requests in flight; return the records and the wall time."""
    records: list[RequestRecord | None] = [None] * len(payloads)
    queue = iter(enumerate(payloads))

    async def one(index: int, payload: dict[str, Any]) -> RequestRecord:
        try:
            return await asyncio.wait_for(stream_request(client, endpoint, payload, index), request_timeout_s)
        except asyncio.TimeoutError:
            return RequestRecord(index=index, error=f"timed out after {request_timeout_s:g} s")

    async def worker() -> None:
        for index, payload in queue:  # the shared iterator hands each payload to exactly one worker
            record = await one(index, payload)
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


async def get_json(client: Any, url: str) -> Any | None:
    """GET a JSON document; None on any HTTP error or non-JSON answer (the endpoint is optional)."""
    import httpx

    try:
        response = await client.get(url)
    except httpx.HTTPError:
        return None
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


async def drain_metrics(client: Any, base_url: str) -> list[dict[str, Any]] | None:
    """Items of ``GET /perf_metrics`` (drained on read by TensorRT-LLM and the reference server); None when absent."""
    data = await get_json(client, base_url.rstrip("/") + "/perf_metrics")
    if isinstance(data, list):
        return [item for item in data if isinstance(item, dict)]
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        return [item for item in data["data"] if isinstance(item, dict)]
    return None


async def list_models(client: Any, base_url: str) -> list[dict[str, Any]]:
    data = await get_json(client, base_url.rstrip("/") + "/v1/models")
    if isinstance(data, dict) and isinstance(data.get("data"), list):
        return [m for m in data["data"] if isinstance(m, dict) and m.get("id")]
    return []
