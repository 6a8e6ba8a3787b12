"""`specconvert tune` on a tiny converted pair: every candidate runs, the table and schedules are written,
a head that accepts nothing turns speculation off for every engine, and a rerun is skipped."""

from __future__ import annotations

import json

import pytest

from tests.serving.conftest import _cli, fake_vllm  # noqa: F401  (fixture)


@pytest.fixture(scope="module")
def tiny_recipe(tmp_path_factory):
    from tests.helpers.tune import write_tiny_tune_recipe

    root = tmp_path_factory.mktemp("tune")
    path, _ = write_tiny_tune_recipe(root, "tiny-tune", {"backend": "reference", "device": "cpu", "trtllm_version": "1.4"},
                                     {"concurrency": [1, 4]})
    assert _cli("convert", path) == 0
    return root, path


def test_tune_measures_every_candidate_and_turns_off_a_useless_head(tiny_recipe, capsys):
    root, path = tiny_recipe
    assert _cli("tune", path, "--json") == 0
    out = json.loads(capsys.readouterr().out)
    report = json.loads((root / "work" / "tune" / "report.json").read_text())
    # Every (draft length, level) has a prediction and a measurement.
    cells = {(r["draft_len"], r["concurrency"]) for r in report["table"]}
    assert cells == {(k, b) for k in (0, 1, 2) for b in (1, 4)}
    assert all(r["measured_tokens_per_second"] > 0 and r["predicted_tokens_per_second"] > 0 for r in report["table"])
    assert all(m["identical_to_plain"] for m in report["measurements"])
    # A random head accepts (almost) nothing: nowhere does drafting pay, so every engine serves plain.
    assert report["per_position_acceptance"][0] < 0.2
    assert report["choice"] == {"1": 0, "4": 0}
    # the manifest holds the measurement; each engine's form is build's to derive (previewed in the report)
    assert "schedules" not in out["manifest"] and out["manifest"]["measured"]["tokens_per_second"]
    schedules = report["engine_forms_preview"]
    assert not schedules["vllm"]["speculate"] and not schedules["trtllm"]["speculate"]
    assert not schedules["sglang"]["speculate"] and not schedules["reference"]["speculate"]
    assert any("does not pay" in line for line in report["verdict"])
    assert "| concurrency | draft length |" in (root / "work" / "tune" / "report.md").read_text()


def test_rerun_is_skipped(tiny_recipe, capsys):
    _, path = tiny_recipe
    assert _cli("tune", path, "--json") == 0
    capsys.readouterr()
    assert _cli("tune", path, "--json") == 0
    assert json.loads(capsys.readouterr().out)["skipped"] is True


def test_tune_on_trtllm_without_tensorrt_llm_is_an_environment_missing(tiny_recipe, monkeypatch):
    """exit 3 (the install route: tests/tuning/test_tune_trtllm.py), no longer exit 2 "cannot run here"."""
    import sys

    monkeypatch.setitem(sys.modules, "tensorrt_llm", None)
    _, path = tiny_recipe
    assert _cli("tune", path, "--set", "runtime.backend=trtllm") == 3


@pytest.mark.parametrize("ram_gib", [64.0, 1.0])
def test_tune_on_vllm_runs_one_server_per_length_and_reads_its_counters(tiny_recipe, fake_vllm, monkeypatch, capsys,  # noqa: F811
                                                                         ram_gib):
    """Through the vLLM TEST DOUBLE (tests/serving/fake_vllm.py): a chain accepts up to 2 drafts (tau 2 for k=1, 3 above).
    With RAM for every server they run together; without it (runtime.vllm_servers: auto) one at a time, said so."""
    from specconvert.backends.vllm import memory
    from tests.serving.conftest import assert_reaped

    root, path = tiny_recipe
    exe, log = fake_vllm
    monkeypatch.setattr(memory, "available_gib", lambda *a, **k: ram_gib)
    capsys.readouterr()
    assert _cli("tune", path, "--force", "--set", "runtime.backend=vllm", "--set", f"runtime.vllm_python={exe}",
                "--set", "runtime.vllm_threads=1", "--set", "tune.max_tokens=10", "--json") == 0
    report = json.loads((root / "work" / "tune" / "report.json").read_text())
    together = ram_gib > 10
    assert ("one server at a time" in report["runtime_note"]) is not together
    assert ("drift between the candidates is not cancelled" in capsys.readouterr().err) is not together
    starts = {a[a.index("--served-model-name") + 1]: a for a in
              (json.loads(line)["argv"] for line in log.read_text().splitlines())}
    configs = {name: json.loads(a[a.index("--speculative-config") + 1]) if "--speculative-config" in a else None
               for name, a in starts.items()}
    # one server per candidate (k = 0 without a draft), and the drafter loaded with its schedule at 0 everywhere
    assert sorted(configs) == ["tiny-tune-k0", "tiny-tune-k0-drafter", "tiny-tune-k1", "tiny-tune-k2"]
    assert configs["tiny-tune-k0"] is None and configs["tiny-tune-k2"]["num_speculative_tokens"] == 2
    assert configs["tiny-tune-k0-drafter"]["num_speculative_tokens_per_batch_size"] == [[1, 16, 0]]
    idle = report["vllm_drafter_idle"]
    assert set(idle) == {"1", "4"} and all(m["acceptance_length"] == 1.0 for m in idle.values())
    assert set(report["vllm_choice"]) == set(report["choice"])
    assert_reaped([s["pid"] for s in report["servers"]])
    tau = {(r["draft_len"], r["concurrency"]): r["measured_tokens_per_step"] for r in report["table"]}
    # 10 tokens: the prefill's, then k=1 emits 2,2,2,2,1 (9 in 5 steps) and k=2 emits 3,3,3 (9 in 3 steps)
    assert tau[(0, 1)] == pytest.approx(1.0) and tau[(1, 4)] == pytest.approx(1.8) and tau[(2, 1)] == pytest.approx(3.0)
    assert report["per_position_acceptance"] == pytest.approx([1.0, 1.0])
    assert report["runtime"] == "vllm" and set(report["choice"]) == {"1", "4"}
    # lossless evidence: compared token by token with plain decoding at concurrency 1 (not compared when batched)
    same = {(m["draft_len"], m["concurrency"]): m["identical_to_plain"] for m in report["measurements"]}
    assert same == {(0, 1): True, (0, 4): True, (1, 1): True, (1, 4): None, (2, 1): True, (2, 4): None}
    assert all(m["identical_to_plain"] for m in idle.values() if m["concurrency"] == 1)


def test_tune_on_vllm_fails_when_a_length_changes_the_greedy_output(tiny_recipe, fake_vllm, monkeypatch,  # noqa: F811
                                                                     capsys):
    """The vLLM TEST DOUBLE's k=2 server streams token id 3 changed: tune compares token ids with plain
    decoding's on the same prompts, and stops (exit 1) naming the length, the prompt and the token."""
    from specconvert.backends.vllm import memory

    root, path = tiny_recipe
    exe, _ = fake_vllm
    monkeypatch.setattr(memory, "available_gib", lambda *a, **k: 64.0)
    monkeypatch.setenv("FAKE_VLLM_LOSSY_K", "2")
    capsys.readouterr()
    code = _cli("tune", path, "--force", "--set", "runtime.backend=vllm", "--set", f"runtime.vllm_python={exe}",
                "--set", "runtime.vllm_threads=1", "--set", "tune.max_tokens=10")
    err = capsys.readouterr().err
    assert code == 1, err[-2000:]
    assert "draft length 2, concurrency 1" in err and "prompt 0 at output token 3" in err
    # asked again for its logprobs there, the plain server led by 3 nats (FAKE_VLLM_TIE_MARGIN's default): no tie
    assert "led by 3 nats there" in err
    # serve_test.lossless.mode: off compares nothing, in tune as in serve-test
    assert _cli("tune", path, "--force", "--set", "runtime.backend=vllm", "--set", f"runtime.vllm_python={exe}",
                "--set", "runtime.vllm_threads=1", "--set", "tune.max_tokens=10",
                "--set", "serve_test.lossless.mode=off") == 0, capsys.readouterr().err[-2000:]
    report = json.loads((root / "work" / "tune" / "report.json").read_text())
    assert report["lossless"]["compared"] is False
    assert all(m["identical_to_plain"] is None for m in report["measurements"])


@pytest.mark.parametrize("servers", ["together", "one"])
def test_tune_on_vllm_passes_a_numerical_tie_and_reports_it(tiny_recipe, fake_vllm, monkeypatch, capsys,  # noqa: F811
                                                             servers):
    """The k=2 server of the vLLM TEST DOUBLE streams token 3 as 1003, and the plain server's logprobs put 1003 only
    0.02 nats behind 3: serve-test's tie rule (serve_test.lossless.tie_margin 0.05) calls it a numerical tie, so tune
    passes and reports where; the other prompts are still compared. With one server at a time, plain decoding's runs
    last, so it is still up to be asked. In strict mode the tie fails."""
    from specconvert.backends.vllm import memory

    root, path = tiny_recipe
    exe, log = fake_vllm
    monkeypatch.setattr(memory, "available_gib", lambda *a, **k: 64.0 if servers == "together" else 1.0)
    monkeypatch.setenv("FAKE_VLLM_LOSSY_K", "2")
    monkeypatch.setenv("FAKE_VLLM_TIE_MARGIN", "0.02")
    args = ["tune", path, "--force", "--set", "runtime.backend=vllm", "--set", f"runtime.vllm_python={exe}",
            "--set", "runtime.vllm_threads=1", "--set", "tune.max_tokens=6"]
    capsys.readouterr()
    code = _cli(*args)
    err = capsys.readouterr().err
    assert code == 0, err[-2000:]
    if servers == "one":  # plain decoding's server started last
        names = [a[a.index("--served-model-name") + 1] for a in
                 (json.loads(line)["argv"] for line in log.read_text().splitlines())]
        assert names[-1] == "tiny-tune-k0"
    report = json.loads((root / "work" / "tune" / "report.json").read_text())
    k2 = next(m for m in report["measurements"] if (m["draft_len"], m["concurrency"]) == (2, 1))
    assert k2["identical_to_plain"] is False and k2["first_divergence"] is None
    # every request (8: 2 x the highest level) differs at token 3, each prompt a tie of its own
    assert [(t["prompt"], t["position"], t["margin"]) for t in k2["numerical_ties"]] == [(i, 3, 0.02) for i in range(8)]
    lossless = report["lossless"]
    assert lossless["mode"] == "greedy" and lossless["numerical_ties"] == 8
    assert lossless["ties"][0] == {"draft_len": 2, "concurrency": 1, "prompt": 0, "position": 3, "margin": 0.02,
                                   "tie_margin": 0.05}
    assert "8 difference(s) from plain decoding at a numerical tie" in err and "prompt 0 token 3: 0.02 nats" in err
    assert "draft length 2, prompt 0, token 3: 0.02 nats" in (root / "work" / "tune" / "report.md").read_text()
    if servers == "together":
        assert _cli(*args, "--set", "serve_test.lossless.mode=strict") == 1
        assert "a numerical tie (0.02 nats < 0.05) that fails in strict mode" in capsys.readouterr().err


def test_vllm_choice_weighs_a_scheduled_zero_at_its_measured_cost():
    """vLLM's 0 still runs the drafter: where plain decoding won, the best of that idle 0 and every chain is used."""
    from specconvert.tuning.model import vllm_choice

    rates = {(0, 1): 10.0, (1, 1): 12.0, (2, 1): 13.0, (0, 4): 48.0, (1, 4): 45.0, (2, 4): 39.0}
    choice = {1: 2, 4: 0}
    assert vllm_choice(choice, rates, {1: 8.0, 4: 40.0}, 0.03) == {1: 2, 4: 1}  # chain 1 beats the idle drafter
    assert vllm_choice(choice, rates, {1: 8.0, 4: 46.0}, 0.03) == {1: 2, 4: 0}  # the idle drafter is cheaper
    # plain decoding wins everywhere: the bundle serves the target alone, a true 0, whatever the idle drafter costs
    assert vllm_choice({1: 0, 4: 0}, rates, {1: 1.0, 4: 1.0}, 0.03) == {1: 0, 4: 0}
