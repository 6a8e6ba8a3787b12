"""A tuned draft-length schedule in TensorRT-LLM's own form (`speculative_config.draft_len_schedule`).

How each release reads the schedule is data, with release windows and sources:
``specconvert/data/trtllm/draft_len_schedule.json``. In short:
- up to 1.3.0rc7 the keys are batch-size *lower* bounds with key 1 required, and EAGLE-3's
  one-model path (the path `eagle3_one_model: true` runs) reads no schedule at all: such a
  release gets one fixed `max_draft_len`;
- from 1.3.0rc8 on (PR #10860, merged 2026-03-13) the keys are *upper* bounds, the smallest
  key maps to `max_draft_len`, above the largest key the draft length is 0, and the schedule
  is not combinable with `max_concurrency`.

PR #16888 (open in July 2026, "Keep drafting alive when dynamic draft length hits its
floor"): on one-engine paths a schedule that resolves to 0 skips the draft forward, the
draft KV cache is left stale, and when the batch shrinks again acceptance collapses
silently for the rest of every affected request. So by default we never write 0 into
a schedule: draft length 1 is the floor, and the notes say so.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any, Sequence

from ...draft_schedule import Segment

@lru_cache(maxsize=None)
def _windows() -> list[dict[str, Any]]:
    path = resources.files("specconvert") / "data" / "trtllm" / "draft_len_schedule.json"
    return json.loads(path.read_text(encoding="utf-8"))["windows"]


def semantics(version: str) -> dict[str, Any]:
    """The release window of ``version`` in the schedule data: ``keys`` (lower_bound | upper_bound),
    ``eagle3_one_model`` (whether EAGLE-3's one-model path reads a schedule), its source."""
    from .versions import in_release_window, parse_release

    parse_release(version)  # a one-line InputError for text that is no version
    for window in _windows():
        if in_release_window(version, window.get("first"), window.get("last")):
            return window
    raise ValueError(f"no draft_len_schedule window holds TensorRT-LLM {version}")  # the windows leave no gap


def supports_schedule(version: str) -> bool:
    """Whether a TensorRT-LLM version runs `draft_len_schedule` on EAGLE-3's one-model path
    (a line pin such as "1.3" means that line's final release)."""
    return bool(semantics(version)["eagle3_one_model"])


def speculative_settings(segments: Sequence[Segment], max_batch_size: int, version: str,
                         allow_zero: bool = False, window: dict[str, Any] | None = None) -> dict[str, Any]:
    """`max_draft_len` and `draft_len_schedule` (or why there is none) for a tuned schedule.

    Returns ``{"speculate": bool, "max_draft_len": int, "draft_len_schedule": dict | None,
    "draft_len_schedule_keys": "upper_bound" | "lower_bound" | None, "notes": [...]}``, in the form
    ``version`` reads (:func:`semantics`). ``speculate`` is False when the schedule drafts nothing
    at batch 1: the bundle then serves without speculation. ``window``: how the release reads the
    schedule, default :func:`semantics` of ``version``.
    """
    notes: list[str] = []
    first = segments[0].draft_len
    if first == 0:
        return {"speculate": False, "max_draft_len": 0, "draft_len_schedule": None, "draft_len_schedule_keys": None,
                "notes": ["speculation does not pay at batch size 1: the bundle serves the target alone"]}
    window = window or semantics(version)
    if not window["eagle3_one_model"]:
        notes.append(f"TensorRT-LLM {version} runs EAGLE-3 at one draft length (EAGLE-3's one-model path reads "
                     f"draft_len_schedule from 1.3.0rc8 on, PR #10860): max_draft_len {first} everywhere")
        return {"speculate": True, "max_draft_len": first, "draft_len_schedule": None, "draft_len_schedule_keys": None,
                "notes": notes}
    floor = 0 if allow_zero else 1
    # (first batch size, last batch size or None, draft length) per segment, floored and capped at max_batch_size
    ranges: list[tuple[int, int, int]] = []
    for seg in segments:
        k = seg.draft_len
        if k < floor:
            notes.append(f"draft length {k} above batch size {seg.start - 1} raised to {floor}: a schedule resolving "
                         "to 0 leaves EAGLE-3's draft KV cache stale on the one-model path (TensorRT-LLM PR #16888)")
            k = floor
        end = max_batch_size if seg.end is None else min(seg.end, max_batch_size)
        if end < seg.start:
            break
        if ranges and ranges[-1][2] == k:  # neighbours with one value: one entry (same lookup, fewer CUDA graphs)
            ranges[-1] = (ranges[-1][0], end, k)
        else:
            ranges.append((seg.start, end, k))
        if end >= max_batch_size:
            break
    if window["keys"] == "upper_bound":
        # above the largest key TensorRT-LLM drafts 0: a trailing 0 needs no key
        schedule = {end: k for _, end, k in ranges if k > 0}
    else:
        schedule = {start: k for start, _, k in ranges}
    return {"speculate": True, "max_draft_len": first, "draft_len_schedule": schedule,
            "draft_len_schedule_keys": window["keys"], "notes": notes}


def draft_len_at(schedule: dict[int, int] | None, max_draft_len: int, batch_size: int,
                 keys: str = "upper_bound") -> int:
    """TensorRT-LLM's lookup for a schedule of ``keys`` semantics (upper: `utils.py` `get_draft_len_for_batch_size`,
    the first key >= the batch, 0 above the largest; lower: the largest key <= the batch), for tests and reports."""
    if schedule is None:
        return max_draft_len
    ordered = sorted((int(key), int(k)) for key, k in schedule.items())
    if keys == "lower_bound":
        found = [k for key, k in ordered if key <= batch_size]
        return found[-1] if found else max_draft_len
    for key, k in ordered:
        if batch_size <= key:
            return k
    return 0
