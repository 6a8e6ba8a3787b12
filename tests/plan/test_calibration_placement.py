"""Calibration of a target bigger than one GPU: convert spreads it over the visible GPUs (issue 34, item 5).

A fake CUDA (4 x 80 GiB, torch.cuda.device_count / mem_get_info) and a fake from_pretrained that
records what it was asked: no weights exist, only the 70B config.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from specconvert.models import size
from specconvert.models.sources import ResolvedModel
from specconvert.recipe import load_recipe
from specconvert.stages import convert

from ..conftest import REPO
from ..helpers.real_configs import LLAMA_3_1_8B_INSTRUCT, LLAMA_3_3_70B_INSTRUCT, write_config_only

GIB = 1024 ** 3
R70 = REPO / "recipes/llama3.3-70b/instruct_eagle3-nvidia_fp8_tp4.yaml"


class _Stop(Exception):
    pass


class _FakeModel:
    def __init__(self):
        self.config = SimpleNamespace(architectures=["LlamaForCausalLM"])
        self.moved_to = None

    def to(self, device):
        self.moved_to = device
        return self

    def eval(self):
        return self


@pytest.fixture
def fake_cuda(monkeypatch):
    """4 GPUs of 80 GiB, 79 GiB free each."""
    import torch

    def use(count=4, free_gib=79.0, total_gib=80.0):
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i=0: (int(free_gib * GIB), int(total_gib * GIB)))
    return use


@pytest.fixture
def loads(monkeypatch):
    """Record every from_pretrained call; stop before calibration."""
    import transformers

    from specconvert.backends.modelopt import quantize as mq

    calls = []

    def fake_model(path, **kwargs):
        calls.append(kwargs)
        calls[-1]["model"] = _FakeModel()
        return calls[-1]["model"]

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", fake_model)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: object())
    monkeypatch.setattr(mq, "calibrate", lambda *a, **k: (_ for _ in ()).throw(_Stop()))
    return calls


def _plan_for(config, folder, dtype="bfloat16"):
    return convert.ConvertPlan(target=ResolvedModel(str(folder), "local", folder), target_config=config,
                               target_info=None, dtype=dtype, head=None, head_source=None, aux_layer_ids=[1],
                               aux_note="")


def _recipe(folder, tmp_path):
    return load_recipe(R70, [f"target.model={folder}", f"draft.model={tmp_path}", "runtime.device=cuda",
                             f"workdir={tmp_path / 'run'}"])


def test_70b_calibration_loads_over_four_gpus_with_max_memory(tmp_path, fake_cuda, loads):
    fake_cuda(4)
    folder = write_config_only(tmp_path, LLAMA_3_3_70B_INSTRUCT, "70b")
    with pytest.raises(_Stop):
        convert._quantize_target(_recipe(folder, tmp_path), _plan_for(LLAMA_3_3_70B_INSTRUCT, folder), tmp_path / "out", {})
    (call,) = loads
    assert call["device_map"] == "auto"
    assert sorted(call["max_memory"]) == [0, 1, 2, 3]
    act = size.forward_activation_bytes(LLAMA_3_3_70B_INSTRUCT, 1024, 2)
    # each GPU's free memory less what the forward needs beside the weights
    assert call["max_memory"][0] == int(79 * GIB - act - size.CUDA_CONTEXT_GIB * GIB)
    assert call["model"].moved_to is None  # never `.to("cuda")`: the whole bf16 70B is 131 GiB


def test_a_target_that_fits_one_gpu_is_moved_there_whole(tmp_path, fake_cuda, loads):
    fake_cuda(4)
    folder = write_config_only(tmp_path, LLAMA_3_1_8B_INSTRUCT, "8b")
    with pytest.raises(_Stop):
        convert._quantize_target(_recipe(folder, tmp_path), _plan_for(LLAMA_3_1_8B_INSTRUCT, folder), tmp_path / "out", {})
    (call,) = loads
    assert "device_map" not in call and call["model"].moved_to == "cuda"


def test_too_few_gpus_stop_before_loading_with_the_count_needed(tmp_path, fake_cuda, loads):
    from specconvert.errors import EnvironmentMissing

    fake_cuda(1)
    folder = write_config_only(tmp_path, LLAMA_3_3_70B_INSTRUCT, "70b")
    with pytest.raises(EnvironmentMissing) as info:
        convert._quantize_target(_recipe(folder, tmp_path), _plan_for(LLAMA_3_3_70B_INSTRUCT, folder), tmp_path / "out", {})
    assert "the smallest has 79.0 GiB free" in info.value.message
    assert "where 2 such GPUs are visible" in info.value.fix
    assert loads == []


def test_plan_and_convert_agree_on_the_placement(tmp_path, fake_cuda):
    """The plan's calibration row is the placement convert computes from the same free memory."""
    from specconvert.stages import plan as plan_mod

    folder = write_config_only(tmp_path, LLAMA_3_3_70B_INSTRUCT, "70b")
    recipe = _recipe(folder, tmp_path)
    hw = plan_mod.Hardware(4, 80.0, "test")
    row = plan_mod.calibration(recipe, plan_mod.read_models(recipe), hw, "cuda")
    weights = size.weight_bytes(LLAMA_3_3_70B_INSTRUCT, "bfloat16")
    act = size.forward_activation_bytes(LLAMA_3_3_70B_INSTRUCT, 1024, 2)
    gpus, per_gpu = size.calibration_placement(weights, act, [80 * GIB] * 4)
    assert (row.gpus_used, row.per_gpu_gib) == (gpus, size.gib(per_gpu)) == (4, size.gib(weights / 4 + act + GIB))
    # and the device map's budget on an 80 GiB GPU holds that GPU's quarter of the weights
    assert size.calibration_max_memory(act, [80 * GIB] * 4)[0] > weights / 4
