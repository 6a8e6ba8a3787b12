"""Training data: response-only loss masks, teacher-forced chunks, deterministic and resumable synthesis."""

from __future__ import annotations

import json

import pytest

from specconvert.training.data import prompt_ids, response_sequence, synthesize, text_sequences
from tests.tiny_models import byte_tokenizer, write_tiny_target


def test_loss_mask_covers_exactly_the_predictions_of_response_tokens():
    seq, cut = response_sequence([10, 11, 12], [20, 21], seq_len=64, source="synthesized")
    assert seq.input_ids == [10, 11, 12, 20, 21]
    # position j is trained when token j+1 is a response token: positions 2 (-> 20) and 3 (-> 21)
    assert seq.loss_mask == [0, 0, 1, 1, 0]
    assert not cut


def test_truncation_is_reported():
    seq, cut = response_sequence(list(range(6)), list(range(6)), seq_len=8, source="synthesized")
    assert cut and len(seq.input_ids) == 8 and len(seq.loss_mask) == 8


def test_text_chunks_train_every_position_but_the_last():
    chunks = text_sequences(list(range(40)), seq_len=16)
    assert [len(c.input_ids) for c in chunks] == [16, 16]  # the 8-token tail is dropped
    assert chunks[0].loss_mask == [1] * 15 + [0]


def test_chat_prompt_without_template_ends_with_the_assistant_cue():
    tok = byte_tokenizer()
    ids = prompt_ids({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]}, tok)
    text = tok.decode(ids)
    assert text.endswith("assistant: ") and "user: hi" in text and "x" not in text


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM

    path = write_tiny_target(tmp_path_factory.mktemp("target"), logit_scale=30.0, eos_token_id=255)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _prompts():
    tok = byte_tokenizer()
    return [tok(f"hello {i} world " * 2)["input_ids"] for i in range(7)]


def test_synthesis_is_deterministic_and_resumes_from_its_cache(tiny, tmp_path):
    prompts = _prompts()
    first, cached = synthesize(tiny, prompts, 12, 3, [255], 0, tmp_path / "a.jsonl")
    assert cached == 0 and len(first) == 7 and all(1 <= len(r) <= 12 for r in first)
    again, _ = synthesize(tiny, prompts, 12, 3, [255], 0, tmp_path / "b.jsonl")
    assert again == first
    # an interrupted run: keep 4 rows and a line cut in half, then resume
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    (tmp_path / "c.jsonl").write_text("\n".join(lines[:4]) + "\n" + lines[4][:7])
    resumed, cached = synthesize(tiny, prompts, 12, 3, [255], 0, tmp_path / "c.jsonl")
    assert cached == 4 and resumed == first
    rows = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text().splitlines()]
    assert sorted(r["i"] for r in rows) == list(range(7))


@pytest.mark.parametrize("cut", [
    pytest.param(lambda line: line[:7], id="half-a-line"),
    pytest.param(lambda line: line, id="whole-line-without-newline"),
    pytest.param(lambda line: "{not json", id="garbage"),
])
def test_a_cut_synthesis_cache_heals_on_the_next_run(tiny, tmp_path, cut):
    """Lines appended after a cut line were never read again: every run redid the same prompts."""
    prompts = _prompts()
    first, _ = synthesize(tiny, prompts, 12, 3, [255], 0, tmp_path / "a.jsonl")
    lines = (tmp_path / "a.jsonl").read_text().splitlines()
    cache = tmp_path / "c.jsonl"
    cache.write_text("\n".join(lines[:4]) + "\n" + cut(lines[4]))
    resumed, cached = synthesize(tiny, prompts, 12, 3, [255], 0, cache)
    assert cached == 4 and resumed == first
    # every line is complete JSON now, so the next run takes everything from the cache
    assert all(json.loads(x) for x in cache.read_text().splitlines()) and cache.read_text().endswith("\n")
    again, cached = synthesize(tiny, prompts, 12, 3, [255], 0, cache)
    assert cached == 7 and again == first
    assert len(cache.read_text().splitlines()) == 7


def test_synthesis_stops_at_a_stop_token(tiny, tmp_path):
    prompts = _prompts()
    free, _ = synthesize(tiny, prompts, 12, 4, [255], 0, tmp_path / "free.jsonl")
    stop = free[0][2]  # make the third generated token of prompt 0 a stop token
    cut, _ = synthesize(tiny, prompts, 12, 4, [stop], 0, tmp_path / "cut.jsonl")
    assert cut[0][-1] == stop and len(cut[0]) <= 3
