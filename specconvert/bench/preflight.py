"""bench's checks before anything starts: the free-speculation arms an engine can serve (``bench.baselines``), and
the context it will serve against the head's training length (``bench.context_lengths``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .. import output
from ..errors import EnvironmentMissing, InputError
from ..manifest import read_manifest


def free_arms(bench: Any, recipe: Any, url: str | None, recipe_path: Path | None = None) -> list[str]:
    """``bench.baselines``' free-speculation arms (``ngram``, ``suffix``), checked before anything starts: servers bench
    starts itself, on an engine that has the method (exit 2 otherwise), with its package installed (exit 3)."""
    arms = list(bench.baselines)
    if not arms:
        return []
    if url is not None or recipe is None:
        raise InputError(f"bench.baselines {arms}: free-speculation arms are servers bench starts itself, and --url "
                         "benches a server you started", fix="drop --url (bench starts the bundle's servers), or "
                         "--set bench.baselines=[]")
    backend = recipe.runtime.backend
    if backend == "reference":
        raise InputError("bench.baselines: the reference server decodes with the head only; it has no n-gram or "
                         "suffix decoding", fix="bench on an engine (runtime.backend: vllm or trtllm), or "
                         "--set bench.baselines=[]")
    if "suffix" in arms and backend != "vllm":
        raise InputError(f"bench.baselines: suffix decoding is vLLM's (method: suffix); runtime.backend is {backend}",
                         fix="--set bench.baselines=[ngram]")
    if "suffix" in arms:
        from ..backends.vllm import launch as vllm

        python = vllm.find_python(recipe.runtime, vllm.project_roots(recipe_path or Path("recipe.yaml")))
        missing = vllm.missing_free_packages(python, arms)
        if missing:
            raise EnvironmentMissing(
                f"bench.baselines: suffix decoding needs the module {missing['suffix']} in vLLM's Python ({python}); "
                "vLLM refuses method 'suffix' without it (vllm/config/speculative.py _validate_suffix_decoding)",
                fix="install arctic-inference==0.1.1 into that environment (on the CPU build it is a source "
                "package that compiles against torch 2.7: see docs/bench.md), or --set bench.baselines=[ngram]")
    return arms


# Far beyond: a head trained on sequences of N tokens, served at more than this many times N.
FAR_BEYOND = 2


def context_check(bench: Any, recipe: Any) -> dict[str, Any]:
    """The context bench serves against the head's training ``seq_len`` (convert manifest): exit 2 when a swept length
    plus ``max_tokens`` exceeds ``build.max_seq_len``; a warning when the context is more than FAR_BEYOND times the
    sequences the head was trained on (the per-length table then shows what that costs)."""
    lengths = list(getattr(bench, "context_lengths", None) or [])
    info: dict[str, Any] = {"swept": lengths, "head_seq_len": None, "serving_context": None, "warning": None}
    if recipe is None:
        return info
    info["serving_context"] = recipe.build.max_seq_len
    too_long = [n for n in lengths if n + bench.max_tokens > recipe.build.max_seq_len]
    if too_long:
        raise InputError(f"bench.context_lengths: {too_long} plus bench.max_tokens {bench.max_tokens} exceed "
                         f"build.max_seq_len {recipe.build.max_seq_len}",
                         fix=f"use lengths up to {recipe.build.max_seq_len - bench.max_tokens}, or raise build.max_seq_len")
    convert = read_manifest(recipe.workdir_path / "convert") or {}
    train = (((convert.get("inputs") or {}).get("recipe") or {}).get("draft") or {}).get("train") or {}
    seq_len = train.get("seq_len")
    info["head_seq_len"] = seq_len
    info["head_seq_len_source"] = ("draft.train.seq_len of the convert that trained the head" if seq_len else
                                   "unknown: the head was not trained by specconvert convert")
    context = max([n + bench.max_tokens for n in lengths] or [recipe.build.max_seq_len])
    if seq_len and context > FAR_BEYOND * seq_len:
        info["warning"] = (f"the head was trained on sequences of {seq_len} tokens and is served at up to {context} "
                           f"({context / seq_len:.1f}x): acceptance usually falls with context beyond training"
                           + ("; the per-length table measures it" if lengths else
                              "; measure it with bench.context_lengths"))
        output.warn(f"bench: {info['warning']}")
    return info
