"""`specconvert plan` on the shipped GPU recipes, pointed at config-only copies of the real targets.

No weights anywhere: the folders hold the public config.json facts (tests/helpers/real_configs.py).
Assertions are on placements, needs and refusals, never on timings.
"""

from __future__ import annotations

import pytest

from specconvert.models import size
from specconvert.stages import plan as plan_mod

from ..conftest import REPO
from ..helpers.real_configs import LLAMA_3_1_8B_INSTRUCT, LLAMA_3_3_70B_INSTRUCT, write_config_only

R70 = REPO / "recipes/llama3.3-70b/instruct_eagle3-nvidia_fp8_tp4.yaml"
R8 = REPO / "recipes/llama3.1-8b/instruct_eagle3-public_bf16_1gpu.yaml"
R8_TRAIN = REPO / "recipes/llama3.1-8b/instruct_eagle3-train_bf16_8gpu.yaml"


@pytest.fixture
def seventy(tmp_path):
    return write_config_only(tmp_path, LLAMA_3_3_70B_INSTRUCT, "llama-3.3-70b")


@pytest.fixture
def eight(tmp_path):
    return write_config_only(tmp_path, LLAMA_3_1_8B_INSTRUCT, "llama-3.1-8b")


def _stage(doc, prefix):
    found = [s for s in doc["stages"] if s["stage"].startswith(prefix)]
    assert len(found) == 1, [s["stage"] for s in doc["stages"]]
    return found[0]


def test_real_configs_count_the_published_parameters():
    assert round(size.parameter_count(LLAMA_3_1_8B_INSTRUCT) / 1e9, 2) == 8.03
    assert round(size.parameter_count(LLAMA_3_3_70B_INSTRUCT) / 1e9, 2) == 70.55
    groups = size.parameter_groups(LLAMA_3_3_70B_INSTRUCT)
    assert sum(groups.values()) == size.parameter_count(LLAMA_3_3_70B_INSTRUCT)
    # FP8 halves the linear layers only: embeddings and lm_head stay bf16
    assert size.weight_bytes(LLAMA_3_3_70B_INSTRUCT, "bfloat16", "fp8") == groups["linear"] + 2 * (
        groups["embeddings"] + groups["lm_head"] + groups["norms"])


def test_70b_fp8_refuses_one_80gib_gpu_naming_calibration_and_every_other_stage(cli, seventy, tmp_path):
    result = cli("plan", R70, "--set", f"target.model={seventy}", "--set", f"draft.model={tmp_path / 'absent-head'}",
                 "--gpus", "1", "--gpu-memory-gib", "80", "--json")
    assert result.code == 2
    doc = result.json()
    assert doc["kind"] == "plan" and doc["schema_version"] == 1 and doc["plan_version"] == 1 and doc["ok"] is False
    calib = _stage(doc, "calibration")
    assert calib["fits"] is False and calib["gpus_used"] == 1
    assert calib["per_gpu_gib"] > 130 and calib["room_gib"] == 80.0
    assert "at least 2 of 80 GiB" in calib["fix"]
    refused = {s["stage"] for s in doc["stages"] if s["runs"] and not s["fits"]}
    assert refused == {"calibration (quantize)", "served bundle (trtllm)", "tune servers (3 x trtllm)",
                       "serve-test servers (2 x trtllm)", "bench servers (2 x trtllm)"}
    assert len(doc["problems"]) == 5
    first, *rest = result.stderr.strip().splitlines()
    assert first.startswith("error: 5 stage(s) do not fit: calibration (quantize): needs 133.")
    assert len(rest) == 4 and all(line.startswith("  - ") for line in rest)
    # the head could not be read: estimated from the target's shape, and the plan says so
    assert doc["draft"]["estimated"] is True and "estimated from the target's shape" in doc["draft"]["source"]
    assert calib["estimated"] == ["draft head"]


def test_70b_fp8_fits_four_80gib_gpus_with_calibration_spread(cli, seventy, tmp_path):
    result = cli("plan", R70, "--set", f"target.model={seventy}", "--set", f"draft.model={tmp_path / 'absent-head'}",
                 "--gpus", "4", "--gpu-memory-gib", "80", "--json")
    assert result.code == 0, result.stderr
    doc = result.json()
    assert doc["ok"] is True and doc["problems"] == []
    calib = _stage(doc, "calibration")
    weights = size.weight_bytes(LLAMA_3_3_70B_INSTRUCT, "bfloat16")
    act = size.forward_activation_bytes(LLAMA_3_3_70B_INSTRUCT, 1024, 2)
    # the plan's per-GPU figure is the placement convert uses: weights / GPUs + activations + context
    assert calib["gpus_used"] == 4
    assert calib["per_gpu_gib"] == size.gib(weights / 4 + act + size.CUDA_CONTEXT_GIB * size.GIB)
    bundle = _stage(doc, "served bundle")
    assert bundle["gpus_used"] == 4 and bundle["fits"] is True
    assert "8192 x 32 tokens at 1 byte(s)" in bundle["detail"]  # FP8 KV cache at max_seq_len x max_batch_size
    assert _stage(doc, "oracle")["runs"] is False


def test_70b_plan_reads_the_head_config_when_it_is_there(cli, seventy, tmp_path):
    head = write_config_only(tmp_path, {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": 8192,
                                        "num_hidden_layers": 1, "num_attention_heads": 64, "num_key_value_heads": 8,
                                        "intermediate_size": 28672, "vocab_size": 128256, "draft_vocab_size": 32000,
                                        "torch_dtype": "bfloat16"}, "head")
    doc = cli("plan", R70, "--set", f"target.model={seventy}", "--set", f"draft.model={head}",
              "--gpus", "4", "--gpu-memory-gib", "80", "--json").json()
    assert doc["draft"]["estimated"] is False and doc["draft"]["source"].startswith("read from")
    assert doc["draft"]["parameters"] == size.eagle3_head_parameters(LLAMA_3_3_70B_INSTRUCT, 32000)


def test_8b_public_head_fits_one_h100(cli, eight, tmp_path):
    result = cli("plan", R8, "--set", f"target.model={eight}", "--set", f"draft.model={tmp_path / 'no-head'}",
                 "--gpus", "1", "--gpu-memory-gib", "80", "--json")
    assert result.code == 0, result.stderr
    doc = result.json()
    bundle = _stage(doc, "served bundle")
    kv = size.kv_bytes_per_token(LLAMA_3_1_8B_INSTRUCT, 2) * 8192 * 16
    assert kv == 16 * size.GIB  # 128 KiB per token in bf16, 8192 x 16 tokens
    assert bundle["gpus_used"] == 1 and 30 < bundle["per_gpu_gib"] < 40
    assert _stage(doc, "calibration")["runs"] is False
    assert "one after another on 1 GPU" in _stage(doc, "tune servers")["where"]


def test_8b_trained_recipe_plans_each_rank_on_one_h100(cli, eight):
    doc = cli("plan", R8_TRAIN, "--set", f"target.model={eight}", "--gpus", "8", "--gpu-memory-gib", "80",
              "--json").json()
    assert doc["ok"] is True
    train = _stage(doc, "features + training")
    assert train["gpus_used"] == 8 and train["fits"] is True
    assert "(whole, per rank)" in train["detail"]
    # per rank: the whole bf16 target, its forward over 4 x 2048 tokens, the head (draft vocab 32000) and AdamW
    cfg, tokens = LLAMA_3_1_8B_INSTRUCT, 4 * 2048
    expect = size.training_rank_bytes(cfg, size.weight_bytes(cfg, "bfloat16"), tokens,
                                      size.eagle3_head_parameters(cfg, 32000), 2, 32000, 3, 2)
    assert train["per_gpu_gib"] == size.gib(expect + size.CUDA_CONTEXT_GIB * size.GIB)
    synth = _stage(doc, "synthesis")
    assert synth["stage"] == "synthesis (in-process)" and synth["fits"] is True
    assert doc["draft"]["source"] == "built here from the target's shape (draft vocab 32000)"


def test_8b_trained_recipe_on_too_few_gpus_names_training(cli, eight):
    result = cli("plan", R8_TRAIN, "--set", f"target.model={eight}", "--gpus", "4", "--gpu-memory-gib", "80")
    assert result.code == 2
    assert "features + training (per rank)" in result.stderr
    assert "it needs 8 GPUs and 4 are planned for" in result.stderr
    assert "DOES NOT FIT" in result.stdout


def test_a_small_gpu_names_the_kv_cache_fix(cli, eight, tmp_path):
    result = cli("plan", R8, "--set", f"target.model={eight}", "--set", f"draft.model={tmp_path / 'no-head'}",
                 "--gpus", "1", "--gpu-memory-gib", "24", "--json")
    assert result.code == 2
    problems = result.json()["problems"]
    assert any(p.startswith("served bundle (trtllm)") and "smaller KV cache" in p for p in problems)


def test_works_offline_on_a_folder_holding_only_config(cli, eight, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert sorted(p.name for p in eight.iterdir()) == ["config.json"]
    result = cli("plan", R8, "--set", f"target.model={eight}", "--set", f"draft.model={tmp_path / 'no-head'}",
                 "--gpus", "1", "--gpu-memory-gib", "80")
    assert result.code == 0, result.stderr
    assert "plan: llama3.1-8b-instruct-eagle3-bf16 on 1 GPU(s) x 80 GiB" in result.stdout


def test_an_uncached_hub_target_offline_is_one_line_exit_2(cli, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    result = cli("plan", R8, "--set", "target.model=specconvert-tests/not-a-model", "--gpus", "1",
                 "--gpu-memory-gib", "80")
    assert result.code == 2
    assert result.stderr.startswith("error: target.model: cannot read config.json of hub id 'specconvert-tests/not-a-model'")
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_no_gpu_here_and_no_flags_says_so(cli, eight, monkeypatch):
    monkeypatch.setattr(plan_mod, "detect_hardware", lambda: None)
    result = cli("plan", R8, "--set", f"target.model={eight}")
    assert result.code == 2
    assert "no GPU is visible on this machine" in result.stderr and "--gpus 4 --gpu-memory-gib 80" in result.stderr
    assert result.stdout == ""


def test_defaults_to_this_machines_gpus(cli, eight, tmp_path, monkeypatch):
    smi = "81559\n81559\n81559\n81559\n"  # nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits (MiB)
    monkeypatch.setattr(plan_mod, "detect_hardware", lambda: plan_mod.hardware_from_nvidia_smi(smi))
    doc = cli("plan", R8, "--set", f"target.model={eight}", "--set", f"draft.model={tmp_path / 'no-head'}",
              "--json").json()
    assert doc["hardware"]["gpus"] == 4 and doc["hardware"]["gpu_gib"] == 79.65
    assert doc["hardware"]["source"] == "nvidia-smi (this machine)"


@pytest.mark.parametrize("args, first", [
    (["--gpus", "-1", "--gpu-memory-gib", "80"], "error: --gpus -1: a count of GPUs is 0 or more"),
    (["--gpus", "1", "--gpu-memory-gib", "0"], "error: --gpu-memory-gib 0.0: memory per GPU is a positive number"),
], ids=["negative-gpus", "zero-memory"])
def test_bad_flags_exit_2(cli, eight, args, first):
    result = cli("plan", R8, "--set", f"target.model={eight}", *args)
    assert result.code == 2 and result.stderr.splitlines()[0].startswith(first)


def test_plan_loads_no_weights_and_imports_no_model_library(eight, tmp_path):
    import subprocess
    import sys

    code = ("import sys; from specconvert.cli import main\n"
            f"try:\n    main(['plan', {str(R8)!r}, '--set', 'target.model={eight}', '--set', "
            f"'draft.model={tmp_path / 'x'}', '--gpus', '1', '--gpu-memory-gib', '80', '--json'])\n"
            "except SystemExit as e:\n    print('code', e.code, file=sys.stderr)\n"
            "print([m for m in ('torch', 'transformers', 'modelopt') if m in sys.modules], file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.stderr.strip().splitlines()[-2:] == ["code 0", "[]"]


def test_gpus_0_plans_a_cpu_recipe_against_host_ram_and_refuses_trtllm(cli, eight, tmp_path):
    result = cli("plan", R8, "--set", f"target.model={eight}", "--set", f"draft.model={tmp_path / 'no-head'}",
                 "--set", "runtime.device=auto", "--gpus", "0", "--json")
    assert result.code == 2
    doc = result.json()
    assert doc["device"] == "cpu"
    bundle = _stage(doc, "served bundle")
    assert bundle["fits"] is False and "it runs on CUDA" in bundle["fix"]  # TensorRT-LLM serves on GPUs only
    ref = cli("plan", R8, "--set", f"target.model={eight}", "--set", f"draft.model={tmp_path / 'no-head'}",
              "--set", "runtime.device=auto", "--set", "runtime.backend=reference", "--gpus", "0", "--json").json()
    served = _stage(ref, "served bundle")
    assert served["gpus_used"] == 0 and served["where"] == "CPU" and served["host_gib"] > 15
