"""The reference OpenAI-compatible HTTP surface (FastAPI + uvicorn).

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (both with
``stream: true`` as server-sent events), ``GET /health``, ``GET /v1/models``,
``GET /perf_metrics`` (TensorRT-LLM's per-request shape; drained on read, as there).

FastAPI is imported with this module; the CLI imports it only when serving.

Two model names are served by the same decoder: ``<name>`` speculates, and
``<name>-baseline`` runs the plain target (no draft), so a client compares both
through one endpoint. A request may also carry the extension field
``"speculative": false``. Each choice carries ``token_ids`` (the generated ids,
as vLLM's ``return_token_ids`` does) so lossless checks compare tokens, not text.

Every error is OpenAI's shape ``{"error": {"message", "type", "param", "code"}}``: 400 for
a bad request (before any header is sent), 404 an unknown model, 413 a body over the
limit, 429 a full queue, 503 a server shutting down, 500 an unexpected failure. Once a
stream's 200 headers are out, an error arrives as an SSE event ``data: {"error": ...}``
followed by ``data: [DONE]``. A client that disconnects (streamed or not) stops its
work after the current decoder step.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from dataclasses import dataclass
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.requests import ClientDisconnect

from ..errors import InputError
from .engine import Delta, EngineRequest, ReferenceEngine
from .openai_api import (BaseRequest, ChatRequest, CompletionRequest, chat_logprobs, check_request,
                         completion_logprobs, error, error_body)

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions
MAX_BODY_BYTES = 8 * 1024 * 1024  # a 128k-token id list is ~1 MB of JSON; anything far larger is abuse
MAX_QUEUED = 16  # requests waiting behind the running one; more get 429 instead of an unbounded wait
DISCONNECT_POLL_S = 0.2  # how often a non-streamed request checks that its client is still there

log = logging.getLogger("specconvert.serving")


class _BodyTooLarge(Exception):
    pass


async def _read_body(request: Request, limit: int) -> bytes:
    """The request body, refusing (before reading it all) one larger than ``limit`` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise _BodyTooLarge
    chunks, size = [], 0
    async for chunk in request.stream():  # chunked bodies declare no length: count as they arrive
        size += len(chunk)
        if size > limit:
            raise _BodyTooLarge
        chunks.append(chunk)
    return b"".join(chunks)


@dataclass
class _Server:
    """What every route reads: the engine and the limits it is served with."""

    engine: ReferenceEngine
    context: int | None  # prompt + max_tokens bound (None: unbounded)
    max_body_bytes: int
    max_queued: int
    started: int  # unix time, reported as each model's ``created``


def create_app(engine: ReferenceEngine, max_model_len: int | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               max_queued: int = MAX_QUEUED):
    """The FastAPI application over one engine.

    ``max_model_len`` bounds prompt + max_tokens; the target's ``max_position_embeddings``
    bounds it too, whichever is smaller (a longer prompt is a 400, as in vLLM).
    """
    app = FastAPI(title="specconvert reference server", docs_url=None, redoc_url=None)
    limits = [n for n in (max_model_len, engine.max_model_len) if n]
    server = _Server(engine, min(limits) if limits else None, max_body_bytes, max_queued, int(time.time()))
    app.add_exception_handler(Exception, _unexpected)
    _add_info_routes(app, server)
    _add_generation_routes(app, server)
    return app


async def _unexpected(request: Request, exc: Exception):
    # Starlette's default is a text/plain 500; OpenAI clients expect the JSON error shape.
    log.exception("unexpected error serving %s", request.url.path)
    return error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")


# ---------------------------------------------------------------------- steps of one request


def _pick_speculative(server: _Server, body: BaseRequest) -> bool | str:
    """True/False, or an error message for an unknown model."""
    engine = server.engine
    names = (engine.model_name, engine.baseline_name)
    if body.model not in (None, "", *names):
        return f"model '{body.model}' is not served here; use one of: {', '.join(names)}"
    speculative = getattr(engine, "speculate", True) and body.model != engine.baseline_name
    if body.speculative is not None:
        speculative = speculative and body.speculative
    return speculative


def _to_engine(server: _Server, body: BaseRequest, prompt_ids: list[int], speculative: bool) -> EngineRequest:
    max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
    context = server.context
    if context is not None and len(prompt_ids) + max_tokens > context:
        # vLLM's wording, with the numbers, so a client's retry logic recognises it.
        raise InputError(f"This model's maximum context length is {context} tokens. However, you requested "
                         f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the prompt, {max_tokens} "
                         "in the completion). Please reduce the length of the prompt or completion.")
    stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
    return EngineRequest(prompt_ids, max_tokens, body.temperature, body.top_p, body.top_k, body.seed, stop,
                         speculative, body.ignore_eos, body.top_logprobs_wanted())


async def _parse(server: _Server, request: Request, model: type[BaseRequest]) -> BaseRequest | JSONResponse:
    try:
        raw = json.loads(await _read_body(request, server.max_body_bytes))
    except _BodyTooLarge:
        return error(413, f"request body is larger than {server.max_body_bytes} bytes")
    except ClientDisconnect:
        # Nobody is left to answer. Raised on, it cost two tracebacks (our handler's and uvicorn's).
        log.warning("client %s disconnected before its request body to %s was complete",
                 request.client.host if request.client else "?", request.url.path)
        return error(400, "client disconnected before the request body was complete")
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        return error(400, "request body is not valid JSON")
    if not isinstance(raw, dict):
        return error(400, "request body must be a JSON object")
    try:
        body = model.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        return error(400, f"{where}: {first['msg']}", param=where)
    return check_request(body) or body


def _admit(server: _Server) -> JSONResponse | None:
    engine = server.engine
    if engine.closed:
        return error(503, "the server is shutting down; retry on another instance", "service_unavailable")
    if engine.queued >= server.max_queued:
        return error(429, f"{engine.queued} requests are already waiting for the decoder; retry later",
                     "rate_limit_exceeded")
    return None


def _check_ids(server: _Server, prompt_ids: list[int]) -> JSONResponse | None:
    vocab = server.engine.vocab_size
    bad = [t for t in prompt_ids if t < 0 or (vocab is not None and t >= vocab)]
    if bad:
        bound = f"0 <= id < {vocab}" if vocab is not None else "ids >= 0"
        return error(400, f"prompt: token id {bad[0]} is out of range ({bound})", param="prompt")
    return None


class _Reply:
    """The OpenAI response of one admitted request: its chunks (streamed) or its one body."""

    def __init__(self, server: _Server, body: BaseRequest, job: EngineRequest, speculative: bool, chat: bool,
                 echo_text: str):
        engine = server.engine
        self.engine, self.body, self.job, self.chat, self.echo_text = engine, body, job, chat, echo_text
        self.request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())
        self.model_name = body.model or (engine.model_name if speculative else engine.baseline_name)
        self.object_name = "chat.completion.chunk" if chat else "text_completion"
        self.usage = {"prompt_tokens": len(job.prompt_ids)}
        self.as_ids = bool(body.return_tokens_as_token_ids)

    def token_text(self, token_id: int) -> str:
        return self.engine.token_text(token_id, self.as_ids)

    def logprobs_of(self, delta: Delta) -> dict | None:
        if delta.logprobs is None:
            return None
        if self.chat:
            return chat_logprobs(delta.logprobs, self.token_text)
        return completion_logprobs(delta.logprobs, [o + len(self.echo_text) for o in delta.text_offsets or []],
                                   self.token_text)

    def chunk(self, delta: Delta | None, first: bool = False) -> dict[str, Any]:
        if self.chat:
            message: dict[str, Any] = {}
            if first:
                message["role"] = "assistant"
            if delta is not None and delta.text:
                message["content"] = delta.text
            choice = {"index": 0, "delta": message, "finish_reason": delta.finish_reason if delta else None}
        else:
            text = (self.echo_text if first else "") + (delta.text if delta else "")
            choice = {"index": 0, "text": text, "finish_reason": delta.finish_reason if delta else None}
        choice["logprobs"] = self.logprobs_of(delta) if delta else None
        choice["token_ids"] = delta.token_ids if delta else []
        return {"id": self.request_id, "object": self.object_name, "created": self.created, "model": self.model_name,
                "choices": [choice]}

    def stream(self) -> StreamingResponse:
        include_usage = bool((self.body.stream_options or {}).get("include_usage"))

        async def events() -> AsyncIterator[str]:
            count = 0
            if self.chat or self.echo_text:
                yield f"data: {json.dumps(self.chunk(None, first=True))}\n\n"
            try:
                async for delta in self.engine.generate(self.job):
                    count += len(delta.token_ids)
                    yield f"data: {json.dumps(self.chunk(delta))}\n\n"
            except InputError as exc:
                yield f"data: {json.dumps(error_body(400, exc.message))}\n\n"
            except Exception as exc:  # the 200 headers are out: the error must travel as an event
                log.exception("stream %s failed", self.request_id)
                yield f"data: {json.dumps(error_body(500, f'internal error: {type(exc).__name__}: {exc}', 'server_error'))}\n\n"
            if include_usage:
                done = {**self.usage, "completion_tokens": count, "total_tokens": self.usage["prompt_tokens"] + count}
                usage_chunk = {"id": self.request_id, "object": self.object_name, "created": self.created,
                               "model": self.model_name, "choices": [], "usage": done}
                yield f"data: {json.dumps(usage_chunk)}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    async def collect(self, request: Request) -> Response:
        deltas: list[Delta] = []

        async def run() -> None:
            async for delta in self.engine.generate(self.job):
                deltas.append(delta)

        # Nothing is sent until the end, so only polling notices a client that left; cancelling the task
        # stops the decoder after its current step (it ran to max_tokens before, blocking everyone queued).
        task = asyncio.ensure_future(run())
        try:
            while not task.done():
                await asyncio.wait({task}, timeout=DISCONNECT_POLL_S)
                if not task.done() and await request.is_disconnected():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    return Response(status_code=499)  # nginx's "client closed request": nobody reads it
            task.result()
        except InputError as exc:
            return error(400, exc.message)
        except Exception as exc:  # answered here (not re-raised) so the server logs it once and stays up
            log.exception("request %s failed", self.request_id)
            return error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")
        finally:
            if not task.done():  # the handler itself was cancelled
                task.cancel()
        return JSONResponse(self.body_of(deltas))

    def body_of(self, deltas: list[Delta]) -> dict[str, Any]:
        token_ids = [t for d in deltas for t in d.token_ids]
        finish = next((d.finish_reason for d in reversed(deltas) if d.finish_reason), None)
        usage = {**self.usage, "completion_tokens": len(token_ids),
                 "total_tokens": self.usage["prompt_tokens"] + len(token_ids)}
        out = "".join(d.text for d in deltas)
        logprobs = None
        if self.job.logprobs is not None:
            merged = Delta(out, token_ids, finish, [e for d in deltas for e in d.logprobs or []],
                           [o for d in deltas for o in d.text_offsets or []])
            logprobs = self.logprobs_of(merged)
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": out}, "logprobs": logprobs,
                      "finish_reason": finish, "token_ids": token_ids}
        else:
            choice = {"index": 0, "text": self.echo_text + out, "logprobs": logprobs, "finish_reason": finish,
                      "token_ids": token_ids}
        return {"id": self.request_id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.model_name, "choices": [choice], "usage": usage}


async def _generate(server: _Server, request: Request, body: BaseRequest, prompt_ids: list[int], speculative: bool,
                    chat: bool, echo_text: str = ""):
    """Bound the request, admit it, then answer it streamed or whole."""
    try:
        job = _to_engine(server, body, prompt_ids, speculative)
    except InputError as exc:
        return error(400, exc.message, param="max_tokens")
    refused = _admit(server)
    if refused is not None:
        return refused
    reply = _Reply(server, body, job, speculative, chat, echo_text)
    return reply.stream() if body.stream else await reply.collect(request)


# ---------------------------------------------------------------------- routes


def _add_info_routes(app: FastAPI, server: _Server) -> None:
    engine = server.engine

    @app.get("/health")
    async def health():
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models():
        data = [
            {"id": name, "object": "model", "created": server.started, "owned_by": "specconvert",
             "speculative": name == engine.model_name, "max_model_len": server.context}
            for name in (engine.model_name, engine.baseline_name)
        ]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/perf_metrics")
    async def perf_metrics():
        return JSONResponse(engine.drain_metrics())

    @app.get("/v1/server_info")
    async def server_info():
        return JSONResponse({"backend": "reference", "model": engine.model_name, "baseline_model": engine.baseline_name,
                             "queued": engine.queued, "max_model_len": server.context, **engine.description})


async def _read_request(server: _Server, request: Request, model: type[BaseRequest]
                        ) -> tuple[BaseRequest, bool] | JSONResponse:
    """The validated body and whether it speculates, or the error response (bad body, unknown model)."""
    body = await _parse(server, request, model)
    if not isinstance(body, model):
        return body
    speculative = _pick_speculative(server, body)
    if isinstance(speculative, str):
        return error(404, speculative, "model_not_found", param="model")
    return body, speculative


def _completion_prompt_ids(server: _Server, body: CompletionRequest) -> tuple[list[int], str] | JSONResponse:
    """A completion's prompt (text, one-element text list, or ids) as ids, and its text for ``echo``."""
    engine = server.engine
    prompt = body.prompt
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
        if len(prompt) != 1:
            return error(400, "prompt: one prompt per request (batch prompts are not supported)", param="prompt")
        prompt = prompt[0]
    try:
        prompt_ids = engine.encode(prompt) if isinstance(prompt, str) else list(prompt)
    except InputError as exc:
        return error(400, exc.message, param="prompt")
    if not prompt_ids:
        return error(400, "prompt: empty", param="prompt")
    echo_text = (prompt if isinstance(prompt, str) else engine.decode(prompt_ids)) if body.echo else ""
    return prompt_ids, echo_text


def _chat_prompt_ids(server: _Server, body: ChatRequest) -> tuple[list[int], str] | JSONResponse:
    """Chat messages through the tokenizer's chat template, as ids (and no ``echo`` text)."""
    engine = server.engine
    messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    try:
        return engine.encode(engine.render_chat(messages), chat=True), ""
    except InputError as exc:
        return error(400, exc.message, param="messages")
    except Exception as exc:  # the model's chat template refused these messages (jinja raise_exception)
        return error(400, f"messages: the chat template refused them: {exc}", param="messages")


async def _answer(server: _Server, request: Request, chat: bool):
    """One generation request, step by step: read it, encode its prompt, check the ids, generate."""
    read = await _read_request(server, request, ChatRequest if chat else CompletionRequest)
    if isinstance(read, JSONResponse):
        return read
    body, speculative = read
    prompt = _chat_prompt_ids(server, body) if chat else _completion_prompt_ids(server, body)
    if isinstance(prompt, JSONResponse):
        return prompt
    prompt_ids, echo_text = prompt
    bad = _check_ids(server, prompt_ids)
    if bad is not None:
        return bad
    return await _generate(server, request, body, prompt_ids, speculative, chat=chat, echo_text=echo_text)


def _add_generation_routes(app: FastAPI, server: _Server) -> None:
    @app.post("/v1/completions")
    async def completions(request: Request):
        return await _answer(server, request, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        return await _answer(server, request, chat=True)


def serve(app: Any, host: str, port: int, log_level: str = "warning") -> None:
    """Run the app under uvicorn until SIGINT/SIGTERM (uvicorn shuts down gracefully on both)."""
    import uvicorn

    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, access_log=False,
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    server.run()
    if not server.started:
        # uvicorn logs the bind error and returns instead of raising.
        from ..errors import ExternalFailure

        raise ExternalFailure(f"the server could not listen on {host}:{port}", fix="see the log line above; pick another --port")
