"""Nothing from a recipe or a path runs from a generated launch script (issue 11, item 5).

Each case builds a bundle with hostile values, then RUNS every emitted script against stub
executables placed first on PATH (trtllm-serve, trtllm-bench, vllm, python3, python,
sglang), which record their argv. Asserted: the hostile host is refused (exit 2, one
line, nothing written); no marker file is ever created; every stub received exactly the
intended argv, paths intact; comment lines stay comments.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from conftest import AUX_IDS, Project
from specconvert.recipe import BuildSpec

MARKER = "PWNED"
STUBS = ("trtllm-serve", "trtllm-bench", "vllm", "python3", "python", "sglang")

# Each would create MARKER if the text reached bash unquoted: as a word, inside double
# quotes, inside ${HOST:-...}, or after a newline in a comment.
HOSTILE_TEXT = {
    "dollar-paren": f"$(touch {MARKER})",
    "backticks": f"`touch {MARKER}`",
    "double-quotes": f'"; touch {MARKER}; "',
    "single-quotes": f"'; touch {MARKER}; '",
    "newline": f"x\ntouch {MARKER}\n#",
    "carriage-return": f"x\rtouch {MARKER}",
    "semicolon-glob": f"a;touch {MARKER};*",
    "variable": "${HOME}$IFS$(id)",
    "leading-dash": "--help",
    "unicode": "ünïcødé-модель",
}


def _write_stubs(bin_dir: Path) -> None:
    bin_dir.mkdir()
    # POSIX sh, so the stubs depend on nothing they shadow (python3 among them). One file per
    # call, NUL-separated, keeps every byte of every argument (newlines included).
    for name in STUBS:
        stub = bin_dir / name
        stub.write_text(f'#!/bin/sh\nprintf "%s\\0" {name} "$@" > "$STUB_LOG_DIR/$$.{name}"\n')
        stub.chmod(0o755)


def _run(script: Path, scratch: Path, bin_dir: Path, **env: str) -> list[str]:
    """Run one script with the stubs first on PATH; return the argv the stub received."""
    log_dir = scratch / "calls"
    log_dir.mkdir(exist_ok=True)
    for old in log_dir.iterdir():
        old.unlink()
    clean = {k: v for k, v in os.environ.items() if k not in ("HOST", "PORT", "OPTIONS", "REPORT")}
    clean.update(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", STUB_LOG_DIR=str(log_dir), **env)
    done = subprocess.run([str(script)], cwd=scratch, env=clean, capture_output=True, timeout=30)
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    calls = sorted(log_dir.iterdir())
    assert len(calls) == 1, f"{script} started {[c.name for c in calls]}"
    return calls[0].read_bytes().decode("utf-8", "surrogateescape").split("\0")[:-1]


def _no_marker(*roots: Path) -> None:
    for root in roots:
        found = [p for p in root.rglob(MARKER)]
        assert not found, f"a command ran from a generated script: {found}"


def _comments_stay_comments(script: Path) -> None:
    head = script.read_text(encoding="utf-8", errors="surrogateescape").split("set -euo pipefail")[0]
    for line in head.splitlines():
        assert line.startswith("#"), f"{script}: header line is not a comment: {line!r}"


def _hostile_project(tmp_path: Path, piece: str) -> Project:
    """Models and workdir under a folder named ``piece``: every path in the bundle carries it."""
    root = tmp_path / f"in {piece} dir"
    target, draft = root / "models" / f"target {piece}", root / "models" / f"draft {piece}"
    target.mkdir(parents=True)
    draft.mkdir(parents=True)
    (target / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "num_hidden_layers": 8}))
    (target / "model.safetensors").write_bytes(b"\0" * 64)
    (draft / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLMEagle3"], "draft_vocab_size": 64,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": AUX_IDS}}))
    (draft / "model.safetensors").write_bytes(b"\1" * 32)
    project = Project(tmp_path, tmp_path / "recipe.yaml", root / f"work {piece}", target, draft)
    recipe = yaml.safe_load(project.write_recipe().read_text())
    project.recipe_path.write_text(yaml.safe_dump({**recipe, "workdir": str(project.workdir)}, sort_keys=False))
    project.write_convert()
    return project


@pytest.fixture
def stubs(tmp_path):
    bin_dir = tmp_path / "stub-bin"
    _write_stubs(bin_dir)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    return bin_dir, scratch


@pytest.mark.parametrize("piece", list(HOSTILE_TEXT.values()), ids=list(HOSTILE_TEXT))
def test_hostile_paths_reach_every_engine_as_one_argument(tmp_path, cli, stubs, monkeypatch, piece):
    bin_dir, scratch = stubs
    monkeypatch.chdir(scratch)  # a `touch` run by build itself would land here
    project = _hostile_project(tmp_path, piece)
    result = cli("build", project.recipe_path, "--no-load")
    assert result.code == 0, result.err
    engine = project.engine
    target = str(project.target_dir)
    trt = engine / "trtllm"
    build = BuildSpec()

    for script in (trt / "serve.sh", trt / "bench.sh", engine / "vllm" / "serve.sh", engine / "sglang" / "serve.sh"):
        _comments_stay_comments(script)
        assert piece.splitlines()[0] in script.read_text(encoding="utf-8"), "the title names the paths"

    assert _run(trt / "serve.sh", scratch, bin_dir) == [
        "trtllm-serve", target, "--backend", "pytorch", "--host", "127.0.0.1", "--port", "8000",
        "--tp_size", "1", "--extra_llm_api_options", str(trt / "llm_api_options.yaml")]
    # The baseline variant and the documented overrides.
    assert _run(trt / "serve.sh", scratch, bin_dir, OPTIONS=str(trt / "baseline.yaml"), HOST="0.0.0.0", PORT="9123") == [
        "trtllm-serve", target, "--backend", "pytorch", "--host", "0.0.0.0", "--port", "9123",
        "--tp_size", "1", "--extra_llm_api_options", str(trt / "baseline.yaml")]

    assert _run(trt / "bench.sh", scratch, bin_dir) == [
        "trtllm-bench", "--model", target, "--model_path", target, "latency", "--dataset", str(trt / "dataset.jsonl"),
        "--extra_llm_api_options", str(trt / "llm_api_options.yaml"),
        "--report_json", str(scratch / "trtllm_bench_report.json")]
    report = str(scratch / f"base {piece}.json")
    assert _run(trt / "bench.sh", scratch, bin_dir, OPTIONS=str(trt / "baseline.yaml"), REPORT=report)[-4:] == [
        "--extra_llm_api_options", str(trt / "baseline.yaml"), "--report_json", report]

    # vLLM: checked by what it must receive, not by its exact spelling (engine/vllm owns that).
    argv = _run(engine / "vllm" / "serve.sh", scratch, bin_dir)
    assert argv[0] in ("vllm", "python3", "python") and target in argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1" and argv[argv.index("--port") + 1] == "8000"
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "eagle3", "model": str(engine / "vllm" / "draft"), "num_speculative_tokens": 3}

    shape = {"steps": 3, "topk": 1, "draft_tokens": 4}
    assert _run(engine / "sglang" / "serve.sh", scratch, bin_dir) == [
        "python3", "-m", "sglang.launch_server", "--model-path", target, "--host", "127.0.0.1", "--port", "8000",
        "--tp-size", "1", "--context-length", str(build.max_seq_len), "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", str(engine / "sglang" / "draft"),
        "--speculative-num-steps", str(shape["steps"]), "--speculative-eagle-topk", str(shape["topk"]),
        "--speculative-num-draft-tokens", str(shape["draft_tokens"])]
    _no_marker(tmp_path)


@pytest.mark.parametrize("host", [
    pytest.param(f"$(touch {MARKER})", id="dollar-paren"),
    pytest.param(f"`touch {MARKER}`", id="backticks"),
    pytest.param(f"127.0.0.1; touch {MARKER}", id="semicolon"),
    pytest.param(f"127.0.0.1\ntouch {MARKER}", id="newline"),
    pytest.param("127.0.0.1\n", id="trailing-newline"),
    pytest.param('127.0.0.1"', id="quote"),
    pytest.param("0.0.0.0 --evil", id="space"),
    pytest.param("-h", id="leading-dash"),
    pytest.param("[::1]", id="brackets"),
    pytest.param(f"fe80::1%$(touch {MARKER})", id="ipv6-scope-injection"),
    pytest.param("", id="empty"),
])
def test_hostile_host_is_refused_before_anything_is_written(project, cli, stubs, monkeypatch, host):
    monkeypatch.chdir(stubs[1])
    # JSON is YAML: the value reaches the schema byte for byte (a bare trailing newline would be stripped).
    result = cli("build", project.recipe_path, "--no-load", "--set", f"runtime.host={json.dumps(host)}")
    assert result.code == 2, result.err
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and "runtime.host" in lines[0] and "127.0.0.1" in lines[0], result.err
    assert not project.engine.exists()
    _no_marker(project.root)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "::1", "fe80::1%eth0", "localhost", "gpu-node-3.cluster.local"])
def test_addresses_and_hostnames_are_accepted(project, cli, stubs, host):
    bin_dir, scratch = stubs
    assert cli("build", project.recipe_path, "--no-load", "--set", f"runtime.host={json.dumps(host)}").code == 0
    for script in (project.engine / "trtllm" / "serve.sh", project.engine / "sglang" / "serve.sh"):
        argv = _run(script, scratch, bin_dir)
        assert argv[argv.index("--host") + 1] == host


@pytest.mark.parametrize("name", [f"x$(touch {MARKER})", "x\ntouch PWNED", "x y", "x`id`"],
                         ids=["dollar-paren", "newline", "space", "backticks"])
def test_hostile_recipe_name_is_refused(project, cli, name):
    result = cli("build", project.recipe_path, "--no-load", "--set", f"name={json.dumps(name)}")
    assert result.code == 2 and "name" in result.err
    assert not project.engine.exists()


@pytest.mark.parametrize("host", [HOSTILE_TEXT["dollar-paren"], HOSTILE_TEXT["backticks"], HOSTILE_TEXT["newline"],
                                  HOSTILE_TEXT["double-quotes"], "} $(touch PWNED) ${X"],
                         ids=["dollar-paren", "backticks", "newline", "double-quotes", "brace"])
def test_renderer_quotes_even_a_host_that_skipped_validation(tmp_path, stubs, host):
    """Second line of defence: a RuntimeSpec built without validation still cannot run anything."""
    from specconvert.backends import launch
    from specconvert.recipe import RuntimeSpec

    bin_dir, scratch = stubs
    runtime = RuntimeSpec.model_construct(host=host, port=8000)
    build = BuildSpec()
    title = f"title {host}"
    scripts = {
        "trtllm": launch.trtllm_serve("/models/target", build, runtime, title),
        "vllm": launch.vllm_serve("/models/target", "/models/draft", build, runtime, title),
        "sglang": launch.sglang_serve("/models/target", "/models/draft", build, runtime, title),
    }
    for name, text in scripts.items():
        path = tmp_path / f"{name}.sh"
        launch.write_executable(path, text)
        _comments_stay_comments(path)
        argv = _run(path, scratch, bin_dir)
        assert argv[argv.index("--host") + 1] == host, name
    _no_marker(tmp_path)


@pytest.mark.parametrize("text, expected", [
    ("plain ünïcødé", "plain ünïcødé"),
    ("a\nb", "a\\x0ab"),
    ("a\rb", "a\\x0db"),
    ("a\x00b", "a\\x00b"),
    ("a\u2028b", "a\\u2028b"),
    ("a\u202eb", "a\\u202eb"),  # right-to-left override: a comment that reads otherwise than bash does
], ids=["letters-kept", "newline", "carriage-return", "nul", "line-separator", "bidi-override"])
def test_comment_safe_escapes_what_could_end_or_disguise_a_comment(text, expected):
    from specconvert.backends.script import comment_safe

    assert comment_safe(text) == expected
