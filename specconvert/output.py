"""One output sink: results to stdout, progress and logs to stderr.

Rich is used only when a person is watching (stderr is a TTY) or when asked;
``--json`` mode prints exactly one versioned JSON document on stdout (a failure
included: ``cli.main`` prints ``{"error", "exit_code", "fix"}``).

Progress (``SPECCONVERT_PROGRESS``): with a terminal on stderr, a live rich bar; without
one (CI logs, ``make demo > log``), plain lines, one per 10 % of a task or per 30 s,
and the libraries' own tqdm bars (transformers, huggingface_hub, GGUF loading) are
turned off, since each of their frames is a carriage return in a log. Set
``SPECCONVERT_PROGRESS=bar`` (or ``1``) for the bar anyway, ``lines`` for lines on a
terminal, ``off`` (or ``0``) for no progress at all.
"""

from __future__ import annotations

import json
import os
import sys
import time
from contextlib import contextmanager
from typing import Any, Iterator

JSON_SCHEMA_VERSION = 1

_state: dict[str, Any] = {"json": False, "quiet": False, "held": None, "emitted": False}


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
    """The command's one JSON document: written now, or held for ``finish_json`` (see ``hold_json``)."""
    doc = {"schema_version": JSON_SCHEMA_VERSION, "kind": kind, **payload}
    if _state["held"] is not None:
        _state["held"].append(doc)
        return
    _write_json(doc)


def hold_json() -> None:
    """Keep the next document back until ``finish_json``: a gate that fails after the report
    was built (bench, serve-test) then adds its error to that one document instead of a second."""
    _state["held"] = []
    _state["emitted"] = False


def finish_json(error: dict[str, Any] | None = None) -> None:
    """Write the held document, with ``error`` merged in; an error alone when there was none."""
    held, _state["held"] = _state["held"] or [], None
    if not held and error is None:
        return
    doc = held[-1] if held else {"schema_version": JSON_SCHEMA_VERSION, "kind": "error"}
    _write_json({**doc, **(error or {})})


def _write_json(doc: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    sys.stdout.flush()
    _state["emitted"] = True


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


def progress_style() -> str:
    """``bar``, ``lines`` or ``off``: SPECCONVERT_PROGRESS, else a bar on a terminal and lines without one."""
    if _state["quiet"]:
        return "off"
    chosen = os.environ.get("SPECCONVERT_PROGRESS", "").strip().lower()
    if chosen in ("bar", "1"):
        return "bar"
    if chosen in ("lines", "off"):
        return chosen
    if chosen == "0":
        return "off"
    return "bar" if _isatty(sys.stderr) else "lines"


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # a closed or replaced stream
        return False


def quiet_library_bars() -> None:
    """Without a live bar, turn off the tqdm bars of transformers, huggingface_hub and GGUF loading.

    Environment variables reach libraries not imported yet and the child processes (vLLM, torchrun);
    ``TQDM_DISABLE`` covers the bare ``tqdm.auto`` of transformers' GGUF loader, which its own
    ``disable_progress_bar`` does not (transformers/modeling_gguf_pytorch_utils.py).
    """
    if progress_style() == "bar":
        return
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()


class LineProgress:
    """The rich ``Progress`` calls the stages use (add_task, advance, update), as plain stderr lines.

    One line when a task starts, then one each time it passes another 10 % (at most one per 5 s, so a
    task of seconds does not fill the log) or 30 s have gone by, and one when it completes: a CI log gets
    a few readable lines, never carriage-return frames.
    """

    STEP_FRACTION = 0.10
    EVERY_S = 30.0
    AT_MOST_EVERY_S = 5.0

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._tasks: dict[int, dict[str, Any]] = {}

    def add_task(self, description: str, total: float | None = None, completed: float = 0, **_: Any) -> int:
        task_id = len(self._tasks)
        now = self._clock()
        self._tasks[task_id] = {"description": description, "total": total, "completed": completed, "start": now,
                                "last_time": now, "last_decile": self._decile(total, completed), "done": False}
        self._line(self._tasks[task_id], "started" if not completed else "resumed")
        return task_id

    def advance(self, task_id: int, advance: float = 1) -> None:
        self.update(task_id, advance=advance)

    def update(self, task_id: int, *, advance: float | None = None, completed: float | None = None,
               total: float | None = None, description: str | None = None, **_: Any) -> None:
        task = self._tasks[task_id]
        if total is not None:
            task["total"] = total
        if description is not None:
            task["description"] = description
        if completed is not None:
            task["completed"] = completed
        if advance:
            task["completed"] += advance
        if task["done"]:
            return
        now, decile = self._clock(), self._decile(task["total"], task["completed"])
        finished = task["total"] is not None and task["completed"] >= task["total"]
        if finished:
            task["done"] = True
            self._line(task, "done")
        elif ((decile > task["last_decile"] and now - task["last_time"] >= self.AT_MOST_EVERY_S)
              or now - task["last_time"] >= self.EVERY_S):
            self._line(task, "")
            task["last_decile"] = decile

    def _decile(self, total: float | None, completed: float) -> int:
        return int(completed / total / self.STEP_FRACTION) if total else 0

    def _line(self, task: dict[str, Any], note: str) -> None:
        task["last_time"] = self._clock()
        done, total = task["completed"], task["total"]
        amount = f"{_count(done)}/{_count(total)} ({done / total:.0%})" if total else _count(done)
        elapsed = task["last_time"] - task["start"]
        sys.stderr.write(f"{task['description']}: {amount}, {_clock_text(elapsed)}{f' ({note})' if note else ''}\n")
        sys.stderr.flush()


def _count(value: float | None) -> str:
    return "?" if value is None else (str(int(value)) if float(value).is_integer() else f"{value:.1f}")


def _clock_text(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}" if seconds >= 3600 else f"{seconds // 60}:{seconds % 60:02d}"


@contextmanager
def progress() -> Iterator[Any]:
    """Progress on stderr: a rich bar on a terminal, plain lines without one (``progress_style``)."""
    style = progress_style()
    if style == "lines":
        yield LineProgress()
        return
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    disable = style == "off"
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
