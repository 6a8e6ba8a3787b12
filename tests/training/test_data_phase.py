"""The data phase of a training run: what validates, where it runs and in what order.

- ``self:N`` without synthesis, and FSDP with in-process answers, are refused at ``recipe validate``;
  FSDP with a served engine validates (the data is made before the target is sharded).
- In a multi-process launch the data phase runs before the process group exists, so a data phase longer
  than any collective timeout cannot kill the waiting processes.
- A served synthesis on this machine's device runs while no copy of the target sits there.
- Multi-turn samples stop asking for turns that ``seq_len`` would throw away.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import write_recipe


def _train_recipe(folder: Path, train_extra: str) -> Path:
    return write_recipe(folder / "r.yaml", f"""name: data-phase
target:
  model: {folder / "target"}
draft:
  train:
{train_extra}
runtime:
  device: cpu
""")


@pytest.mark.parametrize("train_extra, code, needle", [
    pytest.param("    prompts: [builtin:chat-train, self:20]\n    synthesize: false", 2,
                 "self:N prompts have no answers with synthesize: false", id="self-without-synthesis"),
    pytest.param("    prompts: self:20\n    synthesize: false", 2, "set draft.train.synthesize: true", id="self-alone"),
    pytest.param("    prompts: self:20", 0, "", id="self-with-synthesis"),
    pytest.param("    num_processes: 2\n    target_sharding: fsdp\n    synthesis: {engine: url, urls: ['http://127.0.0.1:9']}",
                 0, "", id="fsdp-url"),
    pytest.param("    num_processes: 2\n    target_sharding: fsdp\n    prompts: self:20\n    synthesis: {engine: vllm}",
                 0, "", id="fsdp-self-vllm"),
    pytest.param("    num_processes: 2\n    target_sharding: fsdp", 2, "set draft.train.synthesis.engine: vllm or url",
                 id="fsdp-inprocess"),
])
def test_recipe_validate_refuses_data_no_run_can_make(cli, tmp_path, train_extra, code, needle):
    result = cli("recipe", "validate", _train_recipe(tmp_path, train_extra))
    assert result.code == code, result.stderr
    assert needle in result.stderr and "Traceback" not in result.stderr
    if code == 2:
        assert len(result.stderr.strip().splitlines()) == 1  # one line: cause and fix


def test_multi_turn_samples_stop_asking_for_turns_past_seq_len(tmp_path):
    """A turn whose answer would start past ``seq_len`` is cut by truncation whole: it is never requested."""
    from specconvert.recipe import TrainSpec
    from specconvert.training.answers import AnswerSource, cut_at_stop
    from specconvert.training.data import DataReport, synthesize_conversations
    from specconvert.training.distributed import World
    from tests.tiny_models import byte_tokenizer

    stop = 255

    class Counting(AnswerSource):
        def __init__(self):
            self.asked = []

        def answer(self, jobs, max_new_tokens, sampling, emit):
            for key, ids in jobs:
                self.asked.append((key, len(ids)))
                emit(key, cut_at_stop([65, 66, stop], [stop], max_new_tokens))

    class Bar:
        def add_task(self, *a, **k):
            return 0

        def advance(self, *a):
            pass

    turns = [{"role": "user", "content": f"question number {t}"} for t in range(6)]
    messages = [m for turn in turns for m in (turn, {"role": "assistant", "content": "old"})]
    tok = byte_tokenizer()
    counting, report = Counting(), DataReport()
    seq_len = 80  # the first prompt is 35 tokens, the second 74, the third would be 113: never asked
    train = TrainSpec(prompts="x.jsonl", max_new_tokens=8, seq_len=seq_len)
    seqs = synthesize_conversations(train, [{"messages": messages}], tok, counting, counting, [stop],
                                    tmp_path / "c.jsonl", Bar(), World(), report)
    asked = dict(counting.asked)
    assert all(length < seq_len for length in asked.values()), asked
    assert len(asked) == 2 and report.answers == 2 and report.turns_past_seq_len == 1
    assert len(seqs[0].input_ids) <= seq_len and sum(seqs[0].loss_mask) > 0


# --------------------------------------------------------------------------- a data phase longer than a collective timeout

COLLECTIVE_TIMEOUT_S = 3  # what SPECCONVERT_COLLECTIVE_TIMEOUT_S sets for the group in these tests
DATA_PHASE_S = 6  # process 0's data phase (synthesis, in real runs hours) outlasts it


def _data_phase_worker(rank: int, size: int, port: int, folder: str, group_first: bool) -> None:
    import faulthandler
    import json
    import os
    import time

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(size),
                      LOCAL_RANK=str(rank), SPECCONVERT_COLLECTIVE_TIMEOUT_S=str(COLLECTIVE_TIMEOUT_S))
    os.environ.pop("TORCHELASTIC_RUN_ID", None)
    faulthandler.dump_traceback_later(120, exit=True)  # a deadlock fails instead of hanging
    from specconvert.training import distributed

    world = distributed.current()
    result: dict = {"rank": rank}
    try:
        if group_first:  # the order before the fix: join the group, then make the data
            distributed.init(world, "cpu")
            data_world = world
        else:  # train_head's order: the data first, exchanged through files; then the group
            data_world = distributed.before_group(world, Path(folder) / "exchange")
        if rank == 0:
            time.sleep(DATA_PHASE_S)  # process 0 synthesizes while the others wait for its answers
        result["gathered"] = distributed.gather({"answers": [rank] * 3}, data_world)
        distributed.init(world, "cpu")
        distributed.end_data_phase(data_world)
        result["after"] = distributed.any_true(rank == 1, world)  # the group works once the data is made
    except Exception as exc:  # noqa: BLE001 - the test reads what killed the waiting process
        result["error"] = f"{type(exc).__name__}: {exc}"
    Path(folder, f"rank{rank}.json").write_text(json.dumps(result))
    distributed.finish(world)


@pytest.mark.parametrize("group_first", [pytest.param(True, id="group-first-dies"),
                                         pytest.param(False, id="data-first-survives")])
def test_a_data_phase_longer_than_the_collective_timeout(tmp_path, group_first):
    """Process 1 waits for process 0's data longer than a collective may wait: inside the process group it dies
    (what a multi-process convert did during hours of synthesis); before the group, through files, it survives."""
    import json

    import torch.multiprocessing as mp

    from specconvert.serving.process import free_port

    mp.spawn(_data_phase_worker, args=(2, free_port("127.0.0.1"), str(tmp_path), group_first), nprocs=2, join=True)
    waiting = json.loads((tmp_path / "rank1.json").read_text())
    if group_first:
        assert "error" in waiting and "gathered" not in waiting
        assert "timed out" in waiting["error"].lower() or "timeout" in waiting["error"].lower(), waiting["error"]
        return
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    for r in results:
        assert "error" not in r, r
        assert r["gathered"] == [{"answers": [0, 0, 0]}, {"answers": [1, 1, 1]}] and r["after"] is True
    assert not (tmp_path / "exchange").exists() or not any((tmp_path / "exchange").iterdir())  # files removed


# --------------------------------------------------------------------------- FSDP with served answers, end to end

SLOW_DATA_TIMEOUT_S = 10  # the group's collective timeout in this run; its data phase takes about twice that


def test_a_sharded_convert_trains_on_served_answers_and_self_prompts_made_longer_than_the_timeout(tmp_path):
    """target_sharding: fsdp with engine: url and self:N under torchrun: the served engine writes the prompts and
    answers them while process 1 waits, longer than a collective may wait; then both processes shard the target
    and train. No process ever runs generate (a sharded model's generate on one process would hang)."""
    import json
    import os
    import subprocess
    import sys
    import threading

    import torch
    from transformers import AutoModelForCausalLM

    from specconvert.training.answers import GREEDY
    from specconvert.training.answers.inprocess import InProcessSource
    from tests.helpers.openai_double import Double
    from tests.tiny_models import write_tiny_target
    from tests.training.test_prompt_sets import chat_tokenizer

    target = write_tiny_target(tmp_path / "target", num_hidden_layers=4, eos_token_id=255, logit_scale=30.0)
    tok = chat_tokenizer()
    tok.save_pretrained(target)  # with a chat template: self:N needs one
    opening = list(tok("<|im_start|>user\n", add_special_tokens=False)["input_ids"])
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    local = InProcessSource(model, [255], 0, 1)
    written = []
    lock = threading.Lock()

    def answer(prompt, max_tokens):
        with lock:
            if prompt == opening and written:  # a sampled request for a new prompt: a different one each time
                written.append(len(written))
                return list(tok(f"please count to {len(written)} slowly", add_special_tokens=False)["input_ids"]) + [255]
            if prompt == opening:
                written.append(0)  # the first is the probe's greedy request: the target's own continuation
            got = {}
            local.answer([((0, 0), prompt)], max_tokens, GREEDY, lambda k, a: got.setdefault(k, a))
            return got[(0, 0)]

    recipe = write_recipe(tmp_path / "r.yaml", f"""name: tiny-sharded-served
target:
  model: {target}
  dtype: float32
draft:
  train:
    prompts: self:8
    self_prompts: {{batch_size: 4}}
    max_new_tokens: 12
    draft_vocab_size: 128
    steps: 2
    batch_size: 2
    seq_len: 128
    eval_prompts: null
    num_processes: 2
    target_sharding: fsdp
    synthesis: {{engine: url, urls: ['URL'], concurrency: 1, probe_prompts: 1}}
runtime:
  device: cpu
""")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "SPECCONVERT_COLLECTIVE_TIMEOUT_S": str(SLOW_DATA_TIMEOUT_S)}
    env.pop("WORLD_SIZE", None)
    with Double(answer) as double:
        recipe.write_text(recipe.read_text().replace("URL", double.url))
        double.delay_s = 1.5 * SLOW_DATA_TIMEOUT_S / 18  # 18 requests: the data phase outlasts the timeout 1.5 times
        proc = subprocess.run([sys.executable, "-m", "specconvert", "convert", str(recipe), "--json"],
                              capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(double.requests) * double.delay_s > SLOW_DATA_TIMEOUT_S
    training = json.loads(proc.stdout)["manifest"]["training"]
    assert training["processes"] == 2 and training["steps"] == 2
    data = training["data"]
    assert data["self_prompts"] == 8 and data["synthesis_engine"] == "url" and data["answers"] == 8


# --------------------------------------------------------------------------- synthesis on the GPU: no idle target beside it

GIB = 1024**3


@pytest.mark.parametrize("runtime, fraction", [
    pytest.param({"device": "cuda"}, "0.67", id="cuda-free-memory"),  # 0.9 x 60/80 GiB free
    pytest.param({"device": "auto"}, "0.67", id="auto-on-a-gpu"),
    pytest.param({"device": "cuda", "vllm_memory_fraction": 0.5}, "0.5", id="the-recipe-wins"),
    pytest.param({"device": "cpu"}, "0.3", id="cpu-build-ram-fraction"),
])
def test_the_synthesis_vllm_is_sized_from_the_gpus_free_memory(tmp_path, monkeypatch, runtime, fraction):
    """On a (fake) CUDA GPU with 60 of 80 GiB free, the server asks for 0.9 of the free share, not the CPU build's
    fraction of RAM (0.3 would starve an 8B; the 0.92 default would not start beside anything else)."""
    import torch

    from specconvert.recipe import validate_recipe
    from specconvert.training.answers.vllm import VllmSource

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (60 * GIB, 80 * GIB))
    recipe = validate_recipe({"name": "demo", "target": {"model": "t"}, "runtime": runtime,
                              "draft": {"train": {"synthesis": {"engine": "vllm"}}}}, base_dir=tmp_path)
    source = VllmSource(recipe.draft.train.synthesis, recipe, tmp_path / "target", "bfloat16", [2], None, tmp_path)
    argv, _ = source.command("/cuda/bin/python", 8123)
    assert argv[argv.index("--gpu-memory-utilization") + 1] == fraction


def test_served_synthesis_starts_its_vllm_before_any_copy_of_the_target_is_loaded(cli, tmp_path, monkeypatch):
    """engine: vllm: the server runs while convert holds no target (the probe's reference is loaded on the CPU when
    the probe runs, after the server started), and the training copy loads after the server stopped."""
    import torch
    from transformers import AutoModelForCausalLM

    from specconvert.backends.vllm import launch
    from specconvert.training import pipeline
    from specconvert.training.answers import GREEDY
    from specconvert.training.answers.inprocess import InProcessSource
    from specconvert.training.answers.url import ServedSource
    from specconvert.training.answers.vllm import VllmSource
    from tests.helpers.openai_double import Double
    from tests.tiny_models import write_tiny_target
    from tests.training.test_convert_train import recipe

    target = write_tiny_target(tmp_path / "target", eos_token_id=255, logit_scale=30.0)
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    local = InProcessSource(model, [255], 0, 1)

    def answer(prompt, max_tokens):
        got = {}
        local.answer([((0, 0), prompt)], max_tokens, GREEDY, lambda k, a: got.setdefault(k, a))
        return got[(0, 0)]

    events = []
    real_load = pipeline.load_whole_target
    monkeypatch.setattr(pipeline, "load_whole_target", lambda path, device, *a: events.append(("load", device))
                        or real_load(path, device, *a))
    monkeypatch.setattr(launch, "find_python", lambda *a, **k: "/fake/vllm/python")
    with Double(answer) as double:
        def start(self):  # the server "starts": from here requests go to the double
            events.append("server start")
            self._stack = object()
            self._client = ServedSource([double.url], None, self.stop_ids, concurrency=4, tokenizer=self.tokenizer)
            return self

        def close(self):
            if self._stack is not None:
                events.append("server stop")
                self._stack = None

        monkeypatch.setattr(VllmSource, "start", start)
        monkeypatch.setattr(VllmSource, "close", close)
        result = cli("convert", recipe(tmp_path, target, steps=2, eval_samples=1,
                                       extra="    synthesis: {engine: vllm, concurrency: 4}"), "--json")
    assert result.code == 0, result.stderr
    assert result.json()["manifest"]["training"]["data"]["probe_tokens"] > 0
    start, stop = events.index("server start"), events.index("server stop")
    assert all(e[0] != "load" for e in events[:start]), events  # nothing of the target held while the server starts
    assert [e for e in events[start:stop] if e != "server start"] == [("load", "cpu")], events  # the probe's reference
    assert ("load", "cpu") in events[stop:], events  # the training copy (on this CPU test's device)


@pytest.mark.parametrize("train, after", [
    pytest.param({"num_processes": 2, "target_sharding": "fsdp", "prompts": "self:8",
                  "synthesis": {"engine": "url", "urls": ["http://h:1"]}}, True, id="fsdp-url-self"),
    pytest.param({"num_processes": 2, "target_sharding": "fsdp", "synthesize": False}, True, id="fsdp-given-answers"),
    pytest.param({"synthesis": {"engine": "vllm"}}, True, id="vllm-beside-it"),
    pytest.param({"synthesis": {"engine": "url", "urls": ["http://h:1"]}}, False, id="url-elsewhere"),
    pytest.param({}, False, id="inprocess-needs-it"),
])
def test_the_training_target_loads_after_the_data_where_it_must(train, after):
    """A sharded target is never there while the data is made (no generate on a shard), nor a whole one beside a vLLM
    started here; in-process synthesis needs the target first, and a remote URL does not compete for the device."""
    from specconvert.recipe import TrainSpec
    from specconvert.training.pipeline import target_after_data

    assert target_after_data(TrainSpec(**train)) is after
