"""Acceptance of a trained head on held-out prompts, measured with the reference decoder.

For each draft shape (the chain of ``build.max_draft_len`` and a dynamic tree) the
same prompts are decoded greedily with the head and without speculation; the loop
itself is :func:`specconvert.reference.evaluate.evaluate`, shared with the
quantization check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

from .data import prompt_ids


def measure(target_dir: Path, draft_dir: Path, aux_layer_ids: list[int], prompts: str, items: Sequence[dict[str, Any]],
            max_new_tokens: int, shapes: dict[str, dict[str, Any]], device: str = "cpu", dtype: str = "float32",
            on_prompt: Callable[[], None] | None = None, model: Any = None) -> dict[str, Any]:
    """tau and per-position acceptance per shape over the samples ``items`` of the prompt set named ``prompts``.

    ``model``: an in-memory target (e.g. Model Optimizer's fake-quantized one) used instead of
    the weights in ``target_dir``; its tokenizer and stop tokens still come from ``target_dir``.
    """
    from ..reference.decoder import ReferenceDecoder
    from ..reference.evaluate import evaluate

    decoder = ReferenceDecoder.from_dirs(target_dir, draft_dir, aux_layer_ids, device=device, dtype=dtype,
                                         norm_layout="eagle3", model=model)
    encoded = [prompt_ids(s, decoder.tokenizer) for s in items]
    return {"prompts": prompts, **evaluate(decoder, encoded, max_new_tokens, shapes, on_prompt)}
