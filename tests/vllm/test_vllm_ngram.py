"""The n-gram arm on real vLLM (``make test-vllm``): lossless against plain decoding, with vLLM's own counters.

Two servers only (plain and n-gram, the argv bench starts for ``bench.baselines: [ngram]``), one request at a time,
three prompts that ask to copy text (``ngram_prompts.jsonl``), streamed chat as bench sends it; the outputs are
compared by token id with bench's own ``lossless``. The recipe's head is random (convert in seconds): the n-gram arm
needs none, and the bench path around it is covered on the vLLM test double (tests/bench/test_bench_free_arms.py).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

RECIPE = Path(__file__).with_name("smollm2_random_ngram.yaml")


async def _outputs(urls: dict[str, str], recipe, payloads):
    from specconvert.backends.vllm import counters
    from specconvert.bench.loadgen import Endpoint, run_load
    from specconvert.serving.client import OpenAIClient

    records, counted = {}, None
    for label, url in urls.items():
        client = OpenAIClient(url, request_timeout_s=600)
        try:
            model = recipe.name + ("-baseline" if label == "baseline" else f"-{label}")
            before = await counters.snapshot(client)
            records[label], _ = await run_load(client, Endpoint(label, url, model, "chat"), payloads, 1, 1800)
            if label == "ngram":
                counted = counters.delta(before, await counters.snapshot(client), requests=len(payloads))
        finally:
            await client.aclose()
    return records, counted


def test_the_ngram_arm_is_lossless_against_plain_decoding_on_vllm(vllm_python, tmp_path):
    from specconvert.bench.metrics import lossless
    from specconvert.bench.servers import started_servers, vllm_launches
    from specconvert.bench.workload import build_payloads
    from specconvert.recipe import load_recipe
    from tests.serving.conftest import _cli

    assert _cli("convert", RECIPE) == 0
    assert _cli("build", RECIPE, "--no-load") == 0
    recipe = load_recipe(RECIPE, [f"runtime.vllm_python={vllm_python}"])
    payloads, _ = build_payloads(recipe.bench, recipe.base_dir, "chat")
    payloads = [{**p, "return_token_ids": True} for p in payloads]  # as bench sends them to vLLM
    engine = recipe.workdir_path / "engine"
    launches = [launch for label in ("baseline", "ngram")
                for launch in vllm_launches(recipe, RECIPE, engine, only=label)]
    ngram_argv = launches[1][1]
    assert json.loads(ngram_argv[ngram_argv.index("--speculative-config") + 1])["method"] == "ngram"
    with started_servers(launches, tmp_path, recipe.bench.startup_timeout_s) as info:
        records, counted = asyncio.run(_outputs({"baseline": info["baseline"], "ngram": info["ngram"]}, recipe,
                                                payloads))
    assert all(r.ok for rs in records.values() for r in rs), [r.error for rs in records.values() for r in rs]
    same = lossless([(records["baseline"], records["ngram"])])
    assert same["compared"] == 3 and same["lossless"] is True, same
    assert counted.available and counted.drafts > 0, counted  # prompt lookup drafted on these copy prompts
    # the oracle of a bundle serving n-gram: prompt lookup replayed on each prompt (the target's chat template, as vLLM
    # renders it) and the greedy output, against vLLM's own counters of the same requests
    from specconvert.reference.decoder import load_tokenizer
    from specconvert.reference.ngram import Replay

    tok = load_tokenizer(recipe.workdir_path / "convert" / "target")
    config = json.loads(ngram_argv[ngram_argv.index("--speculative-config") + 1])
    replay = Replay(config["num_speculative_tokens"])
    for payload, record in zip(payloads, records["baseline"]):
        text = tok.apply_chat_template(payload["messages"], tokenize=False, add_generation_prompt=True)
        replay.add(tok.encode(text, add_special_tokens=False), record.token_ids, config["prompt_lookup_min"],
                   config["prompt_lookup_max"], int(ngram_argv[ngram_argv.index("--max-model-len") + 1]))
    print(json.dumps({"ngram_tau_matching_steps": counted.acceptance_length, "drafts": counted.drafts,
                      "per_position": counted.per_position, "replay_tau": replay.acceptance_length,
                      "replay_drafts": replay.drafts, "replay_per_position": replay.acceptance().per_position}))
    assert replay.drafts > 0
    # the last step of a request may accept drafts past max_tokens, which the engine counts and the output lacks
    assert abs(counted.acceptance_length - replay.acceptance_length) <= recipe.serve_test.oracle.tolerance, (
        counted.acceptance_length, replay.acceptance_length)


def test_the_replay_proposes_what_vllms_ngram_proposer_does(vllm_python, tmp_path):
    """``reference.ngram.propose`` against vLLM's own proposer function on random sequences (small vocabularies, so
    that matches, overlaps and ties are common), with random windows, draft lengths and context limits."""
    import subprocess

    script = """
import random, sys, json
import numpy as np
from vllm.v1.spec_decode.ngram_proposer import _find_longest_matched_ngram_and_propose_tokens as vllm_propose
rng = random.Random(0)
cases = []
for _ in range(5000):
    n = rng.randint(0, 60); vocab = rng.choice([2, 3, 5, 20])
    tokens = [rng.randrange(vocab) for _ in range(n)]
    lo = rng.randint(1, 4); hi = rng.randint(lo, 6); k = rng.randint(1, 6); limit = rng.choice([1000, n + rng.randint(0, 3)])
    cases.append([tokens, lo, hi, k, limit, vllm_propose(np.array(tokens, dtype=np.int32), lo, hi, limit, k).tolist()])
json.dump(cases, open(sys.argv[1], 'w'))
"""
    out = tmp_path / "cases.json"
    done = subprocess.run([vllm_python, "-c", script, str(out)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    from specconvert.reference.ngram import propose

    cases = json.loads(out.read_text())
    wrong = [c for c in cases if propose(c[0], c[1], c[2], c[3], c[4]) != c[5]]
    assert len(cases) == 5000 and not wrong, wrong[:3]
    assert sum(1 for c in cases if c[5]) > 1000  # most cases draft something: the comparison is not vacuous
