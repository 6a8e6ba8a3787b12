"""`make bench-convert`: specconvert convert on SmolLM2 vs the bare Model Optimizer calls.

    python benchmarks/bench_convert.py [--runs N]

specconvert runs `convert --force` on recipes/smollm2-135m/instruct_eagle3-random_cpu.yaml:
a random head, no training (the default recipe trains a head, which the bare script
does not). Each side runs in a fresh subprocess (imports included), interleaved A B A B so that
machine drift hits both; medians and their ratio are printed. The bare side does only
what a hand-written script would: load the target, `mtsp.convert`, export the head.
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "smollm2-135m" / "instruct_eagle3-random_cpu.yaml"
RUNS = 3

BARE = r"""
import copy, sys, torch
from transformers import AutoModelForCausalLM
import modelopt.torch.speculative as mtsp
from modelopt.torch.speculative.config import EAGLE3_DEFAULT_CFG
from modelopt.torch.export.unified_export_hf import export_speculative_decoding
target, out = sys.argv[1], sys.argv[2]
model = AutoModelForCausalLM.from_pretrained(target, dtype=torch.float32)
c = model.config
cfg = copy.deepcopy(EAGLE3_DEFAULT_CFG)["config"]
cfg["eagle_use_torch_compile"] = False
cfg["eagle_architecture_config"].update(intermediate_size=c.intermediate_size, num_attention_heads=c.num_attention_heads,
    num_key_value_heads=c.num_key_value_heads, head_dim=c.hidden_size // c.num_attention_heads, has_lm_head=True)
mtsp.convert(model, [("eagle", cfg)])
export_speculative_decoding(model, export_dir=out)
"""


def timed(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    return time.perf_counter() - t0


def main() -> None:
    import argparse
    import os

    from specconvert.models.sources import resolve_model
    from specconvert.recipe import load_recipe

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=RUNS)
    args = ap.parse_args()
    recipe = load_recipe(RECIPE)
    if recipe.draft.init != "random" or recipe.draft.train is not None or recipe.quantize.format != "none":
        sys.exit(f"{RECIPE} must convert a random head without training or quantization: that is what the bare side does")
    target = resolve_model(recipe.target.model, "target.model", REPO).path
    work = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    ours = [sys.executable, "-m", "specconvert", "convert", str(RECIPE), "--force", "--quiet", "--set", f"workdir={work / 'runs'}"]
    bare = [sys.executable, "-c", BARE, str(target), str(work / "bare")]
    print(f"specconvert: {' '.join(['specconvert', *ours[3:]])}")
    print(f"bare:        python -c BARE {target} {work / 'bare'}  (load, mtsp.convert, export_speculative_decoding)")
    times: dict[str, list[float]] = {"bare Model Optimizer": [], "specconvert convert": []}
    try:
        for _ in range(args.runs):
            times["bare Model Optimizer"].append(timed(bare))
            times["specconvert convert"].append(timed(ours))
    finally:
        shutil.rmtree(work, ignore_errors=True)  # two converted copies of the model: not worth keeping
    base = statistics.median(times["bare Model Optimizer"])
    load = os.getloadavg()
    print(f"SmolLM2-135M, random head (draft.init: random, no training), fp32, {args.runs} runs each "
          f"(interleaved, subprocess incl. imports); load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}")
    print(f"{'':24} {'median s':>9} {'ratio':>7}  runs s")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:24} {med:9.2f} {med / base:6.2f}x  {', '.join(f'{v:.1f}' for v in values)}")


if __name__ == "__main__":
    main()
