"""`specconvert serve` input errors, and the pieces serve-test and bench share (metrics, divergence, JUnit)."""

from __future__ import annotations

import yaml

from .conftest import occupied_port
from .junit_schema import validate


def _recipe(tmp_path, **extra):
    data = {"schema_version": 1, "name": "nobuild", "workdir": "work", "target": {"model": str(tmp_path / "t")},
            "draft": {"init": "random"}, **extra}
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_serve_without_a_bundle_says_to_run_build(tmp_path, cli):
    result = cli("serve", _recipe(tmp_path))
    assert result.code == 2
    assert "run `specconvert build RECIPE` first" in result.stderr and "Traceback" not in result.stderr


def test_serve_test_without_a_bundle_and_bad_keys(tmp_path, cli):
    path = _recipe(tmp_path)
    assert cli("serve-test", path).code == 2
    bad = cli("serve-test", path, "--set", "serve_test.max_token=3")
    assert bad.code == 2 and "did you mean 'serve_test.max_tokens'" in bad.stderr
    assert cli("serve-test", path, "--baseline-url", "http://127.0.0.1:1").code == 2


def test_serve_refuses_a_taken_port(project, cli):
    sock = occupied_port()
    try:
        result = cli("serve", project.recipe_path, "--port", str(sock.getsockname()[1]))
    finally:
        sock.close()
    assert result.code == 2 and "already in use" in result.stderr


def test_trtllm_perf_metrics_give_an_estimated_tau():
    from specconvert.serving.metrics import aggregate, request_stats

    entry = {"request_id": 3, "perf_metrics": {"first_iter": 1, "last_iter": 9, "speculative_decoding": {
        "acceptance_rate": 0.5, "total_accepted_draft_tokens": 6, "total_draft_tokens": 12}}}
    stats = request_stats(entry, max_draft_len=3)
    assert stats["steps"] == 4 and stats["acceptance_length"] == 2.5 and stats["estimated"]
    assert request_stats({"request_id": 1, "perf_metrics": {"first_iter": 1}}, 3) is None  # baseline: no block
    both = aggregate([stats, request_stats(entry, 3)])
    assert both["acceptance_length"] == 2.5 and both["per_position_acceptance"] is None and both["estimated"]


def test_first_divergence_by_token_and_by_character():
    from specconvert.serving.client import Completion
    from specconvert.serving.verdict import first_divergence

    def done(text, ids):
        return Completion(text, ids, "length", None, None, 0.1, 0.1, False)

    same = first_divergence(done("abc", [1, 2, 3]), done("abc", [1, 2, 3]))
    assert same is None
    div = first_divergence(done("abXd", [1, 2, 9, 4]), done("abcd", [1, 2, 3, 4]))
    assert div["token_index"] == 2 and div["speculative_tokens"] == [9, 4] and div["baseline_tokens"] == [3, 4]
    assert div["char_index"] == 2 and div["speculative_text"] == "Xd"
    shorter = first_divergence(done("ab", None), done("abc", None))
    assert shorter == {"char_index": 2, "speculative_text": "", "baseline_text": "c"}


def test_junit_escapes_model_output(tmp_path):
    from specconvert.serving import junit

    suite = junit.Suite("s")
    suite.add(junit.Case("prompt <1> & \"x\"", "s", 0.5, "failed", "diverged: \x1b[31m<tag>", "details \x00 & more"))
    suite.add(junit.Case("ok", "s"))
    path = tmp_path / "junit.xml"
    junit.write(path, [suite], "t")
    root = validate(path)
    failure = root.find("testsuite/testcase/failure")
    assert failure.get("message") == "diverged: [31m<tag>" and failure.text == "details  & more"
