"""CLI conventions a CI script relies on (issue 35): --version, one JSON document on failure, exit codes
in every pipeline command's --help, pipeline order, metavars that read as words, vLLM's bench flag names."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from specconvert import __version__

from ..conftest import REPO, write_recipe

PIPELINE = ["plan", "convert", "tune", "build", "serve-test", "bench"]


def test_version(cli):
    result = cli("--version")
    assert result.code == 0 and result.stdout.strip() == f"specconvert {__version__}"


def test_a_failure_under_json_prints_one_error_document_and_exits_2():
    """The issue's own check, through the real console entry point: stdout was empty."""
    proc = subprocess.run([sys.executable, "-m", "specconvert", "build", "/no/such.yaml", "--json"],
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    doc = json.loads(proc.stdout)  # one document, nothing else
    assert doc["exit_code"] == 2 and doc["kind"] == "error"
    assert "/no/such.yaml" in doc["error"] and "does not exist" in doc["error"]
    assert "recipe list" in doc["fix"]
    assert proc.stderr.startswith("error: ")


@pytest.mark.parametrize("args, code, words", [
    (["recipe", "validate", "{bad}", "--json"], 2, "did you mean 'target.dtype'"),
    (["convert", "--json"], 2, "Missing argument"),
    (["bench", "--json", "--url", "http://127.0.0.1:9", "--max-concurrency", "x"], 2, "--max-concurrency x"),
], ids=["bad recipe", "usage error", "bad bench flag"])
def test_every_failure_kind_under_json_is_one_document(cli, tmp_path, args, code, words):
    bad = write_recipe(tmp_path / "r.yaml", "name: x\ntarget:\n  model: a\n  dtyp: float32\ndraft:\n  init: random\n")
    result = cli(*[str(bad) if a == "{bad}" else a for a in args])
    assert result.code == code
    doc = json.loads(result.stdout)
    assert doc["exit_code"] == code and words in doc["error"] + " ".join(doc["problems"])
    assert set(doc) >= {"error", "exit_code", "fix"}


def test_a_report_and_its_failure_are_one_document(cli):
    """A gate that fails after the report was built adds its error to that document, not a second one."""
    import typer

    from specconvert import output
    from specconvert.cli import app
    from specconvert.errors import CheckFailed

    @app.command("reports-then-fails")
    def reports_then_fails(json_out: bool = typer.Option(False, "--json")) -> None:
        output.emit_json("demo", {"speedup": 0.9})
        raise CheckFailed("speedup gate failed", fix="see report.md")

    try:
        result = cli("reports-then-fails", "--json")
    finally:
        app.registered_commands.pop()
    assert result.code == 1
    doc = json.loads(result.stdout)
    assert doc["kind"] == "demo" and doc["speedup"] == 0.9
    assert doc["error"] == "speedup gate failed" and doc["exit_code"] == 1 and doc["fix"] == "see report.md"


@pytest.mark.parametrize("command", PIPELINE)
def test_every_pipeline_command_lists_its_exit_codes(cli, command):
    text = cli(command, "--help").stdout
    assert "Exit codes:" in text
    for code in ("0 ok", "1 ", "2 ", "3 environment missing", "4 "):
        assert f"\n    {code}" in text, (command, code)


def test_commands_are_listed_in_pipeline_order(cli):
    text = cli("--help").stdout
    listed = re.findall(r"^  ([a-z-]+)\s{2,}", text.split("Commands:")[1], re.MULTILINE)
    pipeline = [c for c in listed if c in PIPELINE]
    assert pipeline == PIPELINE
    assert listed.index("bench") < listed.index("serve") < listed.index("recipe")  # the tools after the pipeline


def _all_help_texts(cli) -> dict[str, str]:
    commands = PIPELINE + ["serve", "generate", "inspect", "doctor", "recipe list", "recipe new", "recipe validate",
                           "recipe show", "recipe schema"]
    return {c: cli(*c.split(), "--help").stdout for c in commands}


def test_metavars_read_as_words(cli):
    for command, text in _all_help_texts(cli).items():
        assert not re.search(r"<(str|int|float|path|list\[[a-z]+\])>", text), (command, text)
        assert "{" + "RECIPE" not in text and "{recipe}" not in text, command
    texts = _all_help_texts(cli)
    assert "Usage: specconvert convert [OPTIONS] RECIPE\n" in texts["convert"]
    assert "Usage: specconvert bench [OPTIONS] [RECIPE]\n" in texts["bench"]
    assert "--set KEY=VALUE" in texts["convert"]
    assert "PATH..." in texts["inspect"]


def test_serve_test_port_describes_serve_test(cli):
    text = cli("serve-test", "--help").stdout
    port = text[text.index("--port"):].split("\n  -", 1)[0]
    assert "serve-test starts" in port and "runtime.port" not in port
    serve_port = cli("serve", "--help").stdout
    assert "runtime.port" in serve_port[serve_port.index("--port"):]


@pytest.mark.parametrize("command", ["convert", "tune", "build", "serve-test", "bench"])
def test_json_and_out_are_spelled_alike(cli, command):
    text = cli(command, "--help").stdout
    assert "--json" in text and "on failure it carries `error`, `exit_code` and `fix`" in " ".join(text.split())
    if "--out" in text:
        assert "--out DIR" in text


def test_bench_takes_vllm_bench_serve_workload_flags():
    from specconvert.cli.bench_cmd import workload_overrides

    assert workload_overrides("1,4", 16, 64, True, 1.2) == [
        "bench.concurrency=[1, 4]", "bench.num_requests=16", "bench.max_tokens=64", "bench.ignore_eos=true",
        "bench.fail_below_speedup=1.2"]
    assert workload_overrides(None, None, None, False, None) == []


def test_bench_flags_reach_the_recipe_and_win_over_set(cli, monkeypatch):
    """The flags become bench.* settings, validated like --set (here seen in the spec the stage receives)."""
    from specconvert.stages import bench as bench_stage

    seen = {}

    def fake_run(spec, out_dir, base_dir, **options):
        seen["spec"] = spec
        raise SystemExit(0)

    monkeypatch.setattr(bench_stage, "run", fake_run)
    result = cli("bench", REPO / "recipes/smollm2-135m-eagle3-cpu.yaml", "--set", "bench.num_requests=3",
                 "--max-concurrency", "2", "--num-prompts", "5", "--max-tokens", "7", "--fail-below-speedup", "1.1")
    assert result.code == 0, result.stderr
    spec = seen["spec"]
    assert (spec.concurrency, spec.num_requests, spec.max_tokens, spec.fail_below_speedup) == ([2], 5, 7, 1.1)


def test_bench_help_says_which_concurrency_the_gate_checks(cli):
    text = " ".join(cli("bench", "--help").stdout.split())
    assert "--fail-below-speedup X" in text and "at any measured concurrency level" in text
    for flag in ("--max-concurrency", "--num-prompts", "--output-len, --max-tokens", "--ignore-eos"):
        assert flag in text


def test_a_document_is_never_left_held(cli, capsys):
    """A command that exits by SystemExit after its report still prints it, and nothing stays held for later."""
    import typer

    from specconvert import output
    from specconvert.cli import app

    @app.command("reports-then-exits")
    def reports_then_exits(json_out: bool = typer.Option(False, "--json")) -> None:
        output.emit_json("demo", {"n": 1})
        raise SystemExit(3)

    try:
        result = cli("reports-then-exits", "--json")
    finally:
        app.registered_commands.pop()
    assert result.code == 3 and json.loads(result.stdout)["n"] == 1
    output.emit_json("later", {})  # outside main: written at once
    assert json.loads(capsys.readouterr().out)["kind"] == "later"
