"""`specconvert inspect`: describe folders and judge a target/head pair."""

from __future__ import annotations

from tests.helpers.heads import write_head, write_target_config


def test_inspect_target_and_head_fit(cli, tmp_path):
    target = write_target_config(tmp_path / "target")
    head = write_head(tmp_path / "head", "eagle")
    result = cli("inspect", target, head, "--json")
    assert result.code == 0, result.stderr
    doc = result.json()
    kinds = [item["kind"] for item in doc["items"]]
    assert kinds == ["target", "head"]
    assert doc["fit"]["ok"] is True
    assert doc["items"][1]["layout"] == "eagle"


def test_inspect_reports_every_mismatch_and_exits_1(cli, tmp_path):
    target = write_target_config(tmp_path / "target")
    head = write_head(tmp_path / "head", "modelopt", hidden_size=32, target_hidden_size=32, vocab_size=300)
    result = cli("inspect", target, head, "--json")
    assert result.code == 1
    problems = result.json()["fit"]["problems"]
    errors = [p for p in problems if p["severity"] == "error"]
    assert len(errors) >= 2
    assert all(p["fix"] for p in errors)


def test_inspect_human_output_and_bad_path(cli, tmp_path):
    head = write_head(tmp_path / "head", "speculators")
    human = cli("inspect", head)
    assert human.code == 0 and "speculators" in human.stdout
    missing = cli("inspect", tmp_path / "nope")
    assert missing.code == 2 and "is not a folder" in missing.stderr
