"""serve_test.min_acceptance_length_per_category: a tau floor per prompt category, checked on the vLLM TEST DOUBLE
(tests/serving/fake_vllm.py) whose acceptance is scripted per prompt word (FAKE_VLLM_ACCEPT_BY_WORD)."""

from __future__ import annotations

import json

PROMPTS = [
    {"id": "code-a", "category": "code", "messages": [{"role": "user", "content": "def add(a, b): finish it"}]},
    {"id": "code-b", "category": "code", "messages": [{"role": "user", "content": "def sub(a, b): finish it"}]},
    {"id": "fr", "category": "translation", "messages": [{"role": "user", "content": "Translate: good morning"}]},
]


def _run(project, cli, fake_vllm, monkeypatch, floors):
    exe, _ = fake_vllm
    monkeypatch.setenv("FAKE_VLLM_ACCEPT_BY_WORD", "def:2,Translate:0")
    prompts = project.root / "categories.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    project.write(prompts=str(prompts), min_acceptance_length_per_category=floors, oracle={"enabled": "off"})
    return cli("serve-test", project.recipe_path, "--set", "runtime.backend=vllm",
               "--set", f"runtime.vllm_python={exe}", "--json")


def test_a_category_below_its_floor_fails_and_the_others_pass(project, cli, fake_vllm, monkeypatch):
    result = _run(project, cli, fake_vllm, monkeypatch, {"code": 2.5, "translation": 1.5})
    report = result.json()
    checks = {c["name"]: c for c in report["checks"]}
    code, fr = checks["acceptance length >= 2.5 on category code"], checks["acceptance length >= 1.5 on category translation"]
    assert code["passed"] and code["value"] == 3.0  # chain of 3 accepting 2 per step
    assert fr["passed"] is False and fr["value"] == 1.0 and "translation" in fr["fix"]
    assert result.code == 1 and report["status"] == "failed"
    per = report["summary"]["acceptance_per_category"]
    assert per["code"]["requests"] == 2 and per["translation"]["acceptance_length"] == 1.0
    assert [r["category"] for r in report["prompts"]] == ["code", "code", "translation"]


def test_a_floor_for_a_category_no_prompt_has_is_exit_2(project, cli, fake_vllm, monkeypatch):
    exe, log = fake_vllm
    result = _run(project, cli, fake_vllm, monkeypatch, {"math": 2.0})
    assert result.code == 2 and "no prompt of" in result.stderr and "math" in result.stderr
    assert not log.exists()  # nothing started
