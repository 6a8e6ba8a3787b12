"""A small OpenAI-compatible completions server (stdlib ``http.server``) for synthesis tests.

It answers ``POST /v1/completions`` whose ``prompt`` is a list of token ids with
``answer(prompt, max_tokens)`` and returns ``choices[0].token_ids`` when the request asks for
``return_token_ids`` (as vLLM and SGLang do), else text only. Behaviours a test sets:
``fail_first`` (that many requests answered 503 first, with ``retry_after`` as Retry-After
when set), ``status`` (every request answered with it), ``delay_s`` (per request), ``perturb_at``
(the answer's token at that position + 1: "another model"), ``logprobs(prompt, ids)`` (the chosen
tokens' logprobs, returned when a request asks for ``logprobs``), ``stop_reason`` (sent with an
answer that stopped), ``max_model_len`` (listed in ``/v1/models``), ``refuse(prompt)`` (that
request answered 400, as vLLM answers a prompt longer than its context). ``auth`` records each
request's Authorization header.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:  # a killed client's broken pipe is expected here
        pass


class Double:
    def __init__(self, answer: Callable[[list[int], int], list[int]], model: str = "tiny",
                 logprobs: Callable[[list[int], list[int]], list[float]] | None = None):
        self.answer = answer
        self.model = model
        self.logprobs = logprobs
        self.stop_reason = None
        self.max_model_len: int | None = None
        self.refuse: Callable[[list[int]], bool] | None = None
        self.retry_after: str | None = None
        self.auth: list[str | None] = []
        self.fail_first = 0
        self.status: int | None = None
        self.delay_s = 0.0
        self.perturb_at: int | None = None
        self.requests: list[dict] = []
        self._lock = threading.Lock()
        double = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def _send(self, code: int, body: dict, headers: dict | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                for name, value in (headers or {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                double.auth.append(self.headers.get("Authorization"))
                if self.path == "/v1/models":
                    card = {"id": double.model, "object": "model"}
                    if double.max_model_len is not None:
                        card["max_model_len"] = double.max_model_len
                    self._send(200, {"object": "list", "data": [card]})
                elif self.path == "/health":
                    self._send(200, {})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                double.auth.append(self.headers.get("Authorization"))
                with double._lock:
                    double.requests.append(body)
                    failing = double.fail_first > 0
                    double.fail_first -= 1 if failing else 0
                if double.delay_s:
                    time.sleep(double.delay_s)
                if double.status is not None or failing:
                    retry = {"Retry-After": double.retry_after} if failing and double.retry_after else None
                    self._send(double.status or 503, {"error": {"message": "overloaded", "code": double.status or 503}},
                               retry)
                    return
                if double.refuse is not None and double.refuse(list(body.get("prompt") or [])):
                    self._send(400, {"error": {"message": "This model's maximum context length is 64 tokens.",
                                               "code": 400}})
                    return
                if self.path != "/v1/completions" or not isinstance(body.get("prompt"), list):
                    self._send(400, {"error": {"message": "token-id prompts on /v1/completions only"}})
                    return
                ids = list(double.answer(list(body["prompt"]), int(body.get("max_tokens") or 16)))
                if double.perturb_at is not None and double.perturb_at < len(ids):
                    ids[double.perturb_at] += 1
                stops = set(body.get("stop_token_ids") or [])
                # the text leaves the stop token out, as servers detokenize with skip_special_tokens
                choice = {"index": 0, "text": " ".join(str(t) for t in ids if t not in stops),
                          "finish_reason": "stop" if ids and ids[-1] in stops else "length"}
                if body.get("return_token_ids"):
                    choice["token_ids"] = ids
                if choice["finish_reason"] == "stop" and double.stop_reason is not None:
                    choice["stop_reason"] = double.stop_reason
                if body.get("logprobs") and double.logprobs is not None:
                    choice["logprobs"] = {"tokens": [str(t) for t in ids],
                                          "token_logprobs": list(double.logprobs(list(body["prompt"]), ids))}
                self._send(200, {"id": "cmpl-1", "object": "text_completion", "model": double.model,
                                 "choices": [choice], "usage": {"prompt_tokens": len(body["prompt"]),
                                                                "completion_tokens": len(ids)}})

        self.server = _QuietServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> "Double":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def toy_answer(prompt: list[int], max_tokens: int, stop: int = 255) -> list[int]:
    """A deterministic 'target': a few tokens derived from the prompt, then the stop token."""
    n = 2 + sum(prompt) % 4
    return ([(sum(prompt) + k) % 200 for k in range(n)] + [stop])[:max_tokens]
