"""`specconvert generate` through the real entry point on a tiny pair."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import EOS, hf_greedy, write_workdir


@pytest.fixture
def run_cli(cli):
    """The shared ``cli`` runner (tests/conftest.py), returning (code, stdout, stderr)."""

    def run(*args):
        result = cli(*args)
        return result.code, result.stdout, result.stderr

    return run


@pytest.fixture(scope="module")
def recipe(pair, tmp_path_factory):
    return write_workdir(tmp_path_factory.mktemp("cli"), pair, build={"max_draft_len": 3})


def test_generate_json_shape_and_tokens(run_cli, recipe, eagle_dec):
    code, out, err = run_cli("generate", recipe, "--prompt", "hello world", "--max-tokens", "12", "--json")
    assert code == 0, err
    doc = json.loads(out)
    assert doc["kind"] == "generate" and doc["schema_version"] == 1
    for key in ("prompt_token_ids", "token_ids", "text", "steps", "acceptance_length", "accepted_per_step",
                "tokens_per_second", "per_position_acceptance", "mode"):
        assert key in doc
    assert doc["mode"] == "chain-3" and doc["chat_template"] is False
    tok = eagle_dec.tokenizer
    assert doc["prompt_token_ids"] == tok("hello world")["input_ids"]
    assert doc["token_ids"] == hf_greedy(eagle_dec.target.model, doc["prompt_token_ids"], 12)
    assert doc["text"] == tok.decode(doc["token_ids"], skip_special_tokens=True)
    assert doc["steps"] == len(doc["accepted_per_step"]) and doc["acceptance_length"] >= 1.0
    assert err == ""  # --json: nothing but the document


def test_generate_streams_text_and_summary(run_cli, recipe):
    code, out, err = run_cli("generate", recipe, "--prompt", "abc", "--max-tokens", "8", "--temperature", "0.8", "--seed", "3")
    assert code == 0, err
    assert out.endswith("\n") and len(out.strip()) > 0
    assert "tau" in err and "tok/s" in err and "per-position acceptance" in err


def test_generate_baseline_and_tree_override(run_cli, recipe):
    code, out, _ = run_cli("generate", recipe, "--prompt", "abc", "--max-tokens", "10", "--baseline", "--json")
    base = json.loads(out)
    assert code == 0 and base["mode"] == "baseline" and base["accepted_per_step"] == []
    code, out, _ = run_cli("generate", recipe, "--prompt", "abc", "--max-tokens", "10", "--json",
                           "--set", "build.tree={top_k: 2, depth: 3, total_tokens: 6}")
    tree = json.loads(out)
    assert code == 0 and tree["mode"] == "tree" and tree["token_ids"] == base["token_ids"]


def test_missing_manifest_is_exit_2_one_line(run_cli, tmp_path, pair):
    recipe = write_workdir(tmp_path, pair)
    (tmp_path / "run" / "convert" / "manifest.json").unlink()
    code, out, err = run_cli("generate", recipe, "--prompt", "hi")
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "specconvert convert" in lines[0] and "Traceback" not in err


def test_incomplete_manifest_is_exit_2(run_cli, tmp_path, pair):
    recipe = write_workdir(tmp_path, pair)
    path = tmp_path / "run" / "convert" / "manifest.json"
    doc = json.loads(path.read_text())
    del doc["decisions"]
    path.write_text(json.dumps(doc))
    code, _, err = run_cli("generate", recipe, "--prompt", "hi")
    assert code == 2 and "aux_layer_ids" in err and "Traceback" not in err


def test_help_does_not_import_torch():
    code = "import sys; from specconvert.cli import main\ntry:\n    main(['generate', '--help'])\nexcept SystemExit:\n    pass\nprint('torch' in sys.modules)"
    repo = Path(__file__).resolve().parents[2]
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=repo,
                         env={"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"})
    assert res.stdout.strip().splitlines()[-1] == "False", res.stderr
    assert "--prompt" in res.stdout and "--baseline" in res.stdout


@pytest.mark.parametrize("args,expected", [
    (["--threads", "1"], {"setting": 1, "intra_op": 1}),
    (["--set", "runtime.threads=2"], {"setting": 2, "intra_op": 2}),
    (["--threads", "1", "--set", "runtime.threads=2"], {"setting": 1, "intra_op": 1}),
], ids=["option", "recipe", "option-beats-recipe"])
def test_generate_sets_torch_threads(run_cli, recipe, args, expected):
    import torch

    before = torch.get_num_threads()
    try:
        code, out, err = run_cli("generate", recipe, "--prompt", "abc", "--max-tokens", "4", "--json", *args)
        assert code == 0, err
        used = json.loads(out)["threads"]
        assert {k: used[k] for k in expected} == expected and torch.get_num_threads() == expected["intra_op"]
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("args,message", [
    (["--threads", "0"], "--threads 0: use auto or an integer >= 1"),
    (["--threads", "many"], "--threads many: use auto or an integer >= 1"),
    (["--set", "runtime.threads=0"], "runtime.threads"),
], ids=["zero", "word", "recipe-zero"])
def test_generate_refuses_bad_threads(run_cli, recipe, args, message):
    code, _, err = run_cli("generate", recipe, "--prompt", "abc", *args)
    assert code == 2 and message in err and "Traceback" not in err
