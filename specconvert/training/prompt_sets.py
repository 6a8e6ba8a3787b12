"""``draft.train.prompts``: one prompt set or a list of them, resolved and mixed into one list of samples.

An entry is ``builtin:NAME``, a prompt file (every row format of ``specconvert.prompts``)
or ``self:N`` (prompts the target writes, :mod:`.self_prompts`). The sets are
concatenated in the order written. Every file is read whole before the target writes a
prompt or answers one, so a bad row stops the run with nothing cached.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

from .. import output
from ..errors import InputError
from ..prompts import load_samples, self_count


def prompt_specs(prompts: str | list[str]) -> list[str]:
    """The entries of ``draft.train.prompts`` (one string is a list of one)."""
    return [prompts] if isinstance(prompts, str) else list(prompts)


def spec_key(prompts: str | list[str], n: int) -> str:
    """The recipe path of entry ``n`` (``draft.train.prompts[1]``; no index for a single string)."""
    return "draft.train.prompts" if isinstance(prompts, str) else f"draft.train.prompts[{n}]"


def read_files(train: Any, base_dir: Path) -> dict[int, list[dict[str, Any]]]:
    """Every entry that is not ``self:N``, read and checked (by entry index); no model needed."""
    loaded: dict[int, list[dict[str, Any]]] = {}
    for n, spec in enumerate(prompt_specs(train.prompts)):
        key = spec_key(train.prompts, n)
        if self_count(spec, key) is None:
            loaded[n] = load_samples(spec, key, base_dir)
    return loaded


def check_prompt_sets(train: Any, base_dir: Path) -> None:
    """The preflight: bad files, rows or ``self:N`` specs stop the run before a model loads."""
    read_files(train, base_dir)


def load_prompt_sets(
    train: Any,
    base_dir: Path,
    model: Any,
    tokenizer: Any,
    stop_ids: Any,
    cache_dir: Path,
    target_fingerprint: str,
    progress: Any = None,
    world: Any = None,
    source: Any = None,
    report: Any = None,
    eval_sets: Sequence[tuple[str, str]] = (),
) -> list[dict[str, Any]]:
    """The training prompts of ``train``: every set in order, ``self:N`` written by ``model``, or by
    ``source`` when that is a served answer source (``draft.train.synthesis.engine: vllm | url``).

    Every evaluation set (``eval_prompts`` and ``eval_sets``, each a (spec, recipe key), e.g.
    ``quantize.eval_prompts``) is kept out of training: a file's prompt that overlaps one is
    left out, counted (``report.eval_overlaps``) and warned about, and written prompts never
    repeat a prompt of the other sets nor overlap an evaluation set. In a data-parallel launch
    process 0 writes them and the others receive its list, so every process holds the same
    prompts in the same order.
    """
    from ..prompts.overlap import OverlapIndex, keep_out
    from .distributed import World, gather
    from .self_prompts import user_texts, write_prompts

    world = world or World()
    specs = prompt_specs(train.prompts)
    loaded = read_files(train, base_dir)
    held_sets = [(train.eval_prompts, "draft.train.eval_prompts")] if train.eval_prompts else []
    held_sets += [(spec, key) for spec, key in eval_sets if spec and (spec, key) not in held_sets]
    held_texts = [t for spec, key in held_sets for s in load_samples(spec, key, base_dir) for t in user_texts(s)]
    if held_texts:
        held_out, left_out = OverlapIndex(held_texts), 0
        keep = getattr(train, "eval_overlap", "exclude") == "keep"
        for n in loaded:
            kept, dropped = keep_out(loaded[n], held_out, user_texts)
            loaded[n] = loaded[n] if keep else kept
            left_out += dropped
        if left_out:
            output.warn(f"draft.train.prompts: {left_out} prompt{'s' if left_out > 1 else ''} overlap the evaluation "
                        f"set{'s' if len(held_sets) > 1 else ''} ({', '.join(key for _, key in held_sets)}: equal, or an "
                        "8-word run shared) and "
                        + ("were trained on anyway (draft.train.eval_overlap: keep)" if keep else
                           "were left out of training"))
        if report is not None:
            report.eval_overlaps = left_out
    written: list[dict[str, Any]] = []
    counts = {n: self_count(spec, spec_key(train.prompts, n)) for n, spec in enumerate(specs)}
    for n, count in counts.items():
        if count is None:
            continue
        avoid = [t for samples in loaded.values() for s in samples for t in user_texts(s)] + held_texts
        started = time.perf_counter()
        if world.main:
            written = write_prompts(count, model, tokenizer, stop_ids, train.self_prompts, train.seed, avoid, cache_dir,
                                    target_fingerprint, progress, spec_key(train.prompts, n), on_note=output.warn,
                                    source=source, probe_tokens=train.synthesis.probe_tokens)
        written = gather(written if world.main else None, world)[0]
        if report is not None:  # a DataReport: what the target wrote, where, in how long
            report.self_prompts = len(written)
            report.self_prompts_s = time.perf_counter() - started
            report.self_prompts_engine = source.describe() if source is not None else "in-process generate"
    samples: list[dict[str, Any]] = []
    for n in range(len(specs)):
        samples.extend(written if counts[n] is not None else loaded[n])
    if not samples:
        raise InputError("draft.train.prompts: no prompts", fix="give builtin:NAME, a prompt file or self:N")
    return samples
