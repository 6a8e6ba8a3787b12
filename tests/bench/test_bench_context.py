"""Acceptance per context length: prompts of whole documents plus a question at each requested input length, the
per-length table and plot, and the warning when the served context is far beyond the head's training seq_len."""

from __future__ import annotations

import json

import pytest
import yaml

from specconvert.bench.workload import CHARS_PER_TOKEN, QUESTION, context_prompt
from specconvert.prompts import load_samples, sample_text

from .conftest import FAST
from .standin import Script, StandInServer


def _docs():
    return [sample_text(s) for s in load_samples("python:docs", "k", ".")]


@pytest.mark.parametrize("tokens", [64, 1024, 4096])
def test_a_context_prompt_is_documents_and_a_question_of_about_the_length_asked(tokens):
    text = context_prompt(_docs(), 3, tokens)
    assert text.startswith("Document 1.\n") and text.endswith(QUESTION)
    assert 0.8 * tokens * CHARS_PER_TOKEN <= len(text) <= tokens * CHARS_PER_TOKEN
    # real prose, not padding: many distinct words, no character repeated in a long run
    assert len(set(text.split())) > min(tokens, 1000) / 8
    assert not any(c * 40 in text for c in " .-=*")
    assert context_prompt(_docs(), 4, tokens) != text  # each request reads other documents


def _recipe(tmp_path, seq_len, max_seq_len=512):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "ctx", "workdir": "work", "target": {"model": "m"},
                                    "draft": {"init": "random"}, "build": {"max_seq_len": max_seq_len}}))
    convert = tmp_path / "work" / "convert"
    convert.mkdir(parents=True)
    train = {"seq_len": seq_len} if seq_len else None
    (convert / "manifest.json").write_text(json.dumps({"manifest_version": 1, "stage": "convert", "fingerprint": "x",
                                                       "inputs": {"recipe": {"draft": {"train": train}}}}))
    return path


def test_bench_reports_tau_per_input_length_and_warns_beyond_training(cli, tmp_path):
    script = Script(ttft_s=0.01, gap_s=0.01, spec_chunk=3, long_prompt=(300 * CHARS_PER_TOKEN, 1))
    out = tmp_path / "bench"
    with StandInServer(script) as server:
        result = cli("bench", _recipe(tmp_path, seq_len=64), "--url", server.url, "--out", out, *FAST,
                     "--set", "bench.context_lengths=[64, 400]", "--set", "bench.concurrency=[1]",
                     "--set", "bench.plots=true")
    assert result.code == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["workload"]["input_lengths"] == [64, 400, 64, 400]
    lengths = report["levels"][0]["input_lengths"]
    assert list(lengths) == ["64", "400"] and lengths["64"]["requests"] == 2
    short, long = lengths["64"]["arms"]["speculative"], lengths["400"]["arms"]["speculative"]
    assert short["acceptance_length"] == pytest.approx(3.0) and long["acceptance_length"] == pytest.approx(1.0)
    assert long["per_position"] == [0.0, 0.0, 0.0]  # the recipe's chain of build.max_draft_len 3
    context = report["context"]
    assert context["head_seq_len"] == 64 and context["serving_context"] == 512
    assert "trained on sequences of 64 tokens" in context["warning"] and "407" in context["warning"]
    assert "trained on sequences of 64 tokens" in result.stderr
    md = (out / "report.md").read_text()
    assert "### Acceptance per input length" in md and "| 1 | 400 | 2 | speculative | 1.00 |" in md
    assert "**Warning:**" in md
    assert (out / "acceptance_per_input_length.png").read_bytes()[:4] == b"\x89PNG"


def test_no_warning_within_training_length_and_unknown_for_an_imported_head(cli, tmp_path, standin):
    out = tmp_path / "bench"
    result = cli("bench", _recipe(tmp_path, seq_len=None), "--url", standin.url, "--out", out, *FAST,
                 "--set", "bench.context_lengths=[64]", "--set", "bench.concurrency=[1]")
    assert result.code == 0, result.stderr
    context = json.loads((out / "report.json").read_text())["context"]
    assert context["head_seq_len"] is None and context["warning"] is None
    assert context["head_seq_len_source"].startswith("unknown")


def test_a_length_beyond_the_bundle_context_is_exit_2(cli, tmp_path, standin):
    result = cli("bench", _recipe(tmp_path, seq_len=64, max_seq_len=256), "--url", standin.url,
                 "--out", tmp_path / "b", *FAST, "--set", "bench.context_lengths=[64, 300]")
    assert result.code == 2 and "bench.context_lengths: [300]" in result.stderr
    assert not (tmp_path / "b").exists()


def test_context_lengths_are_validated(cli, tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(yaml.safe_dump({"name": "x", "target": {"model": "m"}, "draft": {"init": "random"},
                                    "bench": {"context_lengths": [64, 64]}}))
    assert cli("recipe", "validate", path).code == 2
    path.write_text(yaml.safe_dump({"name": "x", "target": {"model": "m"}, "draft": {"init": "random"},
                                    "bench": {"context_lengths": [64, 128, 256], "num_requests": 2}}))
    result = cli("recipe", "validate", path)
    assert result.code == 2 and "round-robin" in result.stderr
