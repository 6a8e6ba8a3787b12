"""The target's answers to training prompts: one interface, three sources.

A source answers token-id prompts with token-id answers (each ending with its stop token
unless it reached ``max_new_tokens``). What belongs to the interface, not to a source:

- the **cache** (:class:`AnswerCache`): one JSONL line per finished answer, appended as
  it arrives (``{"i": prompt, "r": [ids]}``, plus ``"t": turn`` for later turns of a
  conversation); a killed run keeps every complete line and resumes; a line cut by the
  kill is cut off the file before anything is appended;
- the **probe** (:func:`probe`): before bulk work a served source's greedy answers to the first
  prompts are scored by the in-process target: each token its best (or a near-tie), and the
  chosen tokens' logprobs equal within a tolerance;
- the **fingerprint** of who answered and how (:func:`settings_key`).

Sources (one module each): :mod:`.inprocess` (transformers ``generate``), :mod:`.url`
(the user's OpenAI-compatible endpoints), :mod:`.vllm` (the project's own vLLM server,
then the url source against it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ...errors import InputError
from ...line_cache import complete_rows

Key = tuple[int, int]  # (prompt index, turn)
Emit = Callable[[Key, list[int]], None]


@dataclass(frozen=True)
class Sampling:
    """How answers are drawn: greedy when ``temperature`` is 0."""

    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0

    def as_key(self) -> dict[str, Any] | None:
        """What goes into the data fingerprint (None for greedy: answers do not depend on top_p or seed)."""
        return None if self.greedy else {"temperature": self.temperature, "top_p": self.top_p, "seed": self.seed}

    def request_seed(self, key: Key) -> int:
        """A per-answer seed, the same whatever order or engine answers it."""
        return (self.seed * 1_000_003 + key[0] * 8191 + key[1]) % (2**31 - 1)


GREEDY = Sampling()


class AnswerSource:
    """Answers prompts; ``emit(key, answer)`` is called once per finished answer, in any order.

    Use as a context manager: a source that starts something (a server) stops it on every exit path.
    """

    name = "source"
    served = False  # answers come over HTTP: probed against the in-process target first

    def answer(self, jobs: Sequence[tuple[Key, list[int]]], max_new_tokens: int, sampling: Sampling, emit: Emit) -> None:
        raise NotImplementedError

    def describe(self) -> str:
        """A label for logs and errors: never a credential."""
        return self.name

    def identity(self) -> dict[str, Any] | None:
        """Who answers, for the cache key; None keeps the key of in-process answers made before keys named it."""
        return None

    def answer_scored(self, jobs: Sequence[tuple[Key, list[int]]], max_new_tokens: int
                      ) -> dict[Key, tuple[list[int], list[float] | None]]:
        """Greedy answers with the logprob of each chosen token (None where the source cannot say)."""
        got: dict[Key, tuple[list[int], list[float] | None]] = {}
        self.answer(jobs, max_new_tokens, GREEDY, lambda key, ids: got.__setitem__(key, (ids, None)))
        return got

    def score(self, prompt: list[int], answer: list[int]) -> list[tuple[float, int, float]]:
        """Teacher-forced, per answer token: (its logprob, the best token, the best logprob)."""
        raise NotImplementedError(f"{self.name} cannot score answers")

    def __enter__(self) -> "AnswerSource":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        pass


def cut_at_stop(tokens: Iterable[int], stop_ids: Iterable[int], max_new_tokens: int) -> list[int]:
    """The answer up to and including its first stop token, at most ``max_new_tokens`` long."""
    stops = set(int(s) for s in stop_ids)
    out: list[int] = []
    for token in tokens:
        out.append(int(token))
        if token in stops or len(out) >= max_new_tokens:
            break
    return out


# --------------------------------------------------------------------------- the cache


class AnswerCache:
    """Append-only JSONL of finished answers; see the module docstring for the line format."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.done, self._complete = read_cache(self.path)
        self._fh = None

    def __contains__(self, key: Key) -> bool:
        return key in self.done

    def open(self) -> "AnswerCache":
        """Cut a torn last line off (appending after it would hide every later line), then open for appending."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if self.path.is_file() and self.path.stat().st_size > self._complete:
            os.truncate(self.path, self._complete)
        self._fh = open(self.path, "ab")
        return self

    def add(self, key: Key, answer: list[int]) -> None:
        self.done[key] = list(answer)
        row: dict[str, Any] = {"i": key[0], "r": list(answer)}
        if key[1]:
            row["t"] = key[1]
        assert self._fh is not None, "AnswerCache.open() first"
        line = (json.dumps(row) + "\n").encode("utf-8")
        self._fh.write(line)
        self._fh.flush()
        self._complete += len(line)  # a later open() must not cut what this one appended

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    @property
    def probe_path(self) -> Path:
        return self.path.with_name(self.path.name + ".probe.json")

    @property
    def probed(self) -> bool:
        """Whether a probe passed for this cache here (a served cache copied in without one is probed again)."""
        try:
            return bool(json.loads(self.probe_path.read_text()).get("passed"))
        except (OSError, ValueError, AttributeError):
            return False

    def mark_probed(self, results: Sequence["ProbeResult"]) -> None:
        """Record the passed probe beside the cache (atomically: a torn record reads as none)."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.probe_path.with_name(self.probe_path.name + ".tmp")
        tmp.write_text(json.dumps({"passed": True, "endpoints": [r.as_dict() for r in results]}))
        os.replace(tmp, self.probe_path)


def read_cache(path: Path) -> tuple[dict[Key, list[int]], int]:
    """Answers in a cache file and the byte length of its complete lines.

    Reading stops at the first line that is cut (no newline: an interruption mid-write) or
    unreadable; everything after it is redone.
    """
    done: dict[Key, list[int]] = {}
    end = 0
    for row, line_end in complete_rows(path):
        try:
            done[(int(row["i"]), int(row.get("t", 0)))] = [int(t) for t in row["r"]]
        except (ValueError, KeyError, TypeError, AttributeError):
            break
        end = line_end
    return done, end


def answer_all(source: AnswerSource, prompts: dict[Key, list[int]], cache: AnswerCache, max_new_tokens: int,
               sampling: Sampling, on_answer: Callable[[int], None] | None = None) -> dict[Key, list[int]]:
    """Every prompt's answer: from the cache, else from ``source`` (each appended to the cache as it arrives)."""
    todo = [(key, ids) for key, ids in prompts.items() if key not in cache]
    if todo:
        cache.open()
        try:
            def emit(key: Key, answer: list[int]) -> None:
                cache.add(key, answer)
                if on_answer:
                    on_answer(1)

            source.answer(todo, max_new_tokens, sampling, emit)
        finally:
            cache.close()
    missing = [key for key in prompts if key not in cache]
    if missing:  # a source that returned without answering everything is a bug, not a user error
        raise RuntimeError(f"{source.describe()} left {len(missing)} prompts unanswered (first: {missing[0]})")
    return {key: cache.done[key] for key in prompts}


# --------------------------------------------------------------------------- the probe


@dataclass(frozen=True)
class ProbeRule:
    """How close a served engine must be to the in-process target (``draft.train.synthesis.probe_*``).

    ``tolerance``: the largest mean |served logprob - target logprob| of the chosen tokens (nats) that is
    numerical noise. ``tie_margin``: a served token that is not the target's best is accepted when the target
    led it by less than this (serve-test's and tune's tie rule, ``serving.oracle.classify_divergence``).
    """

    tolerance: float | None  # None: by the in-process target's dtype (recipe.PROBE_TOLERANCE_BY_DTYPE)
    tie_margin: float

    @classmethod
    def of(cls, recipe: Any) -> "ProbeRule":
        """``draft.train.synthesis.probe_tolerance`` and serve-test's ``serve_test.lossless.tie_margin``."""
        return cls(recipe.draft.train.synthesis.probe_tolerance, float(recipe.serve_test.lossless.tie_margin))

    def tolerance_for(self, reference: "AnswerSource") -> float:
        from ...recipe import PROBE_TOLERANCE_BY_DTYPE

        if self.tolerance is not None:
            return float(self.tolerance)
        dtype = (reference.identity() or {}).get("dtype", "float32")
        return PROBE_TOLERANCE_BY_DTYPE.get(dtype, max(PROBE_TOLERANCE_BY_DTYPE.values()))


@dataclass
class ProbeResult:
    """What the probe measured on one endpoint (recorded in the manifest)."""

    endpoint: str  # redacted
    tolerance: float | None = None  # the mean gap allowed (nats)
    tokens: int = 0  # answer tokens compared
    logprob_tokens: int = 0  # of those, tokens whose served logprob was compared
    mean_gap: float | None = None  # mean |served - target| logprob of the chosen tokens (nats); None: no logprobs
    max_gap: float | None = None
    ties: list[dict[str, Any]] = field(default_factory=list)  # served tokens that were not the target's best, at a tie

    def as_dict(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        for k in ("mean_gap", "max_gap"):
            out[k] = None if out[k] is None else round(out[k], 6)
        return out


def probe(served: AnswerSource, reference: AnswerSource, prompts: Sequence[list[int]], tokens: int,
          token_text: Callable[[int], str], where: str = "draft.train.synthesis",
          rule: ProbeRule | None = None) -> ProbeResult:
    """``served`` must answer ``prompts`` as ``reference`` (the in-process target) would.

    ``served`` answers each prompt greedily, ``tokens`` long, with the logprob of each chosen token
    (``answer_scored``); ``reference`` scores that answer teacher-forced (``score``: one forward). Every served
    token must be the target's best, or lose to it by less than ``rule.tie_margin`` (a near-tie flip, decided by
    serve-test's rule); the mean gap between the served and the target's logprob of the chosen tokens must stay
    within ``rule.tolerance``: a light fine-tune or a requantized copy of the target gives the same first tokens
    but other logprobs. Raises a one-line :class:`InputError` naming the first difference; returns what it measured.
    """
    from ...serving.oracle import classify_divergence

    rule = rule or getattr(served, "probe_rule", None) or default_probe_rule()
    tolerance = rule.tolerance_for(reference)
    jobs = [((n, 0), list(p)) for n, p in enumerate(prompts)]
    scored = getattr(served, "answer_scored", None)  # a duck-typed source without it: tokens alone, no logprobs
    answers = scored(jobs, tokens) if scored is not None else AnswerSource.answer_scored(served, jobs, tokens)
    result = ProbeResult(served.describe(), tolerance)
    gaps: list[float] = []
    fix = "serve the same model (same weights and dtype) and chat template as target.model, or use engine: inprocess"
    for key, prompt in jobs:
        ids, served_lps = answers[key]
        rows = reference.score(prompt, ids)
        for position, (token, (lp, best, best_lp)) in enumerate(zip(ids, rows)):
            if token != best:
                margin = {"margin": round(best_lp - lp, 6), "exact": True}
                if classify_divergence(margin, rule.tie_margin) != "tie":
                    raise InputError(
                        f"{where}: {served.describe()} does not answer as the target: probe prompt {key[0]}, answer "
                        f"token {position}: served {token} ({token_text(token)!r}), target {best} ({token_text(best)!r}), "
                        f"which the target prefers by {best_lp - lp:.3g} nats (a tie is below {rule.tie_margin:g})",
                        fix=fix)
                result.ties.append({"prompt": key[0], "position": position, "served": token, "target": best,
                                    "margin": margin["margin"]})
            if served_lps is not None:
                gaps.append(abs(float(served_lps[position]) - lp))
        result.tokens += len(ids)
    if gaps:
        result.logprob_tokens = len(gaps)
        result.mean_gap, result.max_gap = sum(gaps) / len(gaps), max(gaps)
        if result.mean_gap > tolerance:
            raise InputError(
                f"{where}: {served.describe()} gives the target's tokens with other probabilities: the chosen tokens' "
                f"logprobs differ from the in-process target's by {result.mean_gap:.3g} nats on average over "
                f"{len(gaps)} tokens (largest {result.max_gap:.3g}), above draft.train.synthesis.probe_tolerance "
                f"{tolerance:g}: another checkpoint of the same model (a fine-tune, another quantization)?",
                fix=fix + "; a lower-precision deployment of the same weights may need a larger probe_tolerance")
    return result


def default_probe_rule() -> ProbeRule:
    """The schema's defaults (a source built without a recipe, as in tests)."""
    from ...recipe import LosslessSpec, SynthesisSpec

    return ProbeRule(SynthesisSpec().probe_tolerance, LosslessSpec().tie_margin)


# --------------------------------------------------------------------------- the factory


def settings_key(identity: dict[str, Any] | None, sampling: Sampling) -> dict[str, Any] | None:
    """The part of the synthesis fingerprint the source adds (None: today's in-process greedy key).

    ``identity``: who answers (``AnswerSource.identity()``: engine kind, served model id, redacted endpoints,
    request_extra; for in-process, the target's dtype and device), None for in-process greedy answers as
    before (old caches stay valid).
    """
    parts: dict[str, Any] = {}
    if identity:
        parts["answered_by"] = identity
    if sampling.as_key():
        parts["sampling"] = sampling.as_key()
    return parts or None
