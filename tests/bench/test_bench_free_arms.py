"""bench.baselines: free-speculation arms (n-gram, suffix) beside the head and plain decoding, in one interleaved run.

On the vLLM TEST DOUBLE (tests/serving/fake_vllm.py), which counts n-gram drafts as vLLM 0.32 does: a step whose
lookup finds no match drafts nothing and is not counted, so the counters' tau (2) covers matching steps only while
the stream shows 1.5 tokens per step. The head's bundle is the tuned one of test_bench_arms (chain of 1 at batch 1).
"""

from __future__ import annotations

import json

import pytest
import yaml

from specconvert.bench.metrics import RequestRecord, lossless
from tests.bench.test_bench_arms import QUICK, _spec_config, tuned_bundle  # noqa: F401  (fixture)
from tests.serving.conftest import fake_vllm  # noqa: F401  (fixture)


@pytest.fixture(autouse=True)
def _room_for_every_server(monkeypatch):
    """runtime.vllm_servers: auto decides from the RAM available now: pin it, so the runs interleave whatever else
    this machine is doing (the RAM decision itself is tested in test_bench_arms)."""
    from specconvert.backends.vllm import memory

    monkeypatch.setattr(memory, "available_gib", lambda *a, **k: 64.0)


def _vllm(exe):
    return ["--set", "runtime.backend=vllm", "--set", f"runtime.vllm_python={exe}", "--set", "bench.fixed_draft_lens=[]"]


def test_ngram_arm_runs_beside_the_head_and_plain_decoding(cli, tuned_bundle, fake_vllm, tmp_path):  # noqa: F811
    root, path = tuned_bundle
    exe, log = fake_vllm
    out = tmp_path / "bench"
    result = cli("bench", path, *_vllm(exe), "--set", "bench.baselines=[ngram]", "--set", "bench.repeats=2",
                 "--out", out, *QUICK, "--set", "bench.num_requests=4")
    assert result.code == 0, result.stderr[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert [a["label"] for a in report["arms"]] == ["baseline", "ngram", "speculative"]
    assert report["arms"][1]["free"] is True and "prompt lookup" in report["arms"][1]["setting"]
    assert report["schedule"][:6] == ["baseline-c1-r0", "ngram-c1-r0", "speculative-c1-r0",
                                      "ngram-c1-r1", "speculative-c1-r1", "baseline-c1-r1"]
    by_name = {s["argv"][s["argv"].index("--served-model-name") + 1]: _spec_config(s) for s in
               map(json.loads, log.read_text().splitlines())}
    # the n-gram server: the target alone plus vLLM's ngram config, drafting as far as the head (build.max_draft_len 3)
    assert by_name["tiny-arms-ngram"] == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
                                          "prompt_lookup_min": 2}
    for level in report["levels"]:
        ngram = level["free"]["ngram"]
        assert ngram["draft_len"] == 3
        assert ngram["acceptance"]["measured_by"] == "measured: vllm counters"
        assert ngram["acceptance"]["acceptance_length"] == pytest.approx(2.0, abs=0.05)  # matching steps only
        assert ngram["acceptance"]["chunk_estimate"] == pytest.approx(1.5, abs=0.2)  # every step
        assert ngram["speedup"]["output_tokens_per_s"]["pairs"] == 2
        assert ngram["lossless"] == {"lossless": True, "compared": 8, "identical": 8, "divergences": []}
        assert level["lossless"]["lossless"] is True  # the head's arm gets the same check
        assert "fixed" not in level
    md = (out / "report.md").read_text()
    assert "### Arms side by side" in md
    rows = [line.split(" | ") for line in md.splitlines() if line.startswith("| 1 | ")]
    ngram_row = next(r for r in rows if r[1] == "ngram")
    assert float(ngram_row[2]) == pytest.approx(2.0, abs=0.05) and float(ngram_row[3]) == pytest.approx(1.5, abs=0.2), md
    assert ngram_row[-1] == "yes (8/8) |" and any(r[1] == "plain" for r in rows), md


def test_a_lossy_free_arm_is_reported_not_hidden(cli, tuned_bundle, fake_vllm, tmp_path, monkeypatch):  # noqa: F811
    root, path = tuned_bundle
    exe, _ = fake_vllm
    monkeypatch.setenv("FAKE_VLLM_LOSSY_METHOD", "ngram")
    out = tmp_path / "bench"
    result = cli("bench", path, *_vllm(exe), "--set", "bench.baselines=[ngram]", "--set", "bench.repeats=1",
                 "--set", "bench.concurrency=[1]", "--out", out, *QUICK)
    assert result.code == 0, result.stderr[-2000:]
    level = json.loads((out / "report.json").read_text())["levels"][0]
    same = level["free"]["ngram"]["lossless"]
    assert same["lossless"] is False and same["identical"] == 0 and same["divergences"][0]["position"] == 3
    assert level["lossless"]["lossless"] is True
    assert "**NO** (0/2; request 0 at token 3)" in (out / "report.md").read_text()


def test_suffix_without_arctic_inference_is_exit_3_before_any_server(cli, tuned_bundle, fake_vllm, tmp_path,  # noqa: F811
                                                                     monkeypatch):
    root, path = tuned_bundle
    exe, log = fake_vllm
    monkeypatch.setenv("FAKE_VLLM_NO_ARCTIC", "1")
    result = cli("bench", path, *_vllm(exe), "--set", "bench.baselines=[ngram,suffix]", "--out", tmp_path / "b", *QUICK)
    assert result.code == 3
    assert "arctic_inference.suffix_decoding" in result.stderr and "bench.baselines=[ngram]" in result.stderr
    assert not log.exists() and not (tmp_path / "b").exists()


@pytest.mark.parametrize("sets, message", [
    (["--set", "bench.baselines=[ngram]"], "reference server"),  # the recipe's backend: reference
    (["--set", "runtime.backend=trtllm", "--set", "bench.baselines=[suffix]"], "suffix decoding is vLLM's"),
    (["--url", "http://127.0.0.1:9", "--set", "bench.baselines=[ngram]"], "--url"),
], ids=["reference", "suffix-on-trtllm", "url"])
def test_arms_an_engine_cannot_serve_are_exit_2(cli, tuned_bundle, tmp_path, sets, message):  # noqa: F811
    root, path = tuned_bundle
    result = cli("bench", path, *sets, "--out", tmp_path / "b", *QUICK)
    assert result.code == 2, result.stderr[-1000:]
    assert message in result.stderr and not (tmp_path / "b").exists()


@pytest.mark.parametrize("value, message", [(["ngram", "ngram"], "twice"), (["eagle"], "baselines")])
def test_baselines_are_validated(cli, tmp_path, value, message):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "target": {"model": "m"}, "draft": {"init": "random"},
                                    "bench": {"baselines": value}}))
    result = cli("recipe", "validate", path)
    assert result.code == 2 and message in result.stderr


def test_ngram_window_must_be_ordered(cli, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "target": {"model": "m"}, "draft": {"init": "random"},
                                    "bench": {"ngram": {"prompt_lookup_min": 5, "prompt_lookup_max": 3}}}))
    result = cli("recipe", "validate", path)
    assert result.code == 2 and "prompt_lookup_min 5 must be <= prompt_lookup_max 3" in result.stderr


def _rec(index, ids, error=None):
    return RequestRecord(index=index, e2e_s=None if error else 1.0, token_ids=ids, error=error)


def test_lossless_pairs_requests_by_index_and_names_the_first_divergence():
    base = [_rec(0, [1, 2, 3]), _rec(1, [4, 5, 6]), _rec(2, [7], error="boom")]
    arm = [_rec(1, [4, 5, 9]), _rec(0, [1, 2, 3]), _rec(2, [7])]
    out = lossless([(base, arm)])
    assert out == {"lossless": False, "compared": 2, "identical": 1, "divergences": [{"request": 1, "position": 2}]}
    assert lossless([(base, arm)], temperature=0.7)["lossless"] is None
    assert lossless([([_rec(0, None)], [_rec(0, [1])])])["lossless"] is None
    # a shorter output that agrees so far diverges where it ends
    assert lossless([([_rec(0, [1, 2])], [_rec(0, [1])])])["divergences"] == [{"request": 0, "position": 1}]


def test_lossless_compares_chat_streams_that_open_with_a_role_only_chunk(cli, tuned_bundle, fake_vllm, tmp_path):  # noqa: F811
    """vLLM opens a streamed chat completion with a role-only chunk that carries no token_ids; the ids of the chunks
    after it are the output's, so the lossless check still compares (it compared nothing on real vLLM before)."""
    root, path = tuned_bundle
    exe, _ = fake_vllm
    out = tmp_path / "bench"
    quick_chat = [a if a != "bench.prompts=synthetic" else "bench.prompts=builtin:bench-smoke" for a in QUICK]
    result = cli("bench", path, *_vllm(exe), "--set", "bench.baselines=[ngram]", "--set", "bench.repeats=1",
                 "--set", "bench.concurrency=[1]", "--set", "bench.api=chat", "--out", out, *quick_chat)
    assert result.code == 0, result.stderr[-2000:]
    level = json.loads((out / "report.json").read_text())["levels"][0]
    assert level["free"]["ngram"]["lossless"]["compared"] == 2 and level["free"]["ngram"]["lossless"]["lossless"] is True


def _fake_trtllm(tmp_path, monkeypatch):
    import os
    import sys

    from tests.bench.test_bench_servers import SERVING

    bin_dir = tmp_path / "fake-bin"
    bin_dir.mkdir()
    exe = bin_dir / "trtllm-serve"
    exe.write_text(f"#!{sys.executable}\n" + (SERVING / "fake_trtllm_serve.py").read_text())
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_on_trtllm_the_ngram_arm_serves_builds_ngram_options(cli, tmp_path, monkeypatch):
    from tests.bench.test_bench_servers import trtllm_bundle

    recipe = trtllm_bundle(tmp_path)
    ngram = {"speculative_config": {"decoding_type": "NGram", "max_draft_len": 3, "max_matching_ngram_size": 4},
             "kv_cache_config": {"free_gpu_memory_fraction": 0.85}}
    (tmp_path / "work" / "engine" / "trtllm" / "ngram.yaml").write_text(yaml.safe_dump(ngram))
    _fake_trtllm(tmp_path, monkeypatch)
    result = cli("bench", recipe, "--set", "bench.baselines=[ngram]")
    assert result.code == 0, result.stderr
    out = tmp_path / "work" / "bench"
    report = json.loads((out / "report.json").read_text())
    assert [s["label"] for s in report["servers"]] == ["speculative", "baseline", "ngram"]
    served = yaml.safe_load((out / "ngram_options.yaml").read_text())
    assert served["speculative_config"]["decoding_type"] == "NGram"
    assert served["kv_cache_config"]["free_gpu_memory_fraction"] == pytest.approx(0.85 / 3, abs=1e-3)  # three share
    assert "ngram" in report["levels"][0]["free"]


def test_on_trtllm_a_bundle_built_without_the_arm_says_to_build(cli, tmp_path, monkeypatch):
    from tests.bench.test_bench_servers import trtllm_bundle

    recipe = trtllm_bundle(tmp_path)
    _fake_trtllm(tmp_path, monkeypatch)
    result = cli("bench", recipe, "--set", "bench.baselines=[ngram]")
    assert result.code == 2 and "ngram.yaml is missing" in result.stderr and "specconvert build" in result.stderr
