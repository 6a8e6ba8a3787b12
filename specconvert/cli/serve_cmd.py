"""`specconvert serve` (the reference OpenAI-compatible server) and `specconvert serve-test`."""

from __future__ import annotations

from typing import Optional

import typer
from typing_extensions import Annotated

from ._options import (Command, BaselineUrlOpt, JsonOpt, QuietOpt, RecipeArg, SetOpt, UrlOpt, VerifyOpt, exit_codes,
                       recipe_file, start)

HostOpt = Annotated[str, typer.Option("--host", metavar="ADDRESS", help="Address to bind (loopback unless you mean to expose it).")]
PortOpt = Annotated[Optional[int], typer.Option("--port", metavar="PORT", help="Port to listen on (default: runtime.port).",
                                                 show_default=False)]
TestPortOpt = Annotated[Optional[int], typer.Option(
    "--port", metavar="PORT", help="Port of the server serve-test starts (default: a free one).", show_default=False)]
ThreadsOpt = Annotated[Optional[str], typer.Option(
    "--threads", metavar="auto|N", help="CPU threads for torch: `auto` (the CPUs this process may use: affinity and cgroup quota) or "
    "an integer; inter-op threads 1. Default: runtime.threads. Use 1 on a shared, loaded machine.",
    show_default=False)]
DrafterOpt = Annotated[str, typer.Option(
    "--drafter", metavar="eagle|oracle", help="`eagle`: the bundle's head. `oracle`: the target's own greedy continuation as the draft "
    "(a plumbing check: maximum acceptance). Reference server only.")]


def serve(
    recipe: RecipeArg,
    set_: SetOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = None,
    model_name: Annotated[Optional[str], typer.Option("--model-name", metavar="NAME", help="Served model id (default: the recipe name); "
                                                      "`<id>-baseline` serves the target without speculation.",
                                                      show_default=False)] = None,
    drafter: DrafterOpt = "eagle",
    threads: ThreadsOpt = None,
    draft_len: Annotated[Optional[int], typer.Option(
        "--draft-len", min=1, max=16, metavar="N", help="Serve a fixed chain of N drafted tokens instead of the bundle's setting "
        "(tuned or the recipe's); bench starts such servers for its `fixed-kN` arms.", show_default=False)] = None,
    quiet: QuietOpt = False,
) -> None:
    """Serve the bundle's reference EAGLE-3 decoder over an OpenAI-compatible HTTP API (reads <workdir>/engine/)."""
    from .. import output
    from ..errors import InputError
    from ..manifest import require_current_engine
    from ..serving.engine import load_engine, reference_settings
    from ..serving.process import port_in_use

    loaded = start(recipe, set_, quiet=quiet)
    setting = threads_setting(threads, loaded)
    if drafter not in ("eagle", "oracle"):
        raise InputError(f"--drafter {drafter}: unknown", fix="use eagle or oracle")
    engine_dir = loaded.workdir_path / "engine"
    reference_settings(engine_dir)  # InputError "run build first" before anything slow
    require_current_engine(loaded.workdir_path)  # never serve a bundle built from an older convert
    port = port if port is not None else loaded.runtime.port
    if port_in_use(host, port):
        raise InputError(f"port {port} on {host} is already in use", fix="pass --port with a free port, or stop the other server")
    if loaded.runtime.backend == "trtllm":
        output.warn(f"runtime.backend is trtllm: this serves the reference decoder; TensorRT-LLM: {engine_dir}/trtllm/serve.sh")
    from ..serving.app import create_app, serve as run_server

    name = model_name or loaded.name
    output.log(f"serve: loading the reference decoder from {engine_dir}")
    chosen = apply_threads(setting)
    output.log(f"serve: torch threads {chosen['intra_op']} intra-op, {chosen['inter_op']} inter-op "
               f"(threads: {chosen['setting']})")
    with output.libraries_to_stderr():
        engine = load_engine(engine_dir, name, device=loaded.runtime.device, drafter=drafter, draft_len=draft_len)
    output.log(f"serve: http://{host}:{port}  models: {engine.model_name} (speculative, {drafter}), "
               f"{engine.baseline_name} (no speculation); device {engine.description.get('device')}")
    try:
        run_server(create_app(engine, max_model_len=loaded.build.max_seq_len), host, port)
    finally:
        engine.close()


def threads_setting(option: str | None, loaded) -> int | str:
    """``--threads`` if given, else the recipe's ``runtime.threads`` (checked before anything loads)."""
    from ..errors import InputError
    from ..threads import parse_option

    try:
        setting = parse_option(option)
    except ValueError as exc:
        raise InputError(str(exc), fix="pass --threads auto or --threads N with N >= 1") from None
    return loaded.runtime.threads if setting is None else setting


def apply_threads(setting: int | str) -> dict:
    """Set torch's threads (imports torch: call where the command is about to load a model)."""
    from ..threads import apply

    return apply(setting)


def serve_test(
    recipe: RecipeArg,
    set_: SetOpt = None,
    url: UrlOpt = None,
    baseline_url: BaselineUrlOpt = None,
    port: TestPortOpt = None,
    drafter: DrafterOpt = "eagle",
    json_out: JsonOpt = False,
    quiet: QuietOpt = False,
    verify: VerifyOpt = False,
) -> None:
    """Start the recipe's server, compare speculative with baseline output, check acceptance; stop every child.

    Writes <workdir>/serve-test/{report.json, junit.xml, transcripts.jsonl}.
    """
    from .. import output
    from ..errors import CheckFailed, ExternalFailure
    from ..stages import serve_test as stage

    loaded = start(recipe, set_, json_out, quiet)
    # Ctrl-C: every server started is stopped on the way out, and main() prints the one line.
    result = stage.run(loaded, recipe_file(recipe), set_ or [], url=url, baseline_url=baseline_url, port=port, drafter=drafter,
                       verify=verify)
    report = result.report
    if json_out:
        output.emit_json("serve-test", report)
    else:
        _print_summary(report)
    failed = [c for c in report["checks"] if c["passed"] is False]  # None: skipped, nothing to judge
    if report["status"] == "error":
        first = failed[0]
        raise ExternalFailure(f"serve-test: {first['name']}: {first['message']}",
                              fix=f"see {result.out_dir / 'report.json'} and the server log there")
    if failed:
        raise CheckFailed(f"serve-test: {len(failed)} check{'s' if len(failed) > 1 else ''} failed: "
                          + "; ".join(c["name"] for c in failed),
                          fix=failed[0].get("fix") or f"see {result.out_dir / 'report.json'}")


def _print_summary(report: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False, soft_wrap=True)
    table = Table(title=f"specconvert serve-test: {report['status']}", title_justify="left")
    for column in ("prompt", "exact", "first divergence", "tau", "latency spec / base (s)", "stream"):
        table.add_column(column)
    for row in report["prompts"]:
        div = row["first_divergence"]
        where = "" if not div else (f"token {div['token_index']}" if "token_index" in div else f"char {div['char_index']}")
        if row["errors"]:
            where = (where + "; " if where else "") + row["errors"][0][:80]
        lat = row["latency_s"]
        table.add_row(row["id"], "✓" if row["exact_match"] else "✗", where,
                      "-" if row["acceptance_length"] is None else f"{row['acceptance_length']:.2f}",
                      f"{lat.get('speculative', '-')} / {lat.get('baseline', '-')}",
                      {True: "✓", False: "✗", None: "-"}[row["stream_matches"]])
    console.print(table)
    checks = Table(show_header=False, title="checks", title_justify="left")
    checks.add_column("")
    checks.add_column("check")
    checks.add_column("detail")
    for c in report["checks"]:
        checks.add_row("✓" if c["passed"] else "✗", c["name"], c["message"])
    console.print(checks)
    s = report["summary"]
    console.print(f"exact match {s['exact_match']}/{s['prompts']}, tau {s['acceptance_length']}, "
                  f"per position {s['per_position_acceptance']}, report {report['files']['report.json']}")


EXIT_CODES = exit_codes(one="a check failed: output differs from the baseline, acceptance below "
                        "serve_test.min_acceptance_length, the oracle disagrees", four="the server did not start or died")


def register(app: typer.Typer) -> None:
    app.command("serve-test", epilog=EXIT_CODES, cls=Command)(serve_test)


def register_serve(app: typer.Typer) -> None:
    app.command("serve", cls=Command)(serve)
