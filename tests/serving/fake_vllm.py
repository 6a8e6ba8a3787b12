"""A TEST DOUBLE of vLLM's OpenAI server, run as ``FAKE_PYTHON -m vllm.entrypoints.openai.api_server ARGS``.

Not a model. It takes vLLM's arguments (``--served-model-name``, ``--speculative-config``,
``--host``, ``--port``; the rest is logged and ignored), and answers like vLLM 0.32 does where
specconvert looks: ``/health``, ``/v1/models``, chat completions (with ``return_token_ids``,
streamed or not) and Prometheus ``/metrics`` with the spec-decode counters (``_total``
suffix, ``engine``/``model_name``/``position`` labels) only when a speculative config was given.
Every request generates token ids 0..max_tokens-1 (text "t0 t1 ..."): speculative and
baseline outputs are equal. With speculation each verify step emits 1 + A tokens and counts one
draft of ``num_speculative_tokens`` with A accepted (positions 0..A-1), A = min(``FAKE_VLLM_ACCEPT``
(default 2), the chain): tau = 3 (a chain of 1: tau 2). ``FAKE_VLLM_ACCEPT=0`` accepts nothing (tau 1).

One engine loop decodes every running request in steps of ``STEP_S`` seconds, as vLLM's scheduler
does; requests join once the oldest waiting one has waited ``BATCH_WINDOW_S``, so requests sent
together run (and finish) together. Each step looks its draft length up in the
``num_speculative_tokens_per_batch_size`` schedule for the number of requests running in it
(vLLM's lookup by batch size): where it gives 0, that step decodes one token and drafts nothing.
Free speculation (``"method": "ngram"`` or ``"suffix"``, no draft model), as vLLM 0.32 counts it: a step whose
lookup finds no match drafts nothing and is not counted as a draft (``Scheduler._make_spec_decoding_stats``
returns early without draft tokens), so the counters' tau covers drafting steps only. The double's lookup
matches on every other decode step and accepts ``FAKE_VLLM_NGRAM_ACCEPT`` (default 1) of its drafts there:
counters tau 2, tokens per step 1.5. vLLM refuses ``ngram`` with ``prompt_lookup_min > prompt_lookup_max``
and ``suffix`` without ``arctic_inference`` (``FAKE_VLLM_NO_ARCTIC=1``: the package is absent, and asking
whether it imports answers no).
``FAKE_VLLM_ACCEPT_BY_WORD=word:A,...``: requests whose prompt holds ``word`` accept A per step instead.
``FAKE_VLLM_ARGV_LOG`` appends each start's argv and environment as one JSON line.
``FAKE_VLLM_LOSSY_K=N``: the server with ``num_speculative_tokens`` N streams token id 3 as 1003
(``FAKE_VLLM_LOSSY_METHOD=ngram``: the server with that method).
Non-streaming requests asking ``logprobs`` get OpenAI logprobs (tokens spelled ``token_id:N`` with
``return_tokens_as_token_ids``, else as text): each token leads a runner-up by 5 nats, except token 3,
whose runner-up is 1003 (the lossy token) ``FAKE_VLLM_TIE_MARGIN`` nats behind (default 3: a real
divergence; 0.02 plants a near-tie).
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

STEP_S = 0.01
BATCH_WINDOW_S = float(os.environ.get("FAKE_VLLM_BATCH_WINDOW_S", "0.05"))  # a test of batching under load sets more


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
                                                        if k.startswith(("VLLM_", "OMP_", "CUDA_"))}}) + "\n")
    name = arg("--served-model-name", "model")
    spec = json.loads(arg("--speculative-config")) if "--speculative-config" in argv else None
    n_spec = spec["num_speculative_tokens"] if spec else 0
    free = (spec or {}).get("method") in ("ngram", "suffix")
    if free and spec["method"] == "suffix" and os.environ.get("FAKE_VLLM_NO_ARCTIC"):
        sys.exit("ImportError: Arctic Inference is required for suffix decoding.")
    if free and spec["method"] == "ngram" and spec.get("prompt_lookup_min", 5) > spec.get("prompt_lookup_max", 5):
        sys.exit("ValueError: prompt_lookup_min must be <= prompt_lookup_max")
    schedule = (spec or {}).get("num_speculative_tokens_per_batch_size")
    counts = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "pos": [0] * n_spec}
    waiting, running, engine_task = [], [], []
    accept = int(os.environ.get("FAKE_VLLM_NGRAM_ACCEPT" if free else "FAKE_VLLM_ACCEPT", "1" if free else "2"))

    def k_for(batch):
        """vLLM's lookup: the schedule's K for this batch size (the last range's beyond it), capped at n_spec."""
        if not schedule:
            return n_spec
        k = schedule[-1][2]
        for start, end, kk in schedule:
            if start <= batch <= end:
                k = kk
        return min(k, n_spec)

    async def engine():
        """One engine step every STEP_S over every running request, at the draft length for that batch size.
        Waiting requests join once the oldest has waited BATCH_WINDOW_S, so requests sent together run together."""
        while True:
            await asyncio.sleep(STEP_S)
            if waiting and time.monotonic() - waiting[0]["since"] >= BATCH_WINDOW_S:
                running.extend(waiting)
                waiting.clear()
            k = k_for(len(running))
            for req in list(running):
                if req["next"] == 0:  # the prefill's token
                    group = [0]
                elif free and (req.setdefault("steps", 0) + 1) % 2:  # the lookup found no match: no draft
                    req["steps"] += 1
                    group = [req["next"]]
                else:
                    group = list(range(req["next"], min(req["n"], req["next"] + 1 + (min(req["accept"], k) if k else 0))))
                    req["steps"] = req.get("steps", 0) + 1
                    if k:  # a short last step (max_tokens reached) accepted fewer
                        accepted = len(group) - 1
                        counts["drafts"] += 1
                        counts["draft_tokens"] += k
                        counts["accepted"] += accepted
                        for pos in range(accepted):
                            counts["pos"][pos] += 1
                req["next"] += len(group)
                req["queue"].put_nowait(group)
                if req["next"] >= req["n"]:
                    running.remove(req)
                    req["queue"].put_nowait(None)

    by_word = dict((w, int(a)) for w, a in (item.split(":") for item in
                                              os.environ.get("FAKE_VLLM_ACCEPT_BY_WORD", "").split(",") if item))

    async def steps(n, prompt=""):
        """Token-id groups per engine step: the prefill's token, then 1 + accepted drafts per verify step."""
        if not engine_task:
            engine_task.append(asyncio.create_task(engine()))
        if n <= 0:
            return
        mine = next((a for w, a in by_word.items() if w in prompt), accept)
        req = {"n": n, "next": 0, "queue": asyncio.Queue(), "since": time.monotonic(), "accept": mine}
        waiting.append(req)
        while (group := await req["queue"].get()) is not None:
            yield group

    async def health(request):
        return JSONResponse({})

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": name, "object": "model"}]})

    async def metrics(request):
        lines = ['vllm:num_requests_running{engine="0",model_name="%s"} %.1f' % (name, len(running))]
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
        n = int(body.get("max_tokens", 16))
        text = lambda g: "".join(f"t{t} " for t in g)  # noqa: E731
        with_ids = bool(body.get("return_token_ids"))
        prompt = json.dumps(body.get("messages") or body.get("prompt"))
        if not body.get("stream"):
            ids = [t async for g in steps(n, prompt) for t in g]
            choice = ({"index": 0, "message": {"role": "assistant", "content": text(ids)}, "finish_reason": "length"}
                      if is_chat else {"index": 0, "text": text(ids), "finish_reason": "length"})
            if with_ids:
                choice["token_ids"] = ids
            if body.get("logprobs"):
                choice["logprobs"] = logprobs(ids, is_chat, bool(body.get("return_tokens_as_token_ids")))
            return JSONResponse({"id": "x", "object": "chat.completion", "model": name, "choices": [choice],
                                 "usage": {"prompt_tokens": 5, "completion_tokens": len(ids)}})

        async def events():
            sent = 0
            if is_chat:  # vLLM opens a chat stream with the role alone: no content, no token_ids key
                yield f"data: {json.dumps({'model': name, 'choices': [{'index': 0, 'delta': {'role': 'assistant', 'content': ''}, 'finish_reason': None}]})}\n\n"
            async for g in steps(n, prompt):
                sent += len(g)
                delta = ({"index": 0, "delta": {"content": text(g)}, "finish_reason": None} if is_chat
                         else {"index": 0, "text": text(g), "finish_reason": None})
                if with_ids:
                    delta["token_ids"] = lossy(g)
                yield f"data: {json.dumps({'model': name, 'choices': [delta]})}\n\n"
            yield f"data: {json.dumps({'model': name, 'choices': [], 'usage': {'prompt_tokens': 5, 'completion_tokens': sent}})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    def logprobs(ids, is_chat, by_id):
        """OpenAI logprobs of ``ids``: each token at -0.1, its runner-up 5 nats behind (1003 FAKE_VLLM_TIE_MARGIN behind 3)."""
        spell = (lambda t: f"token_id:{t}") if by_id else (lambda t: f"t{t} ")  # noqa: E731
        tie = float(os.environ.get("FAKE_VLLM_TIE_MARGIN", "3"))
        tops = [[(spell(t), -0.1), (spell(1003 if t == 3 else t + 2000), -0.1 - (tie if t == 3 else 5.0))] for t in ids]
        if is_chat:
            return {"content": [{"token": top[0][0], "logprob": top[0][1],
                                 "top_logprobs": [{"token": tok, "logprob": lp} for tok, lp in top]} for top in tops]}
        return {"tokens": [top[0][0] for top in tops], "token_logprobs": [top[0][1] for top in tops],
                "top_logprobs": [dict(top) for top in tops]}

    def lossy(ids):
        """``FAKE_VLLM_LOSSY_K=N``: the server drafting N streams token id 3 changed (a lossy engine), ids only."""
        if spec and (os.environ.get("FAKE_VLLM_LOSSY_K") == str(n_spec)
                     or os.environ.get("FAKE_VLLM_LOSSY_METHOD") == spec.get("method")):
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
        if "arctic_inference" in " ".join(args) and os.environ.get("FAKE_VLLM_NO_ARCTIC"):
            sys.exit(1)  # specconvert asks whether suffix decoding's package is there: "no"
        sys.exit(0)  # specconvert asks whether vllm can be imported: "yes"
    assert args[:2] == ["-m", "vllm.entrypoints.openai.api_server"], args
    main(args[2:])
