"""Acceptance per prompt category: the `category` field of a bench prompt, the builtin set written for it, and the
report's per-category table and plot (stand-in server: the chunk size, i.e. tau, is scripted per prompt word)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specconvert.bench.metrics import Chunk, RequestRecord, chunk_acceptance, grouped
from specconvert.prompts import load_samples

from .conftest import FAST
from .standin import Script, StandInServer

PNG = b"\x89PNG\r\n\x1a\n"


def test_the_builtin_category_set_covers_every_kind_of_traffic():
    samples = load_samples("builtin:bench-categories", "bench.prompts", Path("."))
    by = {}
    for s in samples:
        by.setdefault(s["category"], []).append(s)
    assert sorted(by) == ["chat", "code", "extraction", "math", "rag", "summarization", "translation"]
    assert all(len(v) >= 3 for v in by.values())
    assert all(sum(m["role"] == "user" for m in s["messages"]) >= 2 for s in by["chat"])  # multi-turn
    shortest_rag = min(len(m["content"]) for s in by["rag"] for m in s["messages"] if m["role"] == "user")
    assert shortest_rag > 4 * max(len(s["messages"][-1]["content"]) for s in by["translation"])  # long inputs


def _rec(index, sizes):
    return RequestRecord(index=index, chunks=[Chunk(0.1 * i, n) for i, n in enumerate(sizes)], e2e_s=1.0,
                         output_tokens=sum(sizes))


def test_chunk_acceptance_per_position():
    out = chunk_acceptance([_rec(0, [1, 4, 2, 1]), _rec(1, [1, 3])], max_draft_len=3)
    # decode chunks 4, 2, 1, 3: accepted 3, 1, 0, 2 drafts
    assert out["acceptance_length"] == pytest.approx(2.5)
    assert out["per_position"] == pytest.approx([0.75, 0.5, 0.25])
    assert out["steps"] == 4 and out["requests"] == 2


def test_grouped_compares_each_group_with_plain_decoding_over_the_same_requests():
    base = [RequestRecord(index=i, chunks=[Chunk(0, 1)], e2e_s=2.0, output_tokens=8) for i in range(3)]
    spec = [RequestRecord(index=0, chunks=[Chunk(0, 1), Chunk(0.1, 3)], e2e_s=1.0, output_tokens=8),
            RequestRecord(index=1, chunks=[Chunk(0, 1), Chunk(0.1, 1)], e2e_s=2.0, output_tokens=8),
            RequestRecord(index=2, chunks=[Chunk(0, 1)], e2e_s=4.0, output_tokens=8)]
    out = grouped({"baseline": base, "speculative": spec}, ["code", "chat", None], {"speculative": 2})
    assert list(out) == ["code", "chat"]  # the uncategorised request is left out
    assert out["code"]["arms"]["speculative"]["speedup"] == pytest.approx(2.0)
    assert out["code"]["arms"]["speculative"]["acceptance_length"] == pytest.approx(3.0)
    assert out["chat"]["arms"]["speculative"]["speedup"] == pytest.approx(1.0)
    assert out["chat"]["arms"]["speculative"]["per_position"] == [0.0, 0.0]
    assert "acceptance_length" not in out["code"]["arms"]["baseline"]


def test_bench_reports_tau_and_speedup_per_category(cli, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in [
        {"category": "code", "prompt": "def add(a, b): return a + b"},
        {"category": "code", "prompt": "def sub(a, b): return a - b"},
        {"category": "chat", "prompt": "hello there, how are you"},
        {"prompt": "no category on this one"}]))
    script = Script(ttft_s=0.01, gap_s=0.01, spec_chunk=2, chunk_by_word={"def": 4})
    out = tmp_path / "bench"
    with StandInServer(script) as server:
        result = cli("bench", "--url", server.url, "--out", out, *FAST, "--set", f"bench.prompts={prompts}",
                     "--set", "bench.concurrency=[1]", "--set", "bench.max_tokens=9", "--set", "bench.plots=true")
    assert result.code == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert sorted(set(c for c in report["workload"]["categories"] if c)) == ["chat", "code"]
    cats = report["levels"][0]["categories"]
    code, chat = cats["code"]["arms"]["speculative"], cats["chat"]["arms"]["speculative"]
    assert code["acceptance_length"] == pytest.approx(4.0) and chat["acceptance_length"] == pytest.approx(2.0)
    # without a recipe the depth is the longest chunk of the group: 9 tokens = 1 + 4 + 4 (code), 1 + 2 x 4 (chat)
    assert code["per_position"] == [1.0, 1.0, 1.0] and chat["per_position"] == [1.0]
    assert code["speedup"] > chat["speedup"] > 0
    md = (out / "report.md").read_text()
    assert "### Acceptance per category" in md and "| 1 | code |" in md and "| 1 | chat |" in md
    plot = out / "acceptance_per_category.png"
    assert plot.read_bytes()[:8] == PNG and report["files"]["plot_categories"] == str(plot)
