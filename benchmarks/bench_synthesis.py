"""Synthesis throughput: the project's own vLLM (served) against in-process `generate`, side by side.

    python benchmarks/bench_synthesis.py                           # demo target, 32 prompts x 64 tokens, 2 threads
    python benchmarks/bench_synthesis.py --prompts 64 --max-new-tokens 128 --threads 2 --concurrency 32
    make bench-synthesis BENCH_ARGS="--threads 1"

Both engines answer the same prompts (the builtin training prompts, chat template applied once,
here) greedily, with the same thread budget: `torch.set_num_threads(T)` in process, and
`OMP_NUM_THREADS=T` (`runtime.vllm_threads`) for vLLM's worker. Each source goes through the
synthesis interface (`specconvert.training.answers`), exactly as `draft.train.synthesis`
runs it: in-process batches of `--batch`, vLLM with `--concurrency` requests in flight.
In-process runs first while no server exists; vLLM's startup is reported apart from its tokens/s.

Prints tokens/s per engine, the ratio (target >= 2x), how many answers agree token for token,
and the load average before and after (the machine is shared: read the ratio with it).
Writes runs/bench-synthesis/report.json. Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
DEFAULT_RECIPE = REPO / "recipes" / "smollm2-135m-eagle3-cpu.yaml"


def run_source(source, prompts, max_new_tokens):
    from specconvert.training.answers import GREEDY, AnswerCache, answer_all

    with tempfile.TemporaryDirectory() as scratch:
        cache = AnswerCache(Path(scratch) / "answers.jsonl")
        started = time.perf_counter()
        got = answer_all(source, {(i, 0): p for i, p in enumerate(prompts)}, cache, max_new_tokens, GREEDY)
        seconds = time.perf_counter() - started
    answers = [got[(i, 0)] for i in range(len(prompts))]
    tokens = sum(len(a) for a in answers)
    return answers, {"tokens": tokens, "seconds": round(seconds, 2), "tokens_per_second": round(tokens / seconds, 2)}


def stop_tokens(target: Path, tokenizer) -> list[int]:
    """The generation config's eos ids, then the tokenizer's (what convert stops synthesis on)."""
    ids = []
    gen = target / "generation_config.json"
    if gen.is_file():
        eos = json.loads(gen.read_text()).get("eos_token_id")
        ids += [eos] if isinstance(eos, int) else list(eos or [])
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return list(dict.fromkeys(int(i) for i in ids))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--recipe", default=str(DEFAULT_RECIPE))
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=2, help="thread budget of each engine")
    parser.add_argument("--batch", type=int, default=16, help="in-process generate batch")
    parser.add_argument("--concurrency", type=int, default=16, help="vLLM requests in flight")
    parser.add_argument("--vllm-python", default=None, help="default: runtime.vllm_python, else .venv-vllm/bin/python")
    parser.add_argument("--out", default=str(REPO / "runs" / "bench-synthesis"))
    args = parser.parse_args()

    import torch
    import transformers

    from specconvert.models.sources import resolve_model
    from specconvert.prompts import load_samples
    from specconvert.recipe import load_recipe
    from specconvert.training.answers.inprocess import InProcessSource
    from specconvert.training.answers.vllm import VllmSource
    from specconvert.training.data import prompt_ids

    overrides = [f"runtime.vllm_threads={args.threads}", f"draft.train.synthesis.concurrency={args.concurrency}",
                 "draft.train.synthesis.engine=vllm"]
    if args.vllm_python:
        overrides.append(f"runtime.vllm_python={args.vllm_python}")
    recipe = load_recipe(args.recipe, overrides)
    target = resolve_model(recipe.target.model, "target.model", recipe.base_dir).path
    dtype = recipe.target.dtype if recipe.target.dtype != "auto" else "float32"
    load_before = os.getloadavg()
    torch.set_num_threads(args.threads)
    print(f"target {target} ({dtype}); {args.prompts} prompts x {args.max_new_tokens} tokens; {args.threads} threads "
          f"each; load average {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}", file=sys.stderr)
    model = transformers.AutoModelForCausalLM.from_pretrained(str(target), dtype=getattr(torch, dtype)).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(target))
    stop_ids = stop_tokens(target, tokenizer)
    samples = load_samples(recipe.draft.train.prompts, "draft.train.prompts", recipe.base_dir)[: args.prompts]
    prompts = [prompt_ids(s, tokenizer) for s in samples]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_ids[0]

    print("in-process generate ...", file=sys.stderr)
    local_answers, local = run_source(InProcessSource(model, stop_ids, pad, args.batch), prompts, args.max_new_tokens)
    print(f"  {local}", file=sys.stderr)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with VllmSource(recipe.draft.train.synthesis, recipe, target, dtype, stop_ids, tokenizer, out) as source:
        print("vLLM: starting ...", file=sys.stderr)
        started = time.perf_counter()
        source.start()
        startup = time.perf_counter() - started
        served_answers, served = run_source(source, prompts, args.max_new_tokens)
    served["startup_s"] = round(startup, 1)
    print(f"  {served}", file=sys.stderr)
    load_after = os.getloadavg()
    ratio = served["tokens_per_second"] / local["tokens_per_second"]
    same = sum(a == b for a, b in zip(local_answers, served_answers))
    report = {"target": str(target), "dtype": dtype, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "threads": args.threads, "batch": args.batch, "concurrency": args.concurrency,
              "inprocess": local, "vllm": served, "ratio": round(ratio, 3), "identical_answers": same,
              "load_average_before": [round(x, 2) for x in load_before],
              "load_average_after": [round(x, 2) for x in load_after], "target_ratio": 2.0, "met": ratio >= 2.0}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    print(f"{'engine':<22}{'tokens':>8}{'seconds':>10}{'tok/s':>10}")
    print(f"{'in-process generate':<22}{local['tokens']:>8}{local['seconds']:>10}{local['tokens_per_second']:>10}")
    print(f"{'vLLM (served)':<22}{served['tokens']:>8}{served['seconds']:>10}{served['tokens_per_second']:>10}"
          f"   (+{served['startup_s']} s startup)")
    print(f"ratio served / in-process: {ratio:.2f}x (target >= 2x: {'met' if ratio >= 2 else 'NOT met'}); "
          f"identical answers {same}/{len(prompts)}; load average {load_before[0]:.2f} -> {load_after[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
