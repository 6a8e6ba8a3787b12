"""The GPU recipe example validates with the current schema and passes the EAGLE-3 rules."""

from __future__ import annotations

from pathlib import Path

from specconvert.backends.trtllm import rules, versions
from specconvert.recipe import load_recipe

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "llama3.3-70b" / "instruct_eagle3-nvidia_fp8_tp4.yaml"


def test_llama70b_fp8_tp4_recipe_is_valid_and_combinable():
    recipe = load_recipe(RECIPE)
    assert recipe.build.tensor_parallel_size == 4 and recipe.runtime.backend == "trtllm"
    header = RECIPE.read_text().split("schema_version")[0].splitlines()
    assert any(line.lstrip("# ").startswith("specconvert doctor") for line in header)  # after `plan` since gpu-plan
    convert = {"quantization": {"format": "fp8", "kv_cache_quant_algo": "FP8"}, "draft": {"dtype": "bfloat16",
               "max_position_embeddings": 131072}, "target": {"max_position_embeddings": 131072}}
    for version in ("1.2", "1.3.0rc27", "1.4.0rc4"):
        report = rules.check(recipe, convert, versions.resolve(version, installed=None, detect=False))
        assert report.errors == [] and report.fixes == {}, (version, report)
    # Without the explicit `enable_block_reuse: false`, the same recipe is an error (set explicitly to true)
    # or gets fixed (left at its default).
    flipped = load_recipe(RECIPE, ["build.kv_cache.enable_block_reuse=true"])
    assert rules.check(flipped, convert, versions.resolve("1.3", installed=None, detect=False)).errors
