"""`specconvert convert` with a `draft.train` block on a tiny target: trains, exports, measures, refuses bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import write_recipe
from tests.tiny_models import write_tiny_target


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return write_tiny_target(tmp_path_factory.mktemp("tiny") / "target", logit_scale=30.0, eos_token_id=255)


def _data(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    train = [{"prompt": f"hello {i} world " * 2} for i in range(48)]
    held = [{"prompt": f"hello {i} world " * 2} for i in range(60, 66)]  # same kind of prompt, never trained on
    (folder / "train.jsonl").write_text("\n".join(json.dumps(x) for x in train))
    (folder / "eval.jsonl").write_text("\n".join(json.dumps(x) for x in held))


def recipe(tmp_path: Path, target: Path, steps: int, lr: float = 3e-3, extra: str = "", eval_samples: int = 6) -> Path:
    _data(tmp_path)
    return write_recipe(
        tmp_path / f"recipe-{steps}.yaml",
        f"""# specconvert convert recipe.yaml
name: tiny-train-{steps}
target:
  model: {target}
  dtype: float32
draft:
  train:
    prompts: train.jsonl
    max_new_tokens: 24
    synthesis_batch_size: 16
    draft_vocab_size: 128
    steps: {steps}
    batch_size: 4
    lr: {lr}
    seq_len: 64
    checkpoint_every: 10
    eval_prompts: eval.jsonl
    eval_samples: {eval_samples}
    eval_max_new_tokens: 24
{extra}
runtime:
  device: cpu
""",
    )


def test_convert_trains_exports_and_measures_a_head_that_beats_the_untrained_one(cli, tmp_path, target):
    untrained = cli("convert", recipe(tmp_path, target, steps=1, lr=1e-9), "--json")
    assert untrained.code == 0, untrained.stderr
    trained = cli("convert", recipe(tmp_path, target, steps=60), "--json")
    assert trained.code == 0, trained.stderr
    manifest = trained.json()["manifest"]
    section = manifest["training"]
    assert section["steps"] == 60 and section["stopped_by"] == "steps"
    assert section["draft_vocab"]["size"] == 128 and section["data"]["synthesized_tokens"] > 0
    assert manifest["draft"]["trained_here"] is True
    assert all(check["ok"] for check in manifest["checks"])
    assert any(c["check"] == "lossless import" for c in manifest["checks"])  # exported == trained tensors
    config = json.loads((Path(manifest["artifacts"]["draft_dir"]) / "config.json").read_text())
    assert config["draft_vocab_size"] == 128
    before = untrained.json()["manifest"]["training"]["evaluation"]["shapes"]["chain-3"]
    after = section["evaluation"]["shapes"]["chain-3"]
    assert after["identical_to_plain"] and before["identical_to_plain"]
    assert after["acceptance_length"] >= before["acceptance_length"] + 0.5, (before, after)
    assert len(after["per_position_acceptance"]) == 3
    assert "tree-8x5-32" in section["evaluation"]["shapes"]
    # the training picture (training vs held-out loss) lies beside the manifest
    assert Path(section["loss_plot"]).read_bytes()[:4] == b"\x89PNG"
    # unchanged inputs: the stage is reused, nothing retrained
    again = cli("convert", recipe(tmp_path, target, steps=60), "--json")
    assert again.code == 0 and again.json()["skipped"] is True


def test_layer_init_target_trains_from_the_targets_layer_and_keys_its_own_checkpoint(cli, tmp_path, target):
    from specconvert.recipe import TrainSpec
    from specconvert.training.pipeline import head_settings_key

    result = cli("convert", recipe(tmp_path, target, steps=4, extra="    layer_init: target", eval_samples=2), "--json")
    assert result.code == 0, result.stderr
    section = result.json()["manifest"]["training"]
    init = section["layer_init"]
    assert init["kind"] == "target" and init["target_layer"] == 5  # the tiny target's aux outputs are {1, 3, 4}
    assert {"self_attn.q_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight", "final norm"} <= set(init["copied"])
    assert section["evaluation"]["shapes"]["chain-3"]["identical_to_plain"]
    # its checkpoint is its own; the default adds nothing to the key (checkpoints from before the key stay valid)
    assert head_settings_key(TrainSpec(layer_init="target"))["layer_init"] == "target"
    assert "layer_init" not in head_settings_key(TrainSpec())


@pytest.mark.parametrize(
    "draft, needle",
    [
        ("  model: some/head\n  train:\n    prompts: train.jsonl", "give exactly one of draft.model, draft.train"),
        ("  train:\n    prompts: nope.jsonl", "draft.train.prompts: file"),
        ("  train:\n    prompts: train.jsonl\n    draft_vocab_size: 999", "draft.train.draft_vocab_size: 999 is larger"),
        ("  train:\n    prompts: train.jsonl\n    steps: 5\n    epochs: 1", "give one of draft.train.steps and draft.train.epochs"),
        ("  train:\n    prompts: train.jsonl\n    eval_prompts: builtin:nope", "draft.train.eval_prompts: no built-in set 'nope'"),
        ("  train:\n    prompts: train.jsonl\n    layer_init: layer27", "draft.train.layer_init"),
    ],
)
def test_bad_train_blocks_exit_2_and_write_nothing(cli, tmp_path, target, draft, needle):
    _data(tmp_path)
    path = write_recipe(tmp_path / "r.yaml", f"name: bad\ntarget:\n  model: {target}\ndraft:\n{draft}\n")
    result = cli("convert", path)
    assert result.code == 2, result.stderr
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


def test_num_processes_trains_data_parallel_under_torchrun(tmp_path, target):
    """Two gloo processes on CPU: convert re-launches itself under torchrun; process 0 exports."""
    import os
    import subprocess
    import sys

    path = recipe(tmp_path, target, steps=6, extra="    num_processes: 2", eval_samples=2)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run([sys.executable, "-m", "specconvert", "convert", str(path), "--json"],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = json.loads(proc.stdout)["manifest"]  # exactly one document: one process reports
    assert manifest["training"]["processes"] == 2
    assert manifest["training"]["steps"] == 6
    assert all(check["ok"] for check in manifest["checks"])
    parts = sorted(p.name.split("-part")[1] for p in (tmp_path / "runs" / "tiny-train-6" / "cache" / "train").glob("synthesis-*"))
    assert parts == ["0of2.jsonl", "1of2.jsonl"]  # each process synthesized its share


@pytest.mark.compat
def test_old_model_optimizer_refuses_to_train_before_loading_anything(cli, tmp_path, target):
    from specconvert.backends.modelopt.eagle import generation

    if generation() != "old":
        pytest.skip("Model Optimizer >= 0.43 trains (make test-compat runs this on 0.37)")
    result = cli("convert", recipe(tmp_path, target, steps=2))
    assert result.code == 3
    assert "needs Model Optimizer >= 0.43" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


def test_convert_synthesizes_through_a_url_and_refuses_an_unreachable_one(cli, tmp_path, target):
    """engine: url end to end: the answers come over HTTP (probed first); a dead URL is one line, exit 4, nothing written."""
    import torch
    from transformers import AutoModelForCausalLM

    from specconvert.serving.process import free_port
    from specconvert.training.answers import GREEDY
    from specconvert.training.answers.inprocess import InProcessSource
    from tests.helpers.openai_double import Double

    dead = f"http://127.0.0.1:{free_port()}"
    bad = cli("convert", recipe(tmp_path / "dead", target, steps=2,
                                extra=f"    synthesis: {{engine: url, urls: ['{dead}'], retries: 0}}"))
    assert bad.code == 4, bad.stderr
    assert "not reachable" in bad.stderr and dead in bad.stderr and "Traceback" not in bad.stderr
    assert not list((tmp_path / "dead").rglob("manifest.json"))
    assert not list((tmp_path / "dead").rglob("synthesis-*.jsonl"))

    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    local = InProcessSource(model, [255], 0, 1)

    def answer(prompt, max_tokens):
        got = {}
        local.answer([((0, 0), prompt)], max_tokens, GREEDY, lambda k, a: got.setdefault(k, a))
        return got[(0, 0)]

    with Double(answer) as double:
        done = cli("convert", recipe(tmp_path / "url", target, steps=2, eval_samples=1,
                                     extra=f"    synthesis: {{engine: url, urls: ['{double.url}'], concurrency: 4}}"), "--json")
    assert done.code == 0, done.stderr
    data = done.json()["manifest"]["training"]["data"]
    assert data["synthesis_engine"] == "url" and data["probe_tokens"] > 0 and data["answers"] == 48
    assert len(double.requests) == 48 + 4  # every prompt once, plus the probe's four (probe_prompts)


def test_engine_vllm_without_vllm_stops_before_loading_anything(cli, tmp_path, target):
    path = recipe(tmp_path, target, steps=2, extra="    synthesis: {engine: vllm}")
    text = path.read_text().replace("runtime:\n", f"runtime:\n  vllm_python: {tmp_path / 'no-such-python'}\n")
    path.write_text(text)
    result = cli("convert", path)
    assert result.code == 3, result.stderr
    assert "no Python with vLLM" in result.stderr and "Traceback" not in result.stderr
    # it names the key that asked for vLLM and the way to do without it (the default recipe synthesizes on vLLM)
    assert "for draft.train.synthesis.engine: vllm" in result.stderr and "engine: inprocess" in result.stderr
    assert not list(tmp_path.rglob("synthesis-*.jsonl")) and not list(tmp_path.rglob("manifest.json"))
