"""A draft-length schedule in engine-neutral form: batch-size segments, each with one draft length.

A leaf module (no imports from the package): `tuning` chooses the segments, each engine's
backend (`backends/*/schedule.py`) writes them in its own form, and both test against
:func:`draft_len_at`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Mapping


@dataclass(frozen=True)
class Segment:
    """Draft length ``draft_len`` for batch sizes ``start..end`` (inclusive; end None = no bound)."""

    start: int
    end: int | None
    draft_len: int

    def as_dict(self) -> dict[str, int | None]:
        return {"start": self.start, "end": self.end, "draft_len": self.draft_len}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Segment":
        end = data.get("end")
        return cls(int(data["start"]), None if end is None else int(end), int(data["draft_len"]))


def draft_len_at(segments: Iterable[Segment], batch_size: int) -> int:
    """The draft length a schedule gives a batch size (the reference lookup every writer is tested against)."""
    for seg in segments:
        if seg.start <= batch_size and (seg.end is None or batch_size <= seg.end):
            return seg.draft_len
    raise ValueError(f"batch size {batch_size} is outside the schedule")
