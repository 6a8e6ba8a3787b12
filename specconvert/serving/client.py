"""An async client for OpenAI-compatible servers that streams SSE and times every chunk.

Used by serve-test and bench alike. Every call is bounded twice: httpx timeouts per
connect/read, and an overall deadline per request (a server that trickles bytes
forever still times out). Failures become :class:`RequestFailed` with a ``kind``
(``timeout``, ``connect``, ``http``, ``malformed``, ``incomplete``) and a one-line
message — never a raw exception from deep inside httpx.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import httpx


class RequestFailed(Exception):
    """A request did not produce a well-formed answer."""

    def __init__(self, kind: str, message: str, status: int | None = None, retry_after_s: float | None = None):
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.status = status
        self.retry_after_s = retry_after_s  # the server's Retry-After (seconds), when it sent one


@dataclass
class Chunk:
    """One SSE event with content: when it arrived (seconds after the request was sent) and what it carried."""

    t_s: float
    text: str
    tokens: int | None  # token ids in the chunk when the server reports them


@dataclass
class Completion:
    text: str
    token_ids: list[int] | None  # when the server returns them (``token_ids`` per choice)
    finish_reason: str | None
    prompt_tokens: int | None
    completion_tokens: int | None
    latency_s: float
    ttft_s: float | None  # first content chunk (streaming) or the whole response (non-streaming)
    stream: bool
    chunks: list[Chunk] = field(default_factory=list)
    model: str | None = None
    client_s: float = 0.0  # time spent parsing events and keeping books (not reading the socket): bench's overhead figure
    events: int = 0  # SSE data events parsed
    logprobs: Any = None  # the choice's OpenAI ``logprobs`` object, when asked for (non-streaming)
    stop_reason: Any = None  # vLLM's ``stop_reason``: the stop token id (or string) that ended it, when given

    def as_dict(self, with_chunks: bool = False) -> dict[str, Any]:
        out = {
            "text": self.text, "token_ids": self.token_ids, "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
            "latency_s": round(self.latency_s, 4), "ttft_s": None if self.ttft_s is None else round(self.ttft_s, 4),
            "stream": self.stream, "model": self.model,
        }
        if with_chunks:
            out["chunks"] = [{"t_s": round(c.t_s, 4), "text": c.text, "tokens": c.tokens} for c in self.chunks]
        return out


class OpenAIClient:
    """``async with OpenAIClient(url, request_timeout_s=120) as client: await client.chat(...)``."""

    def __init__(self, base_url: str, request_timeout_s: float = 120.0, connect_timeout_s: float = 10.0,
                 max_connections: int | None = None, transport: httpx.AsyncBaseTransport | None = None,
                 headers: dict[str, str] | None = None):
        """``max_connections``: bench raises it to its highest concurrency (httpx's default pool holds 100).
        ``transport``: an ``httpx.MockTransport`` in tests. ``headers``: sent with every request
        (``Authorization: Bearer ...``)."""
        self.base_url = base_url.rstrip("/")
        self.request_timeout_s = request_timeout_s
        timeout = httpx.Timeout(request_timeout_s, connect=min(connect_timeout_s, request_timeout_s))
        extra: dict[str, Any] = {}
        if max_connections is not None:
            extra["limits"] = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        if transport is not None:
            extra["transport"] = transport
        if headers:
            extra["headers"] = dict(headers)
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout, trust_env=False, **extra)

    async def __aenter__(self) -> "OpenAIClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------------ small endpoints

    async def _get_json(self, path: str, allow_missing: bool = False) -> Any:
        try:
            response = await asyncio.wait_for(self._http.get(path), self.request_timeout_s)
        except asyncio.TimeoutError:
            raise RequestFailed("timeout", f"GET {path}: no answer within {self.request_timeout_s:g} s") from None
        except httpx.HTTPError as exc:
            raise _transport_error(f"GET {path}", exc) from None
        if allow_missing and response.status_code == 404:
            return None
        if response.status_code != 200:
            raise RequestFailed("http", f"GET {path}: HTTP {response.status_code}: {_snippet(response.text)}",
                                response.status_code)
        try:
            return response.json()
        except ValueError:
            raise RequestFailed("malformed", f"GET {path}: not JSON: {_snippet(response.text)}") from None

    async def models(self) -> list[str]:
        """Model ids from ``GET /v1/models``."""
        return [str(card["id"]) for card in await self.model_cards()]

    async def model_cards(self) -> list[dict[str, Any]]:
        """The entries of ``GET /v1/models`` (each with ``id``; vLLM adds ``max_model_len``)."""
        data = await self._get_json("/v1/models")
        try:
            cards = list(data["data"])
            for card in cards:
                str(card["id"])
            return cards
        except (KeyError, TypeError):
            raise RequestFailed("malformed", f"GET /v1/models: no data[].id in {_snippet(json.dumps(data))}") from None

    async def perf_metrics(self) -> list[dict[str, Any]] | None:
        """``GET /perf_metrics`` (TensorRT-LLM shape; drains the server's buffer). None when the route is absent."""
        data = await self._get_json("/perf_metrics", allow_missing=True)
        if data is None:
            return None
        if not isinstance(data, list):
            raise RequestFailed("malformed", f"GET /perf_metrics: expected a list, got {type(data).__name__}")
        return data

    async def prometheus(self) -> str | None:
        """``GET /metrics`` as Prometheus text (vLLM's counters); None when the route is absent or fails."""
        try:
            response = await asyncio.wait_for(self._http.get("/metrics"), self.request_timeout_s)
        except (asyncio.TimeoutError, httpx.HTTPError):
            return None
        return response.text if response.status_code == 200 else None

    # ------------------------------------------------------------------ generation

    async def chat(self, model: str | None, messages: list[dict[str, Any]], **params: Any) -> Completion:
        return await self.generate("/v1/chat/completions", {"messages": messages}, model, **params)

    async def complete(self, model: str | None, prompt: str | Sequence[int], **params: Any) -> Completion:
        return await self.generate("/v1/completions", {"prompt": prompt}, model, **params)

    async def generate(self, path: str, body: dict[str, Any], model: str | None, *, max_tokens: int,
                       temperature: float = 0.0, top_p: float | None = None, seed: int | None = None,
                       stop: Sequence[str] | None = None, stream: bool = False,
                       extra: dict[str, Any] | None = None) -> Completion:
        """One request, bounded by ``request_timeout_s`` overall. Raises :class:`RequestFailed`."""
        payload: dict[str, Any] = {**body, "max_tokens": max_tokens, "temperature": temperature, "stream": stream}
        if model:
            payload["model"] = model
        if top_p is not None:
            payload["top_p"] = top_p
        if seed is not None:
            payload["seed"] = seed
        if stop:
            payload["stop"] = list(stop)
        if stream:
            payload["stream_options"] = {"include_usage": True}
        payload.update(extra or {})
        chat = path.endswith("/chat/completions")
        run = self._stream(path, payload, chat) if stream else self._once(path, payload, chat)
        try:
            return await asyncio.wait_for(run, self.request_timeout_s)
        except asyncio.TimeoutError:
            raise RequestFailed("timeout", f"POST {path}: no complete answer within {self.request_timeout_s:g} s") from None

    async def _once(self, path: str, payload: dict[str, Any], chat: bool) -> Completion:
        started = time.perf_counter()
        try:
            response = await self._http.post(path, json=payload)
        except httpx.HTTPError as exc:
            raise _transport_error(f"POST {path}", exc) from None
        latency = time.perf_counter() - started
        if response.status_code != 200:
            raise RequestFailed("http", f"POST {path}: HTTP {response.status_code}: {_snippet(response.text)}",
                                response.status_code, _retry_after(response.headers.get("retry-after")))
        try:
            data = response.json()
            choice = data["choices"][0]
            text = choice["message"]["content"] if chat else choice["text"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise RequestFailed("malformed", f"POST {path}: not an OpenAI {'chat ' if chat else ''}completion: "
                                f"{_snippet(response.text)}") from None
        if not isinstance(text, (str, type(None))):
            raise RequestFailed("malformed", f"POST {path}: content is {type(text).__name__}, not text")
        usage = data.get("usage") or {}
        return Completion(text or "", _ids(choice.get("token_ids")), choice.get("finish_reason"),
                          usage.get("prompt_tokens"), usage.get("completion_tokens"), latency, latency, False,
                          model=data.get("model"), logprobs=choice.get("logprobs"), stop_reason=choice.get("stop_reason"))

    async def _stream(self, path: str, payload: dict[str, Any], chat: bool) -> Completion:
        started = time.perf_counter()
        parts: list[str] = []
        token_ids: list[int] | None = []
        chunks: list[Chunk] = []
        finish = model = None
        usage: dict[str, Any] = {}
        done = False
        client_s, events = 0.0, 0
        try:
            async with self._http.stream("POST", path, json=payload) as response:
                if response.status_code != 200:
                    body = (await response.aread()).decode("utf-8", "replace")
                    raise RequestFailed("http", f"POST {path}: HTTP {response.status_code}: {_snippet(body)}",
                                        response.status_code)
                async for line in response.aiter_lines():
                    arrived = time.perf_counter()
                    try:
                        if not line.strip() or line.startswith(":"):
                            continue  # keep-alive comments and event separators
                        if not line.startswith("data:"):
                            if line.startswith(("event:", "id:", "retry:")):
                                continue
                            raise RequestFailed("malformed", f"POST {path}: not a server-sent event line: {_snippet(line)}")
                        data = line[5:].strip()
                        events += 1
                        if data == "[DONE]":
                            done = True
                            break
                        try:
                            event = json.loads(data)
                        except ValueError:
                            raise RequestFailed("malformed", f"POST {path}: event is not JSON: {_snippet(data)}") from None
                        if not isinstance(event, dict):
                            raise RequestFailed("malformed", f"POST {path}: event is not an object: {_snippet(data)}")
                        if "error" in event:
                            raise RequestFailed("http", f"POST {path}: error in stream: {_snippet(json.dumps(event['error']))}")
                        model = event.get("model", model)
                        usage = event.get("usage") or usage
                        choices = event.get("choices")
                        if not isinstance(choices, list):
                            raise RequestFailed("malformed", f"POST {path}: event without choices: {_snippet(data)}")
                        for choice in choices:
                            try:
                                text = (choice.get("delta") or {}).get("content") if chat else choice.get("text")
                            except AttributeError:
                                raise RequestFailed("malformed", f"POST {path}: bad choice: {_snippet(data)}") from None
                            ids = _ids(choice.get("token_ids"))
                            if ids is None:
                                if text:  # tokens without ids (vLLM's role-only opening chunk carries neither)
                                    token_ids = None
                            elif token_ids is not None:
                                token_ids.extend(ids)
                            if text:
                                parts.append(text)
                            if text or ids:
                                chunks.append(Chunk(arrived - started, text or "", len(ids) if ids is not None else None))
                            finish = choice.get("finish_reason") or finish
                    finally:  # parsing and bookkeeping only: the wait for the next line is not the client's cost
                        client_s += time.perf_counter() - arrived
        except httpx.HTTPError as exc:
            raise _transport_error(f"POST {path}", exc, streaming=True) from None
        if not done:
            raise RequestFailed("incomplete", f"POST {path}: the stream ended without [DONE] "
                                f"after {len(chunks)} chunks (did the server die?)")
        latency = time.perf_counter() - started
        return Completion("".join(parts), token_ids, finish, usage.get("prompt_tokens"), usage.get("completion_tokens"),
                          latency, chunks[0].t_s if chunks else None, True, chunks, model, client_s, events)


def _ids(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(isinstance(v, int) for v in value):
        return list(value)
    return None


def _snippet(text: str, limit: int = 200) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[:limit] + "..."


def _retry_after(value: str | None) -> float | None:
    """``Retry-After`` in seconds (the delay form; an HTTP date or garbage reads as none)."""
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None
    return seconds if seconds is not None and 0 <= seconds < 86400 else None


def _transport_error(what: str, exc: httpx.HTTPError, streaming: bool = False) -> RequestFailed:
    if isinstance(exc, httpx.TimeoutException):
        return RequestFailed("timeout", f"{what}: timed out ({type(exc).__name__})")
    if isinstance(exc, httpx.ConnectError):
        return RequestFailed("connect", f"{what}: cannot connect ({exc}); is the server running?")
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
        kind = "incomplete" if streaming else "connect"
        return RequestFailed(kind, f"{what}: the connection broke ({exc or type(exc).__name__}); did the server die?")
    return RequestFailed("connect", f"{what}: {type(exc).__name__}: {exc}")
