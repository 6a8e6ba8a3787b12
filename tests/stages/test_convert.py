"""`specconvert convert` end to end on tiny targets: import, random init, quantize, caching, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import write_recipe
from tests.helpers.heads import TINY, canonical_tensors, write_head
from tests.tiny_models import write_tiny_target

pytestmark = pytest.mark.compat


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    return write_tiny_target(tmp_path_factory.mktemp("tiny") / "target")


def recipe_for(tmp_path: Path, target: Path, draft: str, extra: str = "") -> Path:
    return write_recipe(
        tmp_path / "recipe.yaml",
        f"""# specconvert convert recipe.yaml
name: tiny
target:
  model: {target}
  dtype: float32
draft:
{draft}
{extra}""",
    )


def load_exported(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_random_head_then_cached_then_rerun_on_change(cli, tmp_path, target):
    recipe = recipe_for(tmp_path, target, "  init: random")
    first = cli("convert", recipe, "--json")
    assert first.code == 0, first.stderr
    doc = first.json()
    manifest = doc["manifest"]
    assert doc["skipped"] is False
    assert manifest["decisions"]["aux_layer_ids"] == [1, 3, 4]
    assert manifest["draft"]["init"] == "random"
    assert all(check["ok"] for check in manifest["checks"])
    draft_dir = Path(manifest["artifacts"]["draft_dir"])
    config = json.loads((draft_dir / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert config["rope_scaling"] is None and config["torch_dtype"] == "float32"
    tensors = load_exported(draft_dir)
    assert tensors["fc.weight"].shape == (64, 3 * 64)
    # the target's own copy (never a hard link: edits there must not reach the source)
    target_dir = Path(manifest["artifacts"]["target_dir"])
    assert (target_dir / "model.safetensors").stat().st_ino != (target / "model.safetensors").stat().st_ino
    assert (target_dir / "model.safetensors").read_bytes() == (target / "model.safetensors").read_bytes()
    assert (tmp_path / "runs/tiny/convert/manifest.json").is_file()

    second = cli("convert", recipe, "--json")
    assert second.code == 0 and second.json()["skipped"] is True

    changed = cli("convert", recipe, "--json", "--set", "draft.aux_layers=[2,3,4]")
    assert changed.code == 0 and changed.json()["skipped"] is False
    assert changed.json()["manifest"]["decisions"]["aux_layer_ids"] == [2, 3, 4]

    forced = cli("convert", recipe, "--json", "--set", "draft.aux_layers=[2,3,4]", "--force")
    assert forced.json()["skipped"] is False


@pytest.mark.parametrize("layout", ["eagle", "modelopt", "speculators", "sharded"])
def test_every_layout_imports_losslessly(cli, tmp_path, target, layout):
    head = write_head(tmp_path / "head", layout)
    result = cli("convert", recipe_for(tmp_path, target, f"  model: {head}"), "--json")
    assert result.code == 0, result.stderr
    manifest = result.json()["manifest"]
    assert manifest["draft"]["layout"] == ("modelopt" if layout == "sharded" else layout)
    assert {c["check"]: c["ok"] for c in manifest["checks"]}["lossless import"] is True
    exported = load_exported(Path(manifest["artifacts"]["draft_dir"]))
    source = canonical_tensors(seed=0)
    source.pop("t2d"), source.pop("embed_tokens.weight")
    assert sorted(exported) == sorted(source)
    for name, value in source.items():
        assert exported[name].dtype == value.dtype and bool((exported[name] == value).all()), name


def test_pickle_head_refused_then_allowed(cli, tmp_path, target):
    head = write_head(tmp_path / "head", "eagle_bin")
    recipe = recipe_for(tmp_path, target, f"  model: {head}")
    refused = cli("convert", recipe)
    assert refused.code == 2
    assert "--allow-pickle" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "runs").exists()
    allowed = cli("convert", recipe, "--allow-pickle", "--json")
    assert allowed.code == 0, allowed.stderr


def test_imported_head_keeps_its_rope_and_dtype(cli, tmp_path, target):
    head = write_head(tmp_path / "head", "eagle", dtype="bfloat16", rope_theta=500000.0)
    result = cli("convert", recipe_for(tmp_path, target, f"  model: {head}"), "--json")
    assert result.code == 0, result.stderr
    draft_dir = Path(result.json()["manifest"]["artifacts"]["draft_dir"])
    config = json.loads((draft_dir / "config.json").read_text())
    assert config["rope_theta"] == 500000.0
    assert not config.get("rope_scaling"), "Model Optimizer's YaRN default must not leak into an imported head"
    assert config["torch_dtype"] == "bfloat16"
    assert load_exported(draft_dir)["fc.weight"].dtype.is_floating_point
    assert str(load_exported(draft_dir)["fc.weight"].dtype) == "torch.bfloat16"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(hidden_size=32, target_hidden_size=32), "hidden"),
        (dict(d2t_out_of_range=True), "d2t"),
        (dict(vocab_size=300), "vocab"),
        (dict(truncate=True), "truncated"),
    ],
)
def test_mismatched_head_exits_2_and_writes_nothing(cli, tmp_path, target, kwargs, message):
    head = write_head(tmp_path / "head", "modelopt", **kwargs)
    result = cli("convert", recipe_for(tmp_path, target, f"  model: {head}"))
    assert result.code == 2, result.stderr
    first_line = result.stderr.splitlines()[0]
    assert first_line.startswith("error: ") and message in first_line.lower()
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()


def test_aux_layers_out_of_range(cli, tmp_path, target):
    result = cli("convert", recipe_for(tmp_path, target, "  init: random\n  aux_layers: [1, 3, 8]"))
    assert result.code == 2
    assert "aux" in result.stderr.lower() and "8" in result.stderr


def test_missing_target_path_and_offline_hub(cli, tmp_path, target, monkeypatch):
    missing = cli("convert", recipe_for(tmp_path, tmp_path / "nope", "  init: random"))
    assert missing.code == 2 and "no such folder" in missing.stderr
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    hub = cli("convert", recipe_for(tmp_path, "someone/not-cached-model", "  init: random"))
    assert hub.code == 2
    assert "someone/not-cached-model" in hub.stderr and "HF_HUB_OFFLINE" in hub.stderr


def test_remote_code_needed_but_off(cli, tmp_path):
    folder = tmp_path / "custom"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "my_custom_lm", "auto_map": {"AutoModelForCausalLM": "modeling.MyLM"}, "hidden_size": 64, "num_hidden_layers": 8, "vocab_size": 256, "num_attention_heads": 4, "intermediate_size": 128, "max_position_embeddings": 128}))
    result = cli("convert", recipe_for(tmp_path, folder, "  init: random"))
    assert result.code == 2
    assert "trust_remote_code: true" in result.stderr


def test_failure_mid_stage_leaves_no_manifest_and_keeps_previous(cli, tmp_path, target, monkeypatch):
    recipe = recipe_for(tmp_path, target, "  init: random")
    assert cli("convert", recipe).code == 0
    before = (tmp_path / "runs/tiny/convert/manifest.json").read_text()
    from specconvert.backends.modelopt import eagle

    def broken_export(*args, **kwargs):
        Path(args[1]).mkdir(parents=True, exist_ok=True)
        (Path(args[1]) / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(eagle, "export_draft", broken_export)
    result = cli("convert", recipe, "--force")
    assert result.code == 1 and "disk full" in result.stderr
    assert (tmp_path / "runs/tiny/convert/manifest.json").read_text() == before
    assert sorted(p.name for p in (tmp_path / "runs/tiny").iterdir()) == ["convert"]


def test_fp8_quantized_target_has_quant_config(cli, tmp_path, target):
    result = cli("convert", recipe_for(tmp_path, target, "  init: random", "quantize:\n  format: fp8\n  calib_samples: 4\n  calib_seq_len: 32\n  eval_samples: 1\n  eval_max_new_tokens: 8\n"), "--json")
    assert result.code == 0, result.stderr
    manifest = result.json()["manifest"]
    target_dir = Path(manifest["artifacts"]["target_dir"])
    quant = json.loads((target_dir / "hf_quant_config.json").read_text())
    assert quant["quantization"]["quant_algo"] == "FP8"
    assert manifest["quantization"]["quant_algo"] == "FP8"
    assert (target_dir / "tokenizer.json").is_file()
    # the tokenizer was loaded under HF_HUB_OFFLINE=1 (conftest): its load-time flags stay out of the export
    tokenizer_config = json.loads((target_dir / "tokenizer_config.json").read_text())
    assert not {"local_files_only", "is_local"} & set(tokenizer_config)


def test_nvfp4_without_cuda_is_an_environment_error(cli, tmp_path, target):
    result = cli("convert", recipe_for(tmp_path, target, "  init: random", "quantize:\n  format: nvfp4\n"))
    assert result.code == 3
    assert "CUDA" in result.stderr and "fp8" in result.stderr
    assert not (tmp_path / "runs").exists()


def test_int4_awq_refuses_unpackable_shapes_before_calibrating(cli, tmp_path, target):
    # hidden 64 is not a multiple of AWQ's 128-feature blocks: the export would fail after calibration.
    result = cli("convert", recipe_for(tmp_path, target, "  init: random", "quantize:\n  format: int4_awq\n"))
    assert result.code == 2
    assert "blocks of 128" in result.stderr and "hidden_size 64" in result.stderr and "fp8" in result.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_int4_awq_calibrates_on_cpu_and_exports(cli, tmp_path):
    target = write_tiny_target(tmp_path / "target128", hidden_size=128, intermediate_size=256, head_dim=32)
    # the acceptance check after quantizing runs too, on 2 prompts x 8 tokens: its default 16 x 64 through AWQ's
    # fake-quantized CPU forward made this the suite's longest test (10 min of 25 on two workers)
    extra = ("quantize:\n  format: int4_awq\n  calib_samples: 2\n  calib_seq_len: 16\n  eval_samples: 2\n"
             "  eval_max_new_tokens: 8\n")
    result = cli("convert", recipe_for(tmp_path, target, "  init: random", extra), "--json")
    assert result.code == 0, result.stderr
    manifest = result.json()["manifest"]
    quant = json.loads((Path(manifest["artifacts"]["target_dir"]) / "hf_quant_config.json").read_text())
    assert quant["quantization"]["quant_algo"] == "W4A16_AWQ"
    assert manifest["quantization"]["format"] == "int4_awq"
    assert manifest["quantization"]["acceptance"] is not None  # the check ran, on the small budget
