"""Training benchmark: held-out acceptance of a trained head against training minutes or steps.

    python benchmarks/bench_train.py                                  # default recipe, budgets 2,4,8 min
    python benchmarks/bench_train.py --steps 100,200,400              # seeded step budgets (load-independent heads)
    python benchmarks/bench_train.py --minutes 8 --label docs --set 'draft.train.texts=[python:docs]'
    python benchmarks/bench_train.py --recipe recipes/smollm2-135m/instruct_eagle3-train-long_cpu.yaml --minutes 30,60,120
    python benchmarks/bench_train.py --steps 1200 --answers 1,2,3 --goal chain-3=2.0 --goal tree-8x5-32=2.6

Each budget is a separate `specconvert convert` run in its own workdir
(runs/bench-train/<label>-<budget>), all sharing one synthesis and self:N prompt cache, so the data
is generated once. The budget is set explicitly on every run, whatever the recipe
says: `--minutes M` trains for M wall-clock minutes with the schedule following the
clock (`steps=null`, `epochs=1000`, `max_minutes=M`); `--steps N` trains exactly N
steps (`steps=N`, `epochs=null`, `max_minutes=null`). Each command is printed.

For each run it prints the measured held-out tau (chain and tree, reference decoder,
output checked identical to plain decoding), per-position acceptance, the reference speedup over plain decoding, and the training curve the
run recorded (held-out tau estimate from per-position accuracy at each checkpoint).
`--answers 1,2,3` repeats every budget with that many sampled answers per prompt
(`draft.train.synthesis.answers_per_prompt`; the cache is keyed by the distinct prompts, so the
answers are synthesized once, for the largest N). With two or more data sizes it fits tau against
log2(trained tokens) for each held-out shape, least squares, and prints the slope per doubling of the
data; `--goal SHAPE=TAU` adds where that line reaches TAU. A line through a few points is a trend,
not a promise: it says how far off a goal is in data, in orders of magnitude.

Not a test: numbers depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_RECIPE = REPO / "recipes" / "smollm2-135m-eagle3-cpu.yaml"


def budget_sets(kind: str, value: float) -> list[str]:
    """The overrides that make a run's budget exactly the one measured, whatever the recipe says."""
    if kind == "minutes":
        return ["draft.train.steps=null", "draft.train.epochs=1000", f"draft.train.max_minutes={value:g}"]
    return [f"draft.train.steps={int(value)}", "draft.train.epochs=null", "draft.train.max_minutes=null"]


def run_one(recipe: Path, workdir: Path, budget: list[str], overrides: list[str], shared_cache: Path) -> dict:
    cache = workdir / "cache" / "train"
    cache.mkdir(parents=True, exist_ok=True)
    for f in [*shared_cache.glob("synthesis-*.jsonl"), *shared_cache.glob("self-prompts-*.jsonl")]:
        if not (cache / f.name).exists():
            shutil.copy2(f, cache / f.name)
    cmd = [str(Path(sys.executable).parent / "specconvert"), "convert", str(recipe), "--json", "--force",
           "--set", f"workdir={workdir}"]
    for o in [*budget, *overrides]:
        cmd += ["--set", o]
    print("  " + " ".join(repr(c) if " " in c else c for c in cmd), file=sys.stderr)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"convert failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    for f in [*cache.glob("synthesis-*.jsonl"), *cache.glob("self-prompts-*.jsonl")]:  # the data, written once
        shutil.copy2(f, shared_cache / f.name)
    # a fresh checkpoint per budget: a finished run's checkpoint would be resumed by the next budget
    for f in cache.glob("checkpoint-*.safetensors"):
        f.unlink()
    manifest = json.loads(proc.stdout)["manifest"]
    return {"budget": budget, "wall_s": round(wall, 1), "training": manifest["training"], "timings": manifest["timings"]}


def fit_log2(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares line tau = a + b * log2(tokens) through (tokens, tau) points: (a, b), or None
    without two distinct token counts."""
    xs = [math.log2(t) for t, _ in points]
    if len(set(xs)) < 2:
        return None
    mx, my = sum(xs) / len(xs), sum(y for _, y in points) / len(points)
    b = sum((x - mx) * (y - my) for x, (_, y) in zip(xs, points)) / sum((x - mx) ** 2 for x in xs)
    return my - b * mx, b


def tokens_for(fit: tuple[float, float], tau: float) -> float | None:
    """Trained tokens at which the fitted line reaches tau (None when it never rises)."""
    a, b = fit
    return 2 ** ((tau - a) / b) if b > 0 else None


def parse_goals(goals: list[str]) -> dict[str, float]:
    out = {}
    for g in goals:
        shape, sep, value = g.partition("=")
        try:
            out[shape] = float(value)
        except ValueError:
            sep = ""
        if not sep or not shape:
            sys.exit(f"--goal {g!r}: expected SHAPE=TAU, e.g. chain-3=2.0")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recipe", type=Path, default=DEFAULT_RECIPE)
    group = ap.add_mutually_exclusive_group()
    group.add_argument("--minutes", help="comma list of wall-clock budgets in minutes (default 2,4,8)")
    group.add_argument("--steps", help="comma list of step budgets (seeded: the same heads on any machine with the same CPU kernels)")
    ap.add_argument("--label", default="default")
    ap.add_argument("--set", dest="overrides", action="append", default=[], help="extra recipe overrides (KEY=VALUE)")
    ap.add_argument("--answers", help="comma list of answers per prompt: every budget is trained once per value")
    ap.add_argument("--goal", action="append", default=[], help="SHAPE=TAU: where the fitted data line reaches TAU")
    ap.add_argument("--out", type=Path, help="write all results as JSON here")
    args = ap.parse_args()
    goals = parse_goals(args.goal)
    answers = [int(x) for x in args.answers.split(",")] if args.answers else [None]
    root = REPO / "runs" / "bench-train"
    shared = root / "synthesis-cache"
    shared.mkdir(parents=True, exist_ok=True)
    kind, values = ("steps", args.steps) if args.steps else ("minutes", args.minutes or "2,4,8")
    unit = "min" if kind == "minutes" else "steps"
    results = []
    print(f"recipe {args.recipe}; budgets: {values} {unit}; extra overrides: {args.overrides or 'none'}", file=sys.stderr)
    # the largest N first: it synthesizes every answer the smaller ones read back from the shared cache
    runs = [(n, float(m)) for n in sorted(answers, key=lambda n: -(n or 0)) for m in values.split(",")]
    for n, m in runs:
        label = args.label if n is None else f"{args.label}-a{n}"
        extra = [] if n is None else [f"draft.train.synthesis.answers_per_prompt={n}"]
        workdir = root / f"{label}-{m:g}{unit}"
        print(f"training {label} for {m:g} {unit} -> {workdir}", file=sys.stderr)
        r = run_one(args.recipe, workdir, budget_sets(kind, m), [*args.overrides, *extra], shared)
        r["label"] = label
        r["label_budget"] = f"{m:g} {unit}"
        results.append(r)
        ev = r["training"]["evaluation"]
        shapes = ", ".join(f"{k} tau {v['acceptance_length']:.2f}" for k, v in ev["shapes"].items())
        print(f"  {m:g} {unit}: {r['training']['steps']} steps in {r['training']['train_s'] / 60:.1f} min, {shapes}",
              file=sys.stderr)
    print(f"| label | budget | steps | train min | trained tokens | draft-vocab coverage | held-out shape | tau | per-position acceptance "
          f"| ref tok/s (plain) | speedup vs plain | identical |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        t = r["training"]
        ev = t["evaluation"]
        for name, s in ev["shapes"].items():
            print(f"| {r['label']} | {r['label_budget']} | {t['steps']} | {t['train_s'] / 60:.1f} | {t['data']['trained_tokens']} | "
                  f"{t['draft_vocab']['coverage']:.3f} | {name} | {s['acceptance_length']:.2f} | "
                  f"{', '.join(f'{x:.2f}' for x in s['per_position_acceptance'])} | {s['tokens_per_second']:.1f} "
                  f"({ev['baseline_tokens_per_second']:.1f}) | {s['speedup_vs_plain']}x | {s['identical_to_plain']} |")
    print()
    for r in results:
        curve = "; ".join(f"{h['minutes']:.1f} min: {h['heldout_tau_estimate']:.2f}" for h in r["training"]["history"])
        print(f"{r['label']} {r['label_budget']}, held-out tau estimate by checkpoint: {curve}")
    for budget in dict.fromkeys(r["label_budget"] for r in results):
        same = [r for r in results if r["label_budget"] == budget]
        for shape in dict.fromkeys(k for r in same for k in r["training"]["evaluation"]["shapes"]):
            points = [(r["training"]["data"]["trained_tokens"], r["training"]["evaluation"]["shapes"][shape]["acceptance_length"])
                      for r in same if shape in r["training"]["evaluation"]["shapes"]]
            fit = fit_log2(points)
            if fit is None:
                continue
            line = f"{budget}, {shape}: tau {fit[0]:+.3f} {fit[1]:+.3f} x log2(trained tokens), {fit[1]:+.3f} per doubling"
            if shape in goals:
                need = tokens_for(fit, goals[shape])
                line += (f"; tau {goals[shape]:g} at ~{need:,.0f} trained tokens ({need / max(p[0] for p in points):.0f}x the most here)"
                         if need else f"; tau {goals[shape]:g} not reached: the line does not rise")
            print(line)
    data = results[0]["training"]["data"] if results else {}
    if data.get("synthesis_s") and data.get("synthesis_cached", 0) < data.get("prompts", 0):
        print(f"\nsynthesis: {data['synthesized_tokens']} tokens in {data['synthesis_s']:.0f} s "
              f"({data['synthesized_tokens'] / data['synthesis_s']:.0f} tok/s; cached prompts: {data['synthesis_cached']})")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
