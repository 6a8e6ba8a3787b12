"""The load generator over serve's SSE client against scripted streams: exact timings through a fake clock."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from specconvert.bench import loadgen
from specconvert.bench.loadgen import Endpoint, run_load, stream_request
from specconvert.bench.metrics import itl_samples, tpot, ttft
from specconvert.serving import client as client_module
from specconvert.serving.client import OpenAIClient


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def perf_counter(self):
        return self.now


def scripted_transport(clock, script, status=200):
    """Each script entry: (seconds to advance before the line, SSE data payload or raw line)."""

    class Stream(httpx.AsyncByteStream):
        async def __aiter__(self):
            for advance, data in script:
                clock.now += advance
                line = data if isinstance(data, str) else json.dumps(data)
                yield f"data: {line}\n\n".encode()

    def handler(request):
        return httpx.Response(status, stream=Stream(), headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handler)


def chat_chunk(content=None, ids=None, role=None):
    delta = {}
    if role:
        delta["role"] = role
    if content is not None:
        delta["content"] = content
    choice = {"index": 0, "delta": delta}
    if ids is not None:
        choice["token_ids"] = ids
    return {"choices": [choice]}


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(loadgen, "time", fake)
    monkeypatch.setattr(client_module, "time", fake)
    return fake


def mock_client(transport, timeout=5.0):
    return OpenAIClient("http://x", request_timeout_s=timeout, transport=transport)


def run(coro):
    return asyncio.run(coro)


def test_token_ids_per_chunk_give_exact_ttft_itl_tpot(clock):
    script = [
        (0.000, chat_chunk(role="assistant", ids=[])),  # role-only: no token, not the first token
        (0.120, chat_chunk("a", [5])),
        (0.040, chat_chunk("bcd", [6, 7, 8])),
        (0.030, chat_chunk("ef", [9, 10])),
        (0.010, {"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 6}}),
        (0.005, "[DONE]"),
    ]

    async def go():
        async with mock_client(scripted_transport(clock, script)) as client:
            return await stream_request(client, Endpoint("speculative", "http://x", "m", "chat"), {"max_tokens": 8}, 0)

    rec = run(go())
    assert rec.error is None
    assert [c.tokens for c in rec.chunks] == [1, 3, 2]
    assert rec.output_tokens == 6 and rec.usage_tokens == 6 and rec.prompt_tokens == 4
    assert rec.token_count_source == "token_ids"
    assert ttft(rec) == pytest.approx(0.120)
    assert rec.e2e_s == pytest.approx(0.205)
    assert itl_samples(rec) == pytest.approx([0.040 / 3, 0.030 / 2])
    assert tpot(rec) == pytest.approx((0.205 - 0.120) / 5)


def test_text_only_stream_apportions_usage_and_says_so(clock):
    script = [
        (0.1, {"choices": [{"index": 0, "text": "ab"}]}),
        (0.1, {"choices": [{"index": 0, "text": "cdef"}]}),
        (0.0, {"choices": [], "usage": {"completion_tokens": 5}}),
        (0.0, "[DONE]"),
    ]

    async def go():
        async with mock_client(scripted_transport(clock, script)) as client:
            return await stream_request(client, Endpoint("speculative", "http://x", None, "completions"), {"max_tokens": 8}, 0)

    rec = run(go())
    assert rec.token_count_source == "usage_apportioned"
    assert [c.tokens for c in rec.chunks] == [2, 3]  # 1 each, then 3 more by text length 2:4 -> 1, 2
    assert rec.output_tokens == 5


def test_http_error_and_in_stream_error_are_recorded_not_raised(clock):
    async def go(transport):
        async with mock_client(transport) as client:
            return await stream_request(client, Endpoint("speculative", "http://x", "m", "chat"), {"max_tokens": 8}, 3)

    bad = httpx.MockTransport(lambda r: httpx.Response(500, json={"error": {"message": "boom"}}))
    rec = run(go(bad))
    assert rec.error.startswith("http:") and "HTTP 500" in rec.error and "boom" in rec.error and not rec.ok
    rec = run(go(scripted_transport(clock, [(0.1, {"error": {"message": "too long"}})])))
    assert "too long" in rec.error and not rec.ok


def test_run_load_keeps_concurrency_and_sends_every_payload_once():
    in_flight, peak, seen = 0, 0, []

    async def handler(request):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        seen.append(json.loads(request.content)["i"])  # unknown keys travel as `extra`
        await asyncio.sleep(0.01)
        in_flight -= 1
        body = f"data: {json.dumps(chat_chunk('a', [1]))}\n\ndata: [DONE]\n\n"
        return httpx.Response(200, content=body.encode(), headers={"content-type": "text/event-stream"})

    async def go():
        async with mock_client(httpx.MockTransport(handler), timeout=0.2) as client:
            return await run_load(client, Endpoint("baseline", "http://x", "m", "chat"), [{"i": i, "max_tokens": 2} for i in range(9)],
                                  concurrency=3, run_timeout_s=10)

    records, duration = run(go())
    assert sorted(seen) == list(range(9))
    assert peak == 3
    assert [r.index for r in records] == list(range(9)) and all(r.ok for r in records)
    assert duration > 0


def test_run_load_is_bounded_in_time():
    async def handler(request):
        await asyncio.sleep(5)
        return httpx.Response(200, content=b"data: [DONE]\n\n")

    async def go():
        async with mock_client(httpx.MockTransport(handler), timeout=0.2) as client:
            return await run_load(client, Endpoint("baseline", "http://x", "m", "chat"), [{"max_tokens": 2}] * 4,
                                  concurrency=2, run_timeout_s=10)

    records, duration = run(go())
    assert duration < 2
    assert all(r.error and r.error.startswith("timeout:") for r in records)
