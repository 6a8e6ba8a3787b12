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
