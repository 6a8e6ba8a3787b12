"""Option types shared by every command, defined once, and the help text every pipeline command carries.

A new shared flag goes here as one ``Annotated`` alias; a command takes it as a parameter.
Metavars are words (``RECIPE``, ``KEY=VALUE``, ``DIR``), never Python types.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer
from typer.core import TyperArgument, TyperCommand
from typing_extensions import Annotated

class _WordArgument(TyperArgument):
    """An argument shown by its metavar alone: ``RECIPE``, ``[RECIPE]``, ``PATH...``.

    Typer 0.29 writes a required argument as ``{RECIPE}`` in the usage line and adds its Python type
    (``<str>``) beside it in the list (typer/core.py, TyperArgument); a user reads neither as a word.
    """

    def _usage_display_name(self) -> str:
        name = self.display_name_raw
        return name if self.required or name.startswith("[") else f"[{name}]"

    def display_type_rich(self, ctx):  # noqa: ANN001 - typer's signature
        return None if self.metavar else super().display_type_rich(ctx)


class Command(TyperCommand):
    """Every command's class (``app.command(..., cls=Command)``): arguments read as words."""

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - click's signature
        super().__init__(*args, **kwargs)
        for param in self.params:
            if type(param) is TyperArgument:
                param.__class__ = _WordArgument


RecipeArg = Annotated[str, typer.Argument(
    help="Recipe YAML file, or the name of a shipped recipe (`specconvert recipe list`).",
    metavar="RECIPE", show_default=False)]
SetOpt = Annotated[
    Optional[List[str]],
    typer.Option("--set", "-s", metavar="KEY=VALUE",
                 help="Override a recipe key, e.g. --set build.max_draft_len=4 (repeatable). Relative paths in "
                 "--set values are relative to the current directory; the resolved path is printed.",
                 show_default=False),
]
ForceOpt = Annotated[bool, typer.Option("--force", help="Redo the stage even when its inputs are unchanged.")]
JsonOpt = Annotated[bool, typer.Option(
    "--json", help="Print one JSON document on stdout and nothing else; on failure "
    "it carries `error`, `exit_code` and `fix`.")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress or log lines on stderr.")]
UrlOpt = Annotated[Optional[str], typer.Option("--url", metavar="URL", show_default=False,
                                               help="An already running OpenAI-compatible endpoint to use instead "
                                               "of starting the bundle's server.")]
BaselineUrlOpt = Annotated[Optional[str], typer.Option(
    "--baseline-url", metavar="URL", show_default=False,
    help="The same target served without speculation (default: the --url endpoint's `<model>-baseline` twin "
    "when it lists one).")]

# Exit codes (README "Errors and exit codes"): one table, each command naming what 1 and 4 mean for it.
_EXIT_CODES = ("0 ok", "1 {one}", "2 {two}", "3 environment missing: GPU, package, engine", "4 {four}")
_BAD_INPUT = "bad input: recipe, paths, checkpoints (one line names the key and the fix)"
VerifyOpt = Annotated[bool, typer.Option(
    "--verify", help="Hash every file convert sealed (convert/target, convert/draft), not only compare sizes and mtimes.")]


def exit_codes(one: str, four: str = "an external process failed", two: str = _BAD_INPUT) -> str:
    """The ``Exit codes`` block of a command's --help (an epilog, kept unwrapped line by line)."""
    lines = [code.format(one=one, two=two, four=four) for code in _EXIT_CODES]
    return "\b\nExit codes:\n" + "\n".join(f"  {line}" for line in lines)


def start(recipe: str | Path, overrides: list[str] | None, json_out: bool = False, quiet: bool = False):
    """Set the output mode and load the recipe (raising InputError on any problem).

    ``recipe`` is a file, or the name of a recipe shipped in the package (``recipe list``).
    """
    from .. import output
    from ..recipe import load_recipe

    output.set_mode(json_mode=json_out, quiet=quiet or json_out)
    output.quiet_library_bars()
    path = recipe_file(recipe)
    if str(path) != str(recipe):
        output.log(f"recipe: {recipe} is the shipped recipe {path}; its workdir and relative paths resolve "
                   f"from {Path.cwd() / 'recipes'}")
    return load_recipe(path, overrides or [])


def recipe_file(recipe: str | Path) -> Path:
    """The file a RECIPE argument means (a path, or a shipped recipe's name), for stages that pass it on."""
    from ..recipe_files import find

    return find(recipe)
