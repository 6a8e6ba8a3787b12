"""convert takes a head of any floating dtype for a target of any floating dtype (issue 12, item 4).

The export dtype is the recipe's (`draft.export_dtype`, default: the head's own); the
lossless check compares the export with the source cast the same way, dtype included;
every cast is in the manifest; a cast that would overflow stops convert (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import write_recipe
from tests.helpers.heads import canonical_tensors, source_name, write_head
from tests.tiny_models import write_tiny_target

# Everything but the training test runs under both Model Optimizer generations (`make test-compat`):
# attach, load and export take the same dtype path in 0.37 and 0.47.
compat = pytest.mark.compat

DTYPES = ("float32", "float16", "bfloat16")


@pytest.fixture(scope="module")
def targets(tmp_path_factory) -> dict[str, Path]:
    """The tiny target saved in each dtype (the recipe says `dtype: auto`, so the checkpoint's dtype rules)."""
    import torch
    from transformers import AutoModelForCausalLM

    base = write_tiny_target(tmp_path_factory.mktemp("tiny") / "float32")
    out = {"float32": base}
    for name in ("float16", "bfloat16"):
        model = AutoModelForCausalLM.from_pretrained(str(base), dtype=getattr(torch, name))
        folder = base.parent / name
        model.save_pretrained(folder, safe_serialization=True)
        for tok_file in base.glob("tokenizer*"):
            (folder / tok_file.name).write_bytes(tok_file.read_bytes())
        out[name] = folder
    return out


def recipe_for(tmp_path: Path, target: Path, draft: str) -> Path:
    return write_recipe(
        tmp_path / "recipe.yaml",
        f"""# specconvert convert recipe.yaml
name: tiny-dtype
target:
  model: {target}
  dtype: auto
draft:
{draft}
""",
    )


def load_exported(folder: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def source_tensors(dtype: str) -> dict:
    tensors = canonical_tensors(seed=0, dtype=dtype)
    tensors.pop("t2d"), tensors.pop("embed_tokens.weight")
    return tensors


def check_names(manifest: dict) -> dict:
    return {c["check"]: c for c in manifest["checks"]}


@compat
@pytest.mark.parametrize("head_dtype", DTYPES, ids=[f"head-{d}" for d in DTYPES])
@pytest.mark.parametrize("target_dtype", DTYPES, ids=[f"target-{d}" for d in DTYPES])
def test_every_head_dtype_imports_bit_exact_for_every_target_dtype(cli, tmp_path, targets, target_dtype, head_dtype):
    head = write_head(tmp_path / "head", "eagle", dtype=head_dtype)
    result = cli("convert", recipe_for(tmp_path, targets[target_dtype], f"  model: {head}"), "--json")
    assert result.code == 0, result.stderr
    manifest = result.json()["manifest"]
    assert manifest["target"]["dtype"] == target_dtype
    assert check_names(manifest)["lossless import"]["ok"] is True
    decisions = manifest["decisions"]
    assert decisions["export_dtype"] == head_dtype and decisions["casts"] == []
    assert "keeps its own dtype" in decisions["export_dtype_reason"]
    assert manifest["draft"]["source_dtype"] == head_dtype
    draft_dir = Path(manifest["artifacts"]["draft_dir"])
    assert json.loads((draft_dir / "config.json").read_text())["torch_dtype"] == head_dtype
    exported, source = load_exported(draft_dir), source_tensors(head_dtype)
    assert sorted(exported) == sorted(source)
    for name, value in source.items():
        assert exported[name].dtype == value.dtype and torch_equal(exported[name], value), name


@compat
@pytest.mark.parametrize("export_dtype", ["auto", "bfloat16"], ids=["own-fp16", "cast-to-bf16"])
def test_head_without_lm_head_keeps_none_in_any_dtype(cli, tmp_path, targets, export_dtype):
    """Model Optimizer's exporter fills a missing lm_head from the (bf16) target; it must not come back."""
    head = write_head(tmp_path / "head", "modelopt", dtype="float16", with_lm_head=False, with_d2t=False, draft_vocab_size=256)
    draft = f"  model: {head}\n  export_dtype: {export_dtype}"
    result = cli("convert", recipe_for(tmp_path, targets["bfloat16"], draft), "--json")
    assert result.code == 0, result.stderr
    manifest = result.json()["manifest"]
    assert manifest["draft"]["has_lm_head"] is False and check_names(manifest)["lossless import"]["ok"] is True
    want = "float16" if export_dtype == "auto" else "bfloat16"
    exported = load_exported(Path(manifest["artifacts"]["draft_dir"]))
    assert "lm_head.weight" not in exported
    assert {str(t.dtype) for t in exported.values() if t.is_floating_point()} == {f"torch.{want}"}


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


@compat
@pytest.mark.parametrize(
    "target_dtype, head_dtype, export_dtype",
    [
        ("bfloat16", "float32", "bfloat16"),
        ("bfloat16", "float16", "bfloat16"),
        ("float16", "float32", "float16"),
        ("float32", "bfloat16", "float32"),
        ("float32", "float16", "bfloat16"),
    ],
    ids=["fp32-head-to-bf16", "fp16-head-to-bf16", "fp32-head-to-fp16", "bf16-head-to-fp32", "fp16-head-to-bf16-fp32-target"],
)
def test_export_dtype_casts_once_checks_and_records(cli, tmp_path, targets, target_dtype, head_dtype, export_dtype):
    import torch

    head = write_head(tmp_path / "head", "modelopt", dtype=head_dtype)
    draft = f"  model: {head}\n  export_dtype: {export_dtype}"
    result = cli("convert", recipe_for(tmp_path, targets[target_dtype], draft), "--json")
    assert result.code == 0, result.stderr
    manifest = result.json()["manifest"]
    assert check_names(manifest)["lossless import"]["ok"] is True
    assert f"{head_dtype} -> {export_dtype}" in check_names(manifest)["lossless import"]["detail"]
    decisions = manifest["decisions"]
    assert decisions["export_dtype"] == export_dtype
    assert f"draft.export_dtype: {export_dtype}" in decisions["export_dtype_reason"]
    source = source_tensors(head_dtype)
    floating = sorted(k for k, v in source.items() if v.is_floating_point())
    assert [c["tensor"] for c in decisions["casts"]] == floating  # d2t (int64) is never cast
    assert {(c["from"], c["to"]) for c in decisions["casts"]} == {(head_dtype, export_dtype)}
    upcast = torch.finfo(getattr(torch, export_dtype)).bits > torch.finfo(getattr(torch, head_dtype)).bits
    assert all(c["exact"] is upcast for c in decisions["casts"]), decisions["casts"]
    draft_dir = Path(manifest["artifacts"]["draft_dir"])
    exported = load_exported(draft_dir)
    assert json.loads((draft_dir / "config.json").read_text())["torch_dtype"] == export_dtype
    for name, value in source.items():
        want = value.to(getattr(torch, export_dtype)) if value.is_floating_point() else value
        assert exported[name].dtype == want.dtype and torch.equal(exported[name], want), name


@compat
def test_export_dtype_is_part_of_the_fingerprint(cli, tmp_path, targets):
    head = write_head(tmp_path / "head", "eagle", dtype="float16")
    recipe = recipe_for(tmp_path, targets["bfloat16"], f"  model: {head}")
    assert cli("convert", recipe, "--json").code == 0
    again = cli("convert", recipe, "--json", "--set", "draft.export_dtype=bfloat16")
    assert again.code == 0 and again.json()["skipped"] is False
    assert again.json()["manifest"]["decisions"]["export_dtype"] == "bfloat16"


@compat
@pytest.mark.parametrize(
    "head_dtype, export_dtype, value, suggested",
    [
        ("float32", "float16", 1.0e5, "float32 or bfloat16"),
        ("bfloat16", "float16", 7.0e4, "float32 or bfloat16"),
        ("float32", "bfloat16", 3.4e38, "float32"),
    ],
    ids=["fp32-1e5-to-fp16", "bf16-7e4-to-fp16", "fp32-max-to-bf16"],
)
def test_overflowing_cast_exits_2_names_the_tensor_and_writes_nothing(
    cli, tmp_path, targets, head_dtype, export_dtype, value, suggested
):
    import torch

    fc = canonical_tensors(seed=0, dtype=head_dtype)["fc.weight"].clone()
    fc[0, 0] = value
    head = write_head(tmp_path / "head", "eagle", dtype=head_dtype, tensor_overrides={source_name("eagle", "fc.weight"): fc})
    draft = f"  model: {head}\n  export_dtype: {export_dtype}"
    result = cli("convert", recipe_for(tmp_path, targets["float32"], draft))
    assert result.code == 2, result.stderr
    first = result.stderr.splitlines()[0]
    assert first.startswith("error: ") and "fc.weight" in first and f"to {export_dtype} overflows" in first, first
    assert f"set draft.export_dtype to {suggested}" in first
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "runs").exists()
    assert torch.isfinite(fc.to(getattr(torch, head_dtype))).all()  # the source itself was finite


@compat
@pytest.mark.parametrize(
    "export_dtype, want",
    [("auto", "float32"), ("bfloat16", "bfloat16"), ("float16", "float16")],
    ids=["auto-is-target-dtype", "bf16", "fp16"],
)
def test_random_init_is_built_in_the_export_dtype(cli, tmp_path, targets, export_dtype, want):
    result = cli("convert", recipe_for(tmp_path, targets["float32"], f"  init: random\n  export_dtype: {export_dtype}"), "--json")
    assert result.code == 0, result.stderr
    manifest = result.json()["manifest"]
    decisions = manifest["decisions"]
    assert decisions["export_dtype"] == want and decisions["casts"] == []
    assert ("target's dtype" in decisions["export_dtype_reason"]) is (export_dtype == "auto")
    assert manifest["draft"]["source_dtype"] is None
    draft_dir = Path(manifest["artifacts"]["draft_dir"])
    assert json.loads((draft_dir / "config.json").read_text())["torch_dtype"] == want
    floats = {str(t.dtype) for t in load_exported(draft_dir).values() if t.is_floating_point()}
    assert floats == {f"torch.{want}"}


def _train_recipe(tmp_path: Path, target: Path, export_dtype: str) -> Path:
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps({"prompt": f"hello {i} world"}) for i in range(8)))
    return write_recipe(
        tmp_path / f"train-{export_dtype}.yaml",
        f"""name: tiny-train-dtype-{export_dtype}
target:
  model: {target}
  dtype: auto
draft:
  export_dtype: {export_dtype}
  train:
    prompts: train.jsonl
    max_new_tokens: 8
    synthesis_batch_size: 8
    draft_vocab_size: 64
    steps: 1
    batch_size: 2
    seq_len: 32
    dtype: float32
runtime:
  device: cpu
""",
    )


@pytest.mark.parametrize(
    "export_dtype, want, cast",
    [("auto", "bfloat16", True), ("float32", "float32", False)],
    ids=["auto-is-target-bf16", "float32-as-trained"],
)
def test_trained_head_export_dtype_is_decided_and_recorded(cli, tmp_path, targets, export_dtype, want, cast):
    """Trained in float32 for a bfloat16 target: auto writes the target's dtype, the casts recorded."""
    result = cli("convert", _train_recipe(tmp_path, targets["bfloat16"], export_dtype), "--json")
    assert result.code == 0, result.stderr
    manifest = result.json()["manifest"]
    decisions = manifest["decisions"]
    assert decisions["export_dtype"] == want and manifest["draft"]["source_dtype"] == "float32"
    assert ("trained here (in float32)" in decisions["export_dtype_reason"]) is (export_dtype == "auto")
    assert bool(decisions["casts"]) is cast
    assert all((c["from"], c["to"]) == ("float32", "bfloat16") for c in decisions["casts"])
    assert check_names(manifest)["lossless import"]["ok"] is True
    draft_dir = Path(manifest["artifacts"]["draft_dir"])
    assert json.loads((draft_dir / "config.json").read_text())["torch_dtype"] == want
    assert {str(t.dtype) for t in load_exported(draft_dir).values() if t.is_floating_point()} == {f"torch.{want}"}


# --------------------------------------------------------------------------- the decision and the cast, no model


@pytest.mark.parametrize(
    "requested, origin, source, target, want, reason",
    [
        ("auto", "imported", "float16", "bfloat16", "float16", "keeps its own dtype"),
        ("auto", "imported", "bfloat16", "float32", "bfloat16", "keeps its own dtype"),
        ("auto", "trained", "float32", "bfloat16", "bfloat16", "trained here (in float32)"),
        ("auto", "random", None, "float16", "float16", "initialised here"),
        ("auto", "random", None, "float64", "float32", "float64 is not an export dtype"),
        ("bfloat16", "imported", "float16", "bfloat16", "bfloat16", "float16: cast, checked"),
        ("float32", "imported", "float32", "bfloat16", "float32", "draft.export_dtype: float32"),
    ],
    ids=["fp16-head-bf16-target", "bf16-head-fp32-target", "trained", "random", "random-fp64-target",
         "asked-cast", "asked-same"],
)
def test_choose_export_dtype(requested, origin, source, target, want, reason):
    from specconvert.heads.dtype import choose_export_dtype

    decision = choose_export_dtype(requested, origin, source, target)
    assert decision.dtype == want and decision.source_dtype == source
    assert reason in decision.reason, decision.reason


def test_auto_refuses_a_head_in_no_export_dtype():
    from specconvert.errors import InputError
    from specconvert.heads.dtype import choose_export_dtype

    with pytest.raises(InputError) as err:
        choose_export_dtype("auto", "imported", "float64", "bfloat16")
    assert err.value.exit_code == 2 and "float64" in err.value.message and "draft.export_dtype" in err.value.fix


def test_cast_counts_rounding_and_flush_and_leaves_integers_and_nan_alone():
    import torch

    from specconvert.heads.dtype import cast_for_export

    tensors = {
        "w": torch.tensor([1.0, 1.0 + 2**-12, 1e-9, float("nan")], dtype=torch.float32),
        "d2t": torch.tensor([0, 1, 2], dtype=torch.int64),
        "same": torch.ones(2, dtype=torch.float16),
    }
    out, casts = cast_for_export(tensors, "float16")
    assert out["d2t"] is tensors["d2t"] and out["same"] is tensors["same"]
    assert out["w"].dtype == torch.float16
    assert casts == [{"tensor": "w", "from": "float32", "to": "float16", "values": 4,
                      "rounded": 2, "flushed_to_zero": 1, "exact": False}]


def test_cast_lists_every_overflowing_tensor():
    import torch

    from specconvert.errors import InputError
    from specconvert.heads.dtype import cast_for_export

    tensors = {"a": torch.tensor([1e5]), "b": torch.tensor([-7e4, 1.0]), "c": torch.tensor([float("inf")])}
    with pytest.raises(InputError) as err:
        cast_for_export(tensors, "float16", "draft.model")
    assert err.value.message.startswith("draft.model: casting the head to float16 overflows a (1 value(s)")
    assert "and 1 more tensor(s)" in err.value.message  # c was inf already: not an overflow
    assert [p.split(":")[0] for p in err.value.problems] == ["a", "b"]
