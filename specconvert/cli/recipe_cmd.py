"""`specconvert recipe list|new|validate|show|schema`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from typing_extensions import Annotated

from ._options import Command, JsonOpt, RecipeArg, SetOpt, start

recipe_app = typer.Typer(help="Find, copy and check recipes; print their JSON Schema.", no_args_is_help=True)


@recipe_app.command("list", cls=Command)
def list_(json_out: JsonOpt = False) -> None:
    """The recipes shipped with specconvert, one line each; run one by name or copy it with `recipe new`."""
    from .. import output
    from ..recipe_files import shipped

    recipes = shipped()
    if json_out:
        output.emit_json("recipe.list", {"recipes": [{"id": r.id, "name": r.name, "path": str(r.path),
                                                      "description": r.description} for r in recipes]})
        return
    width = max(len(r.id) for r in recipes)
    for r in recipes:
        print(f"{r.id:<{width}}  {r.description}")
    output.log("run one: specconvert convert ID; copy one into this folder: specconvert recipe new NAME --from ID")


@recipe_app.command("new", cls=Command)
def new(
    name: Annotated[str, typer.Argument(help="Name of the new recipe: writes NAME.yaml, workdir runs/NAME.",
                                        metavar="NAME", show_default=False)],
    source: Annotated[str, typer.Option("--from", metavar="RECIPE", show_default=False,
                                        help="A shipped recipe (`recipe list`) or a recipe file to start from.")],
    folder: Annotated[Optional[Path], typer.Option("--dir", metavar="DIR", show_default=False,
                                                   help="Folder to write NAME.yaml in (default: the current one).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Copy a recipe into your project, renamed, its relative paths kept valid; never overwrites a file (exit 2)."""
    from .. import output
    from ..recipe_files import new as copy_recipe

    output.set_mode(json_mode=json_out, quiet=json_out)
    out = copy_recipe(name, source, folder if folder is not None else Path.cwd())
    if json_out:
        output.emit_json("recipe.new", {"path": str(out), "name": name, "from": source})
        return
    print(out)
    output.log(f"next: specconvert recipe validate {out}  (then convert, build, serve-test, bench)")


@recipe_app.command("validate", cls=Command)
def validate(recipe: RecipeArg, set_: SetOpt = None, json_out: JsonOpt = False) -> None:
    """Check a recipe against the schema; list every problem with its key path."""
    from .. import output

    loaded = start(recipe, set_, json_out)
    if json_out:
        output.emit_json("recipe.validate", {"valid": True, "recipe": loaded.model_dump(mode="json"), "workdir": str(loaded.workdir_path)})
    else:
        print(f"✓ {recipe}: valid recipe '{loaded.name}' (workdir {loaded.workdir_path})")


@recipe_app.command("show", cls=Command)
def show(recipe: RecipeArg, set_: SetOpt = None) -> None:
    """Print the recipe with every default filled in, as YAML."""
    import yaml

    loaded = start(recipe, set_)
    print(yaml.safe_dump(loaded.model_dump(mode="json"), sort_keys=False), end="")


@recipe_app.command("schema", cls=Command)
def schema(out: Path = typer.Option(None, "--out", "-o", metavar="FILE", help="Write to this file instead of stdout.")) -> None:
    """Print the recipe JSON Schema (point your editor's YAML plugin at it for autocompletion)."""
    from ..recipe import json_schema

    text = json.dumps(json_schema(), indent=2) + "\n"
    if out:
        out.write_text(text, encoding="utf-8")
    else:
        print(text, end="")


def register(app: typer.Typer) -> None:
    app.add_typer(recipe_app, name="recipe")
