"""An oracle asked for must run or fail (issue 34 item 7): under `serve_test.oracle.enabled: on` every reason to skip
fails serve-test (exit 1, the reason in the check and the JUnit failure); under `auto` the same skip passes, with
the reason in the report and a JUnit skipped testcase. Through serve-test on the vLLM TEST DOUBLE
(tests/serving/fake_vllm.py); nothing is loaded in any of these cases."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from .test_oracle_setting import LLAMA_8B, edit_settings, serve_test_on_vllm

ORACLE_CHECK = "oracle: engine acceptance agrees with the reference decoder"


def _too_big(project, monkeypatch, tmp_path) -> tuple[list[str], str]:
    from specconvert.backends.vllm import memory

    big = tmp_path / "llama-8b"
    big.mkdir()
    (big / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **LLAMA_8B}))
    edit_settings(project, target_dir=str(big))
    monkeypatch.setattr(memory, "available_gib", lambda *a, **k: 16.0)  # a 16 GiB CI runner
    return [], "8.03 B target parameters"


def _no_gpu(project, monkeypatch, tmp_path) -> tuple[list[str], str]:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    return ["--set", "serve_test.oracle.device=cuda"], "no CUDA device is visible"


def _drafts_nothing_at_batch_1(project, monkeypatch, tmp_path) -> tuple[list[str], str]:
    """tune's vLLM schedule: 0 at batch 1, 3 above (the server still speculates at larger batches)."""
    manifest = project.root / "work" / "engine" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["decisions"]["tuned"] = {"vllm": {"speculate": True, "num_speculative_tokens": 3,
                                           "num_speculative_tokens_per_batch_size": [[1, 1, 0], [2, 8, 3]], "notes": []}}
    manifest.write_text(json.dumps(data))
    return [], "drafts nothing at batch 1"


def _tuned_off(project, monkeypatch, tmp_path) -> tuple[list[str], str]:
    """tune measured that speculation does not pay at batch 1: the bundle serves the target alone."""
    manifest = project.root / "work" / "engine" / "manifest.json"
    data = json.loads(manifest.read_text())
    data["decisions"]["tuned"] = {"vllm": {"speculate": False, "notes": []}}
    manifest.write_text(json.dumps(data))
    return [], "drafts nothing at batch 1"


REASONS = {"too-big": _too_big, "no-gpu": _no_gpu, "tuned-off": _tuned_off}


def _junit_case(project) -> ET.Element:
    root = ET.parse(project.root / "work" / "serve-test" / "junit.xml").getroot()
    return next(c for c in root.iter("testcase") if c.get("name") == ORACLE_CHECK)


@pytest.mark.parametrize("reason", list(REASONS))
@pytest.mark.parametrize("mode", ["on", "auto"])
def test_a_skipped_oracle_fails_when_asked_for_and_is_reported_under_auto(project, cli, fake_vllm, monkeypatch,
                                                                          tmp_path, mode, reason):
    from specconvert.serving import engine as serving_engine

    monkeypatch.setattr(serving_engine, "load_engine", lambda *a, **k: pytest.fail("the oracle loaded a model"))
    extra, said = REASONS[reason](project, monkeypatch, tmp_path)
    result = serve_test_on_vllm(project, cli, fake_vllm, "--set", f"serve_test.oracle.enabled={mode}", *extra)
    report = json.loads((project.root / "work" / "serve-test" / "report.json").read_text())
    oracle = report["oracle"]
    check = next(c for c in report["checks"] if c["name"] == ORACLE_CHECK)
    case = _junit_case(project)
    assert said in oracle["reason"] and oracle["status"] == "skipped"
    if mode == "on":
        assert result.code == 1, result.stderr[-2000:]
        assert oracle["passed"] is False and oracle["required"] is True
        assert check["passed"] is False and said in check["message"] and "enabled: on" in check["message"]
        assert "serve_test.oracle.enabled: auto" in check["fix"]
        assert report["status"] == "failed" and ORACLE_CHECK in result.stderr
        failure = case.find("failure")
        assert failure is not None and said in failure.get("message")
    else:
        assert result.code == 0, result.stderr[-2000:]
        assert oracle["passed"] is None and check["passed"] is None and check.get("skipped")
        assert said in check["message"]
        skipped = case.find("skipped")
        assert skipped is not None and said in skipped.get("message")


def test_a_schedule_drafting_0_at_batch_1_fails_the_oracle_asked_for(project, cli, fake_vllm, monkeypatch, tmp_path):
    """Only under `on`: with a vLLM schedule of 0 at batch 1 the acceptance check has no counters either (it fails
    under `auto` too), so `auto` would not show the oracle's own verdict."""
    extra, said = _drafts_nothing_at_batch_1(project, monkeypatch, tmp_path)
    result = serve_test_on_vllm(project, cli, fake_vllm, "--set", "serve_test.oracle.enabled=on", *extra)
    report = json.loads((project.root / "work" / "serve-test" / "report.json").read_text())
    check = next(c for c in report["checks"] if c["name"] == ORACLE_CHECK)
    assert result.code == 1 and check["passed"] is False and said in check["message"]
    assert report["oracle"]["required"] is True
