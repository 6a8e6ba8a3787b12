"""`specconvert tune` on vLLM on a simulated GPU box (issue 34, item 2): each candidate's server gets GPUs of its own
(``CUDA_VISIBLE_DEVICES``), as many at once as there are GPU groups, and the CUDA launch values; the report says
which placement ran and why. Servers are the vLLM TEST DOUBLE (tests/serving/fake_vllm.py), GPUs a fake nvidia-smi
(tests/helpers/fake_cuda.py)."""

from __future__ import annotations

import json

import pytest

from tests.helpers.fake_cuda import fake_cuda  # noqa: F401  (fixture)
from tests.serving.conftest import _cli, fake_vllm  # noqa: F401  (fixture)
from tests.tuning.test_tune_stage import tiny_recipe  # noqa: F401  (fixture)


def _starts(log) -> dict[str, dict]:
    """Each server's start, by served model name: argv and the CUDA_/VLLM_ environment it got."""
    return {s["argv"][s["argv"].index("--served-model-name") + 1]: s
            for s in map(json.loads, log.read_text().splitlines())}


@pytest.mark.parametrize("gpus, tp, waves, mode", [
    (4, 1, [["tiny-tune-k1", "tiny-tune-k2", "tiny-tune-k0-drafter", "tiny-tune-k0"]], "together"),
    (4, 2, [["tiny-tune-k1", "tiny-tune-k2"], ["tiny-tune-k0-drafter", "tiny-tune-k0"]], "in waves of 2"),
    (1, 1, [["tiny-tune-k1"], ["tiny-tune-k2"], ["tiny-tune-k0-drafter"], ["tiny-tune-k0"]], "sequential"),
])
def test_tune_places_one_server_per_gpu_group(tiny_recipe, fake_vllm, fake_cuda, capsys, gpus, tp, waves, mode):  # noqa: F811
    root, path = tiny_recipe
    exe, log = fake_vllm
    fake_cuda(gpus)
    assert _cli("tune", path, "--force", "--set", "runtime.backend=vllm", "--set", "runtime.device=cuda",
                "--set", f"runtime.vllm_python={exe}", "--set", f"build.tensor_parallel_size={tp}",
                "--set", "tune.max_tokens=6", "--json") == 0, capsys.readouterr().err[-2000:]
    report = json.loads((root / "work" / "tune" / "report.json").read_text())
    starts = _starts(log)
    assert sorted(starts) == sorted(name for wave in waves for name in wave)
    # the CUDA launch values: the target's dtype, CUDA graphs on, vLLM's own memory fraction, no CPU env
    for start in starts.values():
        argv = start["argv"]
        assert argv[argv.index("--dtype") + 1] == "auto" and "--enforce-eager" not in argv
        assert "--gpu-memory-utilization" not in argv and argv[argv.index("--tensor-parallel-size") + 1] == str(tp)
        assert not any(k.startswith("VLLM_CPU_") for k in start["env"])
    groups = [",".join(str(g) for g in range(i * tp, (i + 1) * tp)) for i in range(gpus // tp)]
    for wave in waves:  # within a wave every server has GPUs of its own, the groups in order
        assert [starts[name]["env"]["CUDA_VISIBLE_DEVICES"] for name in wave] == groups[:len(wave)]
    placed = report["placement"]
    assert placed["device"] == "cuda" and placed["mode"] == mode and placed["gpus"]["count"] == gpus
    assert [s["wave"] for s in placed["servers"]] == [i for i, wave in enumerate(waves) for _ in wave]
    assert ("interleaved" in report["runtime_note"]) is (mode == "together")
    assert len(report["servers"]) == len(starts)
