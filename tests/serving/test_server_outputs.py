"""What the reference server returns: stop strings counted like the baseline (issue 11 item 15), the
target's logprobs on both paths (item 17), echo, and an abandoned non-streamed request (item 7)."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from .test_serve_test_reference import ScriptedDecoder, SlowScriptedDecoder, _serve_in_thread

TOL = 1e-4  # fp32 tiny model: a 4-row verify forward and a 1-row forward agree to ~1e-6


@pytest.fixture(scope="module")
def oracle_engine(built_bundle):
    """The tiny bundle with the oracle drafter: every draft accepted, so each verify step emits 4 tokens."""
    import torch

    from specconvert.serving.engine import load_engine

    torch.set_num_threads(1)
    root, _ = built_bundle
    return load_engine(root / "work" / "engine", "tiny-serve", device="cpu", drafter="oracle")


def _post(app, requests: list[tuple[str, dict]]) -> list:
    """POST each (path, body) in order; streamed ones come back as their list of SSE data objects."""
    import httpx

    async def go():
        out = []
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t", timeout=120) as http:
            for path, body in requests:
                if body.get("stream"):
                    events = []
                    async with http.stream("POST", path, json=body) as r:
                        assert r.status_code == 200
                        async for line in r.aiter_lines():
                            if line.startswith("data: ") and line != "data: [DONE]":
                                events.append(json.loads(line[6:]))
                    out.append(events)
                else:
                    r = await http.post(path, json=body)
                    assert r.status_code == 200, r.text
                    out.append(r.json())
        return out

    return asyncio.run(go())


# ---------------------------------------------------------------- stop strings (item 15)


def test_a_stop_string_ends_the_tokens_at_the_token_that_completes_it():
    from specconvert.serving.app import create_app
    from specconvert.serving.engine import ReferenceEngine

    # Three tokens per step: "wor" completes at byte 10, in the middle of the 4th step (bytes 10-12).
    app = create_app(ReferenceEngine(ScriptedDecoder("héllo world, hello stop"), "scripted", 3))
    plain, streamed = _post(app, [
        ("/v1/completions", {"prompt": "x", "max_tokens": 64, "stop": ["wor"]}),
        ("/v1/completions", {"prompt": "x", "max_tokens": 64, "stop": "wor", "stream": True,
                             "stream_options": {"include_usage": True}}),
    ])
    choice = plain["choices"][0]
    assert choice["text"] == "héllo " and choice["finish_reason"] == "stop"
    assert choice["token_ids"] == list("héllo wor".encode()) and plain["usage"]["completion_tokens"] == 10
    ids = [t for e in streamed if e["choices"] for t in e["choices"][0]["token_ids"]]
    assert ids == choice["token_ids"] and streamed[-1]["usage"]["completion_tokens"] == 10


class StepwiseDecoder(ScriptedDecoder):
    """Fixed bytes: four per verify step on the speculative path, one per step on the baseline (as real decoders)."""

    def stream(self, prompt_ids, max_new_tokens, settings):
        from specconvert.reference import Step

        out, width = self.output[:max_new_tokens], 4 if settings.speculative else 1
        for k in range(0, len(out), width):
            spec = settings.speculative
            yield Step("spec" if spec else "plain", out[k:k + width], 3 if spec else 0, 3 if spec else 0,
                       3 if spec else 0, 0.0, 0.0, "length" if k + width >= len(out) else None)


@pytest.mark.parametrize("stop", ["s", "sl", "eep", "ee", "2.", "fox", "p 2"])
def test_speculative_and_baseline_count_the_same_tokens_with_stop_strings(stop):
    from specconvert.serving.app import create_app
    from specconvert.serving.engine import ReferenceEngine

    text = "The fox will sleep 2. times"
    app = create_app(ReferenceEngine(StepwiseDecoder(text), "stepwise", 3))
    body = {"prompt": "x", "max_tokens": 64, "stop": [stop]}
    spec, base, streamed = _post(app, [("/v1/completions", body),
                                       ("/v1/completions", {**body, "model": "stepwise-baseline"}),
                                       ("/v1/completions", {**body, "stream": True})])
    end = text.find(stop) + len(stop)  # bytes up to the one that completes the stop string (ASCII text)
    assert base["choices"][0]["token_ids"] == list(text[:end].encode())
    assert spec["choices"][0]["token_ids"] == base["choices"][0]["token_ids"]
    assert spec["usage"] == base["usage"] and spec["usage"]["completion_tokens"] == end
    assert spec["choices"][0]["text"] == base["choices"][0]["text"] == text[: text.find(stop)]
    assert [t for e in streamed for t in e["choices"][0]["token_ids"]] == spec["choices"][0]["token_ids"]


# ---------------------------------------------------------------- logprobs (item 17)


def _target_logprobs(engine, prompt_ids: list[int], token_ids: list[int]):
    """The target's log-softmax, one plain full-sequence forward (no cache): the ground truth."""
    import torch

    model = engine.decoder.target.model
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt_ids + token_ids]), use_cache=False).logits[0].float()
    return torch.log_softmax(logits[len(prompt_ids) - 1: -1], dim=-1)


def test_completion_logprobs_are_the_targets_on_both_paths(oracle_engine):
    from specconvert.serving.app import create_app

    app = create_app(oracle_engine)
    prompt_ids = oracle_engine.encode("The quick brown fox")
    body = {"prompt": prompt_ids, "max_tokens": 9, "temperature": 0, "logprobs": 3}
    spec, base, spec_stream, unrequested = _post(app, [
        ("/v1/completions", body), ("/v1/completions", {**body, "model": "tiny-serve-baseline"}),
        ("/v1/completions", {**body, "stream": True}), ("/v1/completions", {**body, "logprobs": None}),
    ])
    assert unrequested["choices"][0]["logprobs"] is None
    ids = spec["choices"][0]["token_ids"]
    assert ids == base["choices"][0]["token_ids"] and len(ids) == 9
    truth = _target_logprobs(oracle_engine, prompt_ids, ids)
    for response in (spec, base):
        lp = response["choices"][0]["logprobs"]
        assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
        assert lp["tokens"] == [oracle_engine.token_text(t) for t in ids]
        for i, t in enumerate(ids):
            assert math.isclose(lp["token_logprobs"][i], float(truth[i, t]), abs_tol=TOL)
            top = truth[i].topk(3)
            expected: dict[str, float] = {}  # keyed by text: namesakes keep the more likely entry
            for k, v in zip(top.indices, top.values):
                expected.setdefault(oracle_engine.token_text(int(k)), float(v))
            assert lp["top_logprobs"][i].keys() == expected.keys()
            assert all(math.isclose(lp["top_logprobs"][i][k], v, abs_tol=TOL) for k, v in expected.items())
            # Greedy: the emitted token is the most likely one.
            assert math.isclose(lp["token_logprobs"][i], max(lp["top_logprobs"][i].values()), abs_tol=TOL)
        text = response["choices"][0]["text"]
        assert lp["text_offset"][0] == 0 and lp["text_offset"] == sorted(lp["text_offset"])
        assert all(0 <= o <= len(text) for o in lp["text_offset"])
    streamed = [e["choices"][0]["logprobs"] for e in spec_stream if e["choices"] and e["choices"][0]["logprobs"]]
    merged = {k: [x for chunk in streamed for x in chunk[k]] for k in ("tokens", "token_logprobs", "text_offset")}
    lp = spec["choices"][0]["logprobs"]
    assert merged["tokens"] == lp["tokens"] and merged["text_offset"] == lp["text_offset"]
    assert all(math.isclose(a, b, abs_tol=TOL) for a, b in zip(merged["token_logprobs"], lp["token_logprobs"]))


def test_chat_logprobs_match_between_speculative_and_baseline_streamed_or_not(oracle_engine):
    from specconvert.serving.app import create_app

    app = create_app(oracle_engine)
    body = {"messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 10, "temperature": 0,
            "logprobs": True, "top_logprobs": 2}
    spec, base, spec_stream, no_top = _post(app, [
        ("/v1/chat/completions", body), ("/v1/chat/completions", {**body, "model": "tiny-serve-baseline"}),
        ("/v1/chat/completions", {**body, "stream": True}),
        ("/v1/chat/completions", {**body, "top_logprobs": None}),
    ])
    content = spec["choices"][0]["logprobs"]["content"]
    reference = base["choices"][0]["logprobs"]["content"]
    assert len(content) == len(reference) == len(spec["choices"][0]["token_ids"]) == 10
    streamed = [item for e in spec_stream if e["choices"] and e["choices"][0].get("logprobs")
                for item in e["choices"][0]["logprobs"]["content"]]
    for got in (content, streamed):
        for a, b in zip(got, reference, strict=True):
            assert a["token"] == b["token"] and a["bytes"] == list(a["token"].encode())
            assert math.isclose(a["logprob"], b["logprob"], abs_tol=TOL) and a["logprob"] <= 0
            assert [t["token"] for t in a["top_logprobs"]] == [t["token"] for t in b["top_logprobs"]]
            assert len(a["top_logprobs"]) == 2 and a["top_logprobs"][0]["logprob"] >= a["top_logprobs"][1]["logprob"]
            assert all(math.isclose(x["logprob"], y["logprob"], abs_tol=TOL)
                       for x, y in zip(a["top_logprobs"], b["top_logprobs"]))
            # The margin another check reads at a divergence: top-1 minus top-2, from the target alone.
            assert a["top_logprobs"][0]["logprob"] - a["top_logprobs"][1]["logprob"] >= 0
    assert all(item["top_logprobs"] == [] for item in no_top["choices"][0]["logprobs"]["content"])


def test_echo_prepends_the_prompt():
    from specconvert.serving.app import create_app
    from specconvert.serving.engine import ReferenceEngine

    app = create_app(ReferenceEngine(ScriptedDecoder("abcdef"), "scripted", 3))
    plain, streamed = _post(app, [("/v1/completions", {"prompt": "Q: ", "max_tokens": 4, "echo": True}),
                                  ("/v1/completions", {"prompt": "Q: ", "max_tokens": 4, "echo": True, "stream": True})])
    assert plain["choices"][0]["text"] == "Q: abcd" and plain["usage"]["completion_tokens"] == 4
    assert "".join(e["choices"][0]["text"] for e in streamed) == "Q: abcd"


# ---------------------------------------------------------------- abandoned requests (item 7)


def test_a_client_that_gives_up_on_a_non_streamed_request_frees_the_decoder():
    import httpx

    from specconvert.serving.engine import ReferenceEngine

    decoder = SlowScriptedDecoder("abcdefghijklmnopqrstuvwx")  # 8 steps of 0.1 s
    server, thread, url = _serve_in_thread(ReferenceEngine(decoder, "slow", 3))
    try:
        with httpx.Client(base_url=url, timeout=httpx.Timeout(30, read=0.25), trust_env=False) as impatient:
            with pytest.raises(httpx.ReadTimeout):
                impatient.post("/v1/completions", json={"prompt": "x", "max_tokens": 64})
        with httpx.Client(base_url=url, timeout=30, trust_env=False) as http:
            full = http.post("/v1/completions", json={"prompt": "x", "max_tokens": 64}).json()
            metrics = http.get("/perf_metrics").json()
    finally:
        server.should_exit = True
        thread.join(10)
    assert full["choices"][0]["text"] == "abcdefghijklmnopqrstuvwx"
    aborted, served = metrics[0]["specconvert"], metrics[1]["specconvert"]
    assert aborted["finish_reason"] == "abort" and aborted["completion_tokens"] < 24
    assert decoder.steps < 16  # the abandoned request stopped early instead of running its 8 steps
