"""A thin adapter over TensorRT-LLM's published LLM API: load, warm up, report.

``LLM(model=target, speculative_config=<EagleDecodingConfig|Eagle3DecodingConfig>, **options)``,
one short greedy generation, and the numbers the manifest records. Imported lazily;
never pretends to have run.
"""

from __future__ import annotations

import time
from typing import Any

from ..._imports import installed_version, require
from ...errors import ExternalFailure

WARMUP_PROMPTS = ("The capital of France is", "def fibonacci(n):")


def cuda_available() -> tuple[bool, str | None]:
    """(available, GPU name) without failing where torch is absent."""
    if installed_version("torch") is None:
        return False, None
    import torch

    if not torch.cuda.is_available():
        return False, None
    return True, torch.cuda.get_device_name(0)


def skip_reason() -> str | None:
    """Why TensorRT-LLM cannot load here, or None when it can."""
    if installed_version("tensorrt_llm") is None:
        return "tensorrt_llm not installed"
    ok, _ = cuda_available()
    if not ok:
        return "no CUDA GPU visible"
    return None


def _config_objects(llmapi: Any, options: dict[str, Any], config_class: str) -> dict[str, Any]:
    """Turn the YAML dicts into the LLM API's config objects (the YAML path does the same)."""
    kwargs = dict(options)
    spec = dict(kwargs.pop("speculative_config"))
    spec.pop("decoding_type", None)  # implied by the class (a ClassVar in 1.2, a fixed Literal later)
    kwargs["speculative_config"] = getattr(llmapi, config_class)(**spec)
    if isinstance(kwargs.get("kv_cache_config"), dict):
        kwargs["kv_cache_config"] = llmapi.KvCacheConfig(**kwargs["kv_cache_config"])
    if isinstance(kwargs.get("cuda_graph_config"), dict):
        kwargs["cuda_graph_config"] = llmapi.CudaGraphConfig(**kwargs["cuda_graph_config"])
    return kwargs


def load_and_warm(target_dir: str, options: dict[str, Any], config_class: str, max_new_tokens: int) -> dict[str, Any]:
    """Load target + draft in TensorRT-LLM, generate a short greedy warm-up, return what happened."""
    trtllm = require("tensorrt_llm", "load the bundle in TensorRT-LLM")
    llmapi = require("tensorrt_llm.llmapi", "load the bundle in TensorRT-LLM")
    kwargs = _config_objects(llmapi, options, config_class)
    _, gpu = cuda_available()
    started = time.perf_counter()
    try:
        llm = trtllm.LLM(model=target_dir, **kwargs)
    except (TypeError, ValueError) as exc:  # TRT-LLM's pydantic validation and bad arguments
        raise ExternalFailure(
            f"TensorRT-LLM rejected the bundle's options: {exc}",
            fix="check engine/trtllm/llm_api_options.yaml against this TensorRT-LLM version; rerun with --no-load to "
            "write the bundle only",
        ) from exc
    except RuntimeError as exc:  # CUDA / NCCL / MPI failures while loading
        raise ExternalFailure(
            f"TensorRT-LLM failed to load the target and draft: {exc}",
            fix="see the TensorRT-LLM log above; rerun with --no-load to write the bundle only",
        ) from exc
    load_s = time.perf_counter() - started
    try:
        params = trtllm.SamplingParams(max_tokens=max_new_tokens, temperature=0.0)
        started = time.perf_counter()
        outputs = llm.generate(list(WARMUP_PROMPTS), params)
        gen_s = time.perf_counter() - started
        per_iter = [_acceptance(out) for out in outputs]
        tokens = sum(len(out.outputs[0].token_ids) for out in outputs)
    except RuntimeError as exc:
        raise ExternalFailure(f"TensorRT-LLM warm-up generation failed: {exc}", fix="see the TensorRT-LLM log above") from exc
    finally:
        shutdown = getattr(llm, "shutdown", None)
        if shutdown is not None:
            shutdown()
    measured = [value for value in per_iter if value is not None]
    return {
        "loaded": True,
        "backend": "trtllm",
        "gpu": gpu,
        "load_s": round(load_s, 3),
        "warmup": {
            "prompts": len(WARMUP_PROMPTS),
            "new_tokens": tokens,
            "seconds": round(gen_s, 3),
            "tokens_per_second": round(tokens / gen_s, 2) if gen_s > 0 else None,
            # Accepted tokens per target step (draft accepted + 1), as TRT-LLM reports it.
            "acceptance_length": round(sum(measured) / len(measured), 4) if measured else None,
        },
        "tensorrt_llm_version": getattr(trtllm, "__version__", None),
    }


def _acceptance(output: Any) -> float | None:
    for holder in (output, *(getattr(output, "outputs", None) or [])[:1]):
        value = getattr(holder, "avg_decoded_tokens_per_iter", None)
        if value is not None:
            return float(value)
    return None
