"""A bundle meant for GPUs gets GPU launch values, and build writes it on a machine without one (issue 34, item 1).

The shipped 8B recipe is built as a user's CI runner would: no GPU, the target and head pointed at config-only
stand-ins (tests/helpers/real_configs.py: Llama-3.1-8B-Instruct's public config), convert/ written by hand as
the other build tests do. The CPU demo's launch values stay the CPU's.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest
import yaml

from specconvert.backends.trtllm import loader
from specconvert.backends.vllm import launch
from specconvert.recipe import RuntimeSpec, load_recipe
from tests.helpers.fake_cuda import fake_cuda  # noqa: F401  (fixture)
from tests.helpers.real_configs import LLAMA_31_8B_INSTRUCT, write_config_only_model

REPO = Path(__file__).resolve().parents[2]
RECIPE_8B = REPO / "recipes" / "llama3.1-8b" / "instruct_eagle3-public_bf16_1gpu.yaml"
DEMO = REPO / "recipes" / "smollm2-135m-eagle3-cpu.yaml"
AUX = [1, 15, 28]


def _gpu_project(tmp_path: Path, **runtime) -> Path:
    """The shipped 8B recipe with config-only models and a hand-written convert/ (as tests/build/conftest does)."""
    target = write_config_only_model(tmp_path / "models", LLAMA_31_8B_INSTRUCT, "Llama-3.1-8B-Instruct")
    draft = tmp_path / "models" / "head"
    draft.mkdir()
    (draft / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 32000, "hidden_size": 4096,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX, "use_aux_hidden_state": True}}))
    data = yaml.safe_load(RECIPE_8B.read_text())
    data["workdir"] = str(tmp_path / "work")
    data["target"]["model"], data["draft"]["model"] = str(target), str(draft)
    data["runtime"].update(runtime)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    convert = tmp_path / "work" / "convert"
    convert.mkdir(parents=True)
    config = LLAMA_31_8B_INSTRUCT
    (convert / "manifest.json").write_text(json.dumps({
        "manifest_version": 1, "stage": "convert", "fingerprint": "test",
        "artifacts": {"target_dir": str(target), "draft_dir": str(draft)},
        "decisions": {"aux_layer_ids": AUX, "draft_vocab_size": 32000},
        "target": {"num_hidden_layers": config["num_hidden_layers"], "hidden_size": config["hidden_size"],
                   "vocab_size": config["vocab_size"], "max_position_embeddings": config["max_position_embeddings"],
                   "dtype": "bfloat16", "architecture": "LlamaForCausalLM"},
        "draft": {"max_position_embeddings": 8192, "dtype": "bfloat16"},
        "quantization": {"format": "none", "kv_cache_quant_algo": None}}))
    return path


def _serve_argv(script: Path) -> list[str]:
    """The words of serve.sh's command (after its defaults), shell-split."""
    text = script.read_text()
    command = text[text.index("exec "):] if "exec " in text else text
    return shlex.split(command.replace("\\\n", " "), comments=True)


@pytest.fixture
def no_gpu_here(monkeypatch):
    """This machine shows no CUDA device, also where the test runs on a GPU box."""
    monkeypatch.setattr(loader, "cuda_available", lambda: (False, None))


@pytest.mark.parametrize("backend", ["trtllm", "vllm", "reference"])
def test_the_shipped_8b_recipe_builds_a_gpu_bundle_without_a_gpu(cli, tmp_path, no_gpu_here, backend):
    path = _gpu_project(tmp_path, backend=backend)
    result = cli("build", path, "--json")
    # before: vllm/reference stopped with exit 3 "runtime.device is cuda but no CUDA device is visible"
    assert result.code == 0, result.err[-1500:]
    manifest = json.loads((tmp_path / "work" / "engine" / "manifest.json").read_text())
    if backend != "trtllm":
        assert manifest["loaded"] is False and "no CUDA device is visible" in manifest["load_skipped_reason"]
    for script in ("serve.sh", "serve-baseline.sh"):
        text = (tmp_path / "work" / "engine" / "vllm" / script).read_text()
        words = _serve_argv(tmp_path / "work" / "engine" / "vllm" / script)
        assert "float32" not in words and "--enforce-eager" not in words
        assert words[words.index("--dtype") + 1] == "auto"  # the target's own dtype (bf16)
        # vLLM's own memory default (0.92), or at least 0.8
        assert "--gpu-memory-utilization" not in words or float(words[words.index("--gpu-memory-utilization") + 1]) >= 0.8
        assert "VLLM_CPU_KVCACHE_SPACE" not in text and "VLLM_CPU_OMP_THREADS_BIND" not in text
        assert "Written for cuda (runtime.device: cuda)" in text
    values = manifest["decisions"]["vllm_launch"]
    assert values["device"] == "cuda" and values["device_source"] == "runtime.device: cuda"
    assert values["dtype"] == {"value": "auto", "source": "device default (cuda)"}
    assert values["enforce_eager"] == {"value": False, "source": "device default (cuda)"}
    assert values["memory_fraction"] == {"value": None, "source": "engine default"}


def test_what_the_recipe_sets_wins_over_the_device_default(cli, tmp_path, no_gpu_here):
    path = _gpu_project(tmp_path, backend="vllm", vllm_dtype="float16", vllm_memory_fraction=0.85,
                        vllm_enforce_eager=True)
    assert cli("build", path).code == 0
    words = _serve_argv(tmp_path / "work" / "engine" / "vllm" / "serve.sh")
    assert words[words.index("--dtype") + 1] == "float16" and "--enforce-eager" in words
    assert words[words.index("--gpu-memory-utilization") + 1] == "0.85"
    values = json.loads((tmp_path / "work" / "engine" / "manifest.json").read_text())["decisions"]["vllm_launch"]
    assert {k: values[k]["source"] for k in ("dtype", "enforce_eager", "memory_fraction")} == {
        "dtype": "recipe", "enforce_eager": "recipe", "memory_fraction": "recipe"}


def test_the_cpu_demo_launches_vllm_with_the_cpu_values_as_before():
    """The demo recipe (runtime.device: cpu) sets none of the three: float32, eager, 0.3 of RAM, the CPU env."""
    recipe = load_recipe(DEMO)
    values = launch.launch_values(recipe.runtime)
    argv = launch.server_args("T", "D", recipe.build, recipe.runtime, "demo", values=values)
    assert argv == ["--model", "T", "--served-model-name", "demo", "--dtype", "float32", "--max-model-len", "2048",
                    "--max-num-seqs", "8", "--tensor-parallel-size", "1", "--gpu-memory-utilization", "0.3",
                    "--seed", "0", "--enforce-eager", "--speculative-config",
                    '{"method": "eagle3", "model": "D", "num_speculative_tokens": 3}']
    assert launch.server_env(recipe.runtime, values.device) == {"VLLM_CPU_KVCACHE_SPACE": "1",
                                                                 "VLLM_CPU_OMP_THREADS_BIND": "nobind",
                                                                 "OMP_NUM_THREADS": "1"}
    assert {v["source"] for k, v in values.as_dict().items() if isinstance(v, dict)} == {"device default (cpu)"}


@pytest.mark.parametrize("gpus, device", [(0, "cpu"), (2, "cuda")])
def test_auto_follows_the_gpus_this_machine_shows(fake_cuda, gpus, device):  # noqa: F811
    fake_cuda(gpus)
    values = launch.launch_values(RuntimeSpec())  # runtime.device: auto
    assert values.device == device and values.dtype == ("float32" if device == "cpu" else "auto")
    assert values.enforce_eager is (device == "cpu")
    # the CPU build of vLLM runs on the CPU whatever GPUs the machine has
    assert launch.launch_device(RuntimeSpec(), cpu_build=True)[0] == "cpu"
