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
from specconvert.training.answers import (GREEDY, AnswerCache, AnswerSource, Sampling, answer_all, cut_at_stop, probe,
                                          read_cache, settings_key)
from specconvert.training.answers.url import ServedSource
from tests.helpers.openai_double import Double, toy_answer

REPO = Path(__file__).resolve().parents[2]
STOP = 255


class ToySource(AnswerSource):
    """The 'in-process target' of these tests: the same toy answers the double serves."""

    name = "toy target"

    def __init__(self):
        self.asked: list[list[int]] = []

    def answer(self, jobs, max_new_tokens, sampling, emit):
        for key, ids in jobs:
            self.asked.append(list(ids))
            emit(key, cut_at_stop(toy_answer(ids, max_new_tokens), [STOP], max_new_tokens))


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
    source = ServedSource(["http://127.0.0.1:9"], "tiny", [STOP], concurrency=4)
    with pytest.raises(ExternalFailure) as err:
        answer_all(source, {(i, 0): [i] for i in range(4)}, AnswerCache(tmp_path / "c.jsonl"), 16, GREEDY)
    code, line = err.value.exit_code, err.value.one_line()
    del err  # its traceback holds the tasks: let them go, as a process exiting does
    gc.collect()
    assert code == 4 and "request 0" in line
    assert not [r for r in caplog.records if "never retrieved" in r.getMessage()]


def test_a_refused_request_is_bad_input_not_retried(tmp_path):
    with Double(toy_answer) as double:
        double.status = 400
        with pytest.raises(InputError, match="refused the request"):
            answer_all(served(double, retries=3), {(0, 0): [1]}, AnswerCache(tmp_path / "c.jsonl"), 16, GREEDY)
    assert len(double.requests) == 1


def test_an_unreachable_url_is_one_line_exit_4_and_writes_nothing(tmp_path):
    from specconvert.serving.process import free_port

    source = ServedSource([f"http://127.0.0.1:{free_port()}"], None, [STOP], retries=1, backoff_s=0.01)
    with pytest.raises(ExternalFailure) as err:
        probe(source, ToySource(), [[1, 2]], 8, str)
    assert err.value.exit_code == 4 and "not reachable" in err.value.one_line()
    assert not list(tmp_path.iterdir())


def test_the_probe_passes_the_target_and_names_the_first_difference_of_another_model():
    with Double(toy_answer) as double:
        assert probe(served(double), ToySource(), [[1, 2], [3]], 8, str) > 0
        double.perturb_at = 1
        with pytest.raises(InputError) as err:
            probe(served(double), ToySource(), [[1, 2], [3]], 8, lambda t: f"tok{t}")
    line = err.value.one_line()
    assert err.value.exit_code == 2 and "\n" not in line
    want = toy_answer([1, 2], 8)
    assert f"probe prompt 0, answer token 1: served {want[1] + 1} ('tok{want[1] + 1}'), target {want[1]} ('tok{want[1]}')" in line


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


def test_settings_key_keeps_todays_inprocess_greedy_key_and_separates_sampling():
    assert settings_key("inprocess", GREEDY) is None
    assert settings_key("url", GREEDY) == settings_key("vllm", GREEDY) == {"engine": "served"}
    assert settings_key("inprocess", Sampling(0.5, 1.0, 0)) != settings_key("inprocess", Sampling(0.5, 1.0, 1))
    assert settings_key("inprocess", Sampling(0.0, 0.5, 3)) is None  # greedy ignores top_p and seed


@pytest.mark.parametrize("synthesis, message", [
    pytest.param({"engine": "url"}, "engine: url needs `urls", id="url-without-urls"),
    pytest.param({"engine": "url", "urls": ["127.0.0.1:8000"]}, "not an http(s) base URL", id="url-without-scheme"),
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


def test_every_url_is_probed_and_the_wrong_one_is_named():
    with Double(toy_answer) as good, Double(toy_answer) as wrong:
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
