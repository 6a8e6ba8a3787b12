"""Training sequences for a new head: token ids plus a response-only loss mask.

Two sources, both run through the target so the head learns the target's own
distribution (the EAGLE loss distils the target's logits at masked positions):

- **synthesis**: prompts (chat template applied when the tokenizer has one) answered
  by the target greedily, in left-padded batches. Every finished batch is appended to
  a JSONL cache named by a fingerprint of (target, prompts, settings), so a rerun
  costs nothing and an interrupted one resumes where it stopped.
- **teacher-forced text** (``draft.train.texts``): chunks of text, loss on every token.
  One target forward per chunk, several times cheaper per token than generating.

A sequence's ``loss_mask[j]`` is 1 when the target's prediction at position ``j``
(for token ``j + 1``) is a training target: for a chat sample, when token ``j + 1``
belongs to the response.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ..errors import InputError
from ..prompts import load_samples, sample_text
from .prompt_sets import load_prompt_sets


@dataclass
class TrainSequence:
    input_ids: list[int]
    loss_mask: list[int]
    source: str  # "synthesized" | "given" | "text"

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class DataReport:
    prompts: int = 0
    synthesized_tokens: int = 0
    synthesis_s: float = 0.0
    synthesis_cached: int = 0  # prompts whose response came from the cache
    text_tokens: int = 0
    text_s: float = 0.0
    sequences: int = 0
    trained_tokens: int = 0
    truncated: int = 0
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {k: (round(v, 3) if isinstance(v, float) else v) for k, v in self.__dict__.items()}


def has_chat_template(tokenizer: Any) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def prompt_ids(sample: dict[str, Any], tokenizer: Any) -> list[int]:
    """Token ids of a prompt, ending where the assistant's answer starts."""
    if "messages" in sample:
        messages = list(sample["messages"])
        if messages and messages[-1].get("role") == "assistant":
            messages = messages[:-1]
        if has_chat_template(tokenizer):
            ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)
        text = sample_text({"messages": messages}, None) + "\nassistant: "
    else:
        text = sample_text(sample, None)
    return list(tokenizer(text)["input_ids"])


def given_response_ids(sample: dict[str, Any], tokenizer: Any) -> list[int] | None:
    """The final assistant turn of a chat sample as tokens (``synthesize: false``)."""
    messages = sample.get("messages") or []
    if not messages or messages[-1].get("role") != "assistant":
        return None
    if has_chat_template(tokenizer):
        full = tokenizer.apply_chat_template(messages, tokenize=True)
        full = list(full["input_ids"] if hasattr(full, "keys") else full)
        prefix = prompt_ids(sample, tokenizer)
        if full[: len(prefix)] == prefix:
            return full[len(prefix):]
    return list(tokenizer(str(messages[-1].get("content", "")), add_special_tokens=False)["input_ids"])


def response_sequence(prompt: Sequence[int], response: Sequence[int], seq_len: int, source: str) -> tuple[TrainSequence, bool]:
    """Prompt + response, truncated to ``seq_len``; the mask covers the response's predictions."""
    ids = list(prompt) + list(response)
    mask = [0] * len(ids)
    for j in range(max(0, len(prompt) - 1), len(ids) - 1):
        mask[j] = 1
    truncated = len(ids) > seq_len
    return TrainSequence(ids[:seq_len], mask[:seq_len], source), truncated


def text_sequences(token_ids: Sequence[int], seq_len: int) -> list[TrainSequence]:
    """Teacher-forced chunks of ``seq_len`` tokens (shorter than 16 tokens: dropped)."""
    out = []
    for start in range(0, len(token_ids), seq_len):
        chunk = list(token_ids[start: start + seq_len])
        if len(chunk) < 16:
            continue
        out.append(TrainSequence(chunk, [1] * (len(chunk) - 1) + [0], "text"))
    return out


def fingerprint(*parts: Any) -> str:
    """A short key for cache file names (the manifest's canonical hash of ``parts``)."""
    from ..manifest import canonical_hash

    return canonical_hash(list(parts))[:16]


# --------------------------------------------------------------------------- synthesis


def _read_cache(path: Path) -> tuple[dict[int, list[int]], int]:
    """Responses in the synthesis cache and the byte length of its complete lines.

    Reading stops at the first line that is cut (no newline: an interruption mid-write)
    or unreadable; everything after it is redone.
    """
    done: dict[int, list[int]] = {}
    if not path.is_file():
        return done, 0
    data = path.read_bytes()
    end = 0
    while True:
        newline = data.find(b"\n", end)
        if newline < 0:
            break
        try:
            row = json.loads(data[end:newline].decode("utf-8"))
            response = [int(t) for t in row["r"]]
            done[int(row["i"])] = response
        except (ValueError, KeyError, TypeError):
            break
        end = newline + 1
    return done, end


def synthesize(
    model: Any,
    prompts: list[list[int]],
    max_new_tokens: int,
    batch_size: int,
    stop_ids: Sequence[int],
    pad_id: int,
    cache_file: Path,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[list[list[int]], int]:
    """Greedy responses of ``model`` to ``prompts``; returns (responses, how many came from the cache).

    Prompts run longest first in left-padded batches; each finished batch is appended to
    ``cache_file`` so an interrupted run resumes. A response ends with its stop token.
    """
    import torch

    done, complete = _read_cache(cache_file)
    cached = sum(1 for i in range(len(prompts)) if i in done)
    todo = sorted((i for i in range(len(prompts)) if i not in done), key=lambda i: -len(prompts[i]))
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    if cache_file.is_file() and cache_file.stat().st_size > complete:
        # Appending after a cut line would hide every later line from the next read: cut it off first.
        os.truncate(cache_file, complete)
    device = next(model.parameters()).device
    stops = set(int(s) for s in stop_ids)
    with open(cache_file, "a", encoding="utf-8") as fh:
        for start in range(0, len(todo), batch_size):
            batch = todo[start: start + batch_size]
            width = max(len(prompts[i]) for i in batch)
            ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            attn = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):
                ids[row, width - len(prompts[i]):] = torch.tensor(prompts[i])
                attn[row, width - len(prompts[i]):] = 1
            with torch.no_grad():
                out = model.generate(
                    input_ids=ids.to(device),
                    attention_mask=attn.to(device),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                    temperature=None,
                    top_p=None,
                    top_k=None,
                    eos_token_id=sorted(stops) or None,
                    pad_token_id=pad_id,
                )
            for row, i in enumerate(batch):
                response = []
                for token in out[row, width:].tolist():
                    response.append(int(token))
                    if token in stops:
                        break
                done[i] = response
                fh.write(json.dumps({"i": i, "r": response}) + "\n")
            fh.flush()
            if on_batch:
                on_batch(len(batch))
    return [done[i] for i in range(len(prompts))], cached


# --------------------------------------------------------------------------- the dataset


def load_prompt_samples(spec: str, key: str, base_dir: Path) -> list[dict[str, Any]]:
    samples = load_samples(spec, key, base_dir)
    bad = [n for n, s in enumerate(samples, 1) if "messages" in s and not s["messages"]]
    if bad:
        raise InputError(f"{key}: sample {bad[0]} has an empty `messages` list", fix="give at least one message per sample")
    return samples


def build_sequences(
    train: Any,
    base_dir: Path,
    model: Any,
    tokenizer: Any,
    stop_ids: Sequence[int],
    cache_dir: Path,
    target_fingerprint: str,
    progress: Any,
    world: Any = None,
) -> tuple[list[TrainSequence], DataReport]:
    """All training sequences of a ``draft.train`` block (synthesis cached under ``cache_dir``).

    In a data-parallel launch (``world``) each process synthesizes every ``world.size``-th
    prompt into its own cache file and the shares are exchanged.
    """
    from .distributed import World, gather

    world = world or World()
    report = DataReport()
    samples = load_prompt_sets(train, base_dir, model, tokenizer, stop_ids, cache_dir, target_fingerprint, progress, world)
    sequences: list[TrainSequence] = []
    prompts = [prompt_ids(s, tokenizer) for s in samples]
    report.prompts = len(prompts)
    if train.synthesize:
        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (list(stop_ids) or [0])[0]
        key = fingerprint("synthesis-v1", target_fingerprint, prompts, train.max_new_tokens, sorted(stop_ids),
                          train.synthesis_batch_size, pad_id)
        share = f"-part{world.rank}of{world.size}" if world.parallel else ""
        cache_file = cache_dir / f"synthesis-{key}{share}.jsonl"
        mine = list(range(world.rank, len(prompts), world.size))
        t0 = time.perf_counter()
        task = progress.add_task(f"synthesize responses (batch {train.synthesis_batch_size})", total=len(mine))
        already = len(_read_cache(cache_file)[0])
        progress.advance(task, min(already, len(mine)))
        my_responses, cached = synthesize(
            model, [prompts[i] for i in mine], train.max_new_tokens, train.synthesis_batch_size, stop_ids, pad_id,
            cache_file, on_batch=lambda n: progress.advance(task, n),
        )
        responses: list[list[int]] = [[] for _ in prompts]
        report.synthesis_cached = 0
        for indices, (part, part_cached) in zip(
            (list(range(r, len(prompts), world.size)) for r in range(world.size)), gather((my_responses, cached), world)
        ):
            for i, response in zip(indices, part):
                responses[i] = response
            report.synthesis_cached += part_cached
        report.synthesis_s = time.perf_counter() - t0
        for prompt, response in zip(prompts, responses):
            seq, cut = response_sequence(prompt, response, train.seq_len, "synthesized")
            report.synthesized_tokens += len(response)
            report.truncated += cut
            sequences.append(seq)
    else:
        missing = 0
        for sample, prompt in zip(samples, prompts):
            response = given_response_ids(sample, tokenizer)
            if not response:
                missing += 1
                continue
            seq, cut = response_sequence(prompt, response, train.seq_len, "given")
            report.truncated += cut
            sequences.append(seq)
        if missing:
            report.notes.append(f"{missing} prompts without a final assistant turn were skipped (synthesize: false)")
    t0 = time.perf_counter()
    for n, spec in enumerate(train.texts):
        for sample in load_samples(spec, f"draft.train.texts[{n}]", base_dir):
            text = sample_text(sample, tokenizer)
            ids = list(tokenizer(text)["input_ids"])
            chunks = text_sequences(ids, train.seq_len)
            report.text_tokens += sum(len(c.input_ids) for c in chunks)
            sequences.extend(chunks)
    report.text_s = time.perf_counter() - t0
    sequences = [s for s in sequences if s.trained_tokens > 0 and len(s.input_ids) >= 2]
    if not sequences:
        raise InputError(
            "draft.train: no training tokens (every sequence is empty or has no response)",
            fix="give prompts the target answers (synthesize: true) or chat samples ending with an assistant turn",
        )
    report.sequences = len(sequences)
    report.trained_tokens = sum(s.trained_tokens for s in sequences)
    return sequences, report
