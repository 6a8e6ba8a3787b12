"""A stand-in for vLLM's api_server in synthesis tests (stdlib only): ``synthesis_server.py PORT MODEL STATE_DIR``.

Behaviours, read from files in STATE_DIR: ``taken`` (exists: print uvicorn's "address already in use" and exit, once,
as when another process took the port first), ``die-at-start`` (its text printed as the engine's last error, exit 1),
``die-on-request`` (the same, on the first completion request). Answers are [5, 6, 2] with logprobs -0.1.
"""

import json
import os
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

port, model, state = int(sys.argv[1]), sys.argv[2], Path(sys.argv[3])


def die(reason_file: Path) -> None:
    print("INFO engine starting", flush=True)
    print("Traceback (most recent call last):", flush=True)
    print(f"RuntimeError: {reason_file.read_text()}", flush=True)
    print("INFO shutting down", flush=True)
    os._exit(1)


if (state / "taken").exists():
    (state / "taken").unlink()
    print(f"ERROR: [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): address already in use",
          flush=True)
    sys.exit(1)
if (state / "die-at-start").exists():
    die(state / "die-at-start")


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def _send(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send({"data": [{"id": model, "max_model_len": 4096}]})
        else:
            self._send({})

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if (state / "die-on-request").exists():
            die(state / "die-on-request")
        self._send({"choices": [{"text": "", "token_ids": [5, 6, 2], "finish_reason": "stop",
                                 "logprobs": {"token_logprobs": [-0.1, -0.1, -0.1]}}]})


HTTPServer(("127.0.0.1", port), Handler).serve_forever()
