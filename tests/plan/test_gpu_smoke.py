"""benchmarks/gpu_smoke.py, tested for what runs without a GPU: a clean refusal (exit 3), its shapes and
estimates are `specconvert plan`'s, and (slow) the same steps on a toy model on the CPU."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from specconvert.models import size
from specconvert.recipe import load_recipe
from specconvert.stages import plan as plan_mod

from ..conftest import REPO
from ..helpers.real_configs import write_config_only


@pytest.fixture(scope="module")
def smoke():
    spec = importlib.util.spec_from_file_location("gpu_smoke", REPO / "benchmarks/gpu_smoke.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_smoke"] = module
    spec.loader.exec_module(module)
    return module


def test_without_cuda_it_exits_3_with_one_line(smoke, monkeypatch, capsys):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as info:
        smoke.main([])
    assert info.value.code == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert err.splitlines() == ["gpu_smoke: no CUDA device is visible (torch.cuda.is_available() is False): run it on "
                                "a machine with an NVIDIA GPU and a CUDA build of torch"]


def test_the_full_model_refuses_the_cpu(smoke, capsys):
    with pytest.raises(SystemExit) as info:
        smoke.main(["--device", "cpu"])
    assert info.value.code == 3 and "runs only with --tiny" in capsys.readouterr().err


def test_the_target_is_a_1b_llama(smoke):
    config = smoke.smoke_config(smoke.FULL)
    assert 1.0e9 < size.parameter_count(config) < 1.2e9
    assert (config["hidden_size"], config["num_hidden_layers"], config["num_attention_heads"],
            config["num_key_value_heads"], config["intermediate_size"], config["vocab_size"]) == (2048, 16, 32, 8, 8192, 32000)


def test_its_estimates_are_what_plan_computes_for_the_same_shapes(smoke, tmp_path):
    """The smoke script's figures are plan's own rows for a recipe with its shapes (less the CUDA context)."""
    s = smoke.Settings()
    config = smoke.smoke_config(smoke.FULL)
    folder = write_config_only(tmp_path, config, "smoke-1b")
    recipe = load_recipe(REPO / "recipes/llama3.1-8b/instruct_eagle3-train_bf16_8gpu.yaml", [
        f"target.model={folder}", "draft.train.num_processes=1", f"draft.train.batch_size={s.batch}",
        f"draft.train.seq_len={s.seq_len}", f"draft.train.draft_vocab_size={s.draft_vocab}",
        f"draft.train.ttt_steps={s.ttt_steps}", "quantize.format=fp8", f"quantize.calib_seq_len={s.seq_len}"])
    hw = plan_mod.Hardware(1, 80.0, "test")
    models = plan_mod.read_models(recipe)
    rows = {r.stage: r for r in plan_mod.training(recipe, models, hw, "cuda")}
    rows["calibration"] = plan_mod.calibration(recipe, models, hw, "cuda")
    est = smoke.estimates(config, s)
    context = size.CUDA_CONTEXT_GIB * size.GIB
    assert rows["features + training (per rank)"].per_gpu_gib == size.gib(est["attach + train"] + context)
    assert rows["calibration"].per_gpu_gib == size.gib(est["fp8 calibration"] + context)
    assert est["build target"] == size.weight_bytes(config, "bfloat16")


@pytest.mark.slow
def test_the_same_steps_run_on_a_toy_model_on_cpu(smoke):
    """Every step the GPU run takes (attach, train, FP8 fake-quant, lossless check), on hidden 64."""
    report = smoke.run(smoke.TINY, smoke.Settings.tiny(), "cpu", json_out=True)
    assert [r["step"] for r in report["steps"]] == list(smoke.estimates(smoke.smoke_config(smoke.TINY), smoke.Settings.tiny()))
    assert all(r["status"] == "ok" for r in report["steps"]), report["steps"]
    assert report["lossless"]["identical"] is True
    assert len(report["train_losses"]) == 2
