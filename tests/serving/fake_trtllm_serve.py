"""TEST DOUBLE for `trtllm-serve` — NOT TensorRT-LLM. Nothing here runs a model.

The serving tests install this file as an executable named `trtllm-serve` on PATH to
exercise serve-test's real TensorRT-LLM path (command line, options files, process
group, health wait, /perf_metrics parsing) and to simulate server faults. It takes
trtllm-serve's arguments, reads the `--extra_llm_api_options` YAML to know whether
it is the speculative or the baseline server, and answers OpenAI requests with a
deterministic "generation" (token i = (sum of prompt bytes + 7 i) mod 256), so
speculative and baseline outputs agree unless told otherwise.

Behaviour by FAKE_TRTLLM_MODE:
  ok             serve normally (perf_metrics in TensorRT-LLM's shape on the speculative server)
  exit_on_start  print a few log lines and exit 3 before listening
  never_healthy  listen, but answer /health with 503 forever
  hang           healthy, but completion requests never answer
  die_mid_run    healthy; the first completion request kills the server (exit 9)
  malformed      healthy; completions answer 200 with a body that is not an OpenAI completion
  lossy          the speculative server changes one token of every output
Every mode also starts a grandchild `sleep` in the same process group, so tests can
check that serve-test reaps the whole group. FAKE_TRTLLM_ARGV_LOG: append {pid, argv} (JSON) there.
"""

import json
import os
import subprocess
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def parse(argv):
    args = {"model": argv[0] if argv and not argv[0].startswith("-") else None}
    i = 1 if args["model"] else 0
    while i < len(argv):
        key = argv[i].lstrip("-")
        args[key] = argv[i + 1] if i + 1 < len(argv) else None
        i += 2
    return args


def main():
    argv = sys.argv[1:]
    if os.environ.get("FAKE_TRTLLM_ARGV_LOG"):
        with open(os.environ["FAKE_TRTLLM_ARGV_LOG"], "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "argv": argv}) + "\n")
    mode = os.environ.get("FAKE_TRTLLM_MODE", "ok")
    args = parse(argv)
    options_text = open(args["extra_llm_api_options"]).read()
    speculative = "speculative_config" in options_text
    subprocess.Popen(["sleep", "300"])  # a grandchild in our process group
    print(f"[TEST DOUBLE trtllm-serve] mode={mode} speculative={speculative} argv={argv}", flush=True)
    if mode == "exit_on_start":
        print("[TEST DOUBLE trtllm-serve] RuntimeError: simulated failure while loading the engine", flush=True)
        sys.exit(3)

    state = {"metrics": [], "next_id": 0}
    model_name = os.path.basename(str(args["model"]).rstrip("/")) or "model"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def send_json(self, code, payload):
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/health":
                return self.send_json(503 if mode == "never_healthy" else 200, {})
            if self.path == "/v1/models":
                return self.send_json(200, {"object": "list", "data": [{"id": model_name, "object": "model"}]})
            if self.path == "/perf_metrics":
                items, state["metrics"] = state["metrics"], []
                return self.send_json(200, items)
            self.send_json(404, {"error": "not found"})

        def do_POST(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            if mode == "hang":
                time.sleep(3600)
            if mode == "die_mid_run":
                print("[TEST DOUBLE trtllm-serve] simulated crash: CUDA error: an illegal memory access", flush=True)
                os._exit(9)
            if mode == "malformed":
                return self.send_json(200, {"unexpected": "shape"})
            chat = self.path.endswith("/chat/completions")
            prompt = json.dumps(body.get("messages") if chat else body.get("prompt"))
            seed = sum(prompt.encode())
            n = int(body.get("max_tokens") or 16)
            ids = [(seed + 7 * i) % 256 for i in range(n)]
            if mode == "lossy" and speculative and n > 3:
                ids[3] = (ids[3] + 1) % 256
            text = "".join(chr(97 + t % 26) for t in ids)
            request_id = state["next_id"]
            state["next_id"] += 1
            perf = {"first_iter": 1, "last_iter": n, "timing_metrics": {"arrival_time": 0.0, "first_token_time": 0.1}}
            if speculative:
                drafted = 3 * max(1, n // 3)
                perf["speculative_decoding"] = {"acceptance_rate": 0.5, "total_accepted_draft_tokens": drafted // 2,
                                                "total_draft_tokens": drafted}
            state["metrics"].append({"request_id": request_id, "perf_metrics": perf})
            if not body.get("stream"):
                choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                          if chat else {"index": 0, "text": text, "finish_reason": "length"})
                return self.send_json(200, {"id": f"cmpl-{request_id}", "object": "x", "model": model_name,
                                            "choices": [choice], "usage": {"prompt_tokens": 1, "completion_tokens": n}})
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            for k in range(0, len(text), 4):
                piece = text[k:k + 4]
                choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                self.wfile.write(f"data: {json.dumps({'model': model_name, 'choices': [choice]})}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")

    server = ThreadingHTTPServer((args.get("host") or "127.0.0.1", int(args["port"])), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
