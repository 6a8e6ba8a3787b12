"""Option types shared by every command, defined once."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from typing_extensions import Annotated

RecipeArg = Annotated[Path, typer.Argument(help="Recipe YAML file.", show_default=False)]
SetOpt = Annotated[
    Optional[List[str]],
    typer.Option("--set", "-s", help="Override a recipe key, e.g. --set build.max_draft_len=4 (repeatable).", show_default=False),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Redo the stage even when its inputs are unchanged.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print one JSON document on stdout and nothing else.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress or log lines on stderr.")]
VerifyOpt = Annotated[bool, typer.Option(
    "--verify", help="Hash every file convert sealed (convert/target, convert/draft), not only compare sizes and mtimes.")]


def start(recipe: Path, overrides: list[str] | None, json_out: bool = False, quiet: bool = False):
    """Set the output mode and load the recipe (raising InputError on any problem)."""
    from .. import output
    from ..recipe import load_recipe

    output.set_mode(json_mode=json_out, quiet=quiet or json_out)
    return load_recipe(recipe, overrides or [])
