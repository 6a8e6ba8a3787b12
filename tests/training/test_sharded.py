"""Sharded target features (``draft.train.target_sharding: fsdp``): two gloo processes on CPU, a tiny target.

Each process holds half of the target's weights, and the features it computes equal those
of the whole, unsharded target, even when the processes run different numbers of forwards.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from tests.tiny_models import write_tiny_target

AUX = [0, 1, 2]
LENGTHS = {0: [9, 5], 1: [7]}  # uneven on purpose: process 1 must be padded by even_out()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ids(length: int, salt: int) -> list[int]:
    return [(7 * i + 13 * salt + 1) % 256 for i in range(length)]


def _worker(rank: int, size: int, port: int, target: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size),
                      LOCAL_RANK=str(rank))
    import faulthandler

    faulthandler.dump_traceback_later(240, exit=True)  # a deadlock (unpaired collectives) fails instead of hanging
    import torch
    import transformers

    torch.set_num_threads(1)
    from specconvert.training import distributed, sharded
    from specconvert.training.trainer import FeatureExtractor

    world = distributed.current()
    device = distributed.init(world, "cpu")
    try:
        model = sharded.load_target(Path(target), world, device, torch.float32)
        held, total = sharded.resident_parameters(model)
        features = sharded.feature_extractor(model, AUX, world)
        assert isinstance(features, sharded.ShardedFeatures)
        got = []
        padded = features.even_out(len(LENGTHS[rank]))
        for n, length in enumerate(LENGTHS[rank]):
            ids = torch.tensor([_ids(length, 10 * rank + n)])
            got.append(features(ids, torch.ones_like(ids)))
        lm_head = model.get_output_embeddings().weight.full_tensor()  # what build_train_model gathers

        whole = transformers.AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32).eval()
        reference = FeatureExtractor(whole, AUX)
        max_diff = 0.0
        for n, length in enumerate(LENGTHS[rank]):
            ids = torch.tensor([_ids(length, 10 * rank + n)])
            aux, final = reference(ids, torch.ones_like(ids))
            assert got[n][0].shape == aux.shape and got[n][1].shape == final.shape
            assert torch.allclose(got[n][0], aux, atol=1e-5, rtol=1e-4)
            assert torch.allclose(got[n][1], final, atol=1e-5, rtol=1e-4)
            max_diff = max(max_diff, float((got[n][0] - aux).abs().max()), float((got[n][1] - final).abs().max()))
        assert torch.equal(lm_head, whole.get_output_embeddings().weight)
        held_after, _ = sharded.resident_parameters(model)  # resharded after every forward
        Path(out, f"rank{rank}.json").write_text(json.dumps(
            {"held": held, "held_after": held_after, "total": total, "padded": padded, "max_diff": max_diff}))
    finally:
        distributed.finish(world)


def test_sharded_target_features_equal_the_whole_targets_and_each_process_holds_half(tmp_path):
    import torch.multiprocessing as mp

    target = write_tiny_target(tmp_path / "target", num_hidden_layers=4)
    mp.spawn(_worker, args=(2, _free_port(), str(target), str(tmp_path)), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in results:
        assert r["total"] == results[0]["total"]
        assert abs(r["held"] / r["total"] - 0.5) < 0.01, r
        assert r["held_after"] == r["held"], r
    assert sum(r["held"] for r in results) == results[0]["total"]
    assert [r["padded"] for r in results] == [0, 1]  # process 1 ran one forward fewer: even_out() padded it


def _answered(folder: Path) -> None:
    """Chat samples that carry their answers (`synthesize: false`, what a sharded target trains from)."""
    folder.mkdir(parents=True, exist_ok=True)
    rows = [{"messages": [{"role": "user", "content": f"count {i}"},
                          {"role": "assistant", "content": f"{i} {i + 1} {i + 2} {i + 3} and so on"}]} for i in range(24)]
    (folder / "answered.jsonl").write_text("\n".join(json.dumps(r) for r in rows))


def _recipe(folder: Path, target: Path, train_extra: str) -> Path:
    from tests.conftest import write_recipe

    _answered(folder)
    return write_recipe(folder / "r.yaml", f"""name: tiny-sharded
target:
  model: {target}
  dtype: float32
draft:
  train:
    prompts: answered.jsonl
    draft_vocab_size: 128
    steps: 3
    batch_size: 3
    seq_len: 48
    eval_prompts: null
{train_extra}
runtime:
  device: cpu
""")


@pytest.mark.parametrize("train_extra, needle", [
    pytest.param("    synthesize: false\n    target_sharding: fsdp", "set draft.train.num_processes: 2 or more", id="one-process"),
    pytest.param("    num_processes: 2\n    target_sharding: fsdp", "set draft.train.synthesize: false", id="in-process-answers"),
    pytest.param("    synthesize: false\n    num_processes: 2\n    target_sharding: zero3", "target_sharding", id="unknown-mode"),
])
def test_fsdp_sharding_without_what_it_needs_exits_2_and_writes_nothing(cli, tmp_path, train_extra, needle):
    target = write_tiny_target(tmp_path / "target")
    result = cli("convert", _recipe(tmp_path, target, train_extra))
    assert result.code == 2, result.stderr
    assert needle in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


def test_convert_trains_a_head_from_a_sharded_target_under_torchrun(tmp_path):
    """The whole path: convert re-launches under torchrun, both gloo processes train from their target halves."""
    import subprocess
    import sys

    target = write_tiny_target(tmp_path / "target", num_hidden_layers=4)
    path = _recipe(tmp_path, target, "    synthesize: false\n    num_processes: 2\n    target_sharding: fsdp")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("WORLD_SIZE", None)
    proc = subprocess.run([sys.executable, "-m", "specconvert", "convert", str(path)],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "fsdp over 2 processes; each holds 90,400 of the target's 180,800 parameters (50.0%)" in proc.stderr
    manifest = json.loads((tmp_path / "runs" / "tiny-sharded" / "convert" / "manifest.json").read_text())
    assert manifest["training"]["processes"] == 2 and manifest["training"]["steps"] == 3
    assert all(check["ok"] for check in manifest["checks"])
