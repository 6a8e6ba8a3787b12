"""bench on vLLM on a simulated GPU box (issue 34, item 2): each arm's server on GPUs of its own when there are
enough, one after another on a single GPU, and the argv of each server asserted. Servers are the vLLM TEST DOUBLE
(tests/serving/fake_vllm.py), GPUs a fake nvidia-smi (tests/helpers/fake_cuda.py)."""

from __future__ import annotations

import json

from specconvert.recipe import load_recipe
from tests.bench.test_bench_arms import QUICK, tuned_bundle  # noqa: F401  (fixture)
from tests.helpers.fake_cuda import fake_cuda  # noqa: F401  (fixture)
from tests.serving.conftest import assert_reaped, fake_vllm  # noqa: F401  (fixture)

GPU_BENCH = ["--set", "runtime.backend=vllm", "--set", "runtime.device=cuda", "--set", "bench.repeats=1",
             "--set", "bench.concurrency=[1]", "--set", "bench.fixed_draft_lens=[2]", *QUICK]


def _starts(log) -> list[dict]:
    return [json.loads(line) for line in log.read_text().splitlines()]


def _name(start: dict) -> str:
    return start["argv"][start["argv"].index("--served-model-name") + 1]


def test_four_gpus_give_every_arm_its_own(cli, tuned_bundle, fake_vllm, fake_cuda, tmp_path):  # noqa: F811
    root, path = tuned_bundle
    exe, log = fake_vllm
    fake_cuda(4)
    out = tmp_path / "bench"
    result = cli("bench", path, "--set", f"runtime.vllm_python={exe}", *GPU_BENCH, "--out", out)
    assert result.code == 0, result.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["placement"]["mode"] == "together" and report["servers_together"]["together"] is True
    devices = {_name(s): s["env"]["CUDA_VISIBLE_DEVICES"] for s in _starts(log)}
    assert devices == {"tiny-arms-baseline": "0", "tiny-arms-k2": "1", "tiny-arms": "2"}
    assert report["schedule"][:3] == ["baseline-c1-r0", "fixed-k2-c1-r0", "speculative-c1-r0"]  # interleaved
    assert_reaped([s["pid"] for s in report["servers"]])


def test_one_gpu_runs_the_arms_one_after_another(cli, tuned_bundle, fake_vllm, fake_cuda, tmp_path):  # noqa: F811
    root, path = tuned_bundle
    exe, log = fake_vllm
    fake_cuda(1)
    out = tmp_path / "bench"
    result = cli("bench", path, "--set", f"runtime.vllm_python={exe}", *GPU_BENCH, "--out", out)
    assert result.code == 0, result.stderr[-2000:]
    assert "one after the other" in result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["placement"]["mode"] == "sequential" and report["order"].startswith("sequential")
    assert "1 group(s) of 1 GPU(s)" in report["placement"]["why"]
    starts = _starts(log)
    assert [_name(s) for s in starts] == ["tiny-arms-baseline", "tiny-arms-k2", "tiny-arms"]
    target = json.loads((root / "work" / "engine" / "manifest.json").read_text())["artifacts"]["target_dir"]
    context = str(load_recipe(path).build.max_seq_len)
    for start in starts:
        argv = start["argv"]
        assert start["env"]["CUDA_VISIBLE_DEVICES"] == "0"
        assert not any(k.startswith("VLLM_CPU_") for k in start["env"])
        # every server's argv: the CUDA values, no eager mode, no memory fraction (vLLM's own)
        assert argv[:14] == ["--model", target, "--served-model-name", _name(start), "--dtype", "auto",
                             "--max-model-len", context, "--max-num-seqs", "8", "--tensor-parallel-size", "1",
                             "--seed", "0"]
        assert "--enforce-eager" not in argv and "--gpu-memory-utilization" not in argv
    specs = {_name(s): s["argv"][s["argv"].index("--speculative-config") + 1] if "--speculative-config" in s["argv"]
             else None for s in starts}
    assert specs["tiny-arms-baseline"] is None and json.loads(specs["tiny-arms-k2"])["num_speculative_tokens"] == 2
    assert "servers placed on GPUs: sequential" in (out / "report.md").read_text()
    assert_reaped([s["pid"] for s in report["servers"]])
