"""serve-test and bench on `runtime.backend: vllm` through a vLLM TEST DOUBLE (tests/serving/fake_vllm.py):
the launch lines, sequential servers, counter deltas, the oracle's verdict and the reaping, in seconds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from .conftest import assert_reaped


def starts(log):
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def test_serve_test_on_vllm_reads_the_counters_and_the_oracle_disagrees(project, cli, fake_vllm):
    exe, log = fake_vllm
    result = cli("serve-test", project.recipe_path, "--set", "runtime.backend=vllm",
                 "--set", f"runtime.vllm_python={exe}", "--set", "runtime.vllm_threads=1", "--json")
    report = result.json()
    # speculative, then baseline: one at a time, same settings but the speculative config
    (spec, base) = starts(log)
    assert json.loads(spec["argv"][spec["argv"].index("--speculative-config") + 1])["method"] == "eagle3"
    assert "--speculative-config" not in base["argv"]
    assert spec["env"]["VLLM_CPU_OMP_THREADS_BIND"] == "nobind" and spec["env"]["OMP_NUM_THREADS"] == "1"
    assert_reaped([s["pid"] for s in report["servers"]])
    counters = report["engine_acceptance"]["counters"]
    assert counters["source"] == "measured: vllm counters" and counters["acceptance_length"] == pytest.approx(3.0)
    assert counters["per_position_acceptance"] == [1.0, 1.0, 0.0]
    # streamed: 1 + 3 + 3 + 3 tokens in 4 chunks -> (10 - 1) / 3 = 3: the estimate is exact here
    assert report["engine_acceptance"]["stream_estimate"]["error"] == 0.0
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["lossless (greedy): exact match >= 1"]["passed"]
    # The tiny random head accepts ~nothing on the reference decoder; the double claims tau 3: the oracle fails it,
    # and an engine accepting *more* than the reference points at the prompts/template first.
    oracle = report["oracle"]
    assert result.code == 1 and not oracle["passed"] and oracle["causes"][0] == "template"
    assert not checks["oracle: engine acceptance agrees with the reference decoder"]["passed"]


def test_bench_on_vllm_runs_one_server_at_a_time_and_measures_tau_from_counters(project, cli, fake_vllm, tmp_path):
    exe, log = fake_vllm
    result = cli("bench", project.recipe_path, "--set", "runtime.backend=vllm", "--set", f"runtime.vllm_python={exe}",
                 "--set", "runtime.vllm_servers=sequential",
                 "--set", "bench.prompts=synthetic", "--set", "bench.num_requests=2", "--set", "bench.max_tokens=10",
                 "--set", "bench.concurrency=[1,2]", "--set", "bench.repeats=1", "--set", "bench.warmup_requests=0",
                 "--set", "bench.plots=false", "--json")
    assert result.code == 0, result.stderr[-2000:]
    report = result.json()["report"]
    assert report["order"].startswith("sequential")
    assert [s["label"] for s in report["servers"]] == ["baseline", "speculative"]
    assert [("--speculative-config" in s["argv"]) for s in starts(log)] == [False, True]
    acc = report["acceptance"]
    assert acc["measured_by"] == "measured: vllm counters"
    # the counters and the chunk estimate see the same steps here, short last steps included
    assert acc["acceptance_length"] == pytest.approx(acc["chunk_estimate"], abs=1e-3)
    assert_reaped([s["pid"] for s in report["servers"]])


def test_bench_on_vllm_together_interleaves(project, cli, fake_vllm):
    exe, log = fake_vllm
    result = cli("bench", project.recipe_path, "--set", "runtime.backend=vllm", "--set", f"runtime.vllm_python={exe}",
                 "--set", "runtime.vllm_servers=together", "--set", "bench.prompts=synthetic",
                 "--set", "bench.num_requests=2", "--set", "bench.max_tokens=10", "--set", "bench.concurrency=[1]",
                 "--set", "bench.repeats=2", "--set", "bench.warmup_requests=0", "--set", "bench.plots=false", "--json")
    assert result.code == 0, result.stderr[-2000:]
    report = result.json()["report"]
    assert report["order"].startswith("interleaved")
    assert report["schedule"] == ["baseline-c1-r0", "speculative-c1-r0", "speculative-c1-r1", "baseline-c1-r1"]
    assert {s["label"] for s in report["servers"]} == {"speculative", "baseline"}
    assert report["endpoints"]["baseline"]["model"] == "tiny-serve-baseline"
    assert_reaped([s["pid"] for s in report["servers"]])


def test_serve_test_on_vllm_passes_when_the_engine_accepts_what_the_reference_accepts(project, cli, fake_vllm,
                                                                                       monkeypatch):
    """The oracle's passing side through the double (issue 20, item 10): the tiny random head accepts nothing on the
    reference decoder, and a double that accepts nothing (tau 1, every position 0) agrees with it."""
    exe, log = fake_vllm
    monkeypatch.setenv("FAKE_VLLM_ACCEPT", "0")
    result = cli("serve-test", project.recipe_path, "--set", "runtime.backend=vllm",
                 "--set", f"runtime.vllm_python={exe}", "--set", "runtime.vllm_threads=1", "--json")
    report = result.json()
    oracle = report["oracle"]
    assert oracle["reference"]["acceptance_length"] == pytest.approx(1.0)
    assert oracle["engine"]["acceptance_length"] == pytest.approx(1.0)
    assert oracle["passed"] and oracle["status"] == "agrees" and oracle["found"] == [], oracle["message"]
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["oracle: engine acceptance agrees with the reference decoder"]["passed"]
    assert_reaped([s["pid"] for s in report["servers"]])


def test_an_overlay_one_layer_off_fails_the_oracle_even_when_build_recorded_it(project, cli, fake_vllm, monkeypatch):
    """Issue 20, item 11, end to end: the overlay holds the head's output-numbered ids (build's +1 forgotten) and the
    manifest records the same list, so the files are intact; the convention check still fails the oracle."""
    exe, _ = fake_vllm
    monkeypatch.setenv("FAKE_VLLM_ACCEPT", "0")  # acceptance agrees with the reference: only the files can tell
    engine = project.root / "work" / "engine"
    manifest = json.loads((engine / "manifest.json").read_text())
    draft = engine / "vllm" / "draft"
    config = json.loads((draft / "config.json").read_text())
    trained = json.loads((Path(manifest["artifacts"]["draft_dir"]) / "config.json").read_text())[
        "eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    config["eagle_aux_hidden_state_layer_ids"] = config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = trained
    (draft / "config.json").write_text(json.dumps(config))
    manifest["artifacts"]["vllm_draft"] = str(draft)
    manifest["decisions"]["vllm_aux_layer_ids"] = trained
    (engine / "manifest.json").write_text(json.dumps(manifest))
    result = cli("serve-test", project.recipe_path, "--set", "runtime.backend=vllm",
                 "--set", f"runtime.vllm_python={exe}", "--set", "runtime.vllm_threads=1",
                 "--set", "serve_test.lossless.mode=off", "--json")
    oracle = result.json()["oracle"]
    assert result.code == 1 and not oracle["passed"] and oracle["caught_by"] == ["engine files"]
    assert [f["check"] for f in oracle["found"]] == ["convention"] and oracle["causes"][0] == "aux_layers"
