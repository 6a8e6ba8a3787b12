"""serve-test end to end with the reference server on a tiny bundle: pass, lossy, threshold, streaming."""

from __future__ import annotations

import json
import threading
import time

import pytest

from .conftest import PROMPTS, assert_reaped
from .junit_schema import validate


def test_reference_server_passes_with_the_oracle_drafter(project, cli):
    """The real launch path: `specconvert serve` as a child, both models, lossless, tau at its maximum."""
    result = cli("serve-test", project.recipe_path, "--drafter", "oracle",
                 "--set", "serve_test.min_acceptance_length=2.5", "--json")
    assert result.code == 0, result.stderr[-3000:]
    report = result.json()
    assert report["kind"] == "serve-test" and report["status"] == "passed"
    summary = report["summary"]
    assert summary["prompts"] == len(PROMPTS) and summary["exact_match_fraction"] == 1.0
    # The oracle drafts the target's own continuation: every draft token is accepted.
    assert summary["per_position_acceptance"] == [1.0, 1.0, 1.0]
    assert summary["acceptance_length"] >= 2.5 and summary["acceptance_rate"] == 1.0
    assert report["models"] == {"speculative": "tiny-serve", "baseline": "tiny-serve-baseline"}
    assert all(row["stream_matches"] is True and row["first_divergence"] is None for row in report["prompts"])
    assert all(row["latency_s"]["speculative"] > 0 and row["latency_s"]["baseline"] > 0 for row in report["prompts"])
    # Outputs on disk, the junit valid, one transcript per request (speculative, streamed, baseline).
    root = validate(project.out / "junit.xml")
    assert int(root.get("tests")) == len(report["checks"]) + len(PROMPTS) and root.get("failures") == "0"
    lines = (project.out / "transcripts.jsonl").read_text().splitlines()
    assert len(lines) == 3 * len(PROMPTS)
    streamed = [json.loads(line) for line in lines if json.loads(line)["stream"]]
    assert streamed and all(len(t["response"]["chunks"]) >= 1 for t in streamed)
    assert json.loads((project.out / "manifest.json").read_text())["status"] == "passed"
    assert_reaped([s["pid"] for s in report["servers"]])


# ---------------------------------------------------------------- in-process servers (fast)


class LossyDecoder:
    """Wraps the real decoder; the speculative path changes the 3rd generated token (an injected bug)."""

    def __init__(self, inner):
        self.inner = inner
        self.tokenizer = inner.tokenizer
        self.eos_token_ids = inner.eos_token_ids

    def stream(self, prompt_ids, max_new_tokens, settings):
        emitted = 0
        for step in self.inner.stream(prompt_ids, max_new_tokens, settings):
            if settings.speculative and emitted <= 2 < emitted + len(step.token_ids):
                step.token_ids = list(step.token_ids)
                step.token_ids[2 - emitted] = (step.token_ids[2 - emitted] + 1) % 256
            emitted += len(step.token_ids)
            yield step


def _serve_in_thread(engine):
    import uvicorn

    from specconvert.serving.app import create_app
    from specconvert.serving.process import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(engine), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.started
    return server, thread, f"http://127.0.0.1:{port}"


@pytest.fixture(scope="module")
def engine(built_bundle):
    import torch

    from specconvert.serving.engine import load_engine

    torch.set_num_threads(1)
    root, _ = built_bundle
    return load_engine(root / "work" / "engine", "tiny-serve", device="cpu")


@pytest.fixture
def endpoint(engine):
    server, thread, url = _serve_in_thread(engine)
    yield url
    server.should_exit = True
    thread.join(10)


@pytest.fixture
def lossy_endpoint(engine):
    from specconvert.serving.engine import ReferenceEngine

    lossy = ReferenceEngine(LossyDecoder(engine.decoder), "tiny-serve", engine.max_draft_len)
    server, thread, url = _serve_in_thread(lossy)
    yield url
    server.should_exit = True
    thread.join(10)


def test_lossy_decoder_fails_with_the_divergence_in_the_report(project, cli, lossy_endpoint):
    result = cli("serve-test", project.recipe_path, "--url", lossy_endpoint, "--json")
    assert result.code == 1, result.stderr[-2000:]
    report = result.json()
    assert report["status"] == "failed" and report["summary"]["exact_match"] == 0
    for row in report["prompts"]:
        div = row["first_divergence"]
        assert div["token_index"] == 2, div
        assert div["speculative_tokens"][0] == (div["baseline_tokens"][0] + 1) % 256
    lossless = next(c for c in report["checks"] if c["name"].startswith("lossless"))
    assert not lossless["passed"] and "token 2" in lossless["message"]
    assert "lossless" in result.stderr and "check" in result.stderr
    root = validate(project.out / "junit.xml")
    failures = [f for f in root.iter("failure")]
    assert any("first divergence at token 2" in (f.get("message") or "") for f in failures)


def test_threshold_too_high_fails_acceptance_only(project, cli, endpoint):
    project.write(min_acceptance_length=3.5)
    result = cli("serve-test", project.recipe_path, "--url", endpoint, "--json")
    assert result.code == 1
    checks = {c["name"]: c for c in result.json()["checks"]}
    assert not checks["acceptance length >= 3.5"]["passed"]
    assert checks["lossless (greedy): exact match >= 1"]["passed"]  # a random head is still lossless
    assert checks["streaming equals non-streaming"]["passed"]


def test_endpoints_streaming_agrees_and_concurrent_clients_queue(endpoint):
    import asyncio

    from specconvert.serving.client import OpenAIClient, RequestFailed

    messages = [{"role": "user", "content": "Count to five."}]

    async def go():
        async with OpenAIClient(endpoint, request_timeout_s=60) as client:
            assert await client.models() == ["tiny-serve", "tiny-serve-baseline"]
            await client.perf_metrics()
            plain = await client.chat("tiny-serve", messages, max_tokens=12, temperature=0)
            streamed = await client.chat("tiny-serve", messages, max_tokens=12, temperature=0, stream=True)
            completion = await client.complete("tiny-serve", "Once upon", max_tokens=6, temperature=0, stream=True)
            # Three clients at once against one decoder: each gets the answer it would get alone.
            together = await asyncio.gather(*[
                client.chat(model, messages, max_tokens=12, temperature=0)
                for model in ("tiny-serve", "tiny-serve-baseline", "tiny-serve")
            ])
            metrics = await client.perf_metrics()
            with pytest.raises(RequestFailed) as unknown:
                await client.chat("nope", messages, max_tokens=2)
            return plain, streamed, completion, together, metrics, unknown.value

    plain, streamed, completion, together, metrics, unknown = asyncio.run(go())
    assert len(plain.token_ids) == 12 and plain.finish_reason == "length"
    assert streamed.token_ids == plain.token_ids and streamed.text == plain.text
    assert sum(c.tokens for c in streamed.chunks) == 12 and streamed.ttft_s <= streamed.latency_s
    assert completion.completion_tokens == 6 and len(completion.token_ids) == 6
    assert [t.token_ids for t in together] == [plain.token_ids] * 3
    # TensorRT-LLM's /perf_metrics item shape; the baseline request drafts nothing, so it has no block.
    assert len(metrics) == 6
    spec_items = [m for m in metrics if m["specconvert"]["speculative"]]
    for item in spec_items:
        block = item["perf_metrics"]["speculative_decoding"]
        assert set(block) == {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"}
        assert block["total_draft_tokens"] > 0
    assert all("speculative_decoding" not in m["perf_metrics"] for m in metrics if not m["specconvert"]["speculative"])
    assert unknown.status == 404 and "tiny-serve-baseline" in unknown.message


class ScriptedDecoder:
    """A decoder stand-in that emits fixed bytes, three per step (two drafts accepted each step)."""

    eos_token_ids = (0,)

    class tokenizer:  # noqa: N801 - a stand-in object, not a class users instantiate
        chat_template = None

        @staticmethod
        def encode(text, add_special_tokens=True):
            return list(text.encode())

        @staticmethod
        def decode(ids, skip_special_tokens=True):
            return bytes(ids).decode("utf-8", "replace")

    def __init__(self, text: str):
        self.output = list(text.encode())

    def stream(self, prompt_ids, max_new_tokens, settings):
        from specconvert.reference import Step

        out = self.output[:max_new_tokens]
        for k in range(0, len(out), 3):
            last = k + 3 >= len(out)
            yield Step("spec" if settings.speculative else "plain", out[k:k + 3], 2 if settings.speculative else 0,
                       3 if settings.speculative else 0, 3 if settings.speculative else 0, 0.0, 0.0,
                       "length" if last else None)


def test_stop_strings_streaming_and_bad_requests():
    import asyncio

    import httpx

    from specconvert.serving.app import create_app
    from specconvert.serving.engine import ReferenceEngine

    engine = ReferenceEngine(ScriptedDecoder("héllo world, hello stop"), "scripted", 3)
    app = create_app(engine)

    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as http:
            full = (await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 64})).json()
            cut = (await http.post("/v1/completions", json={"prompt": "x", "max_tokens": 64, "stop": ["wor", "zz"]})).json()
            events = []
            async with http.stream("POST", "/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": "x"}], "max_tokens": 64, "stop": "stop", "stream": True}) as r:
                async for line in r.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        events.append(json.loads(line[6:]))
            bad = [
                (await http.post("/v1/completions", json={"max_tokens": 3})).status_code,
                (await http.post("/v1/completions", json={"prompt": "x", "n": 2})).status_code,
                (await http.post("/v1/chat/completions", content=b"{not json")).status_code,
                (await http.post("/v1/chat/completions", json={"model": "other", "messages": [{"role": "user", "content": "x"}]})).status_code,
            ]
            metrics = (await http.get("/perf_metrics")).json()
            return full, cut, events, bad, metrics

    full, cut, events, bad, metrics = asyncio.run(go())
    assert full["choices"][0]["text"] == "héllo world, hello stop" and full["usage"]["completion_tokens"] == 24
    assert cut["choices"][0]["text"] == "héllo " and cut["choices"][0]["finish_reason"] == "stop"
    streamed = "".join(e["choices"][0]["delta"].get("content", "") for e in events)
    assert streamed == "héllo world, hello " and events[-1]["choices"][0]["finish_reason"] == "stop"
    assert "\ufffd" not in streamed  # the split UTF-8 character was held back, not sent broken
    assert bad == [400, 400, 400, 404]
    # 24 tokens in 8 steps of 3, two drafts accepted per step: tau 3, acceptance rate 2/3.
    assert metrics[0]["specconvert"]["acceptance_length"] == 3.0
    assert metrics[0]["perf_metrics"]["speculative_decoding"] == {
        "acceptance_rate": 2 / 3, "total_accepted_draft_tokens": 16, "total_draft_tokens": 24}
