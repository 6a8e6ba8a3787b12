"""TEST DOUBLE for `trtllm-serve` — NOT TensorRT-LLM. Nothing here runs a model.

The serving tests install this file as an executable named `trtllm-serve` on PATH to
exercise serve-test's real TensorRT-LLM path (command line, options files, process
group, health wait, /perf_metrics parsing) and to simulate server faults. It takes
trtllm-serve's arguments, reads the `--extra_llm_api_options` YAML to know whether
it is the speculative or the baseline server, and answers OpenAI requests with a
deterministic "generation" (token i = (sum of prompt bytes + 7 i) mod 256), so
speculative and baseline outputs agree unless told otherwise.

Which TensorRT-LLM line it behaves like: `--line 1.2|1.3-early|1.3|1.4` (stripped before the
real arguments) or FAKE_TRTLLM_LINE; default 1.2 when the options say `decoding_type: Eagle`,
else 1.4. Per line, as upstream serves EAGLE-3 (specconvert/data/trtllm/acceptance_sources.json):
  GET /metrics             every line, with enable_iter_perf_stats: iteration stats (drained on read)
                           with specDecodingStats, unless FAKE_TRTLLM_ITER_STATS=0 (a build before PR #9855)
  GET /perf_metrics        1.2 / 1.3-early / 1.3: entries WITHOUT a speculative_decoding block
                           (TorchSampler never fills it for EAGLE-3); 1.4: 404 (route removed)
  GET /prometheus/metrics  1.3 / 1.4: trtllm_spec_decode_num_{draft,accepted}_tokens_total counters;
                           1.2 / 1.3-early: request series only
  stream_options.include_usage  every line: a final chunk with `choices: []` and the request's usage
  X-TRTLLM-return-metrics  1.4 only: timing headers (non-streaming) or an SSE event
                           `trtllm.perf_metrics` after [DONE] (streaming) -- timing, no acceptance
The simulated speculation: the first token comes from prefill; each later step drafts
max_draft_len tokens (from the options file) and accepts 2, 1, 2, 1, ... of them (capped by
max_draft_len and the tokens left), so true tau is known; each step streams as one SSE chunk.

Behaviour by FAKE_TRTLLM_MODE:
  ok             serve normally
  exit_on_start  print a few log lines and exit 3 before listening
  never_healthy  listen, but answer /health with 503 forever
  hang           healthy, but completion requests never answer
  die_mid_run    healthy; the first completion request kills the server (exit 9)
  malformed      healthy; completions answer 200 with a body that is not an OpenAI completion
  lossy          the speculative server changes one token of every output
FAKE_TRTLLM_STEP_S: seconds each streamed chunk (one engine iteration) takes; default 0.
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


LINES = ("1.2", "1.3-early", "1.3", "1.4")


def simulate(n, max_draft_len):
    """Token counts per SSE chunk and accepted drafts per step of one request of ``n`` tokens."""
    chunks, accepted = [1] if n > 0 else [], []
    left, pattern = n - 1, [2, 1]
    while left > 0:
        a = min(pattern[len(accepted) % 2], max_draft_len, left - 1)
        accepted.append(a)
        chunks.append(1 + a)
        left -= 1 + a
    return chunks, accepted


def main():
    argv = sys.argv[1:]
    line = os.environ.get("FAKE_TRTLLM_LINE")
    if "--line" in argv:
        i = argv.index("--line")
        line = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    if os.environ.get("FAKE_TRTLLM_ARGV_LOG"):
        with open(os.environ["FAKE_TRTLLM_ARGV_LOG"], "a") as fh:
            fh.write(json.dumps({"pid": os.getpid(), "argv": argv}) + "\n")
    mode = os.environ.get("FAKE_TRTLLM_MODE", "ok")
    args = parse(argv)
    import yaml

    options = yaml.safe_load(open(args["extra_llm_api_options"])) or {}
    spec_config = options.get("speculative_config") or {}
    speculative = bool(spec_config)
    max_draft_len = int(spec_config.get("max_draft_len") or 3)
    line = line or ("1.2" if spec_config.get("decoding_type") == "Eagle" else "1.4")
    assert line in LINES, line
    iter_stats = os.environ.get("FAKE_TRTLLM_ITER_STATS", "1") != "0"
    subprocess.Popen(["sleep", "300"])  # a grandchild in our process group
    print(f"[TEST DOUBLE trtllm-serve] line={line} mode={mode} speculative={speculative} argv={argv}", flush=True)
    if mode == "exit_on_start":
        print("[TEST DOUBLE trtllm-serve] RuntimeError: simulated failure while loading the engine", flush=True)
        sys.exit(3)

    state = {"metrics": [], "iterations": [], "next_id": 0, "iter": 0, "drafted": 0, "accepted": 0}
    model_name = os.path.basename(str(args["model"]).rstrip("/")) or "model"

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def send_json(self, code, payload, headers=None):
            body = json.dumps(payload).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(body)

        def send_text(self, code, text):
            body = text.encode()
            self.send_response(code)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def prometheus(self):
            labels = f'{{engine_type="trtllm",model_name="{model_name}"}}'
            out = ["# TYPE trtllm_request_success_total counter",
                   f'trtllm_request_success_total{{engine_type="trtllm",model_name="{model_name}",finished_reason="length"}} '
                   f'{state["next_id"]}']
            if line in ("1.3", "1.4") and speculative:
                steps = state["drafted"] // max_draft_len
                out += ["# TYPE trtllm_spec_decode_num_draft_tokens_total counter",
                        f"trtllm_spec_decode_num_draft_tokens_total{labels} {float(state['drafted'])}",
                        "# TYPE trtllm_spec_decode_num_accepted_tokens_total counter",
                        f"trtllm_spec_decode_num_accepted_tokens_total{labels} {float(state['accepted'])}",
                        "# TYPE trtllm_spec_decode_acceptance_length gauge",
                        f"trtllm_spec_decode_acceptance_length{labels} {1 + state['accepted'] / steps if steps else 0}"]
            return "\n".join(out) + "\n"

        def do_GET(self):
            if self.path == "/health":
                return self.send_json(503 if mode == "never_healthy" else 200, {})
            if self.path == "/v1/models":
                return self.send_json(200, {"object": "list", "data": [{"id": model_name, "object": "model"}]})
            if self.path == "/perf_metrics":
                if line == "1.4":
                    return self.send_json(404, {"detail": "Not Found"})
                items, state["metrics"] = state["metrics"], []
                return self.send_json(200, items)
            if self.path == "/metrics":
                items, state["iterations"] = state["iterations"], []
                return self.send_json(200, items)
            if self.path == "/prometheus/metrics":
                return self.send_text(200, self.prometheus())
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
            sizes, accepted = simulate(n, max_draft_len) if speculative else ([1] * n, [])
            for a in accepted:
                state["iter"] += 1
                state["drafted"] += max_draft_len
                state["accepted"] += a
                item = {"iter": state["iter"], "numActiveRequests": 1}
                if iter_stats:
                    item["specDecodingStats"] = {
                        "numDraftTokens": max_draft_len, "numAcceptedTokens": a, "numRequestsWithDraftTokens": 1,
                        "acceptanceLength": 1.0 + a, "iterLatencyMS": 1.0, "draftOverhead": 0.1}
                if options.get("enable_iter_perf_stats"):
                    state["iterations"].append(item)
            # No speculative_decoding block on any line: TorchSampler never fills it for EAGLE-3.
            perf = {"first_iter": 1, "last_iter": n, "timing_metrics": {"arrival_time": 0.0, "first_token_time": 0.1}}
            state["metrics"].append({"request_id": request_id, "perf_metrics": perf})
            want_metrics = (line == "1.4" and options.get("return_perf_metrics")
                            and self.headers.get("X-TRTLLM-return-metrics", "").strip() == "1")
            timing = {"Server-Timing": "server_queue;dur=0.100000, server_ttft;dur=1.000000, server_e2e;dur=2.000000",
                      "X-TRTLLM-Start-End-Time": "server-start;ts=1.000000000, server-end;ts=1.002000000"}
            if not body.get("stream"):
                choice = ({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
                          if chat else {"index": 0, "text": text, "finish_reason": "length"})
                return self.send_json(200, {"id": f"cmpl-{request_id}", "object": "x", "model": model_name,
                                            "choices": [choice], "usage": {"prompt_tokens": 1, "completion_tokens": n}},
                                      headers=timing if want_metrics else None)
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            k = 0
            step_s = float(os.environ.get("FAKE_TRTLLM_STEP_S") or 0)
            for size in sizes:
                if step_s:
                    time.sleep(step_s)  # one engine iteration per chunk (so fewer steps take less time)
                piece = text[k:k + size]
                k += size
                choice = {"index": 0, "delta": {"content": piece}} if chat else {"index": 0, "text": piece}
                self.wfile.write(f"data: {json.dumps({'model': model_name, 'choices': [choice]})}\n\n".encode())
                self.wfile.flush()
            if (body.get("stream_options") or {}).get("include_usage"):
                # as trtllm-serve does (tensorrt_llm/serve/postprocess_handlers.py, *_stream_post_processor): one
                # final chunk with no choices and the whole request's usage
                usage = {"prompt_tokens": 1, "completion_tokens": n, "total_tokens": n + 1}
                self.wfile.write(f"data: {json.dumps({'model': model_name, 'choices': [], 'usage': usage})}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            if want_metrics:
                self.wfile.write(f"event: trtllm.perf_metrics\ndata: {json.dumps(timing)}\n\n".encode())

    server = ThreadingHTTPServer((args.get("host") or "127.0.0.1", int(args["port"])), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
