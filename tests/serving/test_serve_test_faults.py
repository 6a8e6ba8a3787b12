"""serve-test's TensorRT-LLM path and every server fault, through the `trtllm-serve` TEST DOUBLE.

Nothing here runs TensorRT-LLM: `fake_trtllm_serve.py` stands in for `trtllm-serve`
(see its docstring). What is real is serve-test's side: the command line built from
the bundle, the process group, the health deadline, the request deadlines, the
report, and the reaping, which each test checks in the process table.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from .conftest import assert_reaped, occupied_port
from .junit_schema import validate

TRT = ("--set", "runtime.backend=trtllm")


def _servers(argv_log):
    return [json.loads(line) for line in argv_log.read_text().splitlines()] if argv_log.exists() else []


def test_trtllm_path_serves_options_then_baseline_and_passes(project, cli, fake_trtllm_serve, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "ok")
    result = cli("serve-test", project.recipe_path, *TRT, "--json")
    assert result.code == 0, result.stderr[-2000:]
    report = result.json()
    servers = _servers(fake_trtllm_serve)
    assert len(servers) == 2
    spec_argv, base_argv = servers[0]["argv"], servers[1]["argv"]
    assert spec_argv[spec_argv.index("--extra_llm_api_options") + 1].endswith("trtllm/llm_api_options.yaml")
    assert base_argv[base_argv.index("--extra_llm_api_options") + 1].endswith("trtllm/baseline.yaml")
    for argv in (spec_argv, base_argv):
        assert argv[argv.index("--backend") + 1] == "pytorch" and argv[argv.index("--host") + 1] == "127.0.0.1"
        assert argv[argv.index("--tp_size") + 1] == "1"
    # Read where the bundle's line really serves it (tests/serving/test_trtllm_acceptance.py has every line):
    # the double's 10 tokens = prefill + 4 steps accepting 2, 1, 2, 0 of 3 drafts -> tau 1 + 5/4, exact steps.
    summary = report["summary"]
    assert summary["acceptance_length"] == 2.25 and not summary["acceptance_estimated"]
    assert summary["acceptance"]["source"].startswith("measured: trtllm iteration stats")
    assert summary["acceptance"]["trtllm_line"] == "1.4"
    assert report["summary"]["exact_match_fraction"] == 1.0
    assert_reaped([s["pid"] for s in servers])


def test_trtllm_lossy_output_reports_the_character_divergence(project, cli, fake_trtllm_serve, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "lossy")
    result = cli("serve-test", project.recipe_path, *TRT, "--json")
    assert result.code == 1
    rows = result.json()["prompts"]
    assert all(r["first_divergence"]["char_index"] == 3 and "token_index" not in r["first_divergence"] for r in rows)
    assert_reaped([s["pid"] for s in _servers(fake_trtllm_serve)])


def test_trtllm_serve_missing_is_environment_missing(project, cli, tmp_path, monkeypatch):
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    result = cli("serve-test", project.recipe_path, *TRT)
    assert result.code == 3
    assert "trtllm-serve" in result.stderr and "Fix:" in result.stderr and "Traceback" not in result.stderr


def test_port_taken_is_refused_before_starting_anything(project, cli, fake_trtllm_serve):
    sock = occupied_port()
    try:
        result = cli("serve-test", project.recipe_path, *TRT, "--port", str(sock.getsockname()[1]))
    finally:
        sock.close()
    assert result.code == 2 and "already in use" in result.stderr
    assert _servers(fake_trtllm_serve) == []


def test_server_exiting_during_startup_shows_its_log(project, cli, fake_trtllm_serve, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "exit_on_start")
    result = cli("serve-test", project.recipe_path, *TRT)
    assert result.code == 4
    assert "exited with code 3 during startup" in result.stderr
    assert "simulated failure while loading the engine" in result.stderr  # its last log lines
    assert "Traceback" not in result.stderr
    report = project.report()
    assert report["status"] == "error" and "simulated failure" in " ".join(report["servers"][0]["log_tail"])
    validate(project.out / "junit.xml")
    assert_reaped([s["pid"] for s in _servers(fake_trtllm_serve)])  # the grandchild `sleep` too


def test_health_that_never_comes_times_out(project, cli, fake_trtllm_serve, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "never_healthy")
    project.write(startup_timeout_s=2)
    started = time.monotonic()
    result = cli("serve-test", project.recipe_path, *TRT)
    assert result.code == 4 and "did not answer GET /health within 2 s" in result.stderr
    assert time.monotonic() - started < 40
    assert_reaped([s["pid"] for s in _servers(fake_trtllm_serve)])


def test_hanging_request_is_bounded_and_reported(project, cli, fake_trtllm_serve, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "hang")
    project.write(request_timeout_s=1.5)
    started = time.monotonic()
    result = cli("serve-test", project.recipe_path, *TRT, "--json")
    elapsed = time.monotonic() - started
    assert result.code == 1
    report = result.json()
    # One hung request per server stops that server's run: two timeouts, not one per prompt.
    assert elapsed < 30
    assert all("hung" in (s["error"] or "") for s in report["servers"]), report["servers"]
    assert any("no complete answer within 1.5 s" in e for r in report["prompts"] for e in r["errors"])
    assert_reaped([s["pid"] for s in _servers(fake_trtllm_serve)])


def test_server_dying_mid_run_is_reported_with_its_log(project, cli, fake_trtllm_serve, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "die_mid_run")
    result = cli("serve-test", project.recipe_path, *TRT, "--json")
    assert result.code == 1
    server = result.json()["servers"][0]
    assert server["died_mid_run"] and server["exit_code"] == 9
    assert any("illegal memory access" in line for line in server["log_tail"])
    stayed_up = next(c for c in result.json()["checks"] if c["name"].startswith("server stayed up"))
    assert not stayed_up["passed"] and "exited with code 9" in stayed_up["message"]
    assert_reaped([s["pid"] for s in _servers(fake_trtllm_serve)])


def test_malformed_responses_fail_cleanly(project, cli, fake_trtllm_serve, monkeypatch):
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "malformed")
    result = cli("serve-test", project.recipe_path, *TRT, "--json")
    assert result.code == 1 and "Traceback" not in result.stderr
    rows = result.json()["prompts"]
    assert all(any("not an OpenAI chat completion" in e or "not an OpenAI completion" in e for e in r["errors"])
               for r in rows)
    root = validate(project.out / "junit.xml")
    assert int(root.get("errors")) + int(root.get("failures")) >= len(rows)
    assert_reaped([s["pid"] for s in _servers(fake_trtllm_serve)])


def test_ctrl_c_stops_the_server_group(project, fake_trtllm_serve, tmp_path):
    """SIGINT to a running serve-test: exit 130, no server or grandchild left, no partial outputs."""
    env = {**os.environ, "FAKE_TRTLLM_MODE": "hang", "SPECCONVERT_DEBUG": "0"}
    project.write(request_timeout_s=60)
    from tests.helpers.signals import default_sigint

    proc = subprocess.Popen([sys.executable, "-m", "specconvert", "serve-test", str(project.recipe_path), *TRT],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint)
    try:
        deadline = time.monotonic() + 60
        while not _servers(fake_trtllm_serve) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.5)  # healthy and a request in flight
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err[-2000:]
    lines = [line for line in err.splitlines() if line.startswith("interrupted (Ctrl-C)")]
    assert len(lines) == 1 and "Traceback" not in err  # one line, from main(); the servers are reaped below
    assert_reaped([s["pid"] for s in _servers(fake_trtllm_serve)])
    assert not (project.out / "report.json").exists()
