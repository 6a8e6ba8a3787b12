"""What bench sends: request payloads from a prompt set or synthetic lengths, and the run order.

Both sides of a comparison get the identical payload list (same prompts, same
order, same seeds), so a per-pair ratio compares like with like.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import output
from ..errors import InputError
from ..prompts import PYTHON_DOCS, builtin_names, load_samples, sample_text

FALLBACK_PROMPTS = "builtin:bench-smoke"
SYNTHETIC = "synthetic"


@dataclass(frozen=True)
class Run:
    """One measured run: one endpoint at one concurrency level, repeat ``repeat`` of that level."""

    label: str  # "baseline" | "speculative" | "fixed-kN"
    concurrency: int
    repeat: int

    @property
    def name(self) -> str:
        return f"{self.label}-c{self.concurrency}-r{self.repeat}"


def arm_labels(compare_baseline: bool, fixed_labels: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The arms of one bench, in run order: baseline, the fixed chains, the bundle's setting."""
    return (["baseline"] if compare_baseline else []) + list(fixed_labels) + ["speculative"]


def interleaved_schedule(levels: list[int], repeats: int, compare_baseline: bool,
                         fixed_labels: list[str] | tuple[str, ...] = ()) -> list[Run]:
    """Per level, ``repeats`` rounds of every arm, the order rotating by one each round (A B C, B C A, C A B, ...)
    so slow machine drift, and whatever one run leaves behind for the next, hits every arm alike.

    A fixed order let the arm that always ran last pay for its predecessor: two servers with the same
    settings measured 5 % apart in `make bench-tune` when one of them always followed the slowest arm."""
    labels = arm_labels(compare_baseline, fixed_labels)
    order: list[Run] = []
    for level in levels:
        for repeat in range(repeats):
            shift = repeat % len(labels)
            order += [Run(label, level, repeat) for label in labels[shift:] + labels[:shift]]
    return order


def load_prompt_samples(spec: str, base_dir: Path) -> tuple[list[dict[str, Any]], str]:
    """Samples and the set actually used (``builtin:chat-eval`` falls back to ``builtin:bench-smoke`` while absent)."""
    if spec == "builtin:chat-eval" and "chat-eval" not in builtin_names():
        output.warn(f"bench.prompts: builtin:chat-eval is not shipped in this version; using {FALLBACK_PROMPTS}")
        spec = FALLBACK_PROMPTS
    return load_samples(spec, "bench.prompts", base_dir), spec


def resolve_api(api: str, samples: list[dict[str, Any]] | None) -> str:
    if api != "auto":
        return api
    if samples is None:
        return "completions"
    return "chat" if all("messages" in s for s in samples) else "completions"


def build_payloads(bench: Any, base_dir: Path, api: str,
                   loaded: tuple[list[dict[str, Any]], str] | None = None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The request bodies of one run (without ``model``) and a description of the workload for the report.

    ``loaded``: the (samples, set used) of :func:`load_prompt_samples` when the caller already read them.
    """
    rng = random.Random(bench.seed)
    common: dict[str, Any] = {"temperature": bench.temperature, "stream": True,
                              "stream_options": {"include_usage": True}}
    if bench.prompts == SYNTHETIC:
        if api == "chat":
            raise InputError("bench.api: synthetic prompts are token-id lists, which only /v1/completions accepts",
                             fix="set `bench.api: completions` (or `auto`)")
        syn = bench.synthetic
        low, high = syn.token_id_range
        payloads = []
        for i in range(bench.num_requests):
            ids = [rng.randrange(low, high) for _ in range(syn.input_tokens)]
            payloads.append({**common, "prompt": ids, "max_tokens": syn.output_tokens, "ignore_eos": True,
                             "seed": bench.seed + i})
        return payloads, {"prompts": SYNTHETIC, "api": "completions", "input_tokens": syn.input_tokens,
                          "output_tokens": syn.output_tokens, "ignore_eos": True}
    if getattr(bench, "context_lengths", None):
        return context_payloads(bench, api, common)
    samples, used = loaded or load_prompt_samples(bench.prompts, base_dir)
    order = list(range(len(samples)))
    rng.shuffle(order)
    payloads, categories = [], []
    for i in range(bench.num_requests):
        sample = samples[order[i % len(order)]]
        categories.append(sample.get("category"))
        body: dict[str, Any] = {**common, "max_tokens": bench.max_tokens, "seed": bench.seed + i}
        if bench.ignore_eos:
            body["ignore_eos"] = True
        if api == "chat":
            body["messages"] = sample.get("messages") or [{"role": "user", "content": sample_text(sample)}]
        else:
            body["prompt"] = sample_text(sample)
        payloads.append(body)
    workload = {"prompts": used, "requested_prompts": bench.prompts, "api": api, "samples": len(samples),
                "max_tokens": bench.max_tokens, "ignore_eos": bench.ignore_eos}
    if any(categories):  # a prompt's category (its `category` field), per payload: the report's per-category table
        workload["categories"] = categories
    return payloads, workload


# A token of English prose or code is about 4 characters in the tokenizers of the models served here (SmolLM2,
# Llama 3); the report shows the prompt tokens the server counted, so the estimate only places the lengths.
CHARS_PER_TOKEN = 4
QUESTION = ("\n\nQuestion: using only the documents above, explain what the first and the last document describe, "
            "and name one idea they share.")


def context_prompt(documents: list[str], start: int, tokens: int) -> str:
    """About ``tokens`` tokens of whole documents (the last one cut at a line end), numbered, then a question about
    them: a long input a model must read, not padding. ``start`` rotates the documents so each request differs."""
    budget = tokens * CHARS_PER_TOKEN - len(QUESTION)
    parts: list[str] = []
    used = 0
    for n in range(len(documents)):
        text = documents[(start + n) % len(documents)].strip()
        head = f"Document {n + 1}.\n"
        room = budget - used - len(head) - 2
        if room <= 0:
            break
        if len(text) > room:
            cut = text.rfind("\n", 0, room)
            text = text[:cut if cut > room // 2 else room].rstrip()
        parts.append(head + text)
        used += len(parts[-1]) + 2
    return "\n\n".join(parts) + QUESTION


def context_payloads(bench: Any, api: str, common: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """``bench.context_lengths``: requests round-robin over the input lengths, each a prompt of documents and a
    question (:func:`context_prompt`), output fixed at ``max_tokens``; the workload names each payload's length."""
    documents = [sample_text(s) for s in load_samples(PYTHON_DOCS, "bench.context_lengths", Path("."))]
    lengths = list(bench.context_lengths)
    payloads, per_payload = [], []
    for i in range(bench.num_requests):
        length = lengths[i % len(lengths)]
        text = context_prompt(documents, 7 * i, length)
        body: dict[str, Any] = {**common, "max_tokens": bench.max_tokens, "seed": bench.seed + i, "ignore_eos": True}
        if api == "chat":
            body["messages"] = [{"role": "user", "content": text}]
        else:
            body["prompt"] = text
        payloads.append(body)
        per_payload.append(length)
    return payloads, {"prompts": "context sweep: python:docs documents + a question", "api": api,
                      "max_tokens": bench.max_tokens, "ignore_eos": True, "context_lengths": lengths,
                      "input_lengths": per_payload, "chars_per_token_estimate": CHARS_PER_TOKEN}
