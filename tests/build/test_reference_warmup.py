"""build with runtime.backend: reference loads and warms the real reference decoder
on a tiny random target + head (CPU, float32). Skipped where specconvert.reference is absent."""

from __future__ import annotations

import pytest

from conftest import tiny_project, write_tiny_models

HIDDEN, HEADS, LAYERS, INTER, VOCAB = 64, 4, 4, 128, 256
AUX = [0, 1, 2]


def test_reference_backend_warms_up_on_tiny_models(tmp_path, cli):
    pytest.importorskip("specconvert.reference")
    target_dir, draft_dir = write_tiny_models(tmp_path / "models", vocab=VOCAB, hidden=HIDDEN, heads=HEADS,
                                              layers=LAYERS, inter=INTER, aux=AUX, dtype="float32")
    project = tiny_project(tmp_path, target_dir, draft_dir, layers=LAYERS, hidden=HIDDEN, vocab=VOCAB, aux=AUX,
                           dtype="float32", recipe={"runtime": {"backend": "reference", "device": "cpu"},
                                                    "build": {"max_draft_len": 3, "warmup_tokens": 8,
                                                              "max_seq_len": 1024}})
    result = cli("build", project.recipe_path, "--json")
    assert result.code == 0, result.err
    manifest = result.json()["manifest"]
    assert manifest["loaded"] is True, manifest.get("load_skipped_reason")
    load = manifest["load"]
    assert load["backend"] == "reference" and load["device"] == "cpu" and load["dtype"] == "float32"
    assert load["warmup"]["new_tokens"] == 8
    # tau counts the target's own token: at least 1, at most max_draft_len + 1.
    assert 1.0 <= load["warmup"]["acceptance_length"] <= 4.0
    assert load["warmup"]["tokens_per_second"] > 0
