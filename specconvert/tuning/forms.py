"""From what `tune` measured to each engine's own schedule, for the bundle being built.

`tune` stores measurements only: the tokens/s of every (draft length, concurrency) run and, on
vLLM, of the server whose schedule drafts 0 (:data:`~specconvert.tuning.measure.DRAFTER_IDLE`).
`build` calls :func:`engine_forms` with its own settings, so a change made after tuning is applied:
the TensorRT-LLM version it builds for (``runtime.trtllm_version`` or the installed one),
``tune.trtllm_allow_zero``, ``build.max_batch_size`` and ``tune.margin``. Only the measurement is
reused; the choice is made again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from ..draft_schedule import Segment
from . import model as M


@dataclass(frozen=True)
class Measurement:
    """What tune measured, as it travels in its manifest."""

    rates: dict[tuple[int, int], float]  # (draft length, concurrency) -> engine tokens/s
    drafter_idle: dict[int, float]  # concurrency -> tokens/s of vLLM's drafter-loaded, schedule-0 server
    # free speculation measured beside the head (`bench.baselines`): method -> concurrency -> tokens/s, and the
    # settings it ran with (method -> vLLM's speculative config), which a bundle serving it must repeat
    free: dict[str, dict[int, float]] = field(default_factory=dict)
    free_settings: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "tokens_per_second": [[k, b, round(r, 4)] for (k, b), r in sorted(self.rates.items())],
            "drafter_idle_tokens_per_second": [[b, round(r, 4)] for b, r in sorted(self.drafter_idle.items())]}
        if self.free:  # absent when nothing free was measured, as in manifests written before it existed
            out["free_tokens_per_second"] = [[m, b, round(r, 4)] for m, by in sorted(self.free.items())
                                             for b, r in sorted(by.items())]
            out["free_settings"] = self.free_settings
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Measurement":
        rates = {(int(k), int(b)): float(r) for k, b, r in data["tokens_per_second"]}
        idle = {int(b): float(r) for b, r in data.get("drafter_idle_tokens_per_second") or []}
        free: dict[str, dict[int, float]] = {}
        for method, b, r in data.get("free_tokens_per_second") or []:
            free.setdefault(str(method), {})[int(b)] = float(r)
        return cls(rates, idle, free, dict(data.get("free_settings") or {}))


@dataclass(frozen=True)
class Decision:
    choice: dict[int, int]  # concurrency -> draft length, by measured tokens/s
    vllm_choice: dict[int, int]  # the same, with vLLM's scheduled 0 priced at its measured cost
    segments: list[Segment]
    vllm_segments: list[Segment]
    # free speculation (n-gram): the levels where it measured best, and what the bundle serves
    free_choice: dict[int, str] = field(default_factory=dict)  # concurrency -> method, where it beat the head
    served: str = "eagle3"  # "ngram" where n-gram won at every measured level
    free_settings: dict[str, Any] | None = None  # the served method's settings (as tune measured them)
    free_notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        out = {"choice": {str(b): k for b, k in self.choice.items()},
               "vllm_choice": {str(b): k for b, k in self.vllm_choice.items()},
               "segments": [s.as_dict() for s in self.segments],
               "vllm_segments": [s.as_dict() for s in self.vllm_segments]}
        if self.free_choice or self.served != "eagle3" or self.free_notes:
            out.update(free_choice={str(b): m for b, m in self.free_choice.items()}, served=self.served,
                       free_notes=self.free_notes)
        return out


def decide(measured: Measurement, margin: float, free_methods: tuple[str, ...] | list[str] = ()) -> Decision:
    """The per-level choice (shorter wins within ``margin``), vLLM's own, and both as monotone segments.

    ``free_methods``: the free-speculation arms the recipe still lists (``bench.baselines``). Where one of them
    measured more than ``margin`` above the head's best choice at a level (plain decoding included), that level
    goes to it. One server serves one method, so the bundle serves n-gram only where it won at every measured level;
    where it won at some, the bundle serves the head and ``free_notes`` name the levels and the n-gram launch."""
    choice = M.best_per_level(measured.rates, margin)
    v_choice = M.vllm_choice(choice, measured.rates, measured.drafter_idle, margin)
    free_choice: dict[int, str] = {}
    served, settings, notes = "eagle3", None, []
    rates = measured.free.get("ngram") if "ngram" in free_methods else None
    for b, k in choice.items():
        head = measured.rates.get((k, b))
        if rates and head and rates.get(b) and rates[b] > head * (1 + margin):
            free_choice[b] = "ngram"
    if free_choice and sorted(free_choice) == sorted(choice):
        served, settings = "ngram", measured.free_settings.get("ngram")
        notes.append(f"ngram measured best at every concurrency ({_versus(measured, 'ngram', choice)}): the bundle "
                     "serves ngram speculation (no head) on every engine")
    elif free_choice:
        won = sorted(free_choice)
        notes.append(f"ngram measured best at concurrency {', '.join(map(str, won))} only "
                     f"({_versus(measured, 'ngram', {b: choice[b] for b in won})}); one server serves one method, so "
                     "the bundle serves the head, and engine/vllm/serve-ngram.sh (bench.baselines) serves ngram for "
                     "traffic at those levels")
    return Decision(choice, v_choice, M.schedule(choice), M.schedule(v_choice), free_choice, served, settings, notes)


def _versus(measured: Measurement, method: str, choice: Mapping[int, int]) -> str:
    parts = []
    for b, k in sorted(choice.items()):
        head, free = measured.rates.get((k, b)), measured.free[method].get(b)
        what = "plain decoding" if k == 0 else f"the head's chain {k}"
        parts.append(f"concurrency {b}: {free:.1f} vs {head:.1f} tok/s for {what}")
    return "; ".join(parts)


def ngram_forms(decision: Decision, trtllm_version: str) -> dict[str, Any]:
    """Each engine's form of a decision that serves n-gram (``decision.served``): the settings tune measured with,
    one draft length at every batch size (prompt lookup has no drafter, so there is no schedule to weigh)."""
    settings = decision.free_settings or {}
    k = int(settings["num_speculative_tokens"])
    window = {"prompt_lookup_max": int(settings["prompt_lookup_max"]),
              "prompt_lookup_min": int(settings["prompt_lookup_min"])}
    notes = list(decision.free_notes)
    from types import SimpleNamespace

    from ..backends.sglang.schedule import ngram_flags

    return {
        "trtllm": {"version": trtllm_version, "speculate": True, "method": "ngram", "max_draft_len": k, **window,
                   "draft_len_schedule": None, "notes": notes},
        "vllm": {"speculate": True, "method": "ngram", "num_speculative_tokens": k,
                 "num_speculative_tokens_per_batch_size": None, **window, "notes": notes},
        "sglang": {"speculate": True, "method": "ngram", "draft_len": k, "flags": ngram_flags(k, SimpleNamespace(**window)),
                   "notes": notes},
        # the reference server has no prompt lookup: it keeps the head's batch-1 choice
        "reference": {"speculate": decision.segments[0].draft_len > 0, "max_draft_len": decision.segments[0].draft_len,
                      "notes": ["the reference server has no n-gram speculation: it serves the head's choice"]},
    }


def engine_forms(decision: Decision, trtllm_version: str, max_batch_size: int, trtllm_allow_zero: bool) -> dict[str, Any]:
    """Each engine's form of ``decision`` (see :func:`decide`), for these build settings."""
    from ..backends.sglang import schedule as sglang
    from ..backends.trtllm import schedule as trt
    from ..backends.vllm import schedule as vllm

    if decision.served == "ngram":
        return ngram_forms(decision, trtllm_version)
    segments = decision.segments
    forms = {
        "trtllm": {"version": trtllm_version,
                   **trt.speculative_settings(segments, max_batch_size, trtllm_version, allow_zero=trtllm_allow_zero)},
        "vllm": vllm.speculative_settings(decision.vllm_segments, max_batch_size),
        "sglang": sglang.speculative_settings(decision.choice),
        # The reference server decodes one request at a time: its batch is always 1.
        "reference": {"speculate": segments[0].draft_len > 0, "max_draft_len": segments[0].draft_len},
    }
    for form in forms.values():  # where n-gram won at some levels only, every engine's notes say so
        if decision.free_notes:
            form["notes"] = list(form.get("notes") or []) + decision.free_notes
    return forms
