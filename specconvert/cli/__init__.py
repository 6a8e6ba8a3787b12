"""The command line: thin commands over the stages; every error funnels through ``main``.

Typer stays behind this package (STYLE: keep it behind one small module); command
modules import nothing heavy at import time, so ``specconvert --help`` is fast.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import traceback
from typing import Any

import typer

try:  # typer >= 0.26 vendors its own click; older releases use the click package
    from typer._click.exceptions import ClickException as _ClickException
except ImportError:  # pragma: no cover - depends on the installed typer
    from click import ClickException as _ClickException

from ..errors import SpecConvertError

app = typer.Typer(
    name="specconvert",
    help="Hugging Face target + EAGLE-3 head -> a verified speculative-decoding deployment "
    "(TensorRT-LLM, vLLM, SGLang).\n\n"
    "\b\nPipeline, in order (each stage reads the one before from <workdir>/):\n"
    "  plan -> convert -> tune (optional) -> build -> serve-test -> bench\n"
    "Start from a shipped recipe: specconvert recipe list",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

from . import (  # noqa: E402  (registers commands)
    bench_cmd,
    build_cmd,
    convert_cmd,
    generate_cmd,
    inspect_cmd,
    plan_cmd,
    recipe_cmd,
    serve_cmd,
    tune_cmd,
)

# --help lists commands in the order they are registered: the pipeline first, in the order it runs,
# then the tools.
for _module in (plan_cmd, convert_cmd, tune_cmd, build_cmd, serve_cmd, bench_cmd):
    _module.register(app)
serve_cmd.register_serve(app)
generate_cmd.register(app)
inspect_cmd.register(app)
build_cmd.register_doctor(app)
recipe_cmd.register(app)


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        print(f"specconvert {__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks (also SPECCONVERT_DEBUG=1)."),
    version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                 help="Print the version and exit."),
) -> None:
    """specconvert: convert, build, serve-test and bench EAGLE-3 speculative decoding."""


def _debug_enabled(argv: list[str]) -> bool:
    return "--debug" in argv or os.environ.get("SPECCONVERT_DEBUG", "") not in ("", "0")


def _disk_problem(exc: BaseException) -> str | None:
    """A full or unwritable disk is the user's to fix (exit 2, README "Errors and exit codes"), not a crash."""
    import errno

    if not isinstance(exc, OSError):
        return None
    where = f" writing {exc.filename}" if exc.filename else ""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"no space left on the device{where} ({exc.strerror}). Fix: free space there, or set workdir on a larger disk"
    if exc.errno in (errno.EROFS, errno.EACCES):
        return f"cannot write{where} ({exc.strerror}). Fix: set workdir to a folder this user can write"
    return None


# True of every command: a stage is built in a staging folder that is removed on any
# exception (manifest.stage_dir), and cache files are written whole or healed on reading.
INTERRUPTED = "interrupted (Ctrl-C): nothing half-written was kept; finished stages and cached work are reused by the next run"


class _CtrlC:
    """Notes that SIGINT arrived, then behaves like Python's default handler.

    Typer catches KeyboardInterrupt inside the command and returns exit code 130 without
    a word, so ``main`` cannot see the exception; it sees this flag instead.
    """

    def __init__(self) -> None:
        self.seen = False
        self.previous: Any = None

    def __enter__(self) -> "_CtrlC":
        if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGINT) is signal.default_int_handler:
            self.previous = signal.signal(signal.SIGINT, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        self.seen = True
        raise KeyboardInterrupt

    def __exit__(self, *exc: Any) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGINT, self.previous)


def main(argv: list[str] | None = None) -> None:
    from .. import output

    argv = list(sys.argv[1:] if argv is None else argv)
    json_out = "--json" in argv
    if json_out:
        output.hold_json()  # one document on stdout, whatever happens: the report, the error, or both
    try:
        _main(argv, json_out)
    finally:
        if json_out:  # a SystemExit raised inside a command still gets its document out (no-op when written)
            output.finish_json()


def _main(argv: list[str], json_out: bool) -> None:
    from .. import output

    debug = _debug_enabled(argv)
    argv = [a for a in argv if a != "--debug"]

    def fail(message: str, code: int, fix: str | None = None, problems: list[str] | None = None) -> None:
        if json_out:
            output.finish_json({"error": message, "exit_code": code, "fix": fix, "problems": problems or []})
        sys.exit(code)

    try:
        with _CtrlC() as ctrl_c:
            # Without standalone mode, click returns a command's typer.Exit code instead of raising it.
            code = app(args=argv, prog_name="specconvert", standalone_mode=False)
        if code == 130:
            from ..workdir import TERMINATED

            if ctrl_c.seen or TERMINATED.is_set():
                line = INTERRUPTED if ctrl_c.seen else INTERRUPTED.replace("(Ctrl-C)", "(SIGTERM)")
                print(line, file=sys.stderr)
                fail(line, 130)
    except SpecConvertError as exc:
        if debug:
            traceback.print_exc()
        print(f"error: {exc.one_line()}", file=sys.stderr)
        for problem in exc.problems[1:]:
            print(f"  - {problem}", file=sys.stderr)
        fail(exc.message, exc.exit_code, exc.fix, exc.problems)
    except typer.Abort:
        print("aborted", file=sys.stderr)
        fail("aborted", 130)
    except typer.Exit as exc:
        if json_out:
            output.finish_json({"exit_code": exc.exit_code} if exc.exit_code else None)
        sys.exit(exc.exit_code)
    except _ClickException as exc:
        # Usage errors: wrong option, missing argument.
        exc.show(file=sys.stderr)
        fail(exc.format_message(), 2, "see `specconvert --help` and the command's --help")
    except KeyboardInterrupt:  # raised outside the command (Typer handles it inside)
        print(INTERRUPTED, file=sys.stderr)
        fail(INTERRUPTED, 130)
    except Exception as exc:  # the one place unexpected errors are summarised
        if debug:
            traceback.print_exc()
        disk = _disk_problem(exc)
        if disk:
            print(f"error: {disk}", file=sys.stderr)
            cause, _, fix = disk.partition(". Fix: ")
            fail(cause, 2, fix or None)
        print(
            f"error: unexpected {type(exc).__name__}: {exc}. Run again with --debug for the traceback",
            file=sys.stderr,
        )
        fail(f"unexpected {type(exc).__name__}: {exc}", 1, "run again with --debug for the traceback")
    code = code if isinstance(code, int) else 0
    if json_out:
        output.finish_json({"exit_code": code} if code else None)
    sys.exit(code)
