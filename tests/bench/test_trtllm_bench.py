"""`bench --trtllm-bench` with a TEST DOUBLE of trtllm-bench (tests/bench/test_doubles/trtllm-bench)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from specconvert.backends import launch

from .conftest import FAST

DOUBLES = Path(__file__).parent / "test_doubles"


def trtllm_recipe(tmp_path: Path, backend: str = "trtllm") -> Path:
    """A recipe whose workdir holds a minimal built bundle: manifest, bench.sh, dataset, option files."""
    work = tmp_path / "work"
    trt = work / "engine" / "trtllm"
    trt.mkdir(parents=True)
    (work / "engine" / "manifest.json").write_text(json.dumps({"stage": "build", "fingerprint": "x"}))
    launch.write_executable(trt / "bench.sh", launch.trtllm_bench(str(tmp_path / "target"), "test bundle"))
    (trt / "dataset.jsonl").write_text(launch.bench_dataset())
    (trt / "llm_api_options.yaml").write_text("speculative_config: {decoding_type: Eagle3}\n")
    (trt / "baseline.yaml").write_text("{}\n")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"name: t\nworkdir: {work}\ntarget: {{model: unused}}\ndraft: {{init: random}}\n"
                      f"runtime: {{backend: {backend}}}\n")
    return recipe


def test_missing_trtllm_bench_exits_3_before_measuring(cli, standin, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    recipe = trtllm_recipe(tmp_path)
    result = cli("bench", recipe, "--url", standin.url, "--trtllm-bench", *FAST)
    assert result.code == 3
    assert "trtllm-bench is not on PATH" in result.stderr and "Fix:" in result.stderr
    assert standin.script.seen == []  # nothing was measured
    assert not (tmp_path / "work" / "bench").exists()


def test_trtllm_bench_reports_land_beside_ours(cli, standin, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", f"{DOUBLES}{os.pathsep}{os.environ['PATH']}")
    recipe = trtllm_recipe(tmp_path)
    result = cli("bench", recipe, "--url", standin.url, "--trtllm-bench", *FAST, "--set", "bench.concurrency=[1]",
                 "--set", "bench.repeats=1")
    assert result.code == 0, result.stderr
    out = tmp_path / "work" / "bench"
    report = json.loads((out / "report.json").read_text())
    tb = report["trtllm_bench"]
    assert set(tb["reports"]) == {"baseline", "speculative"}
    for label, options in (("speculative", "llm_api_options.yaml"), ("baseline", "baseline.yaml")):
        path = out / f"trtllm_bench_{label}.json"
        assert tb["reports"][label] == str(path)  # the final directory, not the staging one
        written = json.loads(path.read_text())
        assert written["test_double"] is True and written["mode"] == "latency"
        assert written["options"].endswith(options)
        assert written["dataset_rows"] == len(launch.bench_dataset().splitlines())
        assert tb["summaries"][label] == written


def test_trtllm_bench_needs_the_trtllm_backend(cli, standin, tmp_path):
    recipe = trtllm_recipe(tmp_path, backend="reference")
    result = cli("bench", recipe, "--url", standin.url, "--trtllm-bench", *FAST)
    assert result.code == 2 and "runtime.backend: trtllm" in result.stderr
