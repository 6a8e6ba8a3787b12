"""One output sink: results to stdout, progress and logs to stderr.

Rich is used only when a person is watching (stderr is a TTY) or when asked;
``--json`` mode prints exactly one versioned JSON document on stdout.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator

JSON_SCHEMA_VERSION = 1

_state = {"json": False, "quiet": False}


def set_mode(json_mode: bool = False, quiet: bool = False) -> None:
    _state["json"] = json_mode
    _state["quiet"] = quiet


def json_mode() -> bool:
    return _state["json"]


def _console(stderr: bool = True):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def log(message: str) -> None:
    """A progress or log line, on stderr."""
    if _state["quiet"]:
        return
    _console().print(message)


def check(ok: bool, message: str) -> None:
    """Log one validation check with ✓ / ✗."""
    log(f"  {'[green]✓[/green]' if ok else '[red]✗[/red]'} {message}")


def warn(message: str) -> None:
    _console().print(f"[yellow]warning:[/yellow] {message}")


def emit_json(kind: str, payload: dict[str, Any]) -> None:
    doc = {"schema_version": JSON_SCHEMA_VERSION, "kind": kind, **payload}
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    sys.stdout.flush()


def print_table(title: str, rows: list[tuple[str, Any]]) -> None:
    """A two-column summary table on stdout (human mode)."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=False, title_justify="left")
    table.add_column("key", style="bold")
    table.add_column("value")
    for key, value in rows:
        table.add_row(key, str(value))
    Console(highlight=False, soft_wrap=True).print(table)


@contextmanager
def progress() -> Iterator[Any]:
    """A rich progress display on stderr (silent when stderr is not a terminal)."""
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    disable = _state["quiet"] or not (sys.stderr.isatty() or os.environ.get("SPECCONVERT_PROGRESS") == "1")
    with Progress(
        SpinnerColumn(),
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=_console(),
        disable=disable,
        transient=False,
    ) as bar:
        yield bar


@contextmanager
def libraries_to_stderr() -> Iterator[None]:
    """Route what libraries print (Model Optimizer, transformers) to stderr: stdout is for results."""
    from contextlib import redirect_stdout

    with redirect_stdout(sys.stderr):
        yield
