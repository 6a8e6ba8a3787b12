"""`specconvert bench` end to end against the stand-in server (real sockets, real CLI entry point)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specconvert.bench.workload import Run, interleaved_schedule

from .conftest import FAST

PNG = b"\x89PNG\r\n\x1a\n"


def test_schedule_interleaves_baseline_and_speculative_per_level():
    order = [r.name for r in interleaved_schedule([1, 4], 2, True)]
    # A B, then B A: neither side always runs after the other
    assert order == ["baseline-c1-r0", "speculative-c1-r0", "speculative-c1-r1", "baseline-c1-r1",
                     "baseline-c4-r0", "speculative-c4-r0", "speculative-c4-r1", "baseline-c4-r1"]
    assert interleaved_schedule([2], 2, False) == [Run("speculative", 2, 0), Run("speculative", 2, 1)]


def test_bench_url_writes_report_plots_and_raw_requests(cli, standin, tmp_path):
    out = tmp_path / "bench"
    result = cli("bench", "--url", standin.url, "--out", out, *FAST, "--set", "bench.plots=true", "--json")
    assert result.code == 0, result.stderr
    doc = result.json()
    assert doc["kind"] == "bench" and doc["schema_version"] == 1
    report = json.loads((out / "report.json").read_text())
    assert report == doc["report"]
    for key in ("definitions", "settings", "workload", "endpoints", "schedule", "runs", "levels", "acceptance",
                "client_overhead", "failed_requests", "gate", "files", "trtllm_bench"):
        assert key in report, key
    assert report["endpoints"]["speculative"]["model"] == "m"
    assert report["endpoints"]["baseline"]["model"] == "m-baseline"
    assert report["endpoints"]["speculative"]["metrics_endpoint"] is True
    assert report["schedule"][:4] == ["baseline-c1-r0", "speculative-c1-r0", "speculative-c1-r1", "baseline-c1-r1"]
    assert [lv["concurrency"] for lv in report["levels"]] == [1, 2]

    # The server's request log shows the runs really alternated (A B, then B A): 1 warm-up each, then blocks of 4.
    models = [model for model, _ in standin.script.seen]
    assert models[:2] == ["m-baseline", "m"]
    blocks = [models[2 + 4 * i: 6 + 4 * i] for i in range(8)]
    assert [set(b) for b in blocks] == [{"m-baseline"}, {"m"}, {"m"}, {"m-baseline"}] * 2
    assert max(c for model, c in standin.script.seen[10:18]) == 1  # concurrency 1 really was 1
    assert max(c for model, c in standin.script.seen[18:]) == 2

    # Scripted 7 tokens: speculative chunks 1+3+3, baseline 1 per chunk: counts exact, timings near the script.
    lines = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert len(lines) == 2 * 2 * 2 * 4
    spec = [r for r in lines if r["label"] == "speculative"]
    base = [r for r in lines if r["label"] == "baseline"]
    assert all(r["chunk_tokens"] == [1, 3, 3] and r["output_tokens"] == 7 for r in spec)
    assert all(r["chunk_tokens"] == [1] * 7 for r in base)
    # Lower bounds only: a loaded CI machine stretches every sleep (an upper bound of 0.5 s flaked).
    assert all(0.02 <= r["ttft_s"] <= r["e2e_s"] for r in lines)
    # Hard lower bounds (sleeps only ever run long): two 15 ms gaps after a 20 ms first token.
    assert all(r["chunk_times_s"][-1] >= 0.02 + 2 * 0.015 for r in spec)
    assert all(r["e2e_s"] >= r["chunk_times_s"][-1] for r in lines)
    spec_itl = sorted(s for r in spec for s in r["itl_s"])
    base_itl = sorted(s for r in base for s in r["itl_s"])
    assert spec_itl[len(spec_itl) // 2] < base_itl[len(base_itl) // 2]  # a 3-token chunk per gap vs 1

    # Acceptance comes from the server's /perf_metrics: 2 accepted of 2 drafted per step -> exactly 3.
    assert report["acceptance"]["estimate"] is False
    assert report["acceptance"]["acceptance_length"] == pytest.approx(3.0)
    assert report["acceptance"]["per_position"] == pytest.approx([1.0, 1.0])
    level1 = report["levels"][0]
    assert level1["speedup"]["output_tokens_per_s"]["pairs"] == 2
    assert level1["speedup"]["output_tokens_per_s"]["median"] > 1.2  # 3 tokens per 15 ms step vs 1
    assert level1["speculative"]["tokens_per_chunk"]["mean"] == pytest.approx(3.0)
    assert report["client_overhead"]["per_event_s"] > 0

    for name in ("latency_vs_concurrency.png", "speedup_vs_concurrency.png", "acceptance_per_position.png"):
        data = (out / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 1000, name
    md = (out / "report.md").read_text()
    assert "| concurrency | output tok/s |" in md and "server /perf_metrics" in md
    assert json.loads((out / "manifest.json").read_text())["stage"] == "bench"
    assert not list(tmp_path.glob(".bench.staging-*"))


def test_url_without_metrics_labels_acceptance_as_estimate(cli, plain_standin, tmp_path):
    out = tmp_path / "bench"
    result = cli("bench", "--url", plain_standin.url, "--out", out, *FAST, "--set", "bench.concurrency=[1]",
                 "--set", "bench.repeats=1", "--set", "bench.api=completions")
    assert result.code == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["endpoints"]["speculative"]["metrics_endpoint"] is False
    acc = report["acceptance"]
    assert acc["estimate"] is True and acc["source"] == "tokens_per_chunk"
    assert "estimate" in acc["note"]
    # Text "t1 t2 t3 " per 3-token chunk and usage=7: apportioning by text length recovers 1, 3, 3.
    assert acc["acceptance_length"] == pytest.approx(3.0)
    lines = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert {r["token_count_source"] for r in lines} == {"usage_apportioned"}
    assert "(est.)" in result.stdout
    assert "estimate from tokens per streamed chunk" in (out / "report.md").read_text()


@pytest.mark.parametrize("threshold, code", [(1.1, 0), (50.0, 1)])
def test_fail_below_speedup_gates_the_exit_code(cli, standin, tmp_path, threshold, code):
    out = tmp_path / "bench"
    result = cli("bench", "--url", standin.url, "--out", out, *FAST, "--set", "bench.concurrency=[1]",
                 "--set", f"bench.fail_below_speedup={threshold}")
    assert result.code == code, result.stderr
    gate = json.loads((out / "report.json").read_text())["gate"]
    assert gate["passed"] is (code == 0)
    assert gate["lowest_level"] == 1
    if code:
        assert "speedup gate failed" in result.stderr and "50.0" in result.stderr


def test_gate_without_baseline_is_an_input_error(cli, standin, tmp_path):
    result = cli("bench", "--url", standin.url, "--out", tmp_path / "b", *FAST,
                 "--set", "bench.compare_baseline=false", "--set", "bench.fail_below_speedup=1.2")
    assert result.code == 2
    assert "compare_baseline" in result.stderr


def test_failed_requests_exit_4_but_keep_the_report(cli, standin, tmp_path):
    standin.script.fail_model = "m-baseline"
    out = tmp_path / "bench"
    result = cli("bench", "--url", standin.url, "--out", out, *FAST, "--set", "bench.warmup_requests=0",
                 "--set", "bench.concurrency=[1]", "--set", "bench.repeats=1")
    assert result.code == 4, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["failed_requests"] == 4
    assert report["levels"][0]["baseline"]["failed"] == 4


def test_no_recipe_and_no_url_is_an_input_error(cli):
    result = cli("bench")
    assert result.code == 2 and "--url" in result.stderr


def test_synthetic_mode_sends_fixed_lengths(cli, standin, tmp_path):
    out = tmp_path / "bench"
    result = cli("bench", "--url", standin.url, "--out", out, *FAST, "--set", "bench.prompts=synthetic",
                 "--set", "bench.synthetic.input_tokens=12", "--set", "bench.synthetic.output_tokens=5",
                 "--set", "bench.concurrency=[2]", "--set", "bench.repeats=1")
    assert result.code == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["workload"]["prompts"] == "synthetic" and report["workload"]["api"] == "completions"
    lines = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    assert {r["output_tokens"] for r in lines} == {5}
