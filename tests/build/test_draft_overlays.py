"""The vLLM and SGLang draft overlays say one thing each, and the manifest says which numbering (issue 12)."""

from __future__ import annotations

import json

from conftest import AUX_IDS

PLUS_ONE = [i + 1 for i in AUX_IDS]
KEY = "eagle_aux_hidden_state_layer_ids"


def vllm_032_aux_layers(config: dict) -> list[int] | None:
    """vLLM 0.32's lookup, restated (vllm/v1/worker/gpu_model_runner.py, _get_eagle3_aux_layers_from_config):
    the top-level list, else ``eagle_config``'s list as it stands (no +1)."""
    ids = config.get(KEY)
    if not ids:
        ids = (config.get("eagle_config") or {}).get(KEY)
    return list(ids) if ids else None


def _head_with_stale_lists(project) -> None:
    config = json.loads((project.draft_dir / "config.json").read_text())
    config[KEY] = [7, 7, 7]  # some heads carry a top-level list of their own
    config["eagle_config"][KEY] = [9, 9, 9]
    (project.draft_dir / "config.json").write_text(json.dumps(config))


def test_vllm_overlay_holds_vllm_numbering_in_both_places(project, cli):
    _head_with_stale_lists(project)
    assert cli("build", project.recipe_path, "--no-load").code == 0
    config = json.loads((project.engine / "vllm" / "draft" / "config.json").read_text())
    assert config[KEY] == PLUS_ONE
    assert config["eagle_config"][KEY] == PLUS_ONE
    assert config["eagle_config"]["use_aux_hidden_state"] is True  # the rest of eagle_config survives
    assert vllm_032_aux_layers(config) == PLUS_ONE
    # The day the top-level key is lost, vLLM still captures the right layers.
    del config[KEY]
    assert vllm_032_aux_layers(config) == PLUS_ONE


def test_sglang_overlay_holds_only_the_output_numbering(project, cli):
    _head_with_stale_lists(project)
    assert cli("build", project.recipe_path, "--no-load").code == 0
    config = json.loads((project.engine / "sglang" / "draft" / "config.json").read_text())
    assert config["eagle_config"][KEY] == AUX_IDS
    assert KEY not in config, "a stale top-level list would contradict eagle_config"
    head = json.loads((project.draft_dir / "config.json").read_text())
    assert head[KEY] == [7, 7, 7] and head["eagle_config"][KEY] == [9, 9, 9], "the user's head is untouched"


def test_manifest_records_the_numbering_of_every_file(project, cli):
    assert cli("build", project.recipe_path, "--no-load").code == 0
    manifest = project.manifest()
    numbering = manifest["decisions"]["aux_layer_numbering"]
    output = {k: v["ids"] for k, v in numbering.items() if v["numbering"].startswith("output of layer i")}
    vllm = {k: v["ids"] for k, v in numbering.items() if v["numbering"].startswith("input of layer i")}
    assert set(output) == {
        f"convert/draft/config.json: eagle_config.{KEY}",
        "engine/trtllm/llm_api_options.yaml: speculative_config.eagle3_layers_to_capture",
        f"engine/sglang/draft/config.json: eagle_config.{KEY}",
    } and all(ids == AUX_IDS for ids in output.values())
    assert set(vllm) == {f"engine/vllm/draft/config.json: {KEY}", f"engine/vllm/draft/config.json: eagle_config.{KEY}"}
    assert all(ids == PLUS_ONE for ids in vllm.values())
    overlays = manifest["artifacts"]["draft_overlay_files"]
    assert overlays["vllm"]["aux_layer_ids"][KEY]["ids"] == PLUS_ONE
    assert overlays["vllm"]["aux_layer_ids"][f"eagle_config.{KEY}"]["ids"] == PLUS_ONE
    assert overlays["sglang"]["aux_layer_ids"] == {f"eagle_config.{KEY}": {"ids": AUX_IDS, "numbering": numbering[
        f"engine/sglang/draft/config.json: eagle_config.{KEY}"]["numbering"]}}
    # What each file really holds matches what the manifest says it holds.
    vllm_config = json.loads((project.engine / "vllm" / "draft" / "config.json").read_text())
    assert vllm_config[KEY] == numbering[f"engine/vllm/draft/config.json: {KEY}"]["ids"]
