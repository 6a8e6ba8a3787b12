"""From what `tune` measured to each engine's own schedule, for the bundle being built.

`tune` stores measurements only: the tokens/s of every (draft length, concurrency) run and, on
vLLM, of the server whose schedule drafts 0 (:data:`~specconvert.tuning.measure.DRAFTER_IDLE`).
`build` calls :func:`engine_forms` with its own settings, so a change made after tuning is applied:
the TensorRT-LLM version it builds for (``runtime.trtllm_version`` or the installed one),
``tune.trtllm_allow_zero``, ``build.max_batch_size`` and ``tune.margin``. Only the measurement is
reused; the choice is made again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..draft_schedule import Segment
from . import model as M


@dataclass(frozen=True)
class Measurement:
    """What tune measured, as it travels in its manifest."""

    rates: dict[tuple[int, int], float]  # (draft length, concurrency) -> engine tokens/s
    drafter_idle: dict[int, float]  # concurrency -> tokens/s of vLLM's drafter-loaded, schedule-0 server

    def as_dict(self) -> dict[str, Any]:
        return {"tokens_per_second": [[k, b, round(r, 4)] for (k, b), r in sorted(self.rates.items())],
                "drafter_idle_tokens_per_second": [[b, round(r, 4)] for b, r in sorted(self.drafter_idle.items())]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Measurement":
        rates = {(int(k), int(b)): float(r) for k, b, r in data["tokens_per_second"]}
        idle = {int(b): float(r) for b, r in data.get("drafter_idle_tokens_per_second") or []}
        return cls(rates, idle)


@dataclass(frozen=True)
class Decision:
    choice: dict[int, int]  # concurrency -> draft length, by measured tokens/s
    vllm_choice: dict[int, int]  # the same, with vLLM's scheduled 0 priced at its measured cost
    segments: list[Segment]
    vllm_segments: list[Segment]

    def as_dict(self) -> dict[str, Any]:
        return {"choice": {str(b): k for b, k in self.choice.items()},
                "vllm_choice": {str(b): k for b, k in self.vllm_choice.items()},
                "segments": [s.as_dict() for s in self.segments],
                "vllm_segments": [s.as_dict() for s in self.vllm_segments]}


def decide(measured: Measurement, margin: float) -> Decision:
    """The per-level choice (shorter wins within ``margin``), vLLM's own, and both as monotone segments."""
    choice = M.best_per_level(measured.rates, margin)
    v_choice = M.vllm_choice(choice, measured.rates, measured.drafter_idle, margin)
    return Decision(choice, v_choice, M.schedule(choice), M.schedule(v_choice))


def engine_forms(decision: Decision, trtllm_version: str, max_batch_size: int, trtllm_allow_zero: bool) -> dict[str, Any]:
    """Each engine's form of ``decision`` (see :func:`decide`), for these build settings."""
    from ..backends.sglang import schedule as sglang
    from ..backends.trtllm import schedule as trt
    from ..backends.vllm import schedule as vllm

    segments = decision.segments
    return {
        "trtllm": {"version": trtllm_version,
                   **trt.speculative_settings(segments, max_batch_size, trtllm_version, allow_zero=trtllm_allow_zero)},
        "vllm": vllm.speculative_settings(decision.vllm_segments, max_batch_size),
        "sglang": sglang.speculative_settings(decision.choice),
        # The reference server decodes one request at a time: its batch is always 1.
        "reference": {"speculate": segments[0].draft_len > 0, "max_draft_len": segments[0].draft_len},
    }
