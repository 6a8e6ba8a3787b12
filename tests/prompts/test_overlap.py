"""Issue 37, item 7: evaluation prompts stay out of training, duplicates stay on one side of the held-out split,
and the overlap index is bounded (hashed 8-word windows, not a set of word tuples)."""

from __future__ import annotations

import random
import tracemalloc

import pytest

from specconvert.prompts.overlap import OverlapIndex, keep_out, split_holdout
from specconvert.training.data import TrainSequence

HELD = "Explain how a bicycle stays upright when it is moving fast."


@pytest.mark.parametrize("text, overlaps", [
    pytest.param(HELD, True, id="same"),
    pytest.param("explain HOW a bicycle   stays upright, when it is moving fast", True, id="same-after-normalising"),
    pytest.param("Tell me: how a bicycle stays upright when it is moving, please", True, id="eight-word-run"),
    pytest.param("Please explain how a bicycle stays upright at all.", False, id="seven-word-run"),
    pytest.param("Explain", False, id="a-word-of-it"),
    pytest.param("Write a haiku about rain on a tin roof in autumn.", False, id="unrelated"),
])
def test_overlap_is_equality_or_a_shared_8_word_run(text, overlaps):
    assert OverlapIndex([HELD]).overlaps(text) is overlaps


def test_an_empty_index_overlaps_nothing():
    assert not OverlapIndex([]).overlaps(HELD)


def test_the_index_over_many_prompts_stays_small():
    """3000 prompts of 40 words: the set of 8-word tuples peaked at 23 MiB; 8 bytes a hashed window, at ~2.5 MiB."""
    import numpy  # noqa: F401  (its import is not the index's memory)

    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(5000)]
    texts = [" ".join(rng.choices(vocab, k=40)) for _ in range(3000)]
    tracemalloc.start()
    try:
        index = OverlapIndex(texts)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(index) == 3000 * (40 - 8 + 1 + 1)  # every window and every whole text, each its own hash
    assert index.nbytes == 8 * len(index)
    assert peak < 8 * 2**20, f"{peak / 2**20:.1f} MiB"
    assert index.overlaps(texts[123]) and index.overlaps(" ".join(texts[7].split()[10:18]))


def _seq(prompt: list[int], answer: list[int], group=None) -> TrainSequence:
    return TrainSequence(prompt + answer, [0] * len(prompt) + [1] * len(answer), "synthesized", group)


def test_duplicate_prompts_land_on_one_side_of_the_held_out_split():
    """ShareGPT repeats first turns: the same prompt answered twice must not be trained on and held out at once."""
    prompts = [[100 + i, 7, 7] for i in range(20)]
    seqs = [_seq(prompts[i % 20], [i, i + 1]) for i in range(60)]  # every prompt three times, answered differently
    for seed in range(10):
        kept, held = split_holdout(seqs, 0.2, seed)
        assert held and len(kept) + len(held) == 60
        assert not {tuple(s.input_ids[:3]) for s in kept} & {tuple(s.input_ids[:3]) for s in held}


def test_groups_and_prompts_join_transitively():
    a, b = [1, 2], [3, 4]
    seqs = [_seq(a, [9], group=0), _seq(b, [9], group=0), _seq(b, [8]), *[_seq([50 + i], [1]) for i in range(9)]]
    for seed in range(10):
        kept, held = split_holdout(seqs, 0.3, seed)
        sides = [any(s is x for x in held) for s in seqs[:3]]
        assert len(set(sides)) == 1


def test_without_repeats_the_split_is_the_one_it_always_was():
    from specconvert.training.pipeline import split_holdout as before

    seqs = [_seq([i, i + 1], [i + 2], group=i // 3 if i < 12 else None) for i in range(40)]
    for seed in range(5):
        assert split_holdout(seqs, 0.1, seed) == before(seqs, 0.1, seed)


def test_keep_out_drops_training_samples_that_overlap_and_counts_them():
    samples = [{"prompt": HELD.upper()}, {"prompt": "fine"}, {"messages": [{"role": "user", "content": HELD}]}]
    kept, dropped = keep_out(samples, OverlapIndex([HELD]), lambda s: [s.get("prompt") or s["messages"][0]["content"]])
    assert kept == [{"prompt": "fine"}] and dropped == 2


# --------------------------------------------------------------------------- every evaluation set kept out of training


def _load(tmp_path, prompts, eval_prompts=None, eval_sets=(), monkeypatch=None):
    from specconvert.recipe import TrainSpec
    from specconvert.training.data import DataReport
    from specconvert.training.prompt_sets import load_prompt_sets
    from tests.tiny_models import byte_tokenizer

    report = DataReport()
    train = TrainSpec(prompts=prompts, eval_prompts=eval_prompts)
    samples = load_prompt_sets(train, tmp_path, None, byte_tokenizer(), [0], tmp_path / "cache", "t", report=report,
                               eval_sets=eval_sets)
    return samples, report


def _jsonl(path, *prompts):
    import json

    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return path.name


@pytest.mark.parametrize("which", ["draft.train.eval_prompts", "quantize.eval_prompts"])
def test_a_training_prompt_that_overlaps_an_evaluation_set_is_left_out_counted_and_warned(tmp_path, capsys, which):
    train = _jsonl(tmp_path / "train.jsonl", "fine one", HELD.lower(), "fine two", f"Also: {HELD}")
    held = _jsonl(tmp_path / "eval.jsonl", HELD)
    if which == "draft.train.eval_prompts":
        samples, report = _load(tmp_path, train, eval_prompts=held)
    else:
        samples, report = _load(tmp_path, train, eval_sets=[(held, "quantize.eval_prompts")])
    assert samples == [{"prompt": "fine one"}, {"prompt": "fine two"}]
    assert report.eval_overlaps == 2 and report.as_dict()["eval_overlaps"] == 2  # the manifest's data block
    err = capsys.readouterr().err
    assert f"2 prompts overlap the evaluation set ({which}" in err and "left out of training" in err


def test_eval_overlap_keep_trains_on_the_overlap_and_still_says_so(tmp_path, capsys):
    """A head memorising its evaluation prompts on purpose (the vLLM integration test's) asks for it by name."""
    from specconvert.recipe import TrainSpec
    from specconvert.training.data import DataReport
    from specconvert.training.prompt_sets import load_prompt_sets
    from tests.tiny_models import byte_tokenizer

    prompts = _jsonl(tmp_path / "train.jsonl", "fine one", HELD)
    report = DataReport()
    train = TrainSpec(prompts=prompts, eval_prompts=prompts, eval_overlap="keep")
    samples = load_prompt_sets(train, tmp_path, None, byte_tokenizer(), [0], tmp_path / "cache", "t", report=report)
    assert samples == [{"prompt": "fine one"}, {"prompt": HELD}] and report.eval_overlaps == 2
    assert "trained on anyway (draft.train.eval_overlap: keep)" in capsys.readouterr().err


def test_no_overlap_keeps_every_prompt_and_says_nothing(tmp_path, capsys):
    samples, report = _load(tmp_path, _jsonl(tmp_path / "t.jsonl", "a", "b"), eval_prompts=_jsonl(tmp_path / "e.jsonl", HELD))
    assert len(samples) == 2 and report.eval_overlaps == 0 and "overlap" not in capsys.readouterr().err


def test_self_prompts_avoid_the_quantization_evaluation_set_too(tmp_path, monkeypatch):
    """self:N avoided draft.train.eval_prompts only: prompts written like quantize.eval_prompts' were trained on."""
    from specconvert.training import self_prompts

    seen = {}

    def write_prompts(count, model, tokenizer, stop_ids, settings, seed, avoid, *args, **kwargs):
        seen["avoid"] = list(avoid)
        return [{"messages": [{"role": "user", "content": "written"}]}]

    monkeypatch.setattr(self_prompts, "write_prompts", write_prompts)
    _load(tmp_path, "self:1", eval_prompts=_jsonl(tmp_path / "e.jsonl", "train eval"),
          eval_sets=[(_jsonl(tmp_path / "q.jsonl", "quant eval"), "quantize.eval_prompts")])
    assert {"train eval", "quant eval"} <= set(seen["avoid"])


def test_self_prompts_filter_uses_the_bounded_index():
    from specconvert.training.self_prompts import HeldOut

    assert HeldOut is OverlapIndex
