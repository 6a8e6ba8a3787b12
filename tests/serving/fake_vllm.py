"""A TEST DOUBLE of vLLM's OpenAI server, run as ``FAKE_PYTHON -m vllm.entrypoints.openai.api_server ARGS``.

Not a model. It takes vLLM's arguments (``--served-model-name``, ``--speculative-config``,
``--host``, ``--port``; the rest is logged and ignored), and answers like vLLM 0.32 does where
specconvert looks: ``/health``, ``/v1/models``, chat completions (with ``return_token_ids``,
streamed or not) and Prometheus ``/metrics`` with the spec-decode counters (``_total``
suffix, ``engine``/``model_name``/``position`` labels) only when a speculative config was given.
Every request generates token ids 0..max_tokens-1 (text "t0 t1 ..."): speculative and
baseline outputs are equal. With speculation each verify step emits 3 tokens and counts one
draft of ``num_speculative_tokens`` with 2 accepted (positions 0 and 1): tau = 3 (a chain of 1: tau 2).
A ``num_speculative_tokens_per_batch_size`` schedule is honoured by the requests in flight when
one arrives: where it gives 0, that request decodes one token per step and drafts nothing.
``FAKE_VLLM_ARGV_LOG`` appends each start's argv and environment as one JSON line.
``FAKE_VLLM_LOSSY_K=N``: the server with ``num_speculative_tokens`` N streams token id 3 as 1003.
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> None:
    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
    from starlette.routing import Route

    def arg(name, default=None):
        return argv[argv.index(name) + 1] if name in argv else default

    if os.environ.get("FAKE_VLLM_ARGV_LOG"):
        with open(os.environ["FAKE_VLLM_ARGV_LOG"], "a") as fh:
            fh.write(json.dumps({"argv": argv, "env": {k: v for k, v in os.environ.items()
                                                        if k.startswith(("VLLM_", "OMP_"))}}) + "\n")
    name = arg("--served-model-name", "model")
    spec = json.loads(arg("--speculative-config")) if "--speculative-config" in argv else None
    n_spec = spec["num_speculative_tokens"] if spec else 0
    schedule = (spec or {}).get("num_speculative_tokens_per_batch_size")
    counts = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "pos": [0] * n_spec}
    in_flight = [0]

    def k_now():
        """vLLM's lookup: the schedule's K for the current batch (the last range's beyond it), capped at n_spec."""
        if not schedule:
            return n_spec
        k = schedule[-1][2]
        for start, end, kk in schedule:
            if start <= in_flight[0] <= end:
                k = kk
        return min(k, n_spec)

    def steps(n):
        """Token-id groups per engine step: the prefill's token, then 3 per verify step (1 without speculation)."""
        ids, out = list(range(n)), []
        if ids:
            out.append(ids[:1])
        k = k_now()
        size = 1 + min(2, k) if k else 1  # accepts two drafts, or all of a shorter chain
        for i in range(1, n, size):
            out.append(ids[i:i + size])
            if k:  # a short last step (max_tokens reached) accepted fewer
                accepted = len(out[-1]) - 1
                counts["drafts"] += 1
                counts["draft_tokens"] += k
                counts["accepted"] += accepted
                for pos in range(accepted):
                    counts["pos"][pos] += 1
        return out

    async def health(request):
        return JSONResponse({})

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": name, "object": "model"}]})

    async def metrics(request):
        lines = ['vllm:num_requests_running{engine="0",model_name="%s"} 0.0' % name]
        if spec:
            label = 'engine="0",model_name="%s"' % name
            lines += [f"vllm:spec_decode_num_drafts_total{{{label}}} {float(counts['drafts'])}",
                      f"vllm:spec_decode_num_draft_tokens_total{{{label}}} {float(counts['draft_tokens'])}",
                      f"vllm:spec_decode_num_accepted_tokens_total{{{label}}} {float(counts['accepted'])}"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{label},position="{i}"}} {float(v)}'
                      for i, v in enumerate(counts["pos"])]
        return PlainTextResponse("\n".join(lines) + "\n")

    async def chat(request):
        body = await request.json()
        is_chat = request.url.path.endswith("/chat/completions")
        in_flight[0] += 1
        try:
            groups = steps(int(body.get("max_tokens", 16)))
        finally:
            in_flight[0] -= 1
        ids = [t for g in groups for t in g]
        text = lambda g: "".join(f"t{t} " for t in g)  # noqa: E731
        with_ids = bool(body.get("return_token_ids"))
        if not body.get("stream"):
            choice = ({"index": 0, "message": {"role": "assistant", "content": text(ids)}, "finish_reason": "length"}
                      if is_chat else {"index": 0, "text": text(ids), "finish_reason": "length"})
            if with_ids:
                choice["token_ids"] = ids
            return JSONResponse({"id": "x", "object": "chat.completion", "model": name, "choices": [choice],
                                 "usage": {"prompt_tokens": 5, "completion_tokens": len(ids)}})

        async def events():
            for g in groups:
                delta = ({"index": 0, "delta": {"content": text(g)}, "finish_reason": None} if is_chat
                         else {"index": 0, "text": text(g), "finish_reason": None})
                if with_ids:
                    delta["token_ids"] = lossy(g)
                yield f"data: {json.dumps({'model': name, 'choices': [delta]})}\n\n"
            yield f"data: {json.dumps({'model': name, 'choices': [], 'usage': {'prompt_tokens': 5, 'completion_tokens': len(ids)}})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    def lossy(ids):
        """``FAKE_VLLM_LOSSY_K=N``: the server drafting N streams token id 3 changed (a lossy engine), ids only."""
        if spec and os.environ.get("FAKE_VLLM_LOSSY_K") == str(n_spec):
            return [t + 1000 if t == 3 else t for t in ids]
        return ids

    app = Starlette(routes=[Route("/health", health), Route("/v1/models", models), Route("/metrics", metrics),
                            Route("/v1/chat/completions", chat, methods=["POST"]),
                            Route("/v1/completions", chat, methods=["POST"])])
    uvicorn.run(app, host=arg("--host", "127.0.0.1"), port=int(arg("--port", "8000")), log_level="warning")


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:2] == ["-c", "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('vllm') else 1)"] or (
            args and args[0] == "-c"):
        sys.exit(0)  # specconvert asks whether vllm can be imported: "yes"
    assert args[:2] == ["-m", "vllm.entrypoints.openai.api_server"], args
    main(args[2:])
