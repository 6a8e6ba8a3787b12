"""Training sequences for a new head: token ids plus a response-only loss mask.

Two sources, both run through the target so the head learns the target's own
distribution (the EAGLE loss distils the target's logits at masked positions):

- **synthesis**: prompts (chat template applied when the tokenizer has one) answered
  by the target, through an answer source (:mod:`.answers`: in-process ``generate``,
  the project's vLLM or the user's URLs). Every finished answer is appended to a JSONL
  cache named by a fingerprint of (target, prompts, settings), so a rerun costs nothing
  and an interrupted one resumes where it stopped. A conversation with several user
  turns has every assistant turn regenerated in order, each conditioned on the
  target's own earlier answers, with loss on all of them.
- **teacher-forced text** (``draft.train.texts``): chunks of text, loss on every token.
  One target forward per chunk, several times cheaper per token than generating.

A sequence's ``loss_mask[j]`` is 1 when the target's prediction at position ``j``
(for token ``j + 1``) is a training target: for a chat sample, when token ``j + 1``
belongs to the response.
"""

from __future__ import annotations

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
    group: int | None = None  # the prompt of one of several answers to it: the held-out share takes whole groups

    @property
    def trained_tokens(self) -> int:
        return sum(self.loss_mask)


@dataclass
class DataReport:
    prompts: int = 0
    answers_per_prompt: int = 1  # sampled answers to each prompt (draft.train.synthesis.answers_per_prompt)
    synthesized_tokens: int = 0
    synthesis_s: float = 0.0
    synthesis_cached: int = 0  # answers that came from the cache
    synthesis_engine: str = ""
    answers: int = 0  # assistant turns synthesized (several per multi-turn sample)
    conversations_cut: int = 0  # multi-turn samples ended early: an answer reached max_new_tokens
    turns_past_seq_len: int = 0  # multi-turn samples ended early: the next turn's answer would start past seq_len
    probe_tokens: int = 0  # answer tokens a served engine matched the in-process target on
    probe: list[dict[str, Any]] = field(default_factory=list)  # per endpoint: the probe's measured logprob gap, ties
    self_prompts: int = 0  # prompts the target wrote (self:N), in `prompts`
    self_prompts_s: float = 0.0  # writing them (a rerun reads them from the cache)
    self_prompts_engine: str = ""
    eval_overlaps: int = 0  # prompts left out of training: they overlap an evaluation set (prompt_sets.py)
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


def prompts_for_key(samples: list[dict[str, Any]], tokenizer: Any) -> list[list[int]]:
    """First-turn prompt ids of every sample (what the synthesis cache key holds)."""
    return [prompt_ids({"messages": t[0]}, tokenizer) if t[0] else prompt_ids(s, tokenizer)
            for s, t in ((s, user_turns(s)) for s in samples)]


def fingerprint(*parts: Any) -> str:
    """A short key for cache file names (the manifest's canonical hash of ``parts``)."""
    from ..manifest import canonical_hash

    return canonical_hash(list(parts))[:16]


# --------------------------------------------------------------------------- synthesis


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
    """Greedy in-process answers of ``model`` to ``prompts``; returns (answers, how many came from the cache).

    The in-process source through the answers interface (cache appended answer by answer, resumable).
    """
    from .answers import GREEDY, AnswerCache, answer_all
    from .answers.inprocess import InProcessSource

    cache = AnswerCache(cache_file)
    keys = [(i, 0) for i in range(len(prompts))]
    cached = sum(1 for key in keys if key in cache)
    got = answer_all(InProcessSource(model, stop_ids, pad_id, batch_size), dict(zip(keys, prompts)), cache,
                     max_new_tokens, GREEDY, on_batch)
    return [got[key] for key in keys], cached


def user_turns(sample: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """The messages of each turn the target answers: the runs of non-assistant messages between assistant ones
    (the given assistant messages are dropped: synthesis regenerates them). A ``prompt`` sample is one turn."""
    if "messages" not in sample:
        return [[]]
    runs: list[list[dict[str, Any]]] = [[]]
    for message in sample["messages"]:
        if message.get("role") == "assistant":
            if runs[-1]:
                runs.append([])
            continue
        runs[-1].append(dict(message))
    return [run for run in runs if run] or [[]]


def render(messages: list[dict[str, Any]], tokenizer: Any, generation_prompt: bool) -> str:
    """A conversation as the text the target sees: its chat template, else ``role: content`` lines."""
    if has_chat_template(tokenizer):
        return tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
    return sample_text({"messages": messages}, None) + ("\nassistant: " if generation_prompt else "")


def next_turn_prompt(context: list[int], answer: list[int], history: list[dict[str, Any]], turn: list[dict[str, Any]],
                     tokenizer: Any, stop_ids: Sequence[int], where: str) -> tuple[list[int], list[dict[str, Any]]]:
    """The prompt of the next turn: ``context`` + the target's own ``answer`` (kept token for token) + the template
    text from the end of that answer to the next assistant cue (the user turn in between).

    Returns (prompt ids, the conversation so far as messages). The bridge is found by rendering the
    conversation before and after the new user turn: a template that renders earlier turns
    differently once a later one follows (it is not prefix-stable) is refused.
    """
    stops = set(int(s) for s in stop_ids)
    content = tokenizer.decode([t for t in answer if t not in stops], skip_special_tokens=True)
    answered = history + [{"role": "assistant", "content": content}]
    before = render(history, tokenizer, True)
    closed = render(answered, tokenizer, False)
    opened = render(answered + turn, tokenizer, True)
    if not (closed.startswith(before) and opened.startswith(closed)):
        raise InputError(
            f"{where}: the chat template renders earlier turns differently once a later turn follows, so the "
            "answers cannot be regenerated turn by turn",
            fix="give single-turn samples (one user turn each), or synthesize: false",
        )
    tail = closed[len(before):]  # the answer as rendered, with what the template closes a turn with
    stop_text = tokenizer.decode([answer[-1]], skip_special_tokens=False) if answer and answer[-1] in stops else ""
    cut = tail.rfind(stop_text) if stop_text else -1
    leftover = tail[cut + len(stop_text):] if cut >= 0 else ""  # e.g. ChatML's "\n" after <|im_end|>
    bridge = list(tokenizer(leftover + opened[len(closed):], add_special_tokens=False)["input_ids"])
    return list(context) + list(answer) + bridge, answered + turn


def conversation_sequence(ids: Sequence[int], spans: Sequence[tuple[int, int]], seq_len: int,
                          source: str) -> tuple[TrainSequence, bool]:
    """``ids`` with loss on the predictions of every token inside ``spans`` ([start, end) answer positions)."""
    mask = [0] * len(ids)
    for start, end in spans:
        for j in range(max(0, start - 1), min(end, len(ids)) - 1):
            mask[j] = 1
    return TrainSequence(list(ids[:seq_len]), mask[:seq_len], source), len(ids) > seq_len


def synthesis_cache_key(target_fingerprint: str, first_prompts: list[list[int]], train: Any, stop_ids: Sequence[int],
                        pad_id: int, turns: list[list[list[dict[str, Any]]]], identity: dict[str, Any] | None = None) -> str:
    """The synthesis cache's name: who answered (``identity``: the engine kind, served model id, redacted endpoints
    and request_extra; in process, the target's dtype and device), sampling and later turns add their part."""
    from .answers import Sampling, settings_key

    synthesis = train.synthesis
    sampling = Sampling(synthesis.temperature, synthesis.top_p, synthesis.seed)
    extra = settings_key(identity, sampling)  # who answered (answers.AnswerSource.identity), and how
    batch = [train.synthesis_batch_size, pad_id] if synthesis.engine == "inprocess" else ["served"]
    parts: list[Any] = ["synthesis-v1", target_fingerprint, first_prompts, train.max_new_tokens, sorted(stop_ids), *batch]
    if extra:
        parts.append(extra)
    later = [t[1:] for t in turns]
    if any(later):
        parts.append({"later_turns": later})
    return fingerprint(*parts)


def synthesize_conversations(train: Any, samples: list[dict[str, Any]], tokenizer: Any, source: Any, reference: Any,
                             stop_ids: Sequence[int], cache_file: Path, progress: Any, world: Any,
                             report: "DataReport") -> list[TrainSequence]:
    """Answer every turn of every sample in order (turn t+1's prompt holds turn t's answer), through ``source``,
    cached; returns one training sequence per sample with loss on every answer.

    A served ``source`` is probed against ``reference`` (the in-process target) before its first request.
    In a data-parallel launch the in-process source answers every ``world.size``-th prompt per process;
    a served one is driven by process 0 alone.
    """
    from .answers import AnswerCache, Sampling, answer_all, probe
    from .distributed import gather

    synthesis = train.synthesis
    sampling = Sampling(synthesis.temperature, synthesis.top_p, synthesis.seed)
    turns = [user_turns(s) for s in samples]
    histories: dict[int, list[dict[str, Any]]] = {i: t[0] for i, t in enumerate(turns)}
    contexts = {(i, 0): (prompt_ids({"messages": t[0]}, tokenizer) if t[0] else prompt_ids(samples[i], tokenizer))
                for i, t in enumerate(turns)}
    cache = AnswerCache(cache_file)
    answers: dict[tuple[int, int], list[int]] = {}
    stops = set(int(s) for s in stop_ids)
    active = list(range(len(samples)))
    probed = False
    turn = 0
    while active:
        keys = [(i, turn) for i in active]
        if source.served:
            mine = keys if world.main else []
        else:
            mine = [key for n, key in enumerate(keys) if n % world.size == world.rank]
        todo = [key for key in mine if key not in cache]
        if source.served and not probed and mine and (todo or not cache.probed):  # a cache made elsewhere: probe first
            first = [contexts[(i, 0)] for i in range(min(synthesis.probe_prompts, len(samples)))]
            results = [probe(endpoint, reference, first, synthesis.probe_tokens,
                             lambda t: tokenizer.decode([t], skip_special_tokens=False)) for endpoint in source.endpoints()]
            report.probe_tokens += sum(r.tokens for r in results)
            report.probe = [r.as_dict() for r in results]
            cache.mark_probed(results)
            probed = True
        label = f"synthesize answers ({source.describe()}" + (f", turn {turn + 1})" if turn else ")")
        task = progress.add_task(label, total=len(mine))
        progress.advance(task, len(mine) - len(todo))
        got = answer_all(source, {key: contexts[key] for key in mine}, cache, train.max_new_tokens, sampling,
                         lambda n: progress.advance(task, n))
        # as JSON rows (the data phase exchanges through files before the process group exists)
        for part, cached in gather(([[i, t, ids] for (i, t), ids in got.items()], len(mine) - len(todo)), world):
            answers.update({(i, t): ids for i, t, ids in part})
            report.synthesis_cached += cached
        following = []
        for i in active:
            if turn + 1 >= len(turns[i]):
                continue
            answer = answers[(i, turn)]
            if not answer or answer[-1] not in stops:
                report.conversations_cut += 1  # an answer cut at max_new_tokens: what followed it never happened
                continue
            following_ids, history = next_turn_prompt(
                contexts[(i, turn)], answer, histories[i], turns[i][turn + 1], tokenizer, stop_ids,
                f"draft.train.prompts sample {i + 1}")
            if len(following_ids) >= train.seq_len:  # its answer would start past seq_len: all of it thrown away
                report.turns_past_seq_len += 1
                continue
            contexts[(i, turn + 1)], histories[i] = following_ids, history
            following.append(i)
        active = following
        turn += 1
    sequences = []
    for i in range(len(samples)):
        spans, last = [], 0
        while (i, last) in answers:
            start = len(contexts[(i, last)])
            spans.append((start, start + len(answers[(i, last)])))
            last += 1
        ids = contexts[(i, last - 1)] + answers[(i, last - 1)]
        seq, cut = conversation_sequence(ids, spans, train.seq_len, "synthesized")
        report.synthesized_tokens += sum(end - start for start, end in spans)
        report.answers += len(spans)
        report.truncated += cut
        sequences.append(seq)
    return sequences


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
    source: Any = None,
    eval_sets: Sequence[tuple[str, str]] = (),
) -> tuple[list[TrainSequence], DataReport]:
    """All training sequences of a ``draft.train`` block (synthesis cached under ``cache_dir``).

    ``source``: where the answers come from (an ``answers.AnswerSource``; default in-process
    ``generate`` with ``model``). In a data-parallel launch (``world``) each process synthesizes
    every ``world.size``-th prompt into its own cache file and the shares are exchanged.
    """
    from .distributed import World, gather

    world = world or World()
    report = DataReport()
    # self:N prompts are written by the served engine too when answers come from one
    writer = source if train.synthesize and source is not None and source.served else None
    samples = load_prompt_sets(train, base_dir, model, tokenizer, stop_ids, cache_dir, target_fingerprint, progress, world,
                               writer, report, eval_sets)
    sequences: list[TrainSequence] = []
    report.prompts = len(samples)
    if train.synthesize:
        from .answers.inprocess import InProcessSource

        pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (list(stop_ids) or [0])[0]
        # The probe's reference answers one prompt at a time, unpadded, as a server does.
        reference = InProcessSource(model, stop_ids, pad_id, 1)
        # Several answers per prompt: the prompt list repeated, copy c of prompt i answered as prompt i + c*n, so
        # every answer has its own key and seed (Sampling.request_seed), in process and served alike.
        # Answer i depends only on its prompt (i mod n) and its seed (from i), never on the number of copies, so the
        # cache is keyed by the distinct prompts: raising answers_per_prompt asks for the new copies alone.
        source = source or InProcessSource(model, stop_ids, pad_id, train.synthesis_batch_size)
        key = synthesis_cache_key(target_fingerprint, prompts_for_key(samples, tokenizer), train, stop_ids, pad_id,
                                  [user_turns(s) for s in samples], source.identity())
        distinct = len(samples)
        copies = train.synthesis.answers_per_prompt
        samples = samples * copies
        report.answers_per_prompt = copies
        share = f"-part{world.rank}of{world.size}" if world.parallel else ""
        report.synthesis_engine = train.synthesis.engine
        t0 = time.perf_counter()
        answered = synthesize_conversations(train, samples, tokenizer, source, reference, stop_ids,
                                            cache_dir / f"synthesis-{key}{share}.jsonl", progress, world, report)
        if copies > 1:
            for n, seq in enumerate(answered):
                seq.group = n % distinct
        sequences.extend(answered)
        report.synthesis_s = time.perf_counter() - t0
    else:
        missing = 0
        for sample in samples:
            prompt = prompt_ids(sample, tokenizer)
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
