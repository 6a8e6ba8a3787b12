"""A small OpenAI-compatible completions server (stdlib ``http.server``) for synthesis tests.

It answers ``POST /v1/completions`` whose ``prompt`` is a list of token ids with
``answer(prompt, max_tokens)`` and returns ``choices[0].token_ids`` when the request asks for
``return_token_ids`` (as vLLM and SGLang do), else text only. Behaviours a test sets:
``fail_first`` (that many requests answered 503 first), ``status`` (every request answered
with it), ``delay_s`` (per request), ``perturb_at`` (the answer's token at that position + 1:
"another model").
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
    def __init__(self, answer: Callable[[list[int], int], list[int]], model: str = "tiny"):
        self.answer = answer
        self.model = model
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

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": double.model, "object": "model"}]})
                elif self.path == "/health":
                    self._send(200, {})
                else:
                    self._send(404, {"error": {"message": "not found"}})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                with double._lock:
                    double.requests.append(body)
                    failing = double.fail_first > 0
                    double.fail_first -= 1 if failing else 0
                if double.delay_s:
                    time.sleep(double.delay_s)
                if double.status is not None or failing:
                    self._send(double.status or 503, {"error": {"message": "overloaded", "code": double.status or 503}})
                    return
                if self.path != "/v1/completions" or not isinstance(body.get("prompt"), list):
                    self._send(400, {"error": {"message": "token-id prompts on /v1/completions only"}})
                    return
                ids = list(double.answer(list(body["prompt"]), int(body.get("max_tokens") or 16)))
                if double.perturb_at is not None and double.perturb_at < len(ids):
                    ids[double.perturb_at] += 1
                stops = set(body.get("stop_token_ids") or [])
                choice = {"index": 0, "text": " ".join(map(str, ids)),
                          "finish_reason": "stop" if ids and ids[-1] in stops else "length"}
                if body.get("return_token_ids"):
                    choice["token_ids"] = ids
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
