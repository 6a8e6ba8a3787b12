"""The CLI surface: fast start, exit codes, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import REPO, write_recipe


def test_help_imports_no_heavy_package():
    code = (
        "import sys; from specconvert.cli import app; import typer.main as tm; "
        "cmd = tm.get_command(app); "
        "heavy = [m for m in ('torch', 'transformers', 'modelopt', 'tensorrt_llm') if m in sys.modules]; "
        "print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_help_and_validate_subprocess_leave_heavy_modules_out():
    code = (
        "import sys; from specconvert.cli import main\n"
        "try:\n    main(['recipe', 'validate', 'recipes/smollm2-135m-eagle3-cpu.yaml'])\n"
        "except SystemExit:\n    pass\n"
        "print([m for m in ('torch', 'transformers', 'modelopt') if m in sys.modules], file=sys.stderr)"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert proc.stderr.strip().splitlines()[-1] == "[]"
    assert "valid recipe" in proc.stdout


def test_validate_ok_and_json(cli):
    result = cli("recipe", "validate", REPO / "recipes/smollm2-135m-eagle3-cpu.yaml", "--json")
    assert result.code == 0
    doc = result.json()
    assert doc["kind"] == "recipe.validate" and doc["valid"] is True
    assert doc["recipe"]["target"]["dtype"] == "float32"


def test_bad_recipe_exits_2_with_one_line_and_no_traceback(cli, tmp_path):
    path = write_recipe(tmp_path / "r.yaml", "name: x\ntarget:\n  model: a\n  dtyp: float32\ndraft:\n  init: random\n")
    result = cli("recipe", "validate", path)
    assert result.code == 2
    assert result.stderr.startswith("error: ")
    assert "did you mean 'target.dtype'" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_usage_error_exits_2(cli):
    result = cli("convert")
    assert result.code == 2
    assert "Missing argument" in result.stderr


def test_schema_command_prints_json_schema(cli):
    result = cli("recipe", "schema")
    assert result.code == 0
    schema = json.loads(result.stdout)
    assert "draft" in schema["properties"]
    assert schema["$defs"]["DraftSpec"]["properties"]["aux_layer_convention"]["description"]


def test_unexpected_error_is_one_line_unless_debug(monkeypatch, capsys):
    from specconvert import cli as cli_module

    def boom(*a, **k):
        raise RuntimeError("kaput")

    monkeypatch.setattr(cli_module, "app", boom)
    monkeypatch.setenv("SPECCONVERT_DEBUG", "0")
    try:
        cli_module.main(["recipe", "schema"])
    except SystemExit as exc:
        assert exc.code == 1
    err = capsys.readouterr().err
    assert "unexpected RuntimeError: kaput" in err and "Traceback" not in err
    try:
        cli_module.main(["--debug", "recipe", "schema"])
    except SystemExit:
        pass
    assert "Traceback" in capsys.readouterr().err


def test_a_duplicate_recipe_key_exits_2_naming_both_lines(cli, tmp_path):
    text = "name: x\ntarget:\n  model: a\ndraft:\n  model: ./real-head\ndraft:\n  init: random\n"
    result = cli("recipe", "validate", write_recipe(tmp_path / "r.yaml", text))
    assert result.code == 2 and result.stdout == "" and "Traceback" not in result.stderr
    assert result.stderr.splitlines()[0].startswith("error: ") and "duplicate key 'draft' at line 6 (first at line 4)" in result.stderr


def test_ctrl_c_exits_130_with_one_line(tmp_path):
    """Typer swallowed KeyboardInterrupt into a silent exit 130: the user saw nothing."""
    import signal
    import time

    code = (
        "import time\n"
        "from specconvert.cli import app, main\n"
        "@app.command('sleepy')\n"
        "def sleepy():\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(60)\n"
        "main(['sleepy'])\n"
    )
    from tests.helpers.signals import default_sigint

    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                            preexec_fn=default_sigint)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 130
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted (Ctrl-C): nothing half-written was kept"), err
