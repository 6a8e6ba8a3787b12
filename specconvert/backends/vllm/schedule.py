"""A tuned draft-length schedule in vLLM's own form.

vLLM 0.32 (`vllm/config/speculative.py`, `SpeculativeConfig.num_speculative_tokens_per_batch_size`)
takes a list of inclusive ``(range_start, range_end, num_speculative_tokens)`` entries;
`vllm/v1/spec_decode/dynamic/utils.py` (`validate_and_normalize_dynamic_sd_schedule`)
requires positive, sorted, non-overlapping ranges starting at 1 and K >= 0, and
`build_dynamic_sd_schedule_lookup` caps every K at `num_speculative_tokens` (which
must be > 0) and carries the last K past the final range. The scheduler
(`vllm/v1/core/sched/scheduler.py`, `dynamic_sd_lookup`) picks K per step from the
number of scheduled requests. With `--data-parallel-size` > 1 vLLM drops the schedule and drafts
`num_speculative_tokens` at every batch size, with a warning ("Dynamic speculative decoding is not
supported with data parallelism": `vllm/config/vllm.py`, `_maybe_disable_dynamic_sd_for_data_parallel`,
vLLM 0.32), so a schedule's notes say so.
"""

from __future__ import annotations

from typing import Any, Sequence

from ...draft_schedule import Segment


DATA_PARALLEL_NOTE = ("vLLM ignores num_speculative_tokens_per_batch_size with --data-parallel-size > 1 and then "
                      "drafts num_speculative_tokens={top} at every batch size (vllm/config/vllm.py, vLLM 0.32): "
                      "serve this bundle without data parallelism, or retune for one length")


def speculative_settings(segments: Sequence[Segment], max_num_seqs: int) -> dict[str, Any]:
    """``{"speculate", "num_speculative_tokens", "num_speculative_tokens_per_batch_size", "notes"}``.

    One segment collapses to a plain ``num_speculative_tokens``; a schedule whose every
    K is 0 turns speculation off (vLLM needs ``num_speculative_tokens > 0``).
    """
    top = max(seg.draft_len for seg in segments)
    if top == 0:
        return {"speculate": False, "num_speculative_tokens": 0, "num_speculative_tokens_per_batch_size": None,
                "notes": ["speculation does not pay at any measured concurrency: the bundle serves the target alone"]}
    if len(segments) == 1:
        return {"speculate": True, "num_speculative_tokens": top, "num_speculative_tokens_per_batch_size": None, "notes": []}
    entries = []
    for seg in segments:
        end = max_num_seqs if seg.end is None else min(seg.end, max_num_seqs)
        if end < seg.start:
            break
        entries.append([seg.start, end, seg.draft_len])
        if end >= max_num_seqs:
            break
    return {"speculate": True, "num_speculative_tokens": top, "num_speculative_tokens_per_batch_size": entries,
            "notes": [DATA_PARALLEL_NOTE.format(top=top)]}


def draft_len_at(entries: list[list[int]] | None, num_speculative_tokens: int, batch_size: int) -> int:
    """vLLM's lookup (`build_dynamic_sd_schedule_lookup`): the range holding the batch, else the last K carried."""
    if not entries:
        return num_speculative_tokens
    last = entries[0][2]
    for start, end, k in sorted(entries):
        if batch_size < start:
            break
        last = k
        if batch_size <= end:
            return min(k, num_speculative_tokens)
    return min(last, num_speculative_tokens)
