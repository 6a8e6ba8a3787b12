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
    print(json.dumps({"ngram_tau_matching_steps": counted.acceptance_length, "drafts": counted.drafts,
                      "per_position": counted.per_position}))
