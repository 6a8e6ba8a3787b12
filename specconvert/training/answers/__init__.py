"""The target's answers to training prompts: one interface, three sources.

A source answers token-id prompts with token-id answers (each ending with its stop token
unless it reached ``max_new_tokens``). What belongs to the interface, not to a source:

- the **cache** (:class:`AnswerCache`): one JSONL line per finished answer, appended as
  it arrives (``{"i": prompt, "r": [ids]}``, plus ``"t": turn`` for later turns of a
  conversation); a killed run keeps every complete line and resumes; a line cut by the
  kill is cut off the file before anything is appended;
- the **probe** (:func:`probe`): before bulk work a served source must give the in-process
  target's greedy answers to the first prompts, token for token;
- the **fingerprint** of the answers' settings (:func:`settings_key`).

Sources (one module each): :mod:`.inprocess` (transformers ``generate``), :mod:`.url`
(the user's OpenAI-compatible endpoints), :mod:`.vllm` (the project's own vLLM server,
then the url source against it).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
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
        return self.name

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


def probe(served: AnswerSource, reference: AnswerSource, prompts: Sequence[list[int]], tokens: int,
          token_text: Callable[[int], str], where: str = "draft.train.synthesis") -> int:
    """Greedy answers of ``served`` to ``prompts`` must equal ``reference``'s (the in-process target) for
    ``tokens`` tokens. Raises a one-line :class:`InputError` naming the first difference; returns the tokens compared."""
    jobs = [((n, 0), list(p)) for n, p in enumerate(prompts)]
    got: dict[str, dict[Key, list[int]]] = {"served": {}, "target": {}}
    for label, source in (("target", reference), ("served", served)):
        source.answer(jobs, tokens, GREEDY, lambda key, answer, label=label: got[label].__setitem__(key, answer))
    compared = 0
    for key, _ in jobs:
        mine, theirs = got["target"][key], got["served"][key]
        position = next((k for k, (a, b) in enumerate(zip(mine, theirs)) if a != b), min(len(mine), len(theirs)))
        if mine[:position] == mine and theirs[:position] == theirs:
            compared += len(mine)
            continue

        def show(ids: list[int]) -> str:
            return f"{ids[position]} ({token_text(ids[position])!r})" if position < len(ids) else "end of answer"

        raise InputError(
            f"{where}: {served.describe()} does not answer as the target: probe prompt {key[0]}, answer token "
            f"{position}: served {show(theirs)}, target {show(mine)}",
            fix="serve the same model (same dtype) and chat template as target.model, or use engine: inprocess",
        )
    return compared


# --------------------------------------------------------------------------- the factory


def settings_key(engine: str, sampling: Sampling) -> dict[str, Any] | None:
    """The part of the synthesis fingerprint the source settings add (None: today's in-process greedy key).

    Served engines share one key: the probe has shown they give the target's own answers.
    """
    parts: dict[str, Any] = {}
    if engine != "inprocess":
        parts["engine"] = "served"
    if sampling.as_key():
        parts["sampling"] = sampling.as_key()
    return parts or None
