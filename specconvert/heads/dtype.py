"""The dtype a draft head is exported in, and the casts that takes: checked and recorded.

A head's tensors are the thing its acceptance was measured with, so convert never
changes them without saying so. ``draft.export_dtype: auto`` keeps an imported head
bit-exact in its own dtype, so it deploys exactly as the original would (public heads
often differ from their target: the EAGLE-3 Llama-3.1-8B head is fp16 for a bf16
target, SafeAILab/EAGLE issue 259). What a runtime then does with it: vLLM 0.32 builds
the draft in the target's dtype (``vllm/config/speculative.py``, ``draft_model_config``
``dtype=self.target_model_config.dtype``); TensorRT-LLM reads the draft's own config
(``ModelConfig.from_pretrained(spec_config.speculative_model)`` in
``tensorrt_llm/_torch/models/modeling_speculative.py``, main 2026); SGLang has an open
change to make the draft inherit the target's dtype because strict norm kernels reject a
mismatch (sgl-project/sglang PR 25894, May 2026). A head trained or initialised here
is written in the target's dtype, the one it will run in. Any other choice is a cast made once,
here, where it can be checked: a value the new dtype cannot hold stops convert
before anything is written, and every cast tensor is listed in the manifest.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..errors import InputError

EXPORT_DTYPES = ("float32", "float16", "bfloat16")


@dataclass
class ExportDtype:
    """The export dtype, the dtype the head's tensors came in, and why this one."""

    dtype: str
    source_dtype: str | None  # None: a random init built here has no source tensors
    reason: str


@dataclass
class ExportTensors:
    """The head's tensors in the export dtype (None for a random init), the decision, the casts made."""

    tensors: dict[str, Any] | None
    dtype: ExportDtype
    casts: list[dict[str, Any]]


_WHERE = {"imported": "draft.model", "trained": "draft.train", "random": "draft.init"}


def prepare_for_export(tensors: dict[str, Any] | None, requested: str, origin: str, target_dtype: str) -> ExportTensors:
    """Decide the export dtype for a head of ``origin`` and cast ``tensors`` to it (see the module doc)."""
    source_dtype = tensors_dtype(tensors) if tensors else None
    decision = choose_export_dtype(requested, origin, source_dtype, target_dtype)
    if tensors is None:
        return ExportTensors(None, decision, [])
    cast, casts = cast_for_export(dict(tensors), decision.dtype, _WHERE[origin])
    return ExportTensors(cast, decision, casts)


def tensors_dtype(tensors: dict[str, Any]) -> str | None:
    """The one floating dtype of ``tensors`` (None when there is no floating tensor)."""
    kinds = sorted({str(t.dtype).replace("torch.", "") for t in tensors.values() if t.is_floating_point()})
    if len(kinds) > 1:
        # heads.check_head refuses mixed heads before this point; a trained head is never mixed
        raise InputError(f"the head's floating tensors have several dtypes ({', '.join(kinds)})",
                         fix="cast the head to one dtype before converting")
    return kinds[0] if kinds else None


def choose_export_dtype(requested: str, origin: str, source_dtype: str | None, target_dtype: str) -> ExportDtype:
    """Decide the export dtype.

    ``origin`` is ``imported`` (draft.model), ``trained`` (draft.train) or ``random``
    (draft.init). ``requested`` is ``draft.export_dtype``.
    """
    if requested != "auto":
        if source_dtype is None or source_dtype == requested:
            return ExportDtype(requested, source_dtype, f"draft.export_dtype: {requested}")
        return ExportDtype(requested, source_dtype,
                           f"draft.export_dtype: {requested} (the head's tensors are {source_dtype}: cast, checked)")
    if origin == "imported":
        if source_dtype not in EXPORT_DTYPES:
            raise InputError(
                f"draft.export_dtype: auto keeps the head's own dtype, but its tensors are {source_dtype}, "
                f"which is none of {', '.join(EXPORT_DTYPES)}",
                fix="set draft.export_dtype to float32, bfloat16 or float16",
            )
        return ExportDtype(source_dtype, source_dtype, "auto: an imported head keeps its own dtype (bit-exact)")
    dtype = target_dtype if target_dtype in EXPORT_DTYPES else "float32"
    if origin == "trained":
        reason = f"auto: a head trained here (in {source_dtype}) is written in the target's dtype, the one it runs in"
    else:
        reason = "auto: a head initialised here is built in the target's dtype"
    if dtype != target_dtype:
        reason += f" ({target_dtype} is not an export dtype: float32 instead)"
    return ExportDtype(dtype, source_dtype, reason)


def cast_for_export(tensors: dict[str, Any], dtype: str, where: str = "draft") -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Cast the floating tensors to ``dtype``; return them and one record per tensor that changed dtype.

    Refuses (exit 2, every offending tensor named) a cast that turns finite values
    into infinities. Precision lost on the way is counted, not refused: a downcast
    rounds by design, and the record says how many values it changed.
    """
    import torch

    want = getattr(torch, dtype)
    out: dict[str, Any] = {}
    casts: list[dict[str, Any]] = []
    overflows: list[tuple[str, int, float]] = []
    for name in sorted(tensors):
        value = tensors[name]
        if not value.is_floating_point() or value.dtype == want:
            out[name] = value
            continue
        cast = value.to(want)
        finite = torch.isfinite(value)
        overflowed = int((torch.isinf(cast) & finite).sum())
        if overflowed:
            overflows.append((name, overflowed, float(value[finite].abs().max())))
            continue
        back = cast.to(value.dtype)
        # NaN never equals itself: a NaN that stays NaN is not a rounded value
        rounded = int((back != value).logical_and(~torch.isnan(value)).sum())
        flushed = int(((cast == 0) & (value != 0)).sum())
        casts.append({
            "tensor": name,
            "from": str(value.dtype).replace("torch.", ""),
            "to": dtype,
            "values": value.numel(),
            "rounded": rounded,
            "flushed_to_zero": flushed,
            "exact": rounded == 0,
        })
        out[name] = cast
    if overflows:
        largest = max(m for _, _, m in overflows)
        holds = [d for d in EXPORT_DTYPES if torch.finfo(getattr(torch, d)).max >= largest]
        name, count, biggest = overflows[0]
        raise InputError(
            f"{where}: casting the head to {dtype} overflows {name} ({count} value(s) beyond "
            f"±{torch.finfo(want).max:.6g}, largest |x| = {biggest:.6g})"
            + (f" and {len(overflows) - 1} more tensor(s)" if len(overflows) > 1 else ""),
            fix=f"set draft.export_dtype to {' or '.join(holds) or 'float32'}, which holds these values",
            problems=[f"{n}: {c} value(s) overflow {dtype}, largest |x| = {m:.6g}" for n, c, m in overflows],
        )
    return out, casts
