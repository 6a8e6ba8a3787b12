"""GPU smoke test: convert's steps on a ~1B random Llama, timed and measured beside `specconvert plan`'s estimate.

    make gpu-smoke                                   # or: python benchmarks/gpu_smoke.py
    python benchmarks/gpu_smoke.py --json            # one JSON document on stdout

For a CUDA machine with torch and this project only (no vLLM, no TensorRT-LLM); about 1-3 minutes on one
H100, well under 10. Steps, each with its wall time and peak GPU memory (torch.cuda.max_memory_allocated):
  1. build a random-weight Llama target in bf16 (hidden 2048, 16 layers, 32 heads, 8 KV heads,
     intermediate 8192, vocab 32000: 1.1 B parameters) on cuda:0;
  2. one teacher-forced forward over the training batch (what feature extraction costs);
  3. attach an EAGLE-3 head with Model Optimizer (convert's offline training model) and train it a few steps;
  4. FP8 fake-quant calibration of the target (Model Optimizer), where it runs;
  5. the reference decoder's lossless check on CUDA: EAGLE-3 greedy output == plain greedy output (float32).
Each step prints the memory model's estimate for the same shapes (specconvert/models/size.py, the functions
`specconvert plan` uses), so what plan gets wrong shows. Record a run in docs/measurements.md.

Without CUDA it exits 3 with one line. `--device cpu --tiny` runs the same steps on a toy model (the tests).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from specconvert.models import size  # noqa: E402  (light: no torch at import)

FULL = {"hidden": 2048, "layers": 16, "heads": 32, "kv_heads": 8, "intermediate": 8192, "vocab": 32000}
TINY = {"hidden": 64, "layers": 8, "heads": 4, "kv_heads": 2, "intermediate": 128, "vocab": 256}
EXIT_NO_CUDA = 3


@dataclass(frozen=True)
class Settings:
    batch: int = 4
    seq_len: int = 1024
    train_steps: int = 8
    ttt_steps: int = 3
    draft_vocab: int = 8192
    calib_samples: int = 8
    new_tokens: int = 48
    max_draft_len: int = 3

    @classmethod
    def tiny(cls) -> "Settings":
        return cls(batch=2, seq_len=32, train_steps=2, draft_vocab=128, calib_samples=2, new_tokens=12)


def smoke_config(shape: dict[str, int]) -> dict[str, Any]:
    """The target's config.json (what `specconvert plan` would read for it)."""
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": shape["hidden"], "num_hidden_layers": shape["layers"],
        "num_attention_heads": shape["heads"], "num_key_value_heads": shape["kv_heads"],
        "head_dim": shape["hidden"] // shape["heads"], "intermediate_size": shape["intermediate"],
        "vocab_size": shape["vocab"], "max_position_embeddings": 4096, "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5, "hidden_act": "silu", "tie_word_embeddings": False, "torch_dtype": "bfloat16",
        "initializer_range": 0.02, "bos_token_id": 1, "eos_token_id": 2,
    }


def estimates(config: dict[str, Any], s: Settings) -> dict[str, int]:
    """Peak bytes per step from the memory model (the CUDA context, size.CUDA_CONTEXT_GIB, is left out: torch's
    allocator counters do not see it)."""
    weights = size.weight_bytes(config, "bfloat16")
    tokens = s.batch * s.seq_len
    forward = size.forward_activation_bytes(config, tokens, 2, logits=False)  # the decoder alone, as features run
    head_params = size.eagle3_head_parameters(config, s.draft_vocab)
    train = size.training_rank_bytes(config, weights, tokens, head_params, 2, s.draft_vocab, s.ttt_steps, 2)
    calib_act = size.forward_activation_bytes(config, s.seq_len, 2)
    _, calib = size.calibration_placement(weights, calib_act, [1 << 62])
    fp32 = size.weight_bytes(config, "float32") + head_params * 4
    decode = size.kv_bytes_per_token(config, 4) * (s.seq_len + s.new_tokens) + size.forward_activation_bytes(config, 32, 4)
    return {
        "build target": weights,
        "target forward": weights + forward,
        "attach + train": train,
        "fp8 calibration": int(calib - size.CUDA_CONTEXT_GIB * size.GIB),
        "lossless check": fp32 + decode,
    }


def _refuse(message: str) -> None:
    print(f"gpu_smoke: {message}", file=sys.stderr)
    raise SystemExit(EXIT_NO_CUDA)


class Meter:
    """Wall time and peak allocated memory of each step, next to its estimate."""

    def __init__(self, device: str, estimate: dict[str, int], json_out: bool):
        self.device, self.estimate, self.json_out = device, estimate, json_out
        self.rows: list[dict[str, Any]] = []

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        import torch

        cuda = self.device.startswith("cuda")
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        status, value = "ok", None
        try:
            value = fn()
        except _Unsupported as exc:
            status = f"skipped: {exc}"
        if cuda:
            torch.cuda.synchronize()
        row = {"step": name, "status": status, "seconds": round(time.perf_counter() - t0, 2),
               "peak_gib": size.gib(torch.cuda.max_memory_allocated()) if cuda else None,
               "estimate_gib": size.gib(self.estimate[name])}
        self.rows.append(row)
        if not self.json_out:
            peak = "n/a (CPU)" if row["peak_gib"] is None else f"{row['peak_gib']:.2f} GiB"
            print(f"{name:<16} {row['seconds']:>7.2f} s   peak {peak:<12} plan {row['estimate_gib']:.2f} GiB   {status}",
                  flush=True)
        return value


class _Unsupported(Exception):
    pass


def run(shape: dict[str, int], s: Settings, device: str, json_out: bool = False) -> dict[str, Any]:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from specconvert.backends.modelopt.eagle import EagleArch, default_aux_layer_ids, head_state
    from specconvert.reference.decoder import DecodeSettings, ReferenceDecoder
    from specconvert.reference.draft_head import DraftHead
    from specconvert.reference.target import TargetModel
    from specconvert.training.trainer import FeatureExtractor, build_train_model

    config = smoke_config(shape)
    meter = Meter(device, estimates(config, s), json_out)
    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    aux = default_aux_layer_ids(shape["layers"])
    ids = torch.randint(3, shape["vocab"], (s.batch, s.seq_len), generator=gen).to(dev)
    mask = torch.ones_like(ids)

    def build() -> Any:
        torch.manual_seed(0)
        with dev:  # built on the device, in bf16: never a float32 copy
            model = LlamaForCausalLM._from_config(LlamaConfig(**{k: v for k, v in config.items() if k != "torch_dtype"}),
                                                  dtype=torch.bfloat16)
        return model.eval()

    model = meter.run("build target", build)
    features = FeatureExtractor(model, aux)
    meter.run("target forward", lambda: features(ids, mask))

    def attach_and_train() -> Any:
        arch = EagleArch.for_target(model.config, s.draft_vocab)
        used = list(range(s.draft_vocab))
        train_model = build_train_model(model, arch, aux, used, s.ttt_steps, torch.bfloat16, dev, seed=0)
        params = [p for p in train_model.eagle_module.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=3e-4)
        rows = model.get_output_embeddings().weight.detach()[: s.draft_vocab]
        losses = []
        for _ in range(s.train_steps):
            aux_h, final = features(ids, mask)
            with torch.no_grad():
                logits = final @ rows.T
            train_model._cached_attn_blk_masks = {}  # as the trainer does: one mask cache per length
            out = train_model(input_ids=ids, attention_mask=mask, loss_mask=mask.to(torch.bfloat16),
                              base_model_outputs={"base_model_hidden_states": final, "aux_hidden_states": aux_h,
                                                  "base_model_logits": logits})
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            losses.append(round(float(out.loss.detach()), 4))
        state = {k: v.detach().float().cpu() for k, v in head_state(train_model).items()}
        del train_model, optimizer
        return state, losses

    head, losses = meter.run("attach + train", attach_and_train)
    features.close()

    def fp8() -> None:
        try:
            import modelopt.torch.quantization as mtq
        except ImportError as exc:
            raise _Unsupported(f"Model Optimizer quantization does not import ({exc})") from None
        calib = [ids[i % s.batch: i % s.batch + 1] for i in range(s.calib_samples)]

        def loop(m: Any) -> None:
            with torch.no_grad():
                for batch in calib:
                    m(input_ids=batch)
        try:
            mtq.quantize(model, mtq.FP8_DEFAULT_CFG, loop)
        except (RuntimeError, NotImplementedError) as exc:  # e.g. a GPU without FP8 support
            raise _Unsupported(str(exc).splitlines()[0][:160]) from None

    meter.run("fp8 calibration", fp8)

    def lossless() -> dict[str, Any]:
        with tempfile.TemporaryDirectory() as tmp:
            draft_dir = _write_head(Path(tmp), head, config, s, aux)
            model.float()
            target = TargetModel(model, aux)
            drafted = DraftHead.from_dir(draft_dir, num_aux=len(aux), dtype=torch.float32, device=dev)
            decoder = ReferenceDecoder(target, drafted, drafter="eagle")
            prompt = ids[0, : s.seq_len // 2].tolist()
            spec = decoder.generate(prompt, s.new_tokens, DecodeSettings(max_draft_len=s.max_draft_len))
            plain = decoder.generate(prompt, s.new_tokens, DecodeSettings(speculative=False))
        return {"identical": spec.token_ids == plain.token_ids, "tokens": len(plain.token_ids),
                "acceptance_length": round(spec.acceptance_length, 3)}

    check = meter.run("lossless check", lossless)
    return {"shape": shape, "settings": asdict(s), "parameters": size.parameter_count(config),
            "device": device, "device_name": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu",
            "train_losses": losses, "lossless": check, "steps": meter.rows,
            "note": f"plan adds {size.CUDA_CONTEXT_GIB:g} GiB of CUDA context per process to each figure"}


def _write_head(folder: Path, state: dict[str, Any], config: dict[str, Any], s: Settings, aux: list[int]) -> Path:
    """The trained head as a canonical draft folder (config.json + model.safetensors) for the reference decoder."""
    from safetensors.torch import save_file

    draft = folder / "draft"
    draft.mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(draft / "model.safetensors"))
    head_config = {k: config[k] for k in ("hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
                                          "intermediate_size", "vocab_size", "rms_norm_eps", "hidden_act", "rope_theta",
                                          "max_position_embeddings")}
    head_config.update(architectures=["LlamaForCausalLMEagle3"], num_hidden_layers=1, draft_vocab_size=s.draft_vocab,
                       eagle_config={"eagle_aux_hidden_state_layer_ids": aux})
    (draft / "config.json").write_text(json.dumps(head_config))
    return draft


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cuda:N; cpu only with --tiny (tests)")
    parser.add_argument("--tiny", action="store_true", help="a toy model (hidden 64) instead of the ~1B one")
    parser.add_argument("--json", action="store_true", help="one JSON document on stdout")
    args = parser.parse_args(argv)
    if args.device == "cpu" and not args.tiny:
        _refuse("--device cpu runs only with --tiny (a ~1B model is for a GPU); run it on a CUDA machine")
    if args.device.startswith("cuda"):
        try:
            import torch
        except ImportError:
            _refuse("torch is not installed: install a CUDA build of torch and this project (pip install -e .)")
        if not torch.cuda.is_available():
            _refuse("no CUDA device is visible (torch.cuda.is_available() is False): run it on a machine with an "
                    "NVIDIA GPU and a CUDA build of torch")
    shape, settings = (TINY, Settings.tiny()) if args.tiny else (FULL, Settings())
    if not args.json:
        print(f"gpu_smoke: {size.parameter_count(smoke_config(shape)) / 1e9:.2f} B-parameter random Llama {shape} on "
              f"{args.device}; plan figures leave out the {size.CUDA_CONTEXT_GIB:g} GiB CUDA context", flush=True)
    report = run(shape, settings, args.device, args.json)
    if args.json:
        print(json.dumps({"schema_version": 1, "kind": "gpu_smoke", **report}, indent=2))
    else:
        lossless = report["lossless"]
        print(f"lossless: EAGLE-3 output identical to plain greedy: {lossless['identical']} "
              f"({lossless['tokens']} tokens, tau {lossless['acceptance_length']}); train losses {report['train_losses']}")
    return 0 if report["lossless"]["identical"] else 1


if __name__ == "__main__":
    sys.exit(main())
