"""build writes what tune chose, in each engine's own form; a stale tune result is ignored, loudly."""

from __future__ import annotations

import json

import pytest
import yaml

from specconvert.manifest import manifest_hash, read_manifest, stage_dir
from specconvert.recipe import load_recipe
from specconvert.stages import tune as tune_stage
from specconvert.tuning.forms import Measurement
from specconvert.tuning.measure import Measured
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


def _write_tune(path, choice, idle=None):
    """A tune result as the stage seals it: tokens/s where ``choice``'s length clearly wins each level
    (measurement itself is tested elsewhere)."""
    recipe = load_recipe(path)
    convert = read_manifest(recipe.workdir_path / "convert")
    rates = {(k, b): (100.0 if k == best else 50.0) for b, best in choice.items() for k in range(4)}
    measured = Measurement(rates, idle or {}).as_dict()
    with stage_dir(tune_stage.tune_dir(recipe), "tune", {"convert_manifest": manifest_hash(convert)}) as stage:
        stage.finish(measured=measured)
    return measured


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
        stage.finish(measured=Measurement({(0, 1): 100.0, (1, 1): 50.0}, {}).as_dict())
    capsys.readouterr()
    assert _cli("build", path, "--no-load") == 0
    options = yaml.safe_load((root / "work" / "engine" / "trtllm" / "llm_api_options.yaml").read_text())
    assert options["speculative_config"]["max_draft_len"] == 3  # the recipe's, not the stale "off"
    assert "older convert" in capsys.readouterr().err


@pytest.mark.parametrize("measured", [None, {"tokens_per_second": "not a table"}, {"tokens_per_second": [[1, 2]]}],
                         ids=["older-tune", "edited", "short-row"])
def test_unreadable_tune_result_is_ignored_with_a_warning(converted, capsys, measured):
    root, path = converted
    recipe = load_recipe(path)
    convert = read_manifest(recipe.workdir_path / "convert")
    with stage_dir(tune_stage.tune_dir(recipe), "tune", {"convert_manifest": manifest_hash(convert)}) as stage:
        stage.finish(measured=measured, schedules={"trtllm": {"speculate": False}})
    capsys.readouterr()
    assert _cli("build", path, "--no-load") == 0
    options = yaml.safe_load((root / "work" / "engine" / "trtllm" / "llm_api_options.yaml").read_text())
    assert options["speculative_config"]["max_draft_len"] == 3  # the recipe's: no stored engine form is copied
    assert "holds no measurement this specconvert reads" in capsys.readouterr().err


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


# --- build derives each engine's form itself, for the settings it builds with (issue 20, item 7) -------------


def _fake_reference_measurement(decoder, prompts, lengths, max_new_tokens, on_run=None):
    """tokens/s 10 / 11.9 / 13 / 13.2 for k = 0..3 at every level (the reference serves one request at a time):
    with the 3 % margin k = 2 wins, with a 50 % margin plain decoding does."""
    decode_s = {0: 10.0, 1: 100 / 11.9, 2: 100 / 13.0, 3: 100 / 13.2}
    out = {}
    for k in lengths:
        steps = int(100 / (1 + 0.5 * k))
        out[k] = Measured(k, 1, tokens=100, steps=steps, decode_s=decode_s[k],
                          accepted_per_position=[steps * 0.5] * k)
    return out


@pytest.fixture
def tuned(converted, monkeypatch):
    """`specconvert tune` really run (reference runtime, TensorRT-LLM 1.4 in the recipe), with a scripted measurement."""
    root, path = converted
    monkeypatch.setattr(tune_stage, "measure_reference", _fake_reference_measurement)
    assert _cli("tune", path, "--force", "--set", "tune.plots=false", "--set", "tune.num_prompts=1") == 0
    manifest = read_manifest(root / "work" / "tune")
    assert "schedules" not in manifest and manifest["choice"] == {"1": 2, "4": 2, "16": 2}
    return root, path


def _spec(root):
    return yaml.safe_load((root / "work" / "engine" / "trtllm" / "llm_api_options.yaml").read_text()).get(
        "speculative_config")


def test_build_writes_trtllm_form_for_the_version_it_builds_for(tuned):
    root, path = tuned
    assert _cli("build", path, "--no-load") == 0
    assert _spec(root)["draft_len_schedule"] == {16: 2}  # 1.4: upper-bound keys, 2 up to max_batch_size
    # the same tune result, built for 1.2.1: one fixed length, no schedule (its one-model path reads none)
    assert _cli("build", path, "--no-load", "--set", "runtime.trtllm_version=1.2.1") == 0
    spec = _spec(root)
    assert spec["max_draft_len"] == 2 and "draft_len_schedule" not in spec
    manifest = read_manifest(root / "work" / "engine")
    assert manifest["decisions"]["tuned"]["trtllm"]["version"] == "1.2.1"
    assert manifest["decisions"]["trtllm_drafting"] == "chain of 2"


def test_build_reapplies_max_batch_size_margin_and_floor(tuned):
    root, path = tuned
    assert _cli("build", path, "--no-load", "--set", "build.max_batch_size=4") == 0
    assert _spec(root)["draft_len_schedule"] == {4: 2}
    # a margin raised after tuning: 2 no longer beats plain decoding by it, so nothing drafts
    assert _cli("build", path, "--no-load", "--set", "tune.margin=0.5") == 0
    assert _spec(root) is None
    decision = read_manifest(root / "work" / "engine")["decisions"]["tune_decision"]
    assert decision["margin"] == 0.5 and decision["choice"] == {"1": 0, "4": 0, "16": 0}


def test_build_applies_trtllm_allow_zero_set_after_tuning(converted):
    root, path = converted
    _write_tune(path, {1: 3, 4: 2, 16: 0})
    assert _cli("build", path, "--no-load") == 0
    assert _spec(root)["draft_len_schedule"] == {2: 3, 8: 2, 16: 1}  # 1 is the floor (PR #16888)
    assert _cli("build", path, "--no-load", "--set", "tune.trtllm_allow_zero=true") == 0
    assert _spec(root)["draft_len_schedule"] == {2: 3, 8: 2}  # 0 above 8: implicit above the largest key


def test_tune_fingerprint_reads_prompt_contents_and_ignores_where_servers_listen(converted, monkeypatch, tmp_path,
                                                                                 capsys):
    root, path = converted
    monkeypatch.setattr(tune_stage, "measure_reference", _fake_reference_measurement)
    first = tmp_path / "a.jsonl"
    first.write_text(json.dumps({"prompt": "Count to five."}) + "\n")
    base = ["tune", path, "--json", "--set", "tune.plots=false", "--set", "tune.num_prompts=1"]

    def skipped(*extra):
        capsys.readouterr()
        assert _cli(*base, *extra) == 0
        return json.loads(capsys.readouterr().out)["skipped"]

    assert skipped("--force", "--set", f"tune.prompts={first}") is False
    copy = tmp_path / "copy.jsonl"
    copy.write_text(first.read_text())
    assert skipped("--set", f"tune.prompts={copy}") is True  # same contents elsewhere: nothing to measure again
    assert skipped("--set", f"tune.prompts={copy}", "--set", "runtime.port=9123", "--set", "runtime.host=0.0.0.0",
                   "--set", "tune.margin=0.2", "--set", "runtime.trtllm_version=1.2.1") is True
    # the levels measured come from bench.concurrency when tune.concurrency is unset: they count
    assert skipped("--set", f"tune.prompts={copy}", "--set", "bench.concurrency=[1,4]") is False
    copy.write_text(json.dumps({"prompt": "Name three colours."}) + "\n")
    assert skipped("--set", f"tune.prompts={copy}", "--set", "bench.concurrency=[1,4]") is False  # new contents


def test_reference_warmup_runs_the_tuned_settings(converted, capsys):
    """A bundle tune turned off warms up without speculation: no "untrained head?" warning about a draft it never runs."""
    root, path = converted
    _write_tune(path, {1: 0, 4: 0})
    capsys.readouterr()
    assert _cli("build", path) == 0  # loads and warms the reference decoder
    manifest = read_manifest(root / "work" / "engine")
    assert manifest["loaded"] is True and manifest["load"]["warmup"]["acceptance_length"] in (None, 1.0)
    assert "untrained head" not in capsys.readouterr().err
    assert not any("untrained head" in w for w in manifest["warnings"])
