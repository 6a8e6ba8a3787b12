"""Post-training quantization of the target with Model Optimizer, exported as a HF checkpoint.

``mtq.quantize(model, CFG, forward_loop)`` then ``export_hf_checkpoint`` writes the
weights plus ``hf_quant_config.json`` that TensorRT-LLM reads. FP8 and INT4-AWQ
calibrate on CPU; NVFP4 needs CUDA (checked before any work starts).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from ..._imports import require
from ...errors import EnvironmentMissing, ExternalFailure, InputError

# recipe format -> Model Optimizer config name
QUANT_CONFIGS = {"fp8": "FP8_DEFAULT_CFG", "int4_awq": "INT4_AWQ_CFG", "nvfp4": "NVFP4_DEFAULT_CFG"}
NEEDS_CUDA = {"nvfp4"}
# INT4_AWQ_CFG quantizes weights in blocks of 128 input features; the HF export cannot pack
# partial blocks ("Cannot pack weight with input dimension 576 and block size 128").
AWQ_BLOCK_SIZE = 128


def check_environment(fmt: str, device: str) -> None:
    """Fail fast, before loading anything, when a format cannot run here."""
    if fmt in NEEDS_CUDA and device != "cuda":
        raise EnvironmentMissing(
            f"quantize.format: {fmt} calibrates only on a CUDA GPU and none is available here",
            fix="run convert on a GPU machine, or use quantize.format: fp8 (calibrates on CPU)",
        )


def check_shapes(fmt: str, target_config: dict[str, Any]) -> None:
    """Refuse shapes the export cannot pack, before minutes of calibration are spent."""
    if fmt != "int4_awq":
        return
    cfg = target_config.get("text_config") or target_config
    heads = cfg.get("num_attention_heads") or 1
    dims = {
        "hidden_size": cfg.get("hidden_size"),
        "intermediate_size": cfg.get("intermediate_size"),
        "num_attention_heads x head_dim": heads * (cfg.get("head_dim") or (cfg.get("hidden_size") or 0) // heads),
    }
    bad = {name: dim for name, dim in dims.items() if dim and dim % AWQ_BLOCK_SIZE}
    if bad:
        listed = ", ".join(f"{name} {dim}" for name, dim in bad.items())
        raise InputError(
            f"quantize.format: int4_awq packs weights in blocks of {AWQ_BLOCK_SIZE} input features; this target has {listed}",
            fix="use quantize.format: fp8 for this target",
        )


def quantize(model: Any, fmt: str, batches: list[Any], on_batch: Callable[[], None] | None = None) -> None:
    """Quantize ``model`` in place, calibrating on ``batches`` of input ids."""
    torch = require("torch")
    mtq = require("modelopt.torch.quantization", purpose=f"quantize the target to {fmt}")
    cfg = getattr(mtq, QUANT_CONFIGS[fmt])
    device = next(model.parameters()).device

    def forward_loop(m: Any) -> None:
        with torch.no_grad():
            for ids in batches:
                m(input_ids=ids.to(device))
                if on_batch:
                    on_batch()

    mtq.quantize(model, cfg, forward_loop)


def calibrate(model: Any, tokenizer: Any, spec: Any, base_dir: Path, on_batch: Callable[[], None] | None = None) -> int:
    """Quantize ``model`` in place to ``spec.format`` (a ``QuantizeSpec``) on its calibration prompts.

    One function for convert's export and for training on the quantized target's features
    (``draft.train.features: quantized``): the same prompts, lengths and order give the
    same calibration. Returns the number of calibration batches.
    """
    from ...prompts import load_samples, sample_text

    samples = load_samples(spec.calib_prompts, "quantize.calib_prompts", base_dir)
    texts = [sample_text(samples[i % len(samples)], tokenizer) for i in range(spec.calib_samples)]
    batches = [tokenizer(text, return_tensors="pt", truncation=True, max_length=spec.calib_seq_len)["input_ids"]
               for text in texts]
    quantize(model, spec.format, batches, on_batch=on_batch)
    return len(batches)


def export(model: Any, out_dir: Path, dtype: Any) -> dict[str, Any]:
    """``export_hf_checkpoint`` into ``out_dir``; returns the ``quantization`` section written."""
    from modelopt.torch.export import export_hf_checkpoint

    out_dir = Path(out_dir)
    export_hf_checkpoint(model, dtype=dtype, export_dir=out_dir)
    qfile = out_dir / "hf_quant_config.json"
    if not qfile.is_file():
        raise ExternalFailure(
            "Model Optimizer's export wrote no hf_quant_config.json for a quantized model",
            fix="check the Model Optimizer version (>=0.37) and report the versions from `specconvert doctor`",
        )
    return json.loads(qfile.read_text()).get("quantization", {})
