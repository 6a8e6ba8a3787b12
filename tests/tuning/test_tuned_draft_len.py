"""On a tuned bundle, τ and every label use the draft length the bundle serves at that batch size, not the
recipe's `build.max_draft_len` (issue 20, item 6). Through serve's `trtllm-serve` TEST DOUBLE
(tests/serving/fake_trtllm_serve.py), which drafts the `max_draft_len` of the options file it is given."""

from __future__ import annotations

import json

import yaml

from specconvert.manifest import read_manifest
from tests.bench.test_bench_servers import trtllm_bundle
from tests.serving.conftest import _cli, fake_trtllm_serve  # noqa: F401  (fixture)
from tests.tuning.test_build_uses_tune import _write_tune, converted  # noqa: F401  (fixture)


def test_serve_test_tau_on_a_tuned_trtllm_bundle_divides_by_the_served_chain(converted, fake_trtllm_serve,  # noqa: F811
                                                                            monkeypatch, capsys):
    """The recipe says 3, tune chose 2: Prometheus counts draft tokens, so steps = drafted / 2."""
    root, path = converted
    _write_tune(path, {1: 2, 4: 2, 16: 2})
    assert _cli("build", path, "--no-load") == 0
    options = yaml.safe_load((root / "work" / "engine" / "trtllm" / "llm_api_options.yaml").read_text())
    assert options["speculative_config"]["max_draft_len"] == 2
    assert read_manifest(root / "work" / "engine")["decisions"]["trtllm_drafting"].startswith("chain of 2")
    monkeypatch.setenv("FAKE_TRTLLM_MODE", "ok")
    monkeypatch.setenv("FAKE_TRTLLM_ITER_STATS", "0")  # no iteration stats: Prometheus, whose steps come from K
    capsys.readouterr()
    code = _cli("serve-test", path, "--json", "--set", "runtime.backend=trtllm", "--set", "serve_test.max_tokens=10",
                "--set", "serve_test.oracle.enabled=off", "--set", "serve_test.stream=false")
    report = json.loads(capsys.readouterr().out)
    assert code == 0, report
    summary = report["summary"]
    # the double's 10 tokens: prefill + 4 steps accepting 2, 1, 2, 0 of 2 drafts -> tau 1 + 5/4 (3 would give 2.875)
    assert summary["acceptance"]["source"].startswith("measured: trtllm prometheus")
    assert summary["acceptance_length"] == 2.25


def test_bench_labels_the_tuned_arm_with_the_chain_served_at_each_level(cli, tmp_path, fake_trtllm_serve):  # noqa: F811
    recipe = trtllm_bundle(tmp_path)
    data = yaml.safe_load(recipe.read_text())
    data["bench"] = {**data["bench"], "concurrency": [1, 4], "num_requests": 4, "fixed_draft_lens": []}
    recipe.write_text(yaml.safe_dump(data))
    manifest = tmp_path / "work" / "engine" / "manifest.json"
    manifest.write_text(json.dumps({"stage": "build", "fingerprint": "x", "decisions": {"tuned": {"trtllm": {
        "speculate": True, "max_draft_len": 2, "draft_len_schedule": {"2": 2, "16": 1},
        "draft_len_schedule_keys": "upper_bound"}}}}))
    result = cli("bench", recipe)
    assert result.code == 0, result.stderr
    report = json.loads((tmp_path / "work" / "bench" / "report.json").read_text())
    spec = next(a for a in report["arms"] if a["label"] == "speculative")
    assert spec["tuned"] is True and spec["draft_len"] == {"1": 2, "4": 1}  # the recipe's 3 nowhere
