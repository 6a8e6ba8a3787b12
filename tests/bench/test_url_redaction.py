"""Passwords in `--url` never reach a report, a manifest or the terminal (issue 11, item 21).

Through the real `bench --url` and `serve-test --url` code paths, against the stand-in
server: the client still sends the credentials (the endpoint is reached), every file the
stage writes and everything printed shows ``***@`` instead.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from specconvert.serving.urls import redact_url

from .conftest import FAST

SECRET = "s3cr3t-pa55"


def _with_credentials(url: str, user: str = "alice", password: str = SECRET) -> str:
    return url.replace("http://", f"http://{user}:{password}@", 1)


def _nothing_leaks(root: Path, *texts: str) -> None:
    for path in [p for p in root.rglob("*") if p.is_file()]:
        assert SECRET.encode() not in path.read_bytes(), f"{path} holds the password"
    for text in texts:
        assert SECRET not in text


@pytest.mark.parametrize("url, expected", [
    ("http://alice:pw@host:8000/v1", "http://***@host:8000/v1"),
    ("https://token@host", "https://***@host"),
    ("http://alice:p@ss@host:1", "http://***@host:1"),          # an unencoded @ in the password
    ("http://alice:pa/ss@host:1", "http://***@host:1"),         # an unencoded / in the password
    ("alice:pw@host:8000", "***@host:8000"),                    # no scheme
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
    ("http://[::1]:8000/v1", "http://[::1]:8000/v1"),
    (None, None),
], ids=["user-password", "token", "at-in-password", "slash-in-password", "no-scheme", "plain", "ipv6", "none"])
def test_redact_url(url, expected):
    assert redact_url(url) == expected


def test_bench_url_with_password_is_redacted_everywhere(cli, standin, tmp_path):
    out = tmp_path / "bench"
    url = _with_credentials(standin.url)
    result = cli("bench", "--url", url, "--baseline-url", url, "--out", out, *FAST, "--set", "bench.concurrency=[1]",
                 "--json")
    assert result.code == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["endpoints"]["speculative"]["url"] == f"http://***@127.0.0.1:{standin.port}"
    assert report["failed_requests"] == 0  # the credentials were used: the endpoint answered
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["inputs"]["url"] == manifest["inputs"]["baseline_url"] == f"http://***@127.0.0.1:{standin.port}"
    _nothing_leaks(out, result.stdout, result.stderr)


def test_serve_test_url_with_password_is_redacted_everywhere(cli, standin, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "redact", "workdir": str(tmp_path / "work"),
                                      "target": {"model": "unused"}, "draft": {"init": "random"},
                                      "serve_test": {"startup_timeout_s": 5}}))
    url = _with_credentials(standin.url)
    result = cli("serve-test", recipe, "--url", url, "--baseline-url", url)
    # The stand-in is not a model, so checks may fail; what matters here is what gets written.
    assert result.code in (0, 1), result.stderr
    out = tmp_path / "work" / "serve-test"
    report = json.loads((out / "report.json").read_text())
    redacted = f"http://***@127.0.0.1:{standin.port}"
    assert report["url"] == report["baseline_url"] == redacted
    assert {s["url"] for s in report["servers"]} == {redacted}
    _nothing_leaks(out, result.stdout, result.stderr)


def test_serve_test_unreachable_url_error_is_redacted(cli, tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump({"name": "redact", "workdir": str(tmp_path / "work"),
                                      "target": {"model": "unused"}, "draft": {"init": "random"},
                                      "serve_test": {"startup_timeout_s": 1}}))
    result = cli("serve-test", recipe, "--url", f"http://alice:{SECRET}@127.0.0.1:9")  # port 9: nothing listens
    assert result.code != 0
    out = tmp_path / "work" / "serve-test"
    report = json.loads((out / "report.json").read_text())
    assert "http://***@127.0.0.1:9/health" in report["servers"][0]["error"]
    _nothing_leaks(out, result.stdout, result.stderr)
