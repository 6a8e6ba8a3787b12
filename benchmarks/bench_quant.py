"""`make bench-quant`: what quantizing the target costs a head in acceptance (issue 19).

    python benchmarks/bench_quant.py --convert runs/NAME/convert            # convert's target source + head
    python benchmarks/bench_quant.py --target DIR --draft DIR --aux 1,14,26  # any pair
    python benchmarks/bench_quant.py ... --formats none,fp8,int4_awq --prompts 8 --max-new-tokens 48

For each format the unquantized target is loaded, fake-quantized with Model Optimizer on
the same calibration convert uses (`quantize.*` defaults unless overridden), and the same
held-out prompts are decoded greedily with the same head through the one evaluation
function convert uses (`specconvert.reference.evaluate`): tau and per-position acceptance
for the build's chain (3) and convert's default tree (top-k 8, depth 5, 32 tokens), plus
whether every speculative output equals that target's own greedy output. A format that
cannot calibrate here (nvfp4 on CPU, int4_awq on dims that are not multiples of 128) is
reported with the reason. Prints a markdown table and the 1-minute load average before
and after; `--out FILE` writes the figures as JSON. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SHAPES = {"chain-3": {"max_draft_len": 3}, "tree-8x5-32": {"tree": {"top_k": 8, "depth": 5, "total_tokens": 32}}}


def load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def measure(fmt: str, target: Path, draft: Path, aux: list[int], items: list, args) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from specconvert.backends.modelopt import quantize as mq
    from specconvert.recipe import QuantizeSpec
    from specconvert.reference.decoder import ReferenceDecoder
    from specconvert.reference.evaluate import evaluate
    from specconvert.training.data import prompt_ids

    started = {"load_avg_before": load_avg()}
    model = AutoModelForCausalLM.from_pretrained(str(target), dtype=getattr(torch, args.dtype)).eval()
    calib_s = 0.0
    if fmt != "none":
        spec = QuantizeSpec(format=fmt, calib_samples=args.calib_samples, calib_seq_len=args.calib_seq_len)
        config = json.loads((target / "config.json").read_text())
        mq.check_environment(fmt, "cuda" if torch.cuda.is_available() else "cpu")
        mq.check_shapes(fmt, config)
        t0 = time.perf_counter()
        mq.calibrate(model, _tokenizer(target), spec, REPO)
        calib_s = time.perf_counter() - t0
    decoder = ReferenceDecoder.from_dirs(target, draft, aux, device="cpu", dtype=args.dtype, model=model)
    encoded = [prompt_ids(s, decoder.tokenizer) for s in items]
    report = evaluate(decoder, encoded, args.max_new_tokens, SHAPES)
    return {**started, **report, "calibrate_s": round(calib_s, 1), "load_avg_after": load_avg()}


def _tokenizer(target: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(target))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--convert", type=Path, help="a convert stage directory (its target source, head and aux ids)")
    parser.add_argument("--target", type=Path, help="an unquantized HF target folder")
    parser.add_argument("--draft", type=Path, help="an EAGLE-3 head folder (canonical layout)")
    parser.add_argument("--aux", help="aux layer ids, comma-separated (output-of-layer convention)")
    parser.add_argument("--formats", default="none,fp8,int4_awq")
    parser.add_argument("--prompt-set", default="builtin:chat-eval")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--calib-samples", type=int, default=64)
    parser.add_argument("--calib-seq-len", type=int, default=256)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    import torch

    from specconvert.errors import SpecConvertError
    from specconvert.training.data import load_prompt_samples

    if args.threads:
        torch.set_num_threads(args.threads)
    target, draft, aux = args.target, args.draft, [int(x) for x in args.aux.split(",")] if args.aux else None
    if args.convert:
        manifest = json.loads((args.convert / "manifest.json").read_text())
        target = target or Path(manifest["target"]["source_path"])
        draft = draft or Path(manifest["artifacts"]["draft_dir"])
        aux = aux or manifest["decisions"]["aux_layer_ids"]
    if not (target and draft and aux):
        parser.error("give --convert, or --target, --draft and --aux")
    items = load_prompt_samples(args.prompt_set, "--prompt-set", REPO)[: args.prompts]
    results = {}
    for fmt in args.formats.split(","):
        print(f"[{time.strftime('%H:%M:%S')}] {fmt}: load average {load_avg()}", file=sys.stderr, flush=True)
        try:
            results[fmt] = measure(fmt, target, draft, aux, items, args)
        except SpecConvertError as exc:
            results[fmt] = {"skipped": exc.one_line()}
    print(f"\ntarget {target}, head {draft}, aux {aux}; {len(items)} prompts of {args.prompt_set}, "
          f"{args.max_new_tokens} new tokens, {args.dtype}, greedy\n")
    print("| target | shape | tau | per-position acceptance | tau drop vs none | identical to its own greedy | load avg |")
    print("|---|---|---|---|---|---|---|")
    base = results.get("none", {}).get("shapes", {})
    for fmt, r in results.items():
        if "skipped" in r:
            print(f"| {fmt} | - | - | not measured: {r['skipped']} | - | - | - |")
            continue
        for name, s in r["shapes"].items():
            drop = f"{base[name]['acceptance_length'] - s['acceptance_length']:+.2f}" if name in base and fmt != "none" else "-"
            print(f"| {fmt} | {name} | {s['acceptance_length']:.2f} | {s['per_position_acceptance']} | {drop} | "
                  f"{s['identical_to_plain']} | {r['load_avg_before']} -> {r['load_avg_after']} |")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
