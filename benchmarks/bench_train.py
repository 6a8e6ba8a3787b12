"""Training benchmark: held-out acceptance of a trained head against training minutes.

    python benchmarks/bench_train.py                                  # default recipe, budgets 2,4,8 min
    python benchmarks/bench_train.py --minutes 8 --label docs --set 'draft.train.texts=[python:docs]'
    python benchmarks/bench_train.py --recipe recipes/smollm2-135m/instruct_eagle3-train-long_cpu.yaml --minutes 30,60,120

Each budget is a separate `specconvert convert` run in its own workdir
(runs/bench-train/<label>-<minutes>min), all sharing one synthesis cache, so the data
is generated once. For each run it prints the measured held-out tau (chain and tree,
reference decoder, output checked identical to plain decoding), per-position
acceptance, the reference speedup over plain decoding, and the training curve the
run recorded (held-out tau estimate from per-position accuracy at each checkpoint).
Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_RECIPE = REPO / "recipes" / "smollm2-135m-eagle3-cpu.yaml"


def run_one(recipe: Path, workdir: Path, minutes: float, overrides: list[str], shared_cache: Path) -> dict:
    cache = workdir / "cache" / "train"
    cache.mkdir(parents=True, exist_ok=True)
    for f in shared_cache.glob("synthesis-*.jsonl"):
        if not (cache / f.name).exists():
            shutil.copy2(f, cache / f.name)
    cmd = [str(Path(sys.executable).parent / "specconvert"), "convert", str(recipe), "--json", "--force",
           "--set", f"workdir={workdir}", "--set", f"draft.train.max_minutes={minutes}"]
    for o in overrides:
        cmd += ["--set", o]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"convert failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    for f in cache.glob("synthesis-*.jsonl"):
        shutil.copy2(f, shared_cache / f.name)
    # a fresh checkpoint per budget: a finished run's checkpoint would be resumed by the next budget
    for f in cache.glob("checkpoint-*.safetensors"):
        f.unlink()
    manifest = json.loads(proc.stdout)["manifest"]
    return {"minutes": minutes, "wall_s": round(wall, 1), "training": manifest["training"], "timings": manifest["timings"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", type=Path, default=DEFAULT_RECIPE)
    ap.add_argument("--minutes", default="2,4,8", help="comma list of training budgets (draft.train.max_minutes)")
    ap.add_argument("--label", default="default")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="extra recipe overrides (KEY=VALUE)")
    ap.add_argument("--out", type=Path, help="write all results as JSON here")
    args = ap.parse_args()
    root = REPO / "runs" / "bench-train"
    shared = root / "synthesis-cache"
    shared.mkdir(parents=True, exist_ok=True)
    results = []
    for m in [float(x) for x in args.minutes.split(",")]:
        workdir = root / f"{args.label}-{m:g}min"
        print(f"training {args.label} for {m:g} min -> {workdir}", file=sys.stderr)
        r = run_one(args.recipe, workdir, m, args.overrides, shared)
        results.append(r)
        ev = r["training"]["evaluation"]
        shapes = ", ".join(f"{k} tau {v['acceptance_length']:.2f}" for k, v in ev["shapes"].items())
        print(f"  {m:g} min: {r['training']['steps']} steps, {shapes}", file=sys.stderr)
    print(f"| label | budget min | steps | trained tokens | draft-vocab coverage | held-out shape | tau | per-position acceptance "
          f"| ref tok/s (plain) | speedup vs plain | identical |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        t = r["training"]
        ev = t["evaluation"]
        for name, s in ev["shapes"].items():
            print(f"| {args.label} | {r['minutes']:g} | {t['steps']} | {t['data']['trained_tokens']} | "
                  f"{t['draft_vocab']['coverage']:.3f} | {name} | {s['acceptance_length']:.2f} | "
                  f"{', '.join(f'{x:.2f}' for x in s['per_position_acceptance'])} | {s['tokens_per_second']:.1f} "
                  f"({ev['baseline_tokens_per_second']:.1f}) | {s['speedup_vs_plain']}x | {s['identical_to_plain']} |")
    print()
    for r in results:
        curve = "; ".join(f"{h['minutes']:.1f} min: {h['heldout_tau_estimate']:.2f}" for h in r["training"]["history"])
        print(f"{args.label} {r['minutes']:g} min, held-out tau estimate by checkpoint: {curve}")
    data = results[0]["training"]["data"] if results else {}
    if data.get("synthesis_s") and data.get("synthesis_cached", 0) < data.get("prompts", 0):
        print(f"\nsynthesis: {data['synthesized_tokens']} tokens in {data['synthesis_s']:.0f} s "
              f"({data['synthesized_tokens'] / data['synthesis_s']:.0f} tok/s; cached prompts: {data['synthesis_cached']})")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
