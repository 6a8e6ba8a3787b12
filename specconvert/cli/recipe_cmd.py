"""`specconvert recipe validate|schema|show`."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from ._options import JsonOpt, RecipeArg, SetOpt, start

recipe_app = typer.Typer(help="Validate recipes and print their JSON Schema.", no_args_is_help=True)


@recipe_app.command("validate")
def validate(recipe: RecipeArg, set_: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Check a recipe against the schema; list every problem with its key path."""
    from .. import output

    loaded = start(recipe, set_, json_out)
    if json_out:
        output.emit_json("recipe.validate", {"valid": True, "recipe": loaded.model_dump(mode="json"), "workdir": str(loaded.workdir_path)})
    else:
        print(f"✓ {recipe}: valid recipe '{loaded.name}' (workdir {loaded.workdir_path})")


@recipe_app.command("show")
def show(recipe: RecipeArg, set_: SetOpt = None) -> None:
    """Print the recipe with every default filled in, as YAML."""
    import yaml

    loaded = start(recipe, set_)
    print(yaml.safe_dump(loaded.model_dump(mode="json"), sort_keys=False), end="")


@recipe_app.command("schema")
def schema(out: Path = typer.Option(None, "--out", "-o", help="Write to this file instead of stdout.")) -> None:
    """Print the recipe JSON Schema (point your editor's YAML plugin at it for autocompletion)."""
    from ..recipe import json_schema

    text = json.dumps(json_schema(), indent=2) + "\n"
    if out:
        out.write_text(text, encoding="utf-8")
    else:
        print(text, end="")


def register(app: typer.Typer) -> None:
    app.add_typer(recipe_app, name="recipe")
