"""Synthesis of the training data: turns of a conversation regenerated in order, loss on every answer,
and a served engine that gives the same sequences as in-process generate."""

from __future__ import annotations

from pathlib import Path

import pytest

from specconvert.errors import InputError
from specconvert.recipe import TrainSpec
from specconvert.training.answers import GREEDY, AnswerSource, cut_at_stop
from specconvert.training.answers.inprocess import InProcessSource
from specconvert.training.answers.url import ServedSource
from specconvert.training.data import (DataReport, build_sequences, next_turn_prompt, prompt_ids, render,
                                       synthesize_conversations, user_turns)
from specconvert.training.distributed import World
from tests.helpers.openai_double import Double
from tests.tiny_models import byte_tokenizer, write_tiny_target

STOP = 255


class Bar:
    def add_task(self, *a, **k):
        return 0

    def advance(self, *a):
        pass


def msgs(*pairs):
    return [{"role": r, "content": c} for r, c in pairs]


@pytest.mark.parametrize("sample, runs", [
    pytest.param({"prompt": "hi"}, [[]], id="prompt"),
    pytest.param({"messages": msgs(("user", "a"))}, [msgs(("user", "a"))], id="one-user-turn"),
    pytest.param({"messages": msgs(("user", "a"), ("assistant", "x"))}, [msgs(("user", "a"))], id="answered-turn"),
    pytest.param({"messages": msgs(("system", "s"), ("user", "a"), ("assistant", "x"), ("user", "b"), ("assistant", "y"))},
                 [msgs(("system", "s"), ("user", "a")), msgs(("user", "b"))], id="two-turns"),
    pytest.param({"messages": msgs(("user", "a"), ("assistant", "x"), ("user", "b"))},
                 [msgs(("user", "a")), msgs(("user", "b"))], id="last-turn-unanswered"),
])
def test_user_turns(sample, runs):
    assert user_turns(sample) == runs


def test_next_turn_prompt_without_a_template_keeps_the_answer_tokens_and_adds_the_user_turn():
    tok = byte_tokenizer()
    history = msgs(("user", "one"))
    context = prompt_ids({"messages": history}, tok)
    answer = list(tok("ok", add_special_tokens=False)["input_ids"]) + [STOP]
    ids, conversation = next_turn_prompt(context, answer, history, msgs(("user", "two")), tok, [STOP], "x")
    assert ids[: len(context) + len(answer)] == context + answer
    assert tok.decode(ids[len(context) + len(answer):]) == "\nuser: two\nassistant: "
    assert conversation == msgs(("user", "one"), ("assistant", "ok"), ("user", "two"))


def _templated():
    tok = byte_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|end|>"]})
    tok.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}<|end|>\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    return tok, tok.convert_tokens_to_ids("<|end|>")


def test_next_turn_prompt_equals_the_template_applied_to_the_whole_conversation():
    """The turn-closing text after the stop token (here "\\n") goes into the bridge, not lost or doubled."""
    tok, end = _templated()
    history = msgs(("system", "be brief"), ("user", "one"))
    context = prompt_ids({"messages": history}, tok)
    answer = list(tok("ok.", add_special_tokens=False)["input_ids"]) + [end]
    ids, conversation = next_turn_prompt(context, answer, history, msgs(("user", "two")), tok, [end], "x")
    whole = tok.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    assert ids == list(tok(whole, add_special_tokens=False)["input_ids"])


def test_a_template_that_rewrites_earlier_turns_is_refused():
    tok, end = _templated()
    tok.chat_template = ("{% for m in messages %}{% if loop.last %}<last>{% endif %}<{{ m.role }}>{{ m.content }}<|end|>"
                         "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}")
    history = msgs(("user", "one"))
    with pytest.raises(InputError, match="renders earlier turns differently"):
        next_turn_prompt(prompt_ids({"messages": history}, tok), [65, end], history, msgs(("user", "two")), tok, [end],
                         "draft.train.prompts sample 1")


class Scripted(AnswerSource):
    """Answers every prompt with 3 tokens derived from it, ending with STOP (or not: ``no_stop`` prompts' first turn)."""

    def __init__(self, no_stop=()):
        self.asked = []
        self.no_stop = set(no_stop)

    def answer(self, jobs, max_new_tokens, sampling, emit):
        for key, ids in sorted(jobs):
            self.asked.append((key, list(ids)))
            tail = [70 + key[0]] if key[0] in self.no_stop and key[1] == 0 else [STOP]
            emit(key, cut_at_stop([65 + key[1], 66 + len(ids) % 5] + tail, [STOP], max_new_tokens))


def _train(**kw):
    return TrainSpec(prompts="x.jsonl", max_new_tokens=8, seq_len=512, **kw)


def test_every_assistant_turn_is_regenerated_in_order_with_loss_on_each(tmp_path):
    tok = byte_tokenizer()
    samples = [
        {"prompt": "single"},
        {"messages": msgs(("user", "q1"), ("assistant", "old"), ("user", "q2"), ("assistant", "old"), ("user", "q3"))},
        {"messages": msgs(("user", "r1"), ("assistant", "old"), ("user", "r2"))},  # its first answer never stops
    ]
    source, report = Scripted(no_stop={2}), DataReport()
    seqs = synthesize_conversations(_train(), samples, tok, source, source, [STOP], tmp_path / "c.jsonl", Bar(), World(),
                                    report)
    asked = dict(source.asked)
    assert sorted(asked) == [(0, 0), (1, 0), (1, 1), (1, 2), (2, 0)]
    # each turn's prompt holds the previous prompt and the target's own answer to it, then the new user turn
    for t in (1, 2):
        prev = asked[(1, t - 1)]
        answer = [65 + t - 1, 66 + len(prev) % 5, STOP]
        assert asked[(1, t)][: len(prev) + 3] == prev + answer
        assert tok.decode(asked[(1, t)][len(prev) + 3:]) == f"\nuser: q{t + 1}\nassistant: "
    assert "old" not in tok.decode(asked[(1, 2)])  # the given assistant turns are replaced
    conv = seqs[1]
    assert conv.input_ids == asked[(1, 2)] + [67, 66 + len(asked[(1, 2)]) % 5, STOP]
    trained = [j + 1 for j, m in enumerate(conv.loss_mask) if m]  # positions whose token is a training target
    want = [p for t in range(3) for p in range(len(asked[(1, t)]), len(asked[(1, t)]) + 3)]
    assert trained == want
    assert report.answers == 5 and report.conversations_cut == 1 and report.synthesized_tokens == 15
    # a rerun takes every turn from the cache
    again = Scripted(no_stop={2})
    rerun = synthesize_conversations(_train(), samples, tok, again, again, [STOP], tmp_path / "c.jsonl", Bar(), World(),
                                     DataReport())
    assert again.asked == [] and [s.input_ids for s in rerun] == [s.input_ids for s in seqs]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    import torch
    from transformers import AutoModelForCausalLM

    path = write_tiny_target(tmp_path_factory.mktemp("target"), logit_scale=30.0, eos_token_id=STOP)
    return AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()


def _data(tmp_path: Path) -> Path:
    import json

    rows = [{"prompt": f"hello {i} world"} for i in range(6)]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    return tmp_path


def _target_server(model):
    """A double that answers as the tiny target: greedy generate, one prompt at a time."""
    target = InProcessSource(model, [STOP], 0, 1)

    def answer(prompt, max_tokens):
        got = {}
        target.answer([((0, 0), prompt)], max_tokens, GREEDY, lambda k, a: got.setdefault(k, a))
        return got[(0, 0)]

    return answer


def test_a_served_target_gives_the_in_process_sequences(tiny, tmp_path):
    tok = byte_tokenizer()
    base = _data(tmp_path)
    train = TrainSpec(prompts="p.jsonl", max_new_tokens=10, seq_len=64, synthesis_batch_size=1)
    local, _ = build_sequences(train, base, tiny, tok, [STOP], tmp_path / "local", "fp", Bar())
    served_train = train.model_copy(update={"synthesis": train.synthesis.model_copy(update={"engine": "url"})})
    with Double(_target_server(tiny)) as double:
        source = ServedSource([double.url], None, [STOP], concurrency=3)
        remote, report = build_sequences(served_train, base, tiny, tok, [STOP], tmp_path / "remote", "fp", Bar(),
                                         source=source)
    assert [s.input_ids for s in remote] == [s.input_ids for s in local]
    assert [s.loss_mask for s in remote] == [s.loss_mask for s in local]
    assert report.probe_tokens > 0 and report.synthesis_engine == "url"
    # served and in-process caches are different files (a served cache is shared by url and vllm)
    assert {p.name for p in (tmp_path / "local").iterdir()} != {p.name for p in (tmp_path / "remote").iterdir()}


def test_an_endpoint_serving_another_model_is_refused_before_anything_is_written(tiny, tmp_path):
    tok = byte_tokenizer()
    base = _data(tmp_path)
    train = TrainSpec(prompts="p.jsonl", max_new_tokens=10, seq_len=64, synthesis={"engine": "url", "urls": ["http://x:1"]})
    with Double(_target_server(tiny)) as double:
        double.perturb_at = 0
        with pytest.raises(InputError) as err:
            build_sequences(train, base, tiny, tok, [STOP], tmp_path / "cache", "fp", Bar(),
                            source=ServedSource([double.url], None, [STOP]))
    assert err.value.exit_code == 2 and "answer token 0" in err.value.one_line()
    assert len(double.requests) == train.synthesis.probe_prompts  # the probe's prompts only: no bulk work
    assert not (tmp_path / "cache").exists()


class Seeded(AnswerSource):
    """Answers with tokens drawn from each request's seed (what a sampling engine does), and records the seeds."""

    def __init__(self):
        self.seeds = {}

    def answer(self, jobs, max_new_tokens, sampling, emit):
        for key, ids in jobs:
            seed = sampling.request_seed(key)
            self.seeds[key] = seed
            emit(key, [65 + seed % 7, 65 + seed % 11, STOP])


def test_several_sampled_answers_per_prompt_each_train_and_hold_out_together(tmp_path):
    """answers_per_prompt: 3 answers each prompt three times with three seeds; the copies of one prompt share a
    group, and the held-out share takes whole groups."""
    import json

    from specconvert.training.pipeline import split_holdout

    tok = byte_tokenizer()
    rows = [{"prompt": f"question {i}"} for i in range(10)]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    train = TrainSpec(prompts="p.jsonl", max_new_tokens=8, seq_len=64,
                      synthesis={"engine": "url", "urls": ["http://h:1"], "temperature": 0.7, "answers_per_prompt": 3})
    source = Seeded()
    source.served = False  # no probe: this source is the target itself
    seqs, report = build_sequences(train, tmp_path, None, tok, [STOP], tmp_path / "cache", "fp", Bar(), source=source)
    assert len(seqs) == 30 and report.prompts == 10 and report.answers == 30 and report.answers_per_prompt == 3
    assert len(set(source.seeds.values())) == 30  # every answer its own seed
    for i in range(10):
        copies = [seqs[i + 10 * c] for c in range(3)]
        assert {s.group for s in copies} == {i}
        prompt = prompt_ids({"prompt": f"question {i}"}, tok)
        assert all(s.input_ids[:len(prompt)] == prompt for s in copies)
    assert len({tuple(s.input_ids) for s in seqs}) > 10  # the copies were answered differently
    for seed in range(5):
        kept, held = split_holdout(seqs, 0.2, seed)
        assert held and len(kept) + len(held) == 30
        assert not {s.group for s in kept} & {s.group for s in held}


def test_the_held_out_split_without_groups_is_the_one_before_groups_existed():
    import random

    from specconvert.training.data import TrainSequence
    from specconvert.training.pipeline import split_holdout

    seqs = [TrainSequence([i, i + 1], [0, 1], "synthesized") for i in range(40)]
    for seed in range(3):
        order = list(range(40))
        random.Random(seed).shuffle(order)
        before = set(order[:2])  # round(0.05 * 40)
        kept, held = split_holdout(seqs, 0.05, seed)
        assert [s.input_ids[0] for s in held] == sorted(before) and len(kept) == 38


def test_raising_answers_per_prompt_answers_only_the_new_copies(tmp_path):
    """Copy c of prompt i is answer i + c*n with its own seed, whatever answers_per_prompt is: the cache is keyed by
    the distinct prompts, so going from 2 to 3 answers asks for the third copies only and keeps the first two."""
    import json

    tok = byte_tokenizer()
    rows = [{"prompt": f"question {i}"} for i in range(6)]
    (tmp_path / "p.jsonl").write_text("\n".join(json.dumps(r) for r in rows))

    def run(copies):
        train = TrainSpec(prompts="p.jsonl", max_new_tokens=8, seq_len=64,
                          synthesis={"engine": "url", "urls": ["http://h:1"], "temperature": 0.7,
                                     "answers_per_prompt": copies})
        source = Seeded()
        source.served = False
        seqs, report = build_sequences(train, tmp_path, None, tok, [STOP], tmp_path / "cache", "fp", Bar(),
                                       source=source)
        return seqs, report, source

    two, _, first = run(2)
    assert len(first.seeds) == 12
    three, report, second = run(3)
    assert sorted(second.seeds) == [(i, 0) for i in range(12, 18)]  # only the new copies were asked for
    assert report.synthesis_cached == 12 and len(three) == 18
    assert [s.input_ids for s in three[:12]] == [s.input_ids for s in two]
    assert len(list((tmp_path / "cache").glob("synthesis-*.jsonl"))) == 1
