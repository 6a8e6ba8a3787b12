"""A tuned draft-length schedule in TensorRT-LLM's own form (`speculative_config.draft_len_schedule`).

Facts, from TensorRT-LLM's sources:
- PR #10860 ("Dynamic draft length on spec decode one-model path", merged 2026-03-13)
  brought `draft_len_schedule` and `max_concurrency` to the one-model path, which is the
  path EAGLE-3 runs with `eagle3_one_model: true`. 1.3.0rc7 was released on 2026-03-10,
  before that merge, so 1.2.x and 1.3.0rc1..rc7 run EAGLE-3 at one fixed draft length.
- Its semantics (`tensorrt_llm/_torch/speculative/utils.py`, `get_draft_len_for_batch_size`):
  keys are batch-size upper bounds, the value holds for batch sizes up to that key, and
  above the largest key the draft length is 0 (speculation off). `llm_args.py`
  `DecodingBaseConfig.validate_draft_len_schedule_and_sort`: keys >= 1, values >= 0 and
  <= max_draft_len, the smallest key must map to max_draft_len; not combinable with
  `max_concurrency` (`validate_max_concurrency_and_draft_len_schedule_mutually_exclusive`).
- PR #16888 (open in July 2026, "Keep drafting alive when dynamic draft length hits its
  floor"): on one-engine paths a schedule that resolves to 0 skips the draft forward, the
  draft KV cache is left stale, and when the batch shrinks again acceptance collapses
  silently for the rest of every affected request. So by default we never write 0 into
  a schedule: draft length 1 is the floor, and the tune report says so.
"""

from __future__ import annotations

from typing import Any, Sequence

from ...draft_schedule import Segment

# The last release before the one-model dynamic draft length (PR #10860) merged.
LAST_WITHOUT_SCHEDULE = "1.3.0rc7"


def supports_schedule(version: str) -> bool:
    """Whether a TensorRT-LLM version runs `draft_len_schedule` on EAGLE-3's one-model path."""
    from packaging.version import InvalidVersion, Version

    try:
        v = Version(version)
    except InvalidVersion:
        # A line pin such as "1.3" means its newest release; "1.2" has no schedule.
        parts = version.split(".")
        return len(parts) >= 2 and (int(parts[0]), int(parts[1])) >= (1, 3)
    if len(version.split(".")) == 2:
        return (v.major, v.minor) >= (1, 3)
    return v > Version(LAST_WITHOUT_SCHEDULE)


def speculative_settings(segments: Sequence[Segment], max_batch_size: int, version: str,
                         allow_zero: bool = False) -> dict[str, Any]:
    """`max_draft_len` and `draft_len_schedule` (or why there is none) for a tuned schedule.

    Returns ``{"speculate": bool, "max_draft_len": int, "draft_len_schedule": dict | None,
    "notes": [...]}``. ``speculate`` is False when the schedule drafts nothing at batch 1:
    the bundle then serves without speculation.
    """
    notes: list[str] = []
    first = segments[0].draft_len
    if first == 0:
        return {"speculate": False, "max_draft_len": 0, "draft_len_schedule": None,
                "notes": ["speculation does not pay at batch size 1: the bundle serves the target alone"]}
    if not supports_schedule(version):
        notes.append(f"TensorRT-LLM {version} runs EAGLE-3 at one draft length (draft_len_schedule reached the "
                     f"one-model path after {LAST_WITHOUT_SCHEDULE}, PR #10860): max_draft_len {first} everywhere")
        return {"speculate": True, "max_draft_len": first, "draft_len_schedule": None, "notes": notes}
    floor = 0 if allow_zero else 1
    schedule: dict[int, int] = {}
    for seg in segments:
        k = seg.draft_len
        if k < floor:
            notes.append(f"draft length {k} above batch size {seg.start - 1} raised to {floor}: a schedule resolving "
                         "to 0 leaves EAGLE-3's draft KV cache stale on the one-model path (TensorRT-LLM PR #16888)")
            k = floor
        end = max_batch_size if seg.end is None else min(seg.end, max_batch_size)
        if k == 0:
            break  # above the largest key TensorRT-LLM drafts 0: the key is implicit
        if end >= seg.start:
            schedule[end] = k
        if end >= max_batch_size:
            break
    # Neighbouring keys with one value collapse into the larger key (same lookup, fewer CUDA graphs).
    collapsed: dict[int, int] = {}
    for key in sorted(schedule):
        prev = max(collapsed) if collapsed else None
        if prev is not None and collapsed[prev] == schedule[key]:
            del collapsed[prev]
        collapsed[key] = schedule[key]
    return {"speculate": True, "max_draft_len": first, "draft_len_schedule": collapsed, "notes": notes}


def draft_len_at(schedule: dict[int, int] | None, max_draft_len: int, batch_size: int) -> int:
    """TensorRT-LLM's lookup (utils.py `get_draft_len_for_batch_size`), for tests and reports."""
    if schedule is None:
        return max_draft_len
    for key in sorted(schedule):
        if batch_size <= key:
            return schedule[key]
    return 0
