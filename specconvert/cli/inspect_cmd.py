"""`specconvert inspect PATH [PATH]`: what a folder is, and whether a target and a head fit."""

from __future__ import annotations

from pathlib import Path
from typing import List

import typer
from typing_extensions import Annotated

from ._options import Command, JsonOpt

PathsArg = Annotated[List[Path], typer.Argument(help="A target folder, a head folder, or one of each.", metavar="PATH...", show_default=False)]


def inspect(
    paths: PathsArg,
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help="Read pickle (.bin/.pt) head weights."),
    json_out: JsonOpt = False,
) -> None:
    """Describe a target or EAGLE-3 head folder; given both, list every mismatch between them."""
    from .. import output
    from ..inspect import inspect_paths

    output.set_mode(json_mode=json_out, quiet=json_out)
    report = inspect_paths(list(paths), allow_pickle=allow_pickle)
    if json_out:
        output.emit_json("inspect", report)
    else:
        for item in report["items"]:
            output.print_table(f"{item['kind']}: {item['path']}", [(k, v) for k, v in item.items() if k not in ("kind", "path")])
        if "fit" in report:
            fit = report["fit"]
            rows = [("verdict", "fits" if fit["ok"] else "does NOT fit")]
            rows += [(p["severity"], f"{p['key']}: {p['message']} (fix: {p['fix']})") for p in fit["problems"]]
            output.print_table("target + head", rows)
    if "fit" in report and not report["fit"]["ok"]:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    app.command("inspect", cls=Command)(inspect)
