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
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, AsyncIterator, Union

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ..errors import InputError
from .engine import Delta, EngineRequest, ReferenceEngine


class _Request(BaseModel):
    # OpenAI clients send fields we do not implement (logprobs, user, ...): accept and ignore them.
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(0, ge=0)
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int = 1
    speculative: bool | None = None  # extension: false = the plain target
    ignore_eos: bool = False


class CompletionRequest(_Request):
    prompt: Union[str, list[int], list[str]]


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: Union[str, list[dict[str, Any]], None] = ""


class ChatRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1)


DEFAULT_MAX_TOKENS = 16  # OpenAI's default for completions


def _error(status: int, message: str, kind: str = "invalid_request_error"):
    return JSONResponse(status_code=status, content={"error": {"message": message, "type": kind, "code": status}})


def _content_text(content: Any) -> str:
    if isinstance(content, list):  # [{"type": "text", "text": ...}]
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return content or ""


def create_app(engine: ReferenceEngine, max_model_len: int | None = None):
    """The FastAPI application over one engine."""
    app = FastAPI(title="specconvert reference server", docs_url=None, redoc_url=None)
    started = int(time.time())

    def pick_speculative(body: _Request) -> bool | str:
        """True/False, or an error message for an unknown model."""
        names = (engine.model_name, engine.baseline_name)
        if body.model not in (None, "", *names):
            return f"model '{body.model}' is not served here; use one of: {', '.join(names)}"
        speculative = body.model != engine.baseline_name
        if body.speculative is not None:
            speculative = speculative and body.speculative
        return speculative

    def to_engine(body: _Request, prompt_ids: list[int], speculative: bool) -> EngineRequest:
        max_tokens = body.max_completion_tokens or body.max_tokens or DEFAULT_MAX_TOKENS
        if max_model_len is not None and len(prompt_ids) + max_tokens > max_model_len:
            raise InputError(f"prompt ({len(prompt_ids)} tokens) + max_tokens ({max_tokens}) exceeds {max_model_len}")
        stop = [body.stop] if isinstance(body.stop, str) else list(body.stop or [])
        return EngineRequest(prompt_ids, max_tokens, body.temperature, body.top_p, body.top_k, body.seed, stop,
                             speculative, body.ignore_eos)

    async def parse(request: Request, model: type[_Request]) -> _Request | Any:
        try:
            raw = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            return _error(400, "request body is not valid JSON")
        try:
            body = model.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "body"
            return _error(400, f"{where}: {first['msg']}")
        if body.n != 1:
            return _error(400, "n: only n = 1 is supported by the reference server")
        return body

    @app.get("/health")
    async def health():
        return JSONResponse({"status": "ok"})

    @app.get("/v1/models")
    async def models():
        data = [
            {"id": name, "object": "model", "created": started, "owned_by": "specconvert",
             "speculative": name == engine.model_name}
            for name in (engine.model_name, engine.baseline_name)
        ]
        return JSONResponse({"object": "list", "data": data})

    @app.get("/perf_metrics")
    async def perf_metrics():
        return JSONResponse(engine.drain_metrics())

    @app.get("/v1/server_info")
    async def server_info():
        return JSONResponse({"backend": "reference", "model": engine.model_name, "baseline_model": engine.baseline_name,
                             "queued": engine.queued, **engine.description})

    async def run(body: _Request, prompt_ids: list[int], speculative: bool, chat: bool):
        request_id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        model_name = body.model or (engine.model_name if speculative else engine.baseline_name)
        try:
            job = to_engine(body, prompt_ids, speculative)
        except InputError as exc:
            return _error(400, exc.message)
        usage = {"prompt_tokens": len(prompt_ids)}

        def chunk(delta: Delta | None, first: bool = False) -> dict[str, Any]:
            if chat:
                message: dict[str, Any] = {}
                if first:
                    message["role"] = "assistant"
                if delta is not None and delta.text:
                    message["content"] = delta.text
                choice = {"index": 0, "delta": message, "finish_reason": delta.finish_reason if delta else None}
            else:
                choice = {"index": 0, "text": delta.text if delta else "", "finish_reason": delta.finish_reason if delta else None}
            choice["token_ids"] = delta.token_ids if delta else []
            return {"id": request_id, "object": "chat.completion.chunk" if chat else "text_completion",
                    "created": created, "model": model_name, "choices": [choice]}

        if body.stream:
            include_usage = bool((body.stream_options or {}).get("include_usage"))

            async def events() -> AsyncIterator[str]:
                count = 0
                if chat:
                    yield f"data: {json.dumps(chunk(None, first=True))}\n\n"
                try:
                    async for delta in engine.generate(job):
                        count += len(delta.token_ids)
                        yield f"data: {json.dumps(chunk(delta))}\n\n"
                except InputError as exc:
                    yield f"data: {json.dumps({'error': {'message': exc.message, 'type': 'invalid_request_error'}})}\n\n"
                if include_usage:
                    done = {**usage, "completion_tokens": count, "total_tokens": usage["prompt_tokens"] + count}
                    yield f"data: {json.dumps({'id': request_id, 'object': 'chat.completion.chunk' if chat else 'text_completion', 'created': created, 'model': model_name, 'choices': [], 'usage': done})}\n\n"
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

        text, token_ids, finish = [], [], None
        try:
            async for delta in engine.generate(job):
                text.append(delta.text)
                token_ids.extend(delta.token_ids)
                finish = delta.finish_reason or finish
        except InputError as exc:
            return _error(400, exc.message)
        usage.update(completion_tokens=len(token_ids), total_tokens=usage["prompt_tokens"] + len(token_ids))
        out = "".join(text)
        if chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": out}, "finish_reason": finish,
                      "token_ids": token_ids}
        else:
            choice = {"index": 0, "text": out, "finish_reason": finish, "token_ids": token_ids}
        return JSONResponse({"id": request_id, "object": "chat.completion" if chat else "text_completion",
                             "created": created, "model": model_name, "choices": [choice], "usage": usage})

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parse(request, CompletionRequest)
        if not isinstance(body, CompletionRequest):
            return body
        speculative = pick_speculative(body)
        if isinstance(speculative, str):
            return _error(404, speculative, "model_not_found")
        prompt = body.prompt
        if isinstance(prompt, list) and prompt and all(isinstance(p, str) for p in prompt):
            if len(prompt) != 1:
                return _error(400, "prompt: one prompt per request (batch prompts are not supported)")
            prompt = prompt[0]
        try:
            prompt_ids = engine.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        except InputError as exc:
            return _error(400, exc.message)
        if not prompt_ids:
            return _error(400, "prompt: empty")
        return await run(body, prompt_ids, speculative, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await parse(request, ChatRequest)
        if not isinstance(body, ChatRequest):
            return body
        speculative = pick_speculative(body)
        if isinstance(speculative, str):
            return _error(404, speculative, "model_not_found")
        messages = [{"role": m.role, "content": _content_text(m.content)} for m in body.messages]
        try:
            prompt_ids = engine.encode(engine.render_chat(messages), chat=True)
        except InputError as exc:
            return _error(400, exc.message)
        return await run(body, prompt_ids, speculative, chat=True)

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
