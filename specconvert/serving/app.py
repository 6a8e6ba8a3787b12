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
from typing import Any, AsyncIterator

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError

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


def create_app(engine: ReferenceEngine, max_model_len: int | None = None, max_body_bytes: int = MAX_BODY_BYTES,
               max_queued: int = MAX_QUEUED):
    """The FastAPI application over one engine.

    ``max_model_len`` bounds prompt + max_tokens; the target's ``max_position_embeddings``
    bounds it too, whichever is smaller (a longer prompt is a 400, as in vLLM).
    """
    app = FastAPI(title="specconvert reference server", docs_url=None, redoc_url=None)
    started = int(time.time())
    limits = [n for n in (max_model_len, engine.max_model_len) if n]
    context = min(limits) if limits else None

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception):
        # Starlette's default is a text/plain 500; OpenAI clients expect the JSON error shape.
        log.exception("unexpected error serving %s", request.url.path)
        return error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")

    def pick_speculative(body: BaseRequest) -> bool | str:
        """True/False, or an error message for an unknown model."""
        names = (engine.model_name, engine.baseline_name)
        if body.model not in (None, "", *names):
            return f"model '{body.model}' is not served here; use one of: {', '.join(names)}"
        speculative = getattr(engine, "speculate", True) and body.model != engine.baseline_name
        if body.speculative is not None:
            speculative = speculative and body.speculative
        return speculative

    def to_engine(body: BaseRequest, prompt_ids: list[int], speculative: bool) -> EngineRequest:
        max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
        if context is not None and len(prompt_ids) + max_tokens > context:
            # vLLM's wording, with the numbers, so a client's retry logic recognises it.
            raise InputError(f"This model's maximum context length is {context} tokens. However, you requested "
                             f"{len(prompt_ids) + max_tokens} tokens ({len(prompt_ids)} in the prompt, {max_tokens} "
                             "in the completion). Please reduce the length of the prompt or completion.")
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        return EngineRequest(prompt_ids, max_tokens, body.temperature, body.top_p, body.top_k, body.seed, stop,
                             speculative, body.ignore_eos, body.top_logprobs_wanted())

    async def parse(request: Request, model: type[BaseRequest]) -> BaseRequest | JSONResponse:
        try:
            raw = json.loads(await _read_body(request, max_body_bytes))
        except _BodyTooLarge:
            return error(413, f"request body is larger than {max_body_bytes} bytes")
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

    def admit() -> JSONResponse | None:
        if engine.closed:
            return error(503, "the server is shutting down; retry on another instance", "service_unavailable")
        if engine.queued >= max_queued:
            return error(429, f"{engine.queued} requests are already waiting for the decoder; retry later",
                         "rate_limit_exceeded")
        return None

    @app.get("/health")
    async def health():
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models():
        data = [
            {"id": name, "object": "model", "created": started, "owned_by": "specconvert",
             "speculative": name == engine.model_name, "max_model_len": context}
            for name in (engine.model_name, engine.baseline_name)
        ]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/perf_metrics")
    async def perf_metrics():
        return JSONResponse(engine.drain_metrics())

    @app.get("/v1/server_info")
    async def server_info():
        return JSONResponse({"backend": "reference", "model": engine.model_name, "baseline_model": engine.baseline_name,
                             "queued": engine.queued, "max_model_len": context, **engine.description})

    async def run(request: Request, body: BaseRequest, prompt_ids: list[int], speculative: bool, chat: bool,
                  echo_text: str = ""):
        request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        model_name = body.model or (engine.model_name if speculative else engine.baseline_name)
        try:
            job = to_engine(body, prompt_ids, speculative)
        except InputError as exc:
            return error(400, exc.message, param="max_tokens")
        refused = admit()
        if refused is not None:
            return refused
        usage = {"prompt_tokens": len(prompt_ids)}
        object_name = "chat.completion.chunk" if chat else "text_completion"

        as_ids = bool(body.return_tokens_as_token_ids)

        def token_text(token_id: int) -> str:
            return engine.token_text(token_id, as_ids)

        def logprobs_of(delta: Delta) -> dict | None:
            if delta.logprobs is None:
                return None
            if chat:
                return chat_logprobs(delta.logprobs, token_text)
            return completion_logprobs(delta.logprobs, [o + len(echo_text) for o in delta.text_offsets or []],
                                       token_text)

        def chunk(delta: Delta | None, first: bool = False) -> dict[str, Any]:
            if chat:
                message: dict[str, Any] = {}
                if first:
                    message["role"] = "assistant"
                if delta is not None and delta.text:
                    message["content"] = delta.text
                choice = {"index": 0, "delta": message, "finish_reason": delta.finish_reason if delta else None}
            else:
                text = (echo_text if first else "") + (delta.text if delta else "")
                choice = {"index": 0, "text": text, "finish_reason": delta.finish_reason if delta else None}
            choice["logprobs"] = logprobs_of(delta) if delta else None
            choice["token_ids"] = delta.token_ids if delta else []
            return {"id": request_id, "object": object_name, "created": created, "model": model_name,
                    "choices": [choice]}

        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))

            async def events() -> AsyncIterator[str]:
                count = 0
                if chat or echo_text:
                    yield f"data: {json.dumps(chunk(None, first=True))}\n\n"
                try:
                    async for delta in engine.generate(job):
                        count += len(delta.token_ids)
                        yield f"data: {json.dumps(chunk(delta))}\n\n"
                except InputError as exc:
                    yield f"data: {json.dumps(error_body(400, exc.message))}\n\n"
                except Exception as exc:  # the 200 headers are out: the error must travel as an event
                    log.exception("stream %s failed", request_id)
                    yield f"data: {json.dumps(error_body(500, f'internal error: {type(exc).__name__}: {exc}', 'server_error'))}\n\n"
                if include_usage:
                    done = {**usage, "completion_tokens": count, "total_tokens": usage["prompt_tokens"] + count}
                    yield f"data: {json.dumps({'id': request_id, 'object': object_name, 'created': created, 'model': model_name, 'choices': [], 'usage': done})}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

        deltas: list[Delta] = []

        async def collect() -> None:
            async for delta in engine.generate(job):
                deltas.append(delta)

        # Nothing is sent until the end, so only polling notices a client that left; cancelling the task
        # stops the decoder after its current step (it ran to max_tokens before, blocking everyone queued).
        task = asyncio.ensure_future(collect())
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
            log.exception("request %s failed", request_id)
            return error(500, f"internal error: {type(exc).__name__}: {exc}", "server_error")
        finally:
            if not task.done():  # the handler itself was cancelled
                task.cancel()
        token_ids = [t for d in deltas for t in d.token_ids]
        finish = next((d.finish_reason for d in reversed(deltas) if d.finish_reason), None)
        usage.update(completion_tokens=len(token_ids), total_tokens=usage["prompt_tokens"] + len(token_ids))
        out = "".join(d.text for d in deltas)
        logprobs = None
        if job.logprobs is not None:
            merged = Delta(out, token_ids, finish, [e for d in deltas for e in d.logprobs or []],
                           [o for d in deltas for o in d.text_offsets or []])
            logprobs = logprobs_of(merged)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": out}, "logprobs": logprobs,
                      "finish_reason": finish, "token_ids": token_ids}
        else:
            choice = {"index": 0, "text": echo_text + out, "logprobs": logprobs, "finish_reason": finish,
                      "token_ids": token_ids}
        return JSONResponse({"id": request_id, "object": "chat.completion" if chat else "text_completion",
                             "created": created, "model": model_name, "choices": [choice], "usage": usage})

    def check_ids(prompt_ids: list[int]) -> JSONResponse | None:
        vocab = engine.vocab_size
        bad = [t for t in prompt_ids if t < 0 or (vocab is not None and t >= vocab)]
        if bad:
            bound = f"0 <= id < {vocab}" if vocab is not None else "ids >= 0"
            return error(400, f"prompt: token id {bad[0]} is out of range ({bound})", param="prompt")
        return None

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parse(request, CompletionRequest)
        if not isinstance(body, CompletionRequest):
            return body
        speculative = pick_speculative(body)
        if isinstance(speculative, str):
            return error(404, speculative, "model_not_found", param="model")
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
        bad = check_ids(prompt_ids)
        if bad is not None:
            return bad
        echo_text = (prompt if isinstance(prompt, str) else engine.decode(prompt_ids)) if body.echo else ""
        return await run(request, body, prompt_ids, speculative, chat=False, echo_text=echo_text)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await parse(request, ChatRequest)
        if not isinstance(body, ChatRequest):
            return body
        speculative = pick_speculative(body)
        if isinstance(speculative, str):
            return error(404, speculative, "model_not_found", param="model")
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
        try:
            prompt_ids = engine.encode(engine.render_chat(messages), chat=True)
        except InputError as exc:
            return error(400, exc.message, param="messages")
        except Exception as exc:  # the model's chat template refused these messages (jinja raise_exception)
            return error(400, f"messages: the chat template refused them: {exc}", param="messages")
        bad = check_ids(prompt_ids)
        if bad is not None:
            return bad
        return await run(request, body, prompt_ids, speculative, chat=True)

    return app


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
