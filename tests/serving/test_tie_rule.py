"""The lossless tie rule end to end (issue 20 item 1): a near-tie planted in a real tiny target, served by the
real reference server, diagnosed by serve-test through the logprobs it serves (token ids, vLLM's spelling)."""

from __future__ import annotations

import json

import pytest

from .test_serve_test_reference import _serve_in_thread

PROMPT = "The quick brown fox"
FLIP_AT = 2  # the generated token where the speculative path takes the near-tied runner-up


class FlipAt:
    """Wraps the real decoder: on the speculative path, output token ``FLIP_AT`` is ``runner_up`` instead of
    ``best`` (what a bf16 engine does at a near-tie between batch shapes); the baseline is untouched."""

    def __init__(self, inner, best: int, runner_up: int):
        self.inner, self.best, self.runner_up = inner, best, runner_up
        self.tokenizer, self.eos_token_ids, self.target = inner.tokenizer, inner.eos_token_ids, inner.target

    def stream(self, prompt_ids, max_new_tokens, settings):
        emitted = 0
        for step in self.inner.stream(prompt_ids, max_new_tokens, settings):
            k = FLIP_AT - emitted
            if settings.speculative and 0 <= k < len(step.token_ids) and step.token_ids[k] == self.best:
                step.token_ids = list(step.token_ids)
                step.token_ids[k] = self.runner_up
            emitted += len(step.token_ids)
            yield step


@pytest.fixture(scope="module")
def near_tie(built_bundle):
    """A tiny engine whose target has token B planted 15% of the way from the argmax A towards the runner-up C at
    generated token 2: B's logit is A's minus 0.15 x (A - C), a ~0.02-nat near-tie, and A stays the argmax
    wherever it was (B is a blend of A and C, never above both)."""
    import torch

    from specconvert.reference import DecodeSettings
    from specconvert.serving.engine import ReferenceEngine, load_engine

    torch.set_num_threads(1)
    root, _ = built_bundle
    engine = load_engine(root / "work" / "engine", "tiny-serve", device="cpu")
    decoder = engine.decoder
    ids = decoder.tokenizer.encode(PROMPT)
    plain = DecodeSettings(max_draft_len=3, temperature=0.0, speculative=False, logprobs=5, stop_token_ids=())
    entries = [e for step in decoder.stream(ids, FLIP_AT + 1, plain) for e in step.logprobs]
    (best, _), (runner_up, _) = entries[FLIP_AT].top[:2]
    used = set(ids) | {e.token_id for e in entries} | {t for e in entries for t, _ in e.top}
    planted = next(t for t in range(255, 0, -1) if t not in used)
    with torch.no_grad():
        w = decoder.target.lm_head_weight()
        w[planted] = w[best] + 0.15 * (w[runner_up] - w[best])
    after = [e for step in decoder.stream(ids, FLIP_AT + 1, plain) for e in step.logprobs][FLIP_AT]
    assert after.token_id == best and after.top[1][0] == planted  # the plant made a near-tie, nothing else
    gap = after.top[0][1] - after.top[1][1]
    assert 0 < gap < 0.05, gap
    flipped = ReferenceEngine(FlipAt(decoder, best, planted), "tiny-serve", engine.max_draft_len)
    server, thread, url = _serve_in_thread(flipped)
    yield url, best, planted, gap
    server.should_exit = True
    thread.join(10)


def test_a_planted_near_tie_is_a_numerical_tie_through_the_reference_server(project, cli, near_tie, tmp_path):
    url, best, planted, gap = near_tie
    prompts = tmp_path / "one.jsonl"
    prompts.write_text(json.dumps({"id": "fox", "prompt": PROMPT}) + "\n")
    project.write(prompts=str(prompts), stream=False, lossless={"mode": "greedy", "tie_margin": 0.05})
    result = cli("serve-test", project.recipe_path, "--url", url, "--json")
    report = result.json()
    (row,) = report["prompts"]
    diagnosis = row["first_divergence"]["diagnosis"]
    assert row["first_divergence"]["token_index"] == FLIP_AT
    # The speculative token is found among the baseline's top logprobs by id: the margin is exact.
    assert diagnosis["class"] == "tie" and diagnosis["exact"] is True, diagnosis
    assert diagnosis["speculative_token"] == f"token_id:{planted}" and diagnosis["baseline_token"] == f"token_id:{best}"
    assert diagnosis["margin"] == pytest.approx(gap, abs=1e-4)
    lossless = next(c for c in report["checks"] if c["name"].startswith("lossless"))
    assert lossless["passed"] and "1 at a numerical tie" in lossless["message"], lossless
    assert result.code == 0, result.stderr[-2000:]

    # The same plant with a tie margin below the gap is a real divergence, and fails.
    project.write(lossless={"mode": "greedy", "tie_margin": gap / 2})
    result = cli("serve-test", project.recipe_path, "--url", url, "--json")
    assert result.code == 1
    assert result.json()["prompts"][0]["first_divergence"]["diagnosis"]["class"] == "divergence"


def test_the_reference_server_spells_logprob_tokens_by_id_on_request(near_tie):
    import httpx

    url, best, planted, _ = near_tie
    body = {"model": "tiny-serve-baseline", "prompt": PROMPT, "max_tokens": FLIP_AT + 1, "temperature": 0,
            "logprobs": 3}
    with httpx.Client(base_url=url, timeout=60, trust_env=False) as http:
        by_id = http.post("/v1/completions", json={**body, "return_tokens_as_token_ids": True}).json()
        by_text = http.post("/v1/completions", json=body).json()
        chat = http.post("/v1/chat/completions", json={"model": "tiny-serve-baseline", "max_tokens": 1, "temperature": 0,
                                                       "messages": [{"role": "user", "content": "x"}], "logprobs": True,
                                                       "top_logprobs": 2, "return_tokens_as_token_ids": True}).json()
    lp = by_id["choices"][0]["logprobs"]
    assert lp["tokens"][FLIP_AT] == f"token_id:{best}"
    assert list(lp["top_logprobs"][FLIP_AT])[:2] == [f"token_id:{best}", f"token_id:{planted}"]
    assert not by_text["choices"][0]["logprobs"]["tokens"][FLIP_AT].startswith("token_id:")
    content = chat["choices"][0]["logprobs"]["content"][0]
    assert content["token"].startswith("token_id:") and all(t["token"].startswith("token_id:") for t in content["top_logprobs"])
