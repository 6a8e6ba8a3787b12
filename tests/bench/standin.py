"""A TEST DOUBLE of an OpenAI-compatible streaming server, with scripted timings and chunk sizes.

Not a model: it streams ``max_tokens`` token ids (0, 1, 2, ...) in chunks of a fixed size
after a fixed first-token delay and a fixed gap between chunks, so the metrics bench
computes from it are known in advance. Model ``m`` sends ``spec_chunk`` tokens per chunk (``chunk_by_word``: another size for prompts holding a word)
(like a speculative server sending each verify step's accepted tokens at once);
``m-baseline`` sends one. ``metrics=False`` drops ``/perf_metrics`` and per-chunk
``token_ids`` (a third-party endpoint exposing only text and usage).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Script:
    ttft_s: float = 0.03
    gap_s: float = 0.02
    spec_chunk: int = 3
    metrics: bool = True
    fail_model: str | None = None  # requests for this model answer HTTP 500
    chunk_by_word: dict = field(default_factory=dict)  # a word in the prompt -> the speculative chunk size for it
    long_prompt: tuple = ()  # (characters, chunk size): prompts longer than that get that speculative chunk size
    perf: list = field(default_factory=list)
    seen: list = field(default_factory=list)  # (model, concurrency in flight at arrival)
    in_flight: int = 0


def create_app(script: Script):
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    async def health(request: Request):
        return JSONResponse({"status": "ok"})

    async def models(request: Request):
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}, {"id": "m-baseline", "object": "model"}]})

    async def perf_metrics(request: Request):
        if not script.metrics:
            return Response(status_code=404)
        items, script.perf[:] = list(script.perf), []
        return JSONResponse(items)

    async def generate(request: Request):
        body = await request.json()
        chat = request.url.path.endswith("/chat/completions")
        model = body.get("model", "m")
        if model == script.fail_model:
            return JSONResponse({"error": {"message": "scripted failure"}}, status_code=500)
        total = int(body.get("max_tokens") or 16)
        size = 1 if model.endswith("-baseline") else script.spec_chunk
        prompt = json.dumps(body.get("messages") or body.get("prompt"))
        for word, chunk in script.chunk_by_word.items():
            if word in prompt and not model.endswith("-baseline"):
                size = chunk
        if script.long_prompt and len(prompt) > script.long_prompt[0] and not model.endswith("-baseline"):
            size = script.long_prompt[1]
        script.in_flight += 1
        script.seen.append((model, script.in_flight))

        def event(ids):
            text = "".join(f"t{i} " for i in ids)
            choice = {"index": 0, "finish_reason": None}
            if chat:
                choice["delta"] = {"content": text}
            else:
                choice["text"] = text
            if script.metrics:
                choice["token_ids"] = list(ids)
            return "data: " + json.dumps({"object": "chunk", "model": model, "choices": [choice]}) + "\n\n"

        async def stream():
            try:
                if chat:  # a role-only first chunk, as OpenAI sends: carries no token
                    yield "data: " + json.dumps({"choices": [{"index": 0, "delta": {"role": "assistant"}}]}) + "\n\n"
                await asyncio.sleep(script.ttft_s)
                yield event([0])  # the prefill's token
                produced, steps = 1, []
                while produced < total:
                    await asyncio.sleep(script.gap_s)
                    n = min(size, total - produced)
                    yield event(range(produced, produced + n))
                    produced += n
                    steps.append(n - 1)
                # Recorded before the stream ends, so a drain right after [DONE] sees it.
                if size > 1:
                    script.perf.append({"request_id": len(script.perf), "perf_metrics": {
                        "speculative_decoding": {"total_draft_tokens": len(steps) * (size - 1),
                                                 "total_accepted_draft_tokens": sum(steps)}},
                        "specconvert": {"speculative": True, "accepted_per_step": steps,
                                        "drafted_depth_per_step": [size - 1] * len(steps)}})
                usage = {"prompt_tokens": 5, "completion_tokens": produced, "total_tokens": produced + 5}
                yield "data: " + json.dumps({"choices": [], "usage": usage}) + "\n\n"
                yield "data: [DONE]\n\n"
            finally:
                script.in_flight -= 1

        return StreamingResponse(stream(), media_type="text/event-stream")

    return Starlette(routes=[
        Route("/health", health), Route("/v1/models", models), Route("/perf_metrics", perf_metrics),
        Route("/v1/completions", generate, methods=["POST"]), Route("/v1/chat/completions", generate, methods=["POST"]),
    ])


class StandInServer:
    """Run the test double with uvicorn in a thread on a free loopback port."""

    def __init__(self, script: Script):
        import uvicorn

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.script = script
        config = uvicorn.Config(create_app(script), host="127.0.0.1", port=self.port, log_level="error", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "StandInServer":
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("stand-in server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
