"""Where acceptance comes from on each TensorRT-LLM line, or why it cannot be measured.

Nothing here runs TensorRT-LLM: `fake_trtllm_serve.py` is a TEST DOUBLE that serves, per
line, what upstream serves for EAGLE-3 (see specconvert/data/trtllm/acceptance_sources.json).
Its simulated speculation has a known tau, so each test checks the number as well as its source.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import signal
import threading
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from specconvert.backends.trtllm import acceptance as T, versions
from specconvert.serving.client import OpenAIClient

HERE = Path(__file__).parent
FAKE = HERE / "fake_trtllm_serve.py"
MAX_DRAFT_LEN = 3
MAX_TOKENS = 10


def _fake_module():
    spec = importlib.util.spec_from_file_location("fake_trtllm_serve", FAKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def true_tau(n: int, requests: int) -> float:
    _, accepted = _fake_module().simulate(n, MAX_DRAFT_LEN)
    return 1 + requests * sum(accepted) / (requests * len(accepted))


# ---------------------------------------------------------------- the table


@pytest.mark.parametrize(
    "version, line",
    [("1.2", "1.2"), ("1.2.1", "1.2"), ("1.3.0rc20", "1.3-early"), ("1.3.0rc26", "1.3-early"),
     ("1.3.0rc27", "1.3"), ("1.3", "1.3"), ("1.3.2", "1.3"), ("1.4.0rc1", "1.4"), ("1.4.0rc4", "1.4"), ("1.5.0", "1.4")],
)
def test_each_release_maps_to_its_line(version, line):
    assert T.line_for(version)["line"] == line


def test_every_source_is_cited_and_every_line_ends_in_the_stream_estimate():
    table = versions.sources_table()
    for name, source in {**table["sources"], **table["not_sources"]}.items():
        assert source["cites"], name
    for row in table["lines"]:
        assert set(row["sources"]) <= set(table["sources"]), row["line"]
        assert row["sources"][-1] == "stream_chunks", row["line"]
    by_line = {row["line"]: row for row in table["lines"]}
    assert "perf_metrics" not in by_line["1.4"]["sources"]  # the route is gone (PR #16668)
    assert "prometheus" not in by_line["1.2"]["sources"]  # no spec-decode series before PR #12545
    assert not any(row["serves"]["perf_metrics_eagle3_block"] for row in table["lines"])


# ---------------------------------------------------------------- one parser per source


def test_iteration_stats_count_each_drafting_request_as_one_step():
    items = [{"iter": 1}, {"specDecodingStats": {"numDraftTokens": 0, "numAcceptedTokens": 0, "numRequestsWithDraftTokens": 0}},
             {"specDecodingStats": {"numDraftTokens": 6, "numAcceptedTokens": 3, "numRequestsWithDraftTokens": 2}},
             {"specDecodingStats": {"numDraftTokens": 3, "numAcceptedTokens": 2, "numRequestsWithDraftTokens": 1}}]
    acc = T.from_iteration_stats(items)
    assert acc.label.startswith("measured: trtllm iteration stats")
    assert acc.acceptance_length == pytest.approx(1 + 5 / 3) and acc.draft_tokens == 9


PROM_BEFORE = 'trtllm_spec_decode_num_draft_tokens_total{model_name="m",engine_type="trtllm"} 30.0\n' \
              'trtllm_spec_decode_num_accepted_tokens_total{model_name="m",engine_type="trtllm"} 12.0\n'
PROM_AFTER = '# HELP x\ntrtllm_spec_decode_num_draft_tokens_total{model_name="m",engine_type="trtllm"} 48.0\n' \
             'trtllm_spec_decode_num_accepted_tokens_total{model_name="m",engine_type="trtllm"} 21.0\n' \
             'trtllm_spec_decode_acceptance_length{model_name="m",engine_type="trtllm"} 9.0\n'


@pytest.mark.parametrize(
    "before, after, label, tau",
    [
        (PROM_BEFORE, PROM_AFTER, "measured: trtllm prometheus counters", 1 + 9 / (18 / 3)),  # deltas, not totals
        ("", PROM_AFTER, "measured: trtllm prometheus counters", 1 + 21 / (48 / 3)),
        (PROM_BEFORE, PROM_BEFORE, "unavailable: the draft-token counter did not move during the run", None),
        ("", "trtllm_request_success_total 3\n", "unavailable: /prometheus/metrics has no trtllm_spec_decode_num_draft_tokens_total series", None),
        ("", None, "unavailable: GET /prometheus/metrics is not served", None),
    ],
    ids=["deltas", "fresh-server", "no-movement", "no-series-1.2", "no-route"],
)
def test_prometheus_counters(before, after, label, tau):
    acc = T.from_prometheus(T.parse_prometheus(before), None if after is None else T.parse_prometheus(after), MAX_DRAFT_LEN)
    assert acc.label.startswith(label)
    assert (acc.acceptance_length is None) == (tau is None)
    if tau is not None:
        assert acc.acceptance_length == pytest.approx(tau)
        assert "max_draft_len" in acc.extra["steps_derived_from"]


@pytest.mark.parametrize(
    "items, label",
    [
        ([{"request_id": 0, "perf_metrics": {"first_iter": 1}}], "unavailable: none of 1 entries has a speculative_decoding block"),
        (None, "unavailable: GET /perf_metrics is not served"),
        ([{"perf_metrics": {"speculative_decoding": {"total_draft_tokens": 9, "total_accepted_draft_tokens": 4}}}],
         "measured: trtllm /perf_metrics"),
    ],
    ids=["eagle3-no-block", "1.4-404", "block-present"],
)
def test_perf_metrics(items, label):
    acc = T.from_perf_metrics(items, MAX_DRAFT_LEN)
    assert acc.label.startswith(label)
    if acc.available:
        assert acc.acceptance_length == pytest.approx(1 + 4 / 3)


# ---------------------------------------------------------------- against the test double, line by line


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture
def serve(tmp_path):
    """Start the trtllm-serve TEST DOUBLE for one line; yields (url, line); reaps its process group."""
    procs = []

    def start(line: str, iter_stats: bool = True) -> str:
        options = tmp_path / f"opts-{line}.yaml"
        decoding = {"decoding_type": "Eagle", "speculative_model_dir": "/d"} if line == "1.2" else \
            {"decoding_type": "Eagle3", "speculative_model": "/d"}
        options.write_text(yaml.safe_dump({"max_batch_size": 1, "enable_iter_perf_stats": True,
                                           "return_perf_metrics": True, "perf_metrics_max_requests": 1024,
                                           "speculative_config": {**decoding, "max_draft_len": MAX_DRAFT_LEN}}))
        port = _free_port()
        env = {**os.environ, "FAKE_TRTLLM_ITER_STATS": "1" if iter_stats else "0"}
        env.pop("FAKE_TRTLLM_LINE", None)
        proc = subprocess.Popen([sys.executable, str(FAKE), str(tmp_path / "model"), "--backend", "pytorch",
                                 "--host", "127.0.0.1", "--port", str(port), "--extra_llm_api_options", str(options),
                                 "--line", line], env=env, stdout=subprocess.DEVNULL, start_new_session=True)
        procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=1).status_code == 200:
                    return url
            except httpx.HTTPError:
                time.sleep(0.1)
        raise RuntimeError("the test double did not start")

    yield start
    for proc in procs:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()


async def _run(url: str, version: str, streams: list[bool]):
    reader = T.AcceptanceReader(version, MAX_DRAFT_LEN, url)
    await reader.start()
    tokens, chunks = [], []
    async with OpenAIClient(url, request_timeout_s=20) as client:
        for i, stream in enumerate(streams):
            done = await client.complete("model", f"prompt {i}", max_tokens=MAX_TOKENS, temperature=0.0, stream=stream)
            if stream:
                tokens.append(len(done.text))  # the double emits one character per token
                chunks.append(len(done.chunks))
    return await reader.finish(tokens, chunks)


@pytest.mark.parametrize(
    "version, iter_stats, label",
    [
        ("1.2.1", True, "measured: trtllm iteration stats"),
        ("1.3.0rc20", True, "measured: trtllm iteration stats"),
        ("1.3.0rc27", True, "measured: trtllm iteration stats"),
        ("1.4.0rc4", True, "measured: trtllm iteration stats"),
        # a build without specDecodingStats for one-model EAGLE-3 (before PR #9855):
        ("1.3.0rc27", False, "measured: trtllm prometheus counters"),
        ("1.4.0rc4", False, "measured: trtllm prometheus counters"),
        ("1.2.1", False, "estimated: stream chunks"),  # /perf_metrics has no block, no Prometheus series
        ("1.3.0rc20", False, "estimated: stream chunks"),
    ],
)
def test_where_acceptance_comes_from_per_line(serve, version, iter_stats, label):
    url = serve(T.line_for(version)["line"], iter_stats=iter_stats)
    acc = asyncio.run(_run(url, version, [False, True, False, True]))
    assert acc.label.startswith(label), acc.label
    assert acc.extra["trtllm_line"] == T.line_for(version)["line"]
    # the double's speculation has a known tau: every source must find it
    assert acc.acceptance_length == pytest.approx(true_tau(MAX_TOKENS, 4), abs=1e-9)
    if not iter_stats:
        assert any(r.startswith("iteration_stats:") for r in acc.extra["not_measured"])


@pytest.mark.parametrize("version", ["1.2.1", "1.3.0rc20"])
def test_unmeasurable_says_why_for_every_source(serve, version):
    url = serve(T.line_for(version)["line"], iter_stats=False)
    acc = asyncio.run(_run(url, version, [False, False]))  # nothing streamed either
    assert not acc.available and acc.acceptance_length is None
    assert acc.label.startswith("unavailable: iteration_stats: no iteration carried specDecodingStats")
    assert "perf_metrics: none of 2 entries has a speculative_decoding block (TorchSampler never fills it" in acc.reason
    assert acc.reason.endswith("stream_chunks: no streamed request to estimate from")


def test_1_4_has_no_perf_metrics_and_its_metrics_header_carries_timing_only(serve):
    url = serve("1.4")
    assert httpx.get(url + "/perf_metrics").status_code == 404
    body = {"model": "m", "prompt": "p", "max_tokens": 4}
    plain = httpx.post(url + "/v1/completions", json=body)
    assert "Server-Timing" not in plain.headers  # only on request
    asked = httpx.post(url + "/v1/completions", json=body, headers={"X-TRTLLM-return-metrics": "1"})
    assert asked.headers["Server-Timing"].startswith("server_queue;dur=")
    streamed = httpx.post(url + "/v1/completions", json={**body, "stream": True}, headers={"X-TRTLLM-return-metrics": "1"})
    after_done = streamed.text.split("data: [DONE]", 1)[1]
    assert after_done.strip().startswith("event: trtllm.perf_metrics")
    assert "accept" not in after_done.lower() and "draft" not in after_done.lower()


@pytest.mark.parametrize("line", ["1.2", "1.3-early", "1.3"])
def test_perf_metrics_never_carries_an_eagle3_block(serve, line):
    url = serve(line)
    httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "p", "max_tokens": 8})
    entries = httpx.get(url + "/perf_metrics").json()
    assert entries and all("speculative_decoding" not in e["perf_metrics"] for e in entries)


# ---------------------------------------------------------------- the verdict never judges a missing number


def _evaluate(acceptance, min_tau=1.5):
    from types import SimpleNamespace

    from specconvert.recipe import ServeTestSpec
    from specconvert.serving.verdict import evaluate

    spec = ServeTestSpec(min_acceptance_length=min_tau, stream=False)
    run = SimpleNamespace(spec=spec, prompts=[], results={}, servers=[], metrics_available={}, acceptance=acceptance)
    report = evaluate(run)
    check = next(c for c in report["checks"] if c["name"].startswith("acceptance length"))
    case = next(c for s in report["junit"] for c in s.cases if c.name == check["name"])
    return report, check, case


def test_unmeasurable_acceptance_is_skipped_with_its_reason_not_failed():
    from specconvert.acceptance import unavailable

    report, check, case = _evaluate(unavailable("trtllm 1.2", "iteration_stats: no iteration carried specDecodingStats"))
    assert check["passed"] is None and check["skipped"] and check["value"] is None
    assert check["message"] == "not measurable: iteration_stats: no iteration carried specDecodingStats"
    assert case.status == "skipped"
    assert report["summary"]["acceptance_length"] is None


@pytest.mark.parametrize("tau, passed", [(2.25, True), (1.2, False)])
def test_measured_acceptance_is_judged_and_names_its_source(tau, passed):
    from specconvert.acceptance import from_counts

    acc = from_counts("trtllm iteration stats (/metrics specDecodingStats)", drafts=4, draft_tokens=12,
                      accepted_tokens=round((tau - 1) * 4))
    report, check, case = _evaluate(acc)
    assert check["passed"] is passed and case.status == ("passed" if passed else "failed")
    assert "measured: trtllm iteration stats" in check["message"]
    assert report["summary"]["acceptance"]["source"].startswith("measured: trtllm iteration stats")


def test_bench_takes_the_readers_acceptance_in_its_shape():
    from specconvert.bench.metrics import acceptance_from_reader
    from specconvert.acceptance import unavailable

    exact = acceptance_from_reader(T.from_iteration_stats(
        [{"specDecodingStats": {"numDraftTokens": 12, "numAcceptedTokens": 5, "numRequestsWithDraftTokens": 4}}]))
    assert exact["acceptance_length"] == 2.25 and exact["acceptance_rate"] == round(5 / 12, 4) and not exact["estimate"]
    assert exact["source"].startswith("measured: trtllm iteration stats")
    derived = acceptance_from_reader(T.from_prometheus({}, T.parse_prometheus(PROM_AFTER), MAX_DRAFT_LEN))
    assert derived["estimate"] and "max_draft_len" in derived["note"]
    assert acceptance_from_reader(unavailable("trtllm 1.2", "nothing")) is None


# ---------------------------------------------------------------- the stream-chunk estimate against a known tau


@pytest.fixture(scope="module")
def reference_engines(built_bundle):
    import torch

    from specconvert.serving.engine import load_engine

    torch.set_num_threads(1)
    root, _ = built_bundle
    return {d: load_engine(root / "work" / "engine", "tiny-serve", device="cpu", drafter=d) for d in ("eagle", "oracle")}


ESTIMATE_PROMPTS = ["The quick brown fox", "Once upon a time", "def main():", "1, 2, 3, 4,", "Hello"]


async def _estimate_vs_exact(url: str, max_tokens: int):
    from specconvert.acceptance import from_stream_chunks
    from specconvert.serving.metrics import aggregate, request_stats

    async with OpenAIClient(url, request_timeout_s=60) as client:
        await client.perf_metrics()
        tokens, chunks = [], []
        for prompt in ESTIMATE_PROMPTS:
            done = await client.complete("tiny-serve", prompt, max_tokens=max_tokens, temperature=0.0, stream=True)
            tokens.append(len(done.token_ids) if done.token_ids is not None else done.completion_tokens)
            chunks.append(len(done.chunks))
        entries = await client.perf_metrics()
    exact = aggregate([request_stats(e, MAX_DRAFT_LEN) for e in entries])["acceptance_length"]
    return from_stream_chunks(tokens, chunks), exact


@pytest.mark.parametrize("drafter", ["eagle", "oracle"])
def test_stream_chunk_estimate_matches_the_reference_servers_exact_tau(reference_engines, drafter):
    """Measured: on the reference server (one SSE chunk per verification step) the estimate's error is 0
    for a random head (tau ~1) and for the oracle drafter (tau at its maximum, 1 + max_draft_len)."""
    import uvicorn

    from specconvert.serving.app import create_app
    from specconvert.serving.process import free_port

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(reference_engines[drafter]), host="127.0.0.1", port=port,
                                           log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 30
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        estimate, exact = asyncio.run(_estimate_vs_exact(f"http://127.0.0.1:{port}", 24))
    finally:
        server.should_exit = True
        thread.join(10)
    assert estimate.label == "estimated: stream chunks" and exact is not None
    print(f"drafter={drafter}: exact tau {exact:.4f}, stream-chunk estimate {estimate.acceptance_length:.4f}, "
          f"error {estimate.acceptance_length - exact:+.4f}")
    assert estimate.acceptance_length == pytest.approx(exact, abs=1e-3)
    if drafter == "oracle":
        assert exact == pytest.approx(1 + MAX_DRAFT_LEN, abs=0.35)  # the last step of each request is cut short
