"""The recipe schema: defaults, strictness, did-you-mean, overrides, every shipped recipe."""

from __future__ import annotations

from pathlib import Path

import pytest

from specconvert.errors import InputError
from specconvert.recipe import json_schema, load_recipe

from .conftest import REPO, write_recipe

MINIMAL = """
name: tiny
target:
  model: ./target
draft:
  init: random
"""


def test_defaults_filled_and_workdir_relative_to_file(tmp_path):
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", MINIMAL))
    assert recipe.target.dtype == "auto"
    assert recipe.quantize.format == "none"
    assert recipe.build.max_draft_len == 3
    assert recipe.runtime.backend == "reference"
    assert recipe.workdir_path == (tmp_path / "runs" / "tiny").resolve()
    assert recipe.resolve_path("target") == (tmp_path / "target").resolve()


@pytest.mark.parametrize(
    "text, expected",
    [
        (MINIMAL + "  aux_layer: auto\n", "draft.aux_layer: unknown key; did you mean 'draft.aux_layers'?"),
        (MINIMAL.replace("  model: ./target", "  model: ./target\n  dtyp: float32"), "target.dtyp: unknown key; did you mean 'target.dtype'?"),
        (MINIMAL + "quantise:\n  format: fp8\n", "quantise: unknown key; did you mean 'quantize'?"),
        (MINIMAL + "build:\n  max_draft_len: many\n", "build.max_draft_len: Input should be a valid integer"),
        (MINIMAL + "quantize:\n  format: int3\n", "quantize.format: Input should be 'none', 'fp8', 'int4_awq' or 'nvfp4'"),
        ("name: x\ntarget:\n  model: a\ndraft: {}\n", "draft: no head given"),
        ("name: x\ndraft:\n  init: random\n", "target: required key is missing"),
        (MINIMAL.replace("init: random", "init: random\n  model: ./head"), "give exactly one of draft.model, draft.train, draft.init (got model, init)"),
    ],
)
def test_bad_recipes_name_the_key_and_the_fix(tmp_path, text, expected):
    with pytest.raises(InputError) as info:
        load_recipe(write_recipe(tmp_path / "r.yaml", text))
    assert expected in info.value.message


def test_every_problem_is_listed_at_once(tmp_path):
    text = MINIMAL + "build:\n  max_draft_len: 0\n  max_batch_sise: 4\n"
    with pytest.raises(InputError) as info:
        load_recipe(write_recipe(tmp_path / "r.yaml", text))
    assert len(info.value.problems) == 2
    assert any("max_batch_sise" in p and "max_batch_size" in p for p in info.value.problems)
    assert "and 1 more problem" in info.value.message


def test_malformed_yaml_gives_line_and_column(tmp_path):
    with pytest.raises(InputError) as info:
        load_recipe(write_recipe(tmp_path / "r.yaml", "name: x\ntarget: [unclosed\n"))
    assert "malformed YAML at line" in info.value.message


def test_non_mapping_and_missing_file(tmp_path):
    with pytest.raises(InputError, match="a recipe is a mapping"):
        load_recipe(write_recipe(tmp_path / "r.yaml", "- a\n- b\n"))
    with pytest.raises(InputError, match="does not exist"):
        load_recipe(tmp_path / "nope.yaml")


def test_overrides_are_typed_and_validated(tmp_path):
    path = write_recipe(tmp_path / "r.yaml", MINIMAL)
    recipe = load_recipe(path, ["build.max_draft_len=5", "build.tree={top_k: 4, depth: 3, total_tokens: 16}", "runtime.trtllm_version=1.2"])
    assert recipe.build.max_draft_len == 5
    assert recipe.build.tree.total_tokens == 16
    assert recipe.runtime.trtllm_version == "1.2"
    with pytest.raises(InputError, match="build.max_draft_lne: unknown key; did you mean 'build.max_draft_len'"):
        load_recipe(path, ["build.max_draft_lne=5"])
    with pytest.raises(InputError, match="is not KEY=VALUE"):
        load_recipe(path, ["build.max_draft_len"])


def test_schema_documents_every_key():
    schema = json_schema()
    defs = schema["$defs"]
    for name, definition in defs.items():
        assert definition.get("additionalProperties") is False, name
        for key, prop in definition["properties"].items():
            assert prop.get("description"), f"{name}.{key} has no description"
    assert schema["additionalProperties"] is False
    for key, prop in schema["properties"].items():
        assert prop.get("description"), f"top-level {key} has no description"


@pytest.mark.parametrize("path", sorted((REPO / "recipes").rglob("*.yaml")), ids=lambda p: str(p.relative_to(REPO)))
def test_every_shipped_recipe_validates(path: Path):
    recipe = load_recipe(path)
    assert recipe.name
    first = path.read_text().splitlines()[0]
    assert first.startswith("#"), "each recipe opens with a comment"
    assert "specconvert" in path.read_text().split("schema_version")[0], "header names the command that runs it"


def test_there_are_gpu_recipes_too():
    recipes = [load_recipe(p) for p in (REPO / "recipes").rglob("*.yaml")]
    assert any(r.runtime.backend == "trtllm" for r in recipes)
    assert any(r.quantize.format == "fp8" for r in recipes)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("workdir=runs/x y", "runs/x y"),
        ("target.model=$(touch X)", "$(touch X)"),  # valid YAML text; the schema decides what it may be
        ("draft.aux_layers=[1, 3, 4]", [1, 3, 4]),
        ("runtime.host=", None),
    ],
    ids=["path-with-space", "shell-looking-text", "list", "empty"],
)
def test_set_values_that_are_yaml_still_parse(text, expected):
    from specconvert.recipe import parse_override

    assert parse_override(text)[1] == expected


@pytest.mark.parametrize("raw", ["[1, 3", "{a: 1", "*alias", "@value"], ids=["open-list", "open-map", "alias", "reserved-char"])
def test_set_value_that_is_not_yaml_names_the_value(raw):
    from specconvert.errors import InputError
    from specconvert.recipe import parse_override

    with pytest.raises(InputError) as exc:
        parse_override(f"draft.aux_layers={raw}")
    assert "is not valid YAML" in exc.value.message and repr(raw) in exc.value.message


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param(MINIMAL + "draft:\n  init: random\n", "duplicate key 'draft' at line 7 (first at line 5)", id="second-top-level-block"),
        pytest.param(MINIMAL.replace("  model: ./target", "  model: ./target\n  model: ./other"),
                     "duplicate key 'model' at line 5 (first at line 4)", id="nested-key"),
        pytest.param(MINIMAL + "build:\n  tree: {top_k: 4, top_k: 8, depth: 3}\n", "duplicate key 'top_k' at line 8 (first at line 8)",
                     id="flow-mapping"),
        pytest.param(MINIMAL + "name: other\n", "duplicate key 'name' at line 7 (first at line 2)", id="scalar-twice"),
    ],
)
def test_a_key_given_twice_is_refused_with_both_lines(tmp_path, text, expected):
    """YAML keeps the last of two equal keys: a second `draft:` block silently replaced the real head."""
    with pytest.raises(InputError) as info:
        load_recipe(write_recipe(tmp_path / "r.yaml", text))
    assert expected in info.value.message and "Fix: keep one" in info.value.one_line()


def test_a_merge_may_still_override_its_keys(tmp_path):
    recipe_text = MINIMAL + "build:\n  <<: {max_draft_len: 2, max_batch_size: 4}\n  max_draft_len: 5\n"
    recipe = load_recipe(write_recipe(tmp_path / "r.yaml", recipe_text))
    assert recipe.build.max_draft_len == 5 and recipe.build.max_batch_size == 4


def test_a_set_value_with_a_key_twice_is_refused(tmp_path):
    path = write_recipe(tmp_path / "r.yaml", MINIMAL)
    with pytest.raises(InputError, match="duplicate key 'top_k'"):
        load_recipe(path, ["build.tree={top_k: 4, top_k: 8, depth: 3, total_tokens: 16}"])
