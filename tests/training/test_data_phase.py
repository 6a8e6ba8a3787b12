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
