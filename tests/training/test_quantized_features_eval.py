"""`draft.train.features: quantized`: the head trains on the fake-quantized target's features (issue 19, repair),
and the quantization check measures it on both targets with the training evaluation as the unquantized pass."""

from __future__ import annotations

import pytest

from tests.conftest import write_recipe
from tests.training.test_convert_train import _data
from tests.tiny_models import write_tiny_target


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return write_tiny_target(tmp_path_factory.mktemp("tiny") / "target", logit_scale=30.0, eos_token_id=255)


def recipe(tmp_path, target, features: str, quantize: str = "quantize:\n  format: fp8\n  calib_samples: 2\n  calib_seq_len: 16\n"
           "  eval_prompts: eval.jsonl\n  eval_samples: 2\n  eval_max_new_tokens: 12\n"):
    _data(tmp_path)
    return write_recipe(tmp_path / "recipe.yaml", f"""name: tiny-qf
target:
  model: {target}
  dtype: float32
draft:
  train:
    prompts: train.jsonl
    max_new_tokens: 12
    synthesis_batch_size: 16
    draft_vocab_size: 128
    steps: 4
    batch_size: 4
    seq_len: 32
    checkpoint_every: 4
    eval_prompts: eval.jsonl
    eval_samples: 2
    eval_max_new_tokens: 12
    features: {features}
{quantize}runtime:
  device: cpu
""")


def test_trains_on_quantized_features_and_measures_both_targets(cli, tmp_path, target, monkeypatch):
    from specconvert.backends.modelopt import quantize as mq

    calibrated = []
    real = mq.calibrate

    def spy(model, tokenizer, spec, base_dir, on_batch=None):
        calibrated.append(type(model).__name__)
        return real(model, tokenizer, spec, base_dir, on_batch)

    monkeypatch.setattr(mq, "calibrate", spy)
    result = cli("convert", recipe(tmp_path, target, "quantized"), "--json")
    assert result.code == 0, result.stderr
    manifest = result.json()["manifest"]
    # once for training's features, once for the export: the same function, the same calibration
    assert calibrated == ["LlamaForCausalLM", "LlamaForCausalLM"]
    assert manifest["training"]["features"] == "quantized"
    acceptance = manifest["quantization"]["acceptance"]
    assert acceptance["unquantized_reused_from_training_evaluation"] is True
    assert acceptance["unquantized"] == manifest["training"]["evaluation"]
    assert "quant_check_unquantized_s" not in manifest["timings"] and manifest["timings"]["quant_check_quantized_s"] > 0
    assert set(acceptance["drop"]) == set(manifest["training"]["evaluation"]["shapes"])


def test_quantized_features_without_a_format_is_a_recipe_error(cli, tmp_path, target):
    result = cli("convert", recipe(tmp_path, target, "quantized", quantize=""))
    assert result.code == 2
    assert "draft.train.features: quantized" in result.stderr and "set quantize.format" in result.stderr
    assert not (tmp_path / "runs").exists()
