"""The training loop: it learns, it resumes exactly where it stopped, it keeps to its budget."""

from __future__ import annotations

import contextlib

import pytest

from specconvert.recipe import TrainSpec
from specconvert.training.data import response_sequence, synthesize
from specconvert.training.trainer import FeatureExtractor, Trainer, build_train_model, tau_estimate
from specconvert.training.vocab import calibrate
from tests.tiny_models import byte_tokenizer, write_tiny_target

AUX = [1, 3, 4]


class _Bar:
    """Stands in for a rich Progress (the loop only adds and updates one task)."""

    def add_task(self, *args, **kwargs):
        return 0

    def update(self, *args, **kwargs):
        pass


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM

    path = write_tiny_target(tmp_path_factory.mktemp("target"), logit_scale=30.0, eos_token_id=255)
    target = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    tok = byte_tokenizer()
    prompts = [tok(f"hello {i} world " * 2)["input_ids"] for i in range(40)]
    responses, _ = synthesize(target, prompts, 24, 8, [255], 0, tmp_path_factory.mktemp("cache") / "s.jsonl")
    seqs = [response_sequence(p, r, 64, "synthesized")[0] for p, r in zip(prompts, responses)]
    return target, seqs[:32], seqs[32:]


def _trainer(setup, tmp_path, autocast=None, **spec):
    import torch

    from specconvert.backends.modelopt.eagle import EagleArch

    target, train, held = setup
    spec = TrainSpec(**{"batch_size": 4, "lr": 3e-3, "checkpoint_every": 5, "steps": 20, **spec})
    vocab = calibrate(train, 256, 128, always=[255])
    arch = EagleArch.for_target(target.config, 128, 1)
    model = build_train_model(target, arch, AUX, vocab.used, spec.ttt_steps, torch.float32, torch.device("cpu"), spec.seed)
    features = FeatureExtractor(target, AUX)
    return Trainer(spec, model, features, train, held, torch.device("cpu"), torch.float32, tmp_path / "ckpt.safetensors", "fp",
                   autocast=autocast)


def test_training_lowers_the_loss_and_raises_heldout_accuracy(setup, tmp_path):
    trainer = _trainer(setup, tmp_path, steps=30)
    loss0, acc0 = trainer.evaluate_holdout()
    result = trainer.run(_Bar())
    loss1, acc1 = trainer.evaluate_holdout()
    assert result.steps == 30 and result.stopped_by == "steps"
    assert loss1 < 0.7 * loss0
    assert tau_estimate(acc1) > tau_estimate(acc0) + 0.5
    # the first layer's input_layernorm stays 1 (it is what makes Model Optimizer's math the runtime's)
    import torch

    assert torch.equal(result.tensors["layers.0.input_layernorm.weight"], torch.ones(64))
    assert [h["step"] for h in result.history] == [5, 10, 15, 20, 25, 30]
    assert round(result.best_score, 4) == max(h["heldout_tau_estimate"] for h in result.history)


class _Stop(Exception):
    pass


def test_an_interrupted_run_resumes_to_the_same_head(setup, tmp_path):
    import torch

    straight = _trainer(setup, tmp_path / "a", steps=12).run(_Bar())

    first = _trainer(setup, tmp_path / "b", steps=12)

    def interrupt(step):
        if step == 10:
            raise _Stop

    with contextlib.suppress(_Stop):
        first.run(_Bar(), on_step=interrupt)
    second = _trainer(setup, tmp_path / "b", steps=12)
    assert second.load_checkpoint() is not None and second.step == 10
    resumed = second.run(_Bar())
    assert resumed.resumed_from == 10 and resumed.steps == 12
    for name, value in straight.tensors.items():
        torch.testing.assert_close(resumed.tensors[name], value, rtol=1e-4, atol=1e-5, msg=name)


def test_the_thread_counts_a_head_trained_with_are_recorded_and_a_change_on_resume_is_said(setup, tmp_path, monkeypatch):
    """The head's bits depend on torch's thread count (threads.py): a resume at another count must say so."""
    import torch

    from specconvert import output

    warned = []
    monkeypatch.setattr(output, "warn", warned.append)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        first = _trainer(setup, tmp_path, steps=12)

        def interrupt(step):
            if step == 10:
                raise _Stop

        with contextlib.suppress(_Stop):
            first.run(_Bar(), on_step=interrupt)
        assert not warned
        torch.set_num_threads(1)
        second = _trainer(setup, tmp_path, steps=12)
        assert second.load_checkpoint() is not None and second.step == 10
        result = second.run(_Bar())
    finally:
        torch.set_num_threads(before)
    assert result.threads == [2, 1] and result.as_dict()["intra_op_threads"] == [2, 1]
    assert len(warned) == 1 and "step 10 with 1 torch threads" in warned[0] and "ran with 2" in warned[0]
    assert _trainer(setup, tmp_path / "straight", steps=3).run(_Bar()).threads == [before]


def test_a_checkpoint_of_other_settings_is_not_resumed(setup, tmp_path):
    _trainer(setup, tmp_path, steps=5).run(_Bar())
    other = _trainer(setup, tmp_path, steps=5)
    other.fingerprint = "other"
    assert other.load_checkpoint() is None and other.step == 0


def test_the_budget_stops_cleanly_and_keeps_a_usable_head(setup, tmp_path):
    trainer = _trainer(setup, tmp_path, steps=100000, max_minutes=0.02)
    result = trainer.run(_Bar())
    assert result.stopped_by == "budget"
    assert 0 < result.steps < 100000
    assert result.history[-1]["step"] == result.steps
    assert (tmp_path / "ckpt.safetensors").is_file()
    assert "fc.weight" in result.tensors and "d2t" in result.tensors


class _Planted:
    """A pickle that runs a command when unpickled: what a poisoned CI cache could hold."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import os

        return (os.system, (f"touch '{self.marker}'",))


@pytest.mark.parametrize("planted", ["ckpt.safetensors", "ckpt.pt"], ids=["at-the-checkpoint-path", "at-the-legacy-pt-path"])
def test_a_planted_pickle_in_the_cache_never_runs(setup, tmp_path, planted, capsys):
    import torch

    marker = tmp_path / "pwned"
    torch.save({"fingerprint": "fp", "step": _Planted(marker)}, tmp_path / planted)
    trainer = _trainer(setup, tmp_path, steps=5)
    assert trainer.load_checkpoint() is None and trainer.step == 0
    assert not marker.exists()
    err = capsys.readouterr().err
    assert ("unreadable" in err) if planted.endswith(".safetensors") else ("ignoring" in err and "never loaded" in err)
    trainer.run(_Bar())  # and training still works, writing a safe checkpoint over the planted one
    assert not marker.exists()
    assert (tmp_path / "ckpt.safetensors").read_bytes()[8:9] == b"{"  # a safetensors JSON header, not a pickle


def test_a_checkpoint_holds_tensors_and_json_only(setup, tmp_path):
    from safetensors import safe_open

    _trainer(setup, tmp_path, steps=5).run(_Bar())
    with safe_open(str(tmp_path / "ckpt.safetensors"), framework="pt") as fh:
        names = set(fh.keys())
        meta = fh.metadata()
    assert any(n.startswith("head.") for n in names) and any(n.startswith("best.") for n in names)
    assert any(n.startswith("optimizer.") and n.endswith(".exp_avg") for n in names)
    import json

    state = json.loads(meta["state"])
    assert state["step"] == 5 and state["complete"] is True and state["optimizer"]["param_groups"][0]["values"]["betas"] == [0.9, 0.95]


def test_the_same_seed_and_steps_give_the_same_head(setup, tmp_path):
    import torch

    a = _trainer(setup, tmp_path / "a", steps=8, seed=3).run(_Bar())
    b = _trainer(setup, tmp_path / "b", steps=8, seed=3).run(_Bar())
    assert a.tensors.keys() == b.tensors.keys()
    for name in a.tensors:
        assert torch.equal(a.tensors[name], b.tensors[name]), name


def test_with_a_step_budget_the_schedule_ignores_the_clock(setup, tmp_path):
    """max_minutes is a safety cap only: a slow machine must not decay the learning rate sooner."""
    trainer = _trainer(setup, tmp_path, steps=100, max_minutes=1)
    trainer.step = 30
    trainer.elapsed_s = 0.0
    quiet = trainer.lr_factor()
    trainer.elapsed_s = 55.0  # the same step reached late on a loaded machine
    assert trainer.lr_factor() == quiet
    by_epochs = _trainer(setup, tmp_path / "e", steps=None, epochs=100, max_minutes=1)
    by_epochs.step, by_epochs.elapsed_s = 30, 55.0
    assert by_epochs.lr_factor() < quiet  # without steps the budget still shapes the decay


def test_bf16_mixed_runs_the_head_in_bf16_and_keeps_float32_weights(setup, tmp_path):
    """bf16-mixed: the head's matmuls in bf16 (AMX on CPU), the weights and AdamW in float32, and it still learns."""
    import torch

    trainer = _trainer(setup, tmp_path, autocast=torch.bfloat16, steps=30)
    seen = []
    hook = trainer.model.eagle_module.fc.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    loss0, acc0 = trainer.evaluate_holdout()
    result = trainer.run(_Bar())
    loss1, acc1 = trainer.evaluate_holdout()
    hook.remove()
    assert seen and set(seen) == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in trainer.params)
    assert all(v.dtype == torch.float32 for k, v in result.tensors.items() if v.is_floating_point())
    assert loss1 < 0.7 * loss0 and tau_estimate(acc1) > tau_estimate(acc0) + 0.5
    plain = []
    fp32 = _trainer(setup, tmp_path / "fp32", steps=1)
    hook = fp32.model.eagle_module.fc.register_forward_hook(lambda mod, args, out: plain.append(out.dtype))
    fp32.evaluate_holdout()
    hook.remove()
    assert set(plain) == {torch.float32}


def test_precision_names_map_to_weight_dtypes_and_bf16_mixed_warns_only_without_bf16_units(monkeypatch):
    from specconvert.training import pipeline

    assert pipeline.train_dtype("auto", "cpu") == "float32" and pipeline.train_dtype("auto", "cuda") == "bfloat16"
    assert pipeline.train_dtype("bf16-mixed", "cpu") == "bf16-mixed"  # an explicit setting is kept
    assert pipeline.param_dtype("bf16-mixed") == "float32" and pipeline.param_dtype("bfloat16") == "bfloat16"
    assert isinstance(pipeline.cpu_has_bf16_matmul(), bool)
    monkeypatch.setattr(pipeline, "cpu_has_bf16_matmul", lambda: False)  # an AVX2-only CPU
    assert pipeline.emulated_bf16("bf16-mixed", "cpu") and pipeline.emulated_bf16("bfloat16", "cpu")
    assert not pipeline.emulated_bf16("float32", "cpu") and not pipeline.emulated_bf16("bf16-mixed", "cuda:0")
    monkeypatch.setattr(pipeline, "cpu_has_bf16_matmul", lambda: True)  # AMX
    assert not pipeline.emulated_bf16("bf16-mixed", "cpu")


def test_layer_init_target_starts_the_draft_layer_as_the_targets_next_layer(setup):
    """`draft.train.layer_init: target`: the draft layer is the target's layer after the deepest feature, fc passes it."""
    import torch

    from specconvert.backends.modelopt.eagle import EagleArch
    from specconvert.training.trainer import init_from_target_layer, target_layer_for

    target, train, _ = setup
    vocab = calibrate(train, 256, 128, always=[255])
    arch = EagleArch.for_target(target.config, 128, 1)
    model = build_train_model(target, arch, AUX, vocab.used, 3, torch.float32, torch.device("cpu"), 0)
    before = {k: v.clone() for k, v in model.eagle_module.state_dict().items()}
    report = init_from_target_layer(model, target, AUX)
    assert report["target_layer"] == target_layer_for(AUX, 8) == 5  # outputs 1, 3, 4 are read: layer 5 comes next
    src = target.model.layers[5]
    layer = model.eagle_module.layers[0]
    for proj in ("q_proj", "k_proj", "v_proj"):
        ours, theirs = getattr(layer.self_attn, proj).weight, getattr(src.self_attn, proj).weight
        assert torch.equal(ours[:, 64:], theirs)  # the feature half (Model Optimizer: cat(embeddings, hidden_norm(h)))
        assert torch.equal(ours[:, :64], before[f"layers.0.self_attn.{proj}.weight"][:, :64])  # embedding half: random
    for name in ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"):
        assert torch.equal(layer.get_submodule(name).weight, src.get_submodule(name).weight), name
    assert torch.equal(layer.post_attention_layernorm.weight, src.post_attention_layernorm.weight)
    assert torch.equal(layer.hidden_norm.weight, src.input_layernorm.weight)
    assert torch.equal(layer.input_layernorm.weight, torch.ones(64))  # still frozen at 1 (the runtimes' math)
    assert torch.equal(model.eagle_module.norm.weight, target.model.norm.weight)
    fc = model.eagle_module.fc.weight
    expected = 0.1 * before["fc.weight"]
    expected[:, 128:192] += torch.eye(64)  # layer 4's output is the third block
    torch.testing.assert_close(fc, expected)
    # the fused feature starts as (about) the deepest feature
    feats = torch.randn(2, 192)
    fused = feats @ fc.T
    assert torch.nn.functional.cosine_similarity(fused, feats[:, 128:], dim=-1).min() > 0.9
    # the rest of the head is untouched
    assert torch.equal(model.eagle_module.lm_head.weight, before["lm_head.weight"])


def test_layer_init_target_refuses_a_target_whose_layers_are_not_the_drafts_kind():
    import torch

    from specconvert.errors import InputError
    from specconvert.training.trainer import check_target_layer

    class Odd(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = torch.nn.Module()
            self.model.layers = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(6)])

    with pytest.raises(InputError) as err:
        check_target_layer(Odd(), [1, 2, 4])
    assert "layer 5" in str(err.value) and "self_attn.q_proj.weight" in str(err.value)
    assert "layer_init: random" in err.value.fix
