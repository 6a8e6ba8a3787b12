"""Which answer source a ``draft.train.synthesis`` block names (kept apart from the interface in ``__init__``,
which the sources themselves import: the interface knows no source)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from . import AnswerSource

def open_source(spec: Any, model: Any, tokenizer: Any, stop_ids: Sequence[int], pad_id: int, batch_size: int,
                target_path: Path, target_dtype: str, recipe: Any, log_dir: Path) -> AnswerSource:
    """The source ``spec`` (a ``draft.train.synthesis`` block) names; a served one is not probed yet."""
    from .inprocess import InProcessSource

    if spec.engine == "inprocess":
        return InProcessSource(model, stop_ids, pad_id, batch_size)
    if spec.engine == "url":
        from .url import ServedSource

        return ServedSource(spec.urls, spec.model, stop_ids, concurrency=spec.concurrency, timeout_s=spec.timeout_s,
                            retries=spec.retries, request_extra=spec.request_extra, tokenizer=tokenizer)
    from .vllm import VllmSource

    return VllmSource(spec, recipe, target_path, target_dtype, stop_ids, tokenizer, log_dir)
