"""`make bench-tune`: the tuned bundle against every fixed chain length and the baseline, on vLLM, in one run.

    python benchmarks/bench_tune.py [--recipe R] [--fixed 1,2,3] [--repeats 5] [--num-requests 8] [--max-tokens 32]

Needs the demo's tune and build (`make demo`, or convert + tune + build). Runs
`specconvert bench` with every fixed chain length as an extra arm (`bench.fixed_draft_lens`), all
vLLM servers up at once (`runtime.vllm_servers: together`, 1 GiB of KV cache each so five fit in
24 GiB) and the runs interleaved per level, the order of baseline, k1, k2, k3, tuned rotating
each round. It prints output
tok/s per arm and level, and the speed target of issue 14:

- tuned >= 0.97x the best of {baseline, every fixed chain length} at each level;
- tuned >= 1.0x the baseline; where tune turned speculation off (draft length 0) the tuned server
  decodes like the baseline, so there the ratio only has to be 1 within noise (>= 0.97).

Ratios come from one interleaved run (drift hits every arm alike); absolute tok/s come with the
load average, which moves them on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "smollm2-135m-eagle3-cpu.yaml"
TARGET_BEST, TARGET_BASELINE = 0.97, 1.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", type=Path, default=RECIPE)
    ap.add_argument("--fixed", default="1,2,3", help="fixed chain lengths to run beside the tuned bundle")
    ap.add_argument("--repeats", type=int, default=5, help="rounds per level; 5 puts each of the 5 arms in each position once")
    ap.add_argument("--num-requests", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--vllm-python", default=str(REPO / ".venv-vllm" / "bin" / "python"))
    args = ap.parse_args()

    from specconvert.manifest import read_manifest
    from specconvert.recipe import load_recipe
    from specconvert.stages.outputs import engine_dir, read_tune

    recipe = load_recipe(args.recipe)
    tune = read_tune(recipe)
    if tune is None:
        print(f"bench-tune: no tune result in {recipe.workdir_path / 'tune'}: run `make demo` (or tune + build) first",
              file=sys.stderr)
        return 2
    # what the bundle's vLLM server drafts per level: build's choice from tune's measurement (vLLM's own, where
    # tune priced its scheduled 0); tune's own choice for a bundle built before build recorded it
    decision = ((read_manifest(engine_dir(recipe)) or {}).get("decisions") or {}).get("tune_decision") or tune
    choice = {int(b): int(k) for b, k in (decision.get("vllm_choice") or decision.get("choice") or {}).items()}
    out = recipe.workdir_path / "bench-tune"
    fixed = [int(k) for k in args.fixed.split(",") if k.strip()]
    command = [sys.executable, "-m", "specconvert", "bench", str(args.recipe), "--out", str(out),
               "--set", "runtime.backend=vllm", "--set", f"runtime.vllm_python={args.vllm_python}",
               "--set", "runtime.vllm_servers=together", "--set", "runtime.vllm_kv_cache_gib=1",
               "--set", f"bench.fixed_draft_lens={json.dumps(fixed)}", "--set", f"bench.repeats={args.repeats}",
               "--set", f"bench.num_requests={args.num_requests}", "--set", f"bench.max_tokens={args.max_tokens}",
               "--set", "bench.plots=false"]
    print("running:", " ".join(command[2:]), flush=True)
    load_before = os.getloadavg()
    done = subprocess.run(command, cwd=REPO)
    load_after = os.getloadavg()
    if done.returncode != 0:
        print(f"bench-tune: specconvert bench exited {done.returncode}", file=sys.stderr)
        return done.returncode
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    labels = [a["label"] for a in report["arms"]]
    tuned = next(a for a in report["arms"] if a["label"] == "speculative")
    print()
    print(f"SmolLM2-135M on vLLM (CPU), {report['settings']['num_requests']} requests x {args.max_tokens} tokens per run, "
          f"{args.repeats} interleaved repeats; order: {report['order']}")
    print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f}, after {load_after[0]:.2f} {load_after[1]:.2f}")
    print(f"tuned arm: {tuned['setting']}")
    print(f"tune chose draft length {choice} per concurrency")
    header = ["conc."] + [("tuned" if label == "speculative" else label) for label in labels] + ["tuned/best", "tuned/base", "target"]
    print(" ".join(f"{h:>12}" for h in header))
    ok = True
    for level in report["levels"]:
        vb = level.get("versus_best") or {}
        best, base = vb.get("ratio_to_best_other"), vb.get("ratio_to_baseline")
        chosen = choice.get(level["concurrency"])
        floor = TARGET_BEST if chosen == 0 else TARGET_BASELINE  # draft length 0: the baseline itself, within noise
        met = best is not None and best >= TARGET_BEST and base is not None and base >= floor
        ok = ok and met
        cells = [str(level["concurrency"])] + [f"{(level.get(label) or {}).get('output_tokens_per_s') or 0:.2f}" for label in labels]
        cells += [f"{best:.3f}x" if best else "-", f"{base:.3f}x" if base else "-", "met" if met else "NOT met"]
        print(" ".join(f"{c:>12}" for c in cells))
    print(f"(output tok/s; target: tuned >= {TARGET_BEST}x the best other arm and >= {TARGET_BASELINE}x the baseline; "
          f"report: {out / 'report.md'})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
