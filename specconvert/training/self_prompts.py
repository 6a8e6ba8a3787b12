"""``self:N``: prompts the target writes itself (the Magpie method), seeded, deduplicated, filtered, cached.

Magpie (Xu et al. 2024, github.com/magpie-align/magpie, ``configs/model_configs.json``)
feeds an instruct model only the opening of a user turn -- its "pre-query template",
e.g. ``<|im_start|>user\\n`` for Qwen2's ChatML -- and samples: the model writes what a
user would ask, and stops at its end-of-turn token. We take that opening from the
target's own chat template instead of a table: the template renders one user message
holding a sentinel, and everything before the sentinel is the opening (any default
system prompt the template adds included, as for every training prompt), everything
after it the end of the turn. For SmolLM2 that opening is ChatML with its default
system prompt: ``<|im_start|>system\\nYou are a helpful AI assistant named SmolLM,
trained by Hugging Face<|im_end|>\\n<|im_start|>user\\n``.

Candidates are generated in batches of ``self_prompts.batch_size`` from the same
opening, batch ``b`` seeded with (``draft.train.seed``, ``b``), and every finished batch
is appended to ``<cache>/self-prompts-<key>.jsonl`` as raw token ids. The key holds
what shapes the raw stream (target, opening, stop tokens, seed, sampling settings) but
not N or the filters, which run on read: a larger N continues the same stream, a rerun
costs nothing, and a killed run resumes after its last whole batch with the same result.

A candidate is kept when its turn ended within ``max_tokens`` and it is at least
``min_tokens`` long, not repetitive (distinct token 3-grams under half), not a repeat of
an earlier prompt after normalisation (case, whitespace and punctuation folded), and
shares no 8-word run with a held-out evaluation prompt (or equals one).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

from ..errors import InputError
from ..line_cache import complete_rows
from ..prompts.overlap import OVERLAP_WORDS, normalise  # noqa: F401  (normalise is this module's API too)
from ..prompts.overlap import OverlapIndex as HeldOut  # bounded: hashed 8-word windows (issue 37, item 7)

SENTINEL = "SPECCONVERTSELFPROMPTSENTINEL"
MIN_DISTINCT_TRIGRAMS = 0.5  # below: a text that says the same thing over and over
ATTEMPT_FACTOR = 4  # candidates generated at most, per prompt asked for, before giving up


# --------------------------------------------------------------------------- the opening of a user turn


@dataclass(frozen=True)
class UserTurn:
    opening: str  # the chat template's text before a user message's content
    closing: str  # the template's text right after it (the end-of-turn marker first)

    @property
    def end_marker(self) -> str:
        return self.closing.strip().split()[0] if self.closing.strip() else ""


def user_turn(tokenizer: Any, key: str = "draft.train.prompts") -> UserTurn:
    """The opening and closing of a user turn in ``tokenizer``'s chat template."""
    if not getattr(tokenizer, "chat_template", None):
        raise InputError(f"{key}: self:N needs a target with a chat template (the target writes the user turns of its own template)",
                         fix="use builtin:NAME or a prompt file for a base model")
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False, add_generation_prompt=False)
    at = rendered.find(SENTINEL)
    if at < 0:
        raise InputError(f"{key}: the target's chat template does not show a user message's text, so self:N cannot find "
                         "where a user turn starts", fix="use builtin:NAME or a prompt file")
    return UserTurn(rendered[:at], rendered[at + len(SENTINEL):])


# --------------------------------------------------------------------------- filters (pure)


def is_repetitive(token_ids: Sequence[int]) -> bool:
    """Fewer than half of its token 3-grams distinct (texts of under 8 3-grams are never repetitive)."""
    grams = [tuple(token_ids[i: i + 3]) for i in range(len(token_ids) - 2)]
    return len(grams) >= 8 and len(set(grams)) / len(grams) < MIN_DISTINCT_TRIGRAMS


@dataclass
class Selection:
    """The prompts kept so far and why the others were dropped."""

    prompts: list[str] = field(default_factory=list)
    dropped: dict[str, int] = field(default_factory=dict)
    seen: set[str] = field(default_factory=set)

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def summary(self) -> str:
        return ", ".join(f"{n} {reason}" for reason, n in sorted(self.dropped.items(), key=lambda x: -x[1])) or "none"


def consider(candidate: Sequence[int], tokenizer: Any, turn: UserTurn, stops: set[int], settings: Any,
             held_out: HeldOut, selection: Selection) -> None:
    """Keep ``candidate`` (generated token ids) in ``selection`` or count why not."""
    ids = list(candidate)
    ended = False
    for n, token in enumerate(ids):
        if token in stops:
            ids, ended = ids[:n], True
            break
    text = tokenizer.decode(ids, skip_special_tokens=False)
    marker = turn.end_marker
    if marker and marker in text:
        text, ended = text[: text.index(marker)], True
    for special in getattr(tokenizer, "all_special_tokens", []) or []:
        if special and special in text:  # a new turn or the end of the text: the prompt ended before it
            text, ended = text[: text.index(special)], True
    text = text.strip()
    if not ended:
        return selection.drop("too long")
    if not text:
        return selection.drop("empty")
    body = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if len(body) < settings.min_tokens:
        return selection.drop("too short")
    if len(body) > settings.max_tokens:
        return selection.drop("too long")
    if is_repetitive(body):
        return selection.drop("repetitive")
    key = normalise(text)
    if key in selection.seen:
        return selection.drop("duplicate")
    if held_out.overlaps(text):
        return selection.drop("overlapping a held-out prompt")
    selection.seen.add(key)
    selection.prompts.append(text)


# --------------------------------------------------------------------------- the cache


def read_batches(path: Path) -> tuple[list[list[list[int]]], int]:
    """The whole batches in the cache, in order, and the byte length they take.

    Reading stops at a cut, unreadable or out-of-order line (a kill mid-write); what
    follows is generated again.
    """
    batches: list[list[list[int]]] = []
    end = 0
    for row, line_end in complete_rows(path):
        try:
            if int(row["b"]) != len(batches):
                break
            batches.append([[int(t) for t in c] for c in row["c"]])
        except (ValueError, KeyError, TypeError, AttributeError):
            break
        end = line_end
    return batches, end


def cache_key(target_fingerprint: str, opening_ids: list[int], stops: list[int], seed: int, settings: Any,
              served: bool = False) -> str:
    """The cache file's key. Served engines draw with per-prompt seeds, in-process ``generate`` with one seed per
    batch: the same settings give other prompts, so they get other files (the in-process key is unchanged)."""
    from ..manifest import canonical_hash

    return canonical_hash(["self-prompts-v1", target_fingerprint, opening_ids, stops, seed, settings.temperature,
                           settings.top_p, settings.max_tokens, settings.batch_size, *(["served"] if served else [])])[:16]


# --------------------------------------------------------------------------- generation


def write_prompts(
    count: int,
    model: Any,
    tokenizer: Any,
    stop_ids: Sequence[int],
    settings: Any,
    seed: int,
    held_out: Iterable[str],
    cache_dir: Path,
    target_fingerprint: str,
    progress: Any = None,
    key: str = "draft.train.prompts",
    on_note: Callable[[str], None] | None = None,
    source: Any = None,
    probe_tokens: int = 16,
) -> list[dict[str, Any]]:
    """``count`` user prompts written by ``model`` as chat samples ``{"messages": [{"role": "user", ...}]}``.

    Same target, seed and settings: the same prompts. Fewer than ``count`` when the
    target repeats itself past ``ATTEMPT_FACTOR`` x ``count`` candidates (``on_note`` says
    so); none at all is bad input.

    ``source``: a served answer source (``answers.AnswerSource`` with ``served``; the one
    ``draft.train.synthesis`` names) writes the prompts instead of in-process ``generate``:
    one request per candidate, seeded per candidate, after a probe (the greedy continuation
    of the opening, ``probe_tokens`` long, must equal the in-process target's).
    """
    turn = user_turn(tokenizer, key)
    opening_ids = list(tokenizer(turn.opening, add_special_tokens=False)["input_ids"])
    stops = set(int(s) for s in stop_ids)
    marker_ids = list(tokenizer(turn.end_marker, add_special_tokens=False)["input_ids"]) if turn.end_marker else []
    if len(marker_ids) == 1:
        stops.add(marker_ids[0])  # <|im_end|>, <|eot_id|>: stop on the token, not after max_tokens
    served = bool(source is not None and getattr(source, "served", False))
    name = cache_key(target_fingerprint, opening_ids, sorted(stops), seed, settings, served)
    cache_file = cache_dir / f"self-prompts-{name}.jsonl"
    batches, complete = read_batches(cache_file)
    cache_dir.mkdir(parents=True, exist_ok=True)
    if cache_file.is_file() and cache_file.stat().st_size > complete:
        os.truncate(cache_file, complete)  # drop a cut line so appended batches stay readable

    excluded = HeldOut(held_out)
    selection = Selection()
    max_batches = -(-ATTEMPT_FACTOR * count // settings.batch_size)
    task = progress.add_task(f"write prompts (self:{count}, batch {settings.batch_size})", total=count) if progress else None

    def take(batch: list[list[int]]) -> None:
        before = len(selection.prompts)
        for candidate in batch:
            if len(selection.prompts) < count:
                consider(candidate, tokenizer, turn, stops, settings, excluded, selection)
        if task is not None:
            progress.advance(task, len(selection.prompts) - before)

    used = 0
    for batch in batches:
        if len(selection.prompts) >= count:
            break
        take(batch)
        used += 1
    if len(selection.prompts) < count and used < max_batches:
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (sorted(stops) or [0])[0]
        if served:
            _probe(source, model, stop_ids, pad_id, opening_ids, probe_tokens, tokenizer, key)
            draw = _served_draw(source, opening_ids, stops, settings, seed)
            # enough batches in flight to keep the engine's `concurrency` slots busy
            window = max(1, -(-2 * int(getattr(source, "concurrency", 1) or 1) // settings.batch_size))
        else:
            draw, window = _inprocess_draw(model, opening_ids, stops, settings, seed, pad_id), 1
        with open(cache_file, "a", encoding="utf-8") as fh:
            b = len(batches)
            while b < max_batches and len(selection.prompts) < count:
                for batch in draw(range(b, min(b + window, max_batches))):
                    fh.write(json.dumps({"b": b, "c": batch}) + "\n")
                    fh.flush()
                    b += 1
                    if len(selection.prompts) < count:
                        take(batch)
    if not selection.prompts:
        raise InputError(f"{key}: the target wrote no usable prompt for self:{count} (dropped: {selection.summary()})",
                         fix="use a chat (instruct) target, raise draft.train.self_prompts.max_tokens, or give a prompt file")
    if len(selection.prompts) < count and on_note:
        on_note(f"self:{count}: the target wrote {len(selection.prompts)} usable prompts in {ATTEMPT_FACTOR * count} tries "
                f"(dropped: {selection.summary()})")
    return [{"messages": [{"role": "user", "content": text}]} for text in selection.prompts]


def _cut(row: Sequence[int], stops: set[int]) -> list[int]:
    """A candidate up to and including its first stop token."""
    end = next((n + 1 for n, t in enumerate(row) if t in stops), len(row))
    return [int(t) for t in row[:end]]


def _inprocess_draw(model: Any, opening_ids: list[int], stops: set[int], settings: Any, seed: int,
                    pad_id: int) -> Callable[[range], list[list[list[int]]]]:
    """Batches drawn by ``generate``, one seed per batch (from ``seed`` and the batch's number)."""
    import torch

    device = next(model.parameters()).device

    def draw(numbers: range) -> list[list[list[int]]]:
        out_batches = []
        for b in numbers:
            ids = torch.tensor([opening_ids] * settings.batch_size, dtype=torch.long, device=device)
            # fork_rng: the seeds here must not shift the head's initialisation or data order
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []), torch.no_grad():
                torch.manual_seed(seed * 1_000_003 + b)
                out = model.generate(
                    input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=settings.max_tokens,
                    do_sample=True, temperature=settings.temperature, top_p=settings.top_p, top_k=0,
                    eos_token_id=sorted(stops) or None, pad_token_id=pad_id,
                )
            out_batches.append([_cut(row, stops) for row in out[:, len(opening_ids):].tolist()])
        return out_batches

    return draw


def _served_draw(source: Any, opening_ids: list[int], stops: set[int], settings: Any,
                 seed: int) -> Callable[[range], list[list[list[int]]]]:
    """Batches drawn by a served engine: one request per candidate ``(b, i)``, seeded from (``seed``, b, i)
    (``answers.Sampling.request_seed``), so a candidate does not depend on what else was in flight."""
    from .answers import Sampling

    sampling = Sampling(temperature=settings.temperature, top_p=settings.top_p, seed=seed)

    def draw(numbers: range) -> list[list[list[int]]]:
        got: dict[tuple[int, int], list[int]] = {}
        jobs = [((b, i), list(opening_ids)) for b in numbers for i in range(settings.batch_size)]
        source.answer(jobs, settings.max_tokens, sampling, lambda k, ids: got.__setitem__(k, list(ids)))
        return [[_cut(got[(b, i)], stops) for i in range(settings.batch_size)] for b in numbers]

    return draw


def _probe(source: Any, model: Any, stop_ids: Sequence[int], pad_id: int, opening_ids: list[int], tokens: int,
           tokenizer: Any, key: str) -> None:
    """A served engine must continue the opening greedily as the in-process target does (else: another model or
    template would write the prompts)."""
    from .answers import probe
    from .answers.inprocess import InProcessSource

    reference = InProcessSource(model, stop_ids, pad_id, 1)
    for endpoint in source.endpoints():
        probe(endpoint, reference, [opening_ids], tokens, lambda t: tokenizer.decode([t], skip_special_tokens=False),
              where=f"{key} (self:N through draft.train.synthesis)")


def user_texts(sample: dict[str, Any]) -> list[str]:
    """The user-written text of a sample (what a written prompt must not repeat)."""
    if "messages" in sample:
        return [str(m.get("content", "")) for m in sample["messages"] if m.get("role") == "user"]
    return [str(sample.get("prompt", sample.get("text", "")))]
