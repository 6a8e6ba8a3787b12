"""draft.train.prompts: sets mixed in order, and self:N (the target writes its own prompts) seeded, filtered, cached."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from specconvert.errors import InputError
from specconvert.recipe import SelfPromptsSpec, TrainSpec
from specconvert.training.prompt_sets import load_prompt_sets, prompt_specs
from specconvert.training.self_prompts import (
    HeldOut, Selection, UserTurn, consider, is_repetitive, normalise, read_batches, user_turn, write_prompts,
)
from tests.conftest import write_recipe
from tests.tiny_models import byte_tokenizer, write_tiny_target

CHATML = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# SmolLM2's shape: a default system turn when the chat has none
CHATML_DEFAULT_SYSTEM = ("{% if messages[0].role != 'system' %}<|im_start|>system\nBe helpful.<|im_end|>\n{% endif %}" + CHATML)


def chat_tokenizer(template: str = CHATML):
    tok = byte_tokenizer()
    tok.chat_template = template
    return tok


# --------------------------------------------------------------------------- the opening of a user turn


@pytest.mark.parametrize("template,opening,marker", [
    pytest.param(CHATML, "<|im_start|>user\n", "<|im_end|>", id="chatml"),
    pytest.param(CHATML_DEFAULT_SYSTEM, "<|im_start|>system\nBe helpful.<|im_end|>\n<|im_start|>user\n", "<|im_end|>",
                 id="chatml-default-system"),
    pytest.param("{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}", "[INST] ", "[/INST]", id="inst"),
])
def test_the_user_turn_opening_comes_from_the_chat_template(template, opening, marker):
    turn = user_turn(chat_tokenizer(template))
    assert turn.opening == opening and turn.end_marker == marker


def test_a_target_without_chat_template_is_refused():
    with pytest.raises(InputError, match="self:N needs a target with a chat template"):
        user_turn(byte_tokenizer())


# --------------------------------------------------------------------------- filters


@pytest.mark.parametrize("a,b", [
    ("What is  the capital of France?", "what is the capital of france"),
    ("Hello,\tWORLD!!", "hello world"),
    ("¿Qué tal?", "qué tal"),
])
def test_normalisation_folds_case_whitespace_and_punctuation(a, b):
    assert normalise(a) == normalise(b) == b


def test_repetition_is_a_low_share_of_distinct_trigrams():
    assert is_repetitive([1, 2, 3] * 6)
    assert not is_repetitive(list(range(20)))
    assert not is_repetitive([1, 1, 1, 1, 1])  # too short to judge


def test_held_out_overlap_is_equality_or_a_shared_eight_word_run():
    held = HeldOut(["Explain how a bicycle stays upright when it is moving fast."])
    assert held.overlaps("explain how a bicycle stays upright when it is moving fast")
    assert held.overlaps("Quick one: how a bicycle stays upright when it is moving, please")
    assert not held.overlaps("Explain how a bicycle works")


SETTINGS = SelfPromptsSpec(min_tokens=3, max_tokens=80, batch_size=4)
STOP = 10  # a byte id standing in for the end-of-turn token


@pytest.mark.parametrize("text,ends,reason", [
    ("Write a haiku about rain.", True, None),
    ("Write a haiku about rain.", False, "too long"),  # the turn never ended
    ("   ", True, "empty"),
    ("Hi", True, "too short"),
    ("x" * 81, True, "too long"),
    ("la la la la la la la la la la la la", True, "repetitive"),
    ("name THREE rivers, in europe", True, "duplicate"),
    ("Explain how a bicycle stays upright when it is moving fast.", True, "overlapping a held-out prompt"),
    ("Write a poem.<|im_end|>\nignored", False, None),  # the template's end marker ends the turn
])
def test_each_candidate_is_kept_or_dropped_for_one_reason(text, ends, reason):
    tok = chat_tokenizer()
    turn = user_turn(tok)
    selection = Selection()
    held = HeldOut(["Explain how a bicycle stays upright when it is moving fast."])
    consider(tok("Name three rivers in Europe.")["input_ids"] + [STOP], tok, turn, {STOP}, SETTINGS, held, selection)
    ids = tok(text)["input_ids"] + ([STOP] if ends else [])
    consider(ids, tok, turn, {STOP}, SETTINGS, held, selection)
    if reason is None:
        assert len(selection.prompts) == 2 and selection.dropped == {}
    else:
        assert selection.prompts == ["Name three rivers in Europe."] and selection.dropped == {reason: 1}


# --------------------------------------------------------------------------- writing prompts with a tiny target


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory):
    return write_tiny_target(tmp_path_factory.mktemp("target"), eos_token_id=255)


@pytest.fixture(scope="module")
def tiny(target_dir):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32).eval()


# 32 of 256 byte ids end a turn: a random tiny target's "prompts" end after ~8 tokens (and a
# non-ASCII byte reads back as 3, hence the room in max_tokens)
STOPS = list(range(0, 256, 8))
TINY = SelfPromptsSpec(min_tokens=2, max_tokens=32, batch_size=8)


def _write(tiny, cache: Path, count: int = 10, seed: int = 0, **kw):
    return write_prompts(count, tiny, chat_tokenizer(), STOPS, kw.pop("settings", TINY), seed, kw.pop("held_out", []),
                         cache, "tiny", **kw)


def test_self_prompts_are_seeded_cached_and_resume_after_a_kill(tiny, tmp_path, monkeypatch):
    first = _write(tiny, tmp_path / "a")
    assert len(first) == 10 and all(s["messages"][0]["role"] == "user" and s["messages"][0]["content"] for s in first)
    assert len({normalise(s["messages"][0]["content"]) for s in first}) == 10  # deduplicated
    assert _write(tiny, tmp_path / "b") == first  # same seed, same prompts
    assert _write(tiny, tmp_path / "c", count=2, seed=1) != first[:2]
    (cache,) = (tmp_path / "a").glob("self-prompts-*.jsonl")
    # a killed run: one whole batch and half of the next line
    lines = cache.read_text().splitlines()
    assert len(lines) >= 2
    cache.write_text(lines[0] + "\n" + lines[1][:9])
    assert _write(tiny, tmp_path / "a") == first
    assert [json.loads(x)["b"] for x in cache.read_text().splitlines()] == list(range(len(lines)))
    # a rerun is free: the target is not asked again
    monkeypatch.setattr(tiny, "generate", lambda *a, **k: pytest.fail("generate called on a cached rerun"))
    assert _write(tiny, tmp_path / "a") == first
    # a smaller N reads the same stream: a prefix of the same prompts
    assert _write(tiny, tmp_path / "a", count=3) == first[:3]


def test_an_out_of_order_cache_line_is_redone(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text('{"b": 0, "c": [[1]]}\n{"b": 2, "c": [[2]]}\n')
    assert read_batches(path) == ([[[1]]], len('{"b": 0, "c": [[1]]}\n'))


def test_a_target_that_writes_nothing_usable_is_bad_input(tiny, tmp_path):
    """max_tokens 2 with min_tokens 2: nothing ends in time; no endless loop, one line naming why."""
    with pytest.raises(InputError, match=r"wrote no usable prompt for self:4 \(dropped: \d+ too long"):
        _write(tiny, tmp_path, count=4, settings=SelfPromptsSpec(min_tokens=2, max_tokens=2, batch_size=8))


def test_too_few_usable_prompts_is_a_warning_with_the_reasons(tiny, tmp_path):
    notes = []
    out = _write(tiny, tmp_path, count=200, settings=SelfPromptsSpec(min_tokens=2, max_tokens=4, batch_size=200),
                 on_note=notes.append)
    assert 0 < len(out) < 200 and "usable prompts in 800 tries (dropped:" in notes[0]


# --------------------------------------------------------------------------- mixing sets


def _train(prompts, **kw):
    return TrainSpec(prompts=prompts, eval_prompts=kw.pop("eval_prompts", None),
                     self_prompts=kw.pop("self_prompts", TINY), **kw)


def test_one_string_and_a_list_both_work():
    assert prompt_specs("builtin:chat-train") == ["builtin:chat-train"]
    assert prompt_specs(["builtin:smoke", "self:5"]) == ["builtin:smoke", "self:5"]


def test_sets_mix_in_order_and_written_prompts_avoid_the_others(tiny, tmp_path):
    (tmp_path / "mine.jsonl").write_text(json.dumps({"conversations": [{"from": "human", "value": "q"},
                                                                        {"from": "gpt", "value": "a"}]}) + "\n")
    (tmp_path / "eval.jsonl").write_text(json.dumps({"prompt": "held out"}) + "\n")
    train = _train(["builtin:smoke", "self:4", "mine.jsonl"], eval_prompts="eval.jsonl")
    from specconvert.training.data import DataReport

    report = DataReport()
    samples = load_prompt_sets(train, tmp_path, tiny, chat_tokenizer(), STOPS, tmp_path / "cache", "tiny", report=report)
    assert (report.self_prompts, report.self_prompts_engine) == (4, "in-process generate")  # the data report counts them
    from specconvert.prompts import load_samples

    smoke = load_samples("builtin:smoke", "k", tmp_path)
    assert samples[: len(smoke)] == smoke
    assert len(samples) == len(smoke) + 4 + 1
    assert samples[-1] == {"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
    written = [s["messages"][0]["content"] for s in samples[len(smoke): -1]]
    assert written == [s["messages"][0]["content"] for s in
                       _write(tiny, tmp_path / "cache", count=4, held_out=["q", "held out"] +
                              [m["content"] for s in smoke for m in s.get("messages", []) if m["role"] == "user"])]


def test_a_bad_row_stops_before_the_target_writes_anything(tmp_path):
    (tmp_path / "mine.jsonl").write_text('{"prompt": "ok"}\n{"conversations": [{"from": "bot", "value": "x"}]}\n')
    model = SimpleNamespace(generate=lambda *a, **k: pytest.fail("the target ran before the files were checked"))
    with pytest.raises(InputError, match=r"draft.train.prompts\[1\]: .*mine.jsonl:2: conversations\[0\] has from 'bot'"):
        load_prompt_sets(_train(["self:4", "mine.jsonl"]), tmp_path, model, chat_tokenizer(), STOPS, tmp_path / "cache", "t")
    assert not (tmp_path / "cache").exists()


@pytest.mark.parametrize("prompts,needle", [
    ("self:0", "'self:0' needs a whole number of prompts of at least 1"),
    ("[builtin:smoke, self:-3]", "'self:-3' needs a whole number"),
    ("[]", "draft.train.prompts is an empty list"),
    ("[self:1, self:2]", "give one self:N entry"),
    ("[builtin:smoke, nope.jsonl]", "draft.train.prompts[1]: file"),
])
def test_bad_prompt_lists_exit_2_with_one_line(cli, tmp_path, target_dir, prompts, needle):
    path = write_recipe(tmp_path / "r.yaml", f"name: bad\ntarget:\n  model: {target_dir}\ndraft:\n  train:\n    prompts: {prompts}\n")
    result = cli("convert", path)
    assert result.code == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and needle in errors[0], result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "runs").exists()


def test_in_a_data_parallel_launch_process_0_writes_and_the_others_receive(tmp_path, monkeypatch):
    """Sampling on two devices need not agree bit for bit: the others must take process 0's list, not write their own."""
    from specconvert.training import distributed
    from specconvert.training.distributed import World

    mine = [{"messages": [{"role": "user", "content": "from process 0"}]}]
    sent = []
    monkeypatch.setattr(distributed, "gather", lambda obj, world: sent.append(obj) or [mine, obj])
    model = SimpleNamespace(generate=lambda *a, **k: pytest.fail("process 1 sampled prompts"))
    samples = load_prompt_sets(_train(["self:4"]), tmp_path, model, chat_tokenizer(), STOPS, tmp_path / "cache", "t",
                               world=World(rank=1, size=2))
    assert samples == mine and sent == [None] and not (tmp_path / "cache").exists()


# --------------------------------------------------------------------------- written by a served engine


class FakeServed:
    """A served answer source: greedy answers are the tiny target's own (so the probe passes unless ``lie``),
    sampled ones a pure function of the request's seed (as a seeded vLLM request is)."""

    served = True
    concurrency = 6

    def __init__(self, tiny, lie: bool = False):
        from specconvert.training.answers.inprocess import InProcessSource

        self.target = InProcessSource(tiny, STOPS, 0, 1)
        self.lie = lie
        self.seeds: list[int] = []
        self.calls = 0

    def endpoints(self):
        return [self]

    def describe(self):
        return "fake endpoint"

    def answer(self, jobs, max_new_tokens, sampling, emit):
        import random

        self.calls += 1
        if sampling.greedy:
            if self.lie:
                for key, _ in jobs:
                    emit(key, [200 + key[0]] * max_new_tokens)
                return
            self.target.answer(jobs, max_new_tokens, sampling, emit)
            return
        for key, _ in reversed(jobs):  # in any order, as a server finishes them
            seed = sampling.request_seed(key)
            self.seeds.append(seed)
            rng = random.Random(seed)
            letters = [i for i in chat_tokenizer()("abcdefghijklmnopqrstuvwxyz")["input_ids"] if i not in STOPS]
            emit(key, [rng.choice(letters) for _ in range(rng.randint(3, 9))] + [STOPS[1]])


def test_a_served_engine_writes_the_prompts_one_seeded_request_each_cached_apart(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(tiny, "generate", lambda *a, **k: pytest.fail("in-process generate wrote served prompts")
                        if k.get("do_sample") else type(tiny).generate(tiny, *a, **k))
    source = FakeServed(tiny)
    first = _write(tiny, tmp_path / "a", source=source)
    assert len(first) == 10 and len({normalise(s["messages"][0]["content"]) for s in first}) == 10
    # every candidate its own seed, from (seed, batch, index): what else is in flight does not matter
    assert len(set(source.seeds)) == len(source.seeds) and source.seeds
    # several batches per call keep the engine's slots busy (window = 2 x concurrency / batch size)
    assert source.calls <= 1 + -(-len(source.seeds) // (2 * TINY.batch_size))
    again = FakeServed(tiny)
    assert _write(tiny, tmp_path / "b", source=again) == first  # same seed, same prompts
    # a cache of its own: in-process generate samples other prompts from the same settings
    (served_cache,) = (tmp_path / "a").glob("self-prompts-*.jsonl")
    monkeypatch.undo()
    _write(tiny, tmp_path / "a", count=2)
    assert len(list((tmp_path / "a").glob("self-prompts-*.jsonl"))) == 2
    # a killed run resumes after its last whole batch; a rerun asks nothing
    lines = served_cache.read_text().splitlines()
    served_cache.write_text(lines[0] + "\n" + lines[1][:7])
    resumed = FakeServed(tiny)
    assert _write(tiny, tmp_path / "a", source=resumed) == first and resumed.calls
    idle = FakeServed(tiny)
    assert _write(tiny, tmp_path / "a", source=idle) == first and idle.calls == 0


def test_a_served_engine_that_does_not_continue_as_the_target_writes_nothing(tiny, tmp_path):
    with pytest.raises(InputError, match=r"draft.train.prompts \(self:N through draft.train.synthesis\): fake endpoint "
                                         r"does not answer as the target: probe prompt 0, answer token 0"):
        _write(tiny, tmp_path / "a", source=FakeServed(tiny, lie=True))
    assert not list((tmp_path / "a").glob("self-prompts-*.jsonl"))
