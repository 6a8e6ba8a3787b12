"""build writes what tune chose, in each engine's own form; a stale tune result is ignored, loudly."""

from __future__ import annotations

import json

import pytest
import yaml

from specconvert.manifest import manifest_hash, read_manifest, stage_dir
from specconvert.recipe import load_recipe
from specconvert.stages import tune as tune_stage
from specconvert.tuning.model import schedule
from tests.serving.conftest import _cli


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    from tests.helpers.heads import write_head
    from tests.tiny_models import write_tiny_target

    root = tmp_path_factory.mktemp("tuned-build")
    write_tiny_target(root / "target")
    write_head(root / "head", "modelopt")
    recipe = {
        "schema_version": 1, "name": "tiny-tuned", "workdir": "work",
        "target": {"model": str(root / "target"), "dtype": "float32"},
        "draft": {"model": str(root / "head")},
        "build": {"max_draft_len": 3, "max_batch_size": 16},
        "runtime": {"backend": "reference", "device": "cpu", "trtllm_version": "1.4"},
        "bench": {"concurrency": [1, 4, 16]},
    }
    path = root / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    assert _cli("convert", path) == 0
    return root, path


def _write_tune(path, choice):
    """A tune result as the stage seals it, with a chosen schedule (measurement itself is tested elsewhere)."""
    recipe = load_recipe(path)
    convert = read_manifest(recipe.workdir_path / "convert")
    segments = schedule(choice)
    schedules = tune_stage.engine_schedules(recipe, segments, choice)
    with stage_dir(tune_stage.tune_dir(recipe), "tune", {"convert_manifest": manifest_hash(convert)}) as stage:
        stage.finish(schedules=schedules)
    return schedules


def test_build_writes_each_engines_schedule(converted):
    root, path = converted
    _write_tune(path, {1: 3, 4: 2, 16: 1})  # 1..2 -> 3, 3..8 -> 2, 9.. -> 1
    assert _cli("build", path, "--no-load") == 0
    engine = root / "work" / "engine"
    options = yaml.safe_load((engine / "trtllm" / "llm_api_options.yaml").read_text())
    spec = options["speculative_config"]
    assert spec["max_draft_len"] == 3 and spec["draft_len_schedule"] == {2: 3, 8: 2, 16: 1}
    sglang = (engine / "sglang" / "serve.sh").read_text()
    assert "--speculative-num-steps 3" in sglang and "--speculative-num-draft-tokens 4" in sglang
    settings = json.loads((engine / "reference" / "settings.json").read_text())
    assert settings["max_draft_len"] == 3 and settings["speculative"] is True
    manifest = read_manifest(engine)
    assert manifest["decisions"]["tune"].startswith("tuned by")


def test_build_serves_plain_where_speculation_never_pays(converted):
    root, path = converted
    _write_tune(path, {1: 0, 4: 0})
    assert _cli("build", path, "--no-load") == 0
    engine = root / "work" / "engine"
    assert "speculative_config" not in yaml.safe_load((engine / "trtllm" / "llm_api_options.yaml").read_text())
    assert "--speculative-algorithm" not in (engine / "sglang" / "serve.sh").read_text()
    assert json.loads((engine / "reference" / "settings.json").read_text())["speculative"] is False
    from specconvert.serving.engine import load_engine

    served = load_engine(engine, "tiny", device="cpu")
    assert served.speculate is False and served.description["speculative"] is False


def test_stale_tune_result_is_ignored_with_a_warning(converted, capsys):
    root, path = converted
    recipe = load_recipe(path)
    with stage_dir(tune_stage.tune_dir(recipe), "tune", {"convert_manifest": "an-older-convert"}) as stage:
        stage.finish(schedules={"trtllm": {"speculate": False}})
    capsys.readouterr()
    assert _cli("build", path, "--no-load") == 0
    options = yaml.safe_load((root / "work" / "engine" / "trtllm" / "llm_api_options.yaml").read_text())
    assert options["speculative_config"]["max_draft_len"] == 3  # the recipe's, not the stale "off"
    assert "older convert" in capsys.readouterr().err


def test_serve_test_skips_acceptance_when_tune_turned_speculation_off(converted, capsys):
    root, path = converted
    _write_tune(path, {1: 0, 4: 0})
    assert _cli("build", path, "--no-load") == 0
    capsys.readouterr()
    assert _cli("serve-test", path, "--set", "serve_test.min_acceptance_length=1.5", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    check = next(c for c in report["checks"] if c["name"].startswith("acceptance length"))
    # tau is 1 by construction: a floor of 1.5 would fail a bundle that is right not to speculate
    assert check["passed"] is None and "specconvert tune" in check["message"]
    assert report["status"] == "passed"
