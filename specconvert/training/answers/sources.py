"""Which answer source a ``draft.train.synthesis`` block names (kept apart from the interface in ``__init__``,
which the sources themselves import: the interface knows no source)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from . import AnswerSource, ProbeRule

_MARK = "\u2063answer\u2063"  # content no template rewrites, to find what the template closes an assistant turn with


def end_of_turn_id(tokenizer: Any, stop_ids: Sequence[int]) -> int | None:
    """The stop token the chat template closes an assistant turn with (Llama 3: ``<|eot_id|>`` 128009, not the
    first eos id 128001 ``<|end_of_text|>``); the first stop id when the template does not say."""
    stops = [int(s) for s in stop_ids]
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        try:
            text = tokenizer.apply_chat_template([{"role": "user", "content": "q"}, {"role": "assistant", "content": _MARK}],
                                                 tokenize=False)
        except Exception:  # noqa: BLE001 - a template that cannot render a two-turn chat names no end of turn
            text = ""
        if isinstance(text, str) and _MARK in text:
            closing = tokenizer(text[text.rindex(_MARK) + len(_MARK):], add_special_tokens=False)["input_ids"]
            for token in closing:
                if int(token) in stops:
                    return int(token)
    return stops[0] if stops else None


def open_source(spec: Any, model: Any, tokenizer: Any, stop_ids: Sequence[int], pad_id: int, batch_size: int,
                target_path: Path, target_dtype: str, recipe: Any, log_dir: Path) -> AnswerSource:
    """The source ``spec`` (a ``draft.train.synthesis`` block) names; a served one is not probed yet."""
    from .inprocess import InProcessSource

    if spec.engine == "inprocess":
        return InProcessSource(model, stop_ids, pad_id, batch_size)
    end_of_turn = end_of_turn_id(tokenizer, stop_ids)
    if spec.engine == "url":
        from .url import ServedSource

        return ServedSource(spec.urls, spec.model, stop_ids, concurrency=spec.concurrency, timeout_s=spec.timeout_s,
                            retries=spec.retries, request_extra=spec.request_extra, tokenizer=tokenizer,
                            api_key_env=spec.api_key_env, end_of_turn=end_of_turn, probe_rule=ProbeRule.of(recipe))
    from .vllm import VllmSource

    return VllmSource(spec, recipe, target_path, target_dtype, stop_ids, tokenizer, log_dir, end_of_turn=end_of_turn)


def check_endpoints(spec: Any) -> None:
    """``engine: url``: every URL answers ``GET /v1/models`` (and serves ``model``), checked in seconds before the
    target is loaded; an unset ``api_key_env`` variable is bad input here too."""
    if spec.engine != "url":
        return
    from .url import ServedSource

    ServedSource(spec.urls, spec.model, [], timeout_s=spec.timeout_s, api_key_env=spec.api_key_env).connect()
