"""Credentials through `specconvert convert` end to end: an unreachable `https://user:token@...` endpoint (or one whose
API key comes from `api_key_env`) exits 4 before the target loads, leaves nothing half-written, and the token appears
nowhere: stdout, stderr, any file under the workdir."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.training.test_convert_train import recipe, target  # noqa: F401  (the tiny target fixture)

TOKEN = "t0ken-s3cret-9f2c"


def _everything_under(folder: Path) -> str:
    text = ""
    for path in folder.rglob("*") if folder.exists() else []:
        if path.is_file():
            text += path.name + path.read_bytes().decode("utf-8", "replace")
    return text


@pytest.mark.parametrize("how", ["userinfo", "api_key_env"])
def test_an_unreachable_authenticated_endpoint_exits_4_and_the_token_is_nowhere(cli, tmp_path, target, monkeypatch, how):  # noqa: F811
    from specconvert.serving.process import free_port

    port = free_port()
    if how == "userinfo":
        synthesis = f"{{engine: url, urls: ['https://user:{TOKEN}@127.0.0.1:{port}'], retries: 0}}"
    else:
        monkeypatch.setenv("SYNTH_API_KEY", TOKEN)
        synthesis = f"{{engine: url, urls: ['https://127.0.0.1:{port}'], api_key_env: SYNTH_API_KEY, retries: 0}}"
    result = cli("convert", recipe(tmp_path, target, steps=2, extra=f"    synthesis: {synthesis}"), "--json")
    assert result.code == 4, result.stderr
    assert "not reachable" in result.stderr and "Traceback" not in result.stderr
    assert "load target" not in result.stderr  # the endpoint is asked before the target loads
    assert TOKEN not in result.stdout and TOKEN not in result.stderr
    workdir = tmp_path / "runs"
    assert TOKEN not in _everything_under(workdir)
    assert not list(workdir.rglob("manifest.json")) and not list(workdir.rglob("synthesis-*"))
