"""The reference decoder behind an async interface: one worker thread, per-request metrics.

The decoder holds one KV cache and serves one request at a time, so every request
runs on a single worker thread (requests queue in arrival order); an asyncio lock
keeps their order FIFO. The event loop never blocks on the model: the worker
pushes each decoder ``Step`` into an asyncio queue. Detokenisation and ``stop``
strings are handled on the loop side, which asks the worker to stop early; a stop
string ends the tokens at the one that completes it, also inside a verify step, so
the speculative model counts what the baseline counts.

Metrics follow TensorRT-LLM's ``/perf_metrics`` shape (per finished request:
``request_id`` and ``perf_metrics`` with ``first_iter``, ``last_iter``,
``timing_metrics`` and, when anything was drafted, ``speculative_decoding`` with
``acceptance_rate``, ``total_accepted_draft_tokens``, ``total_draft_tokens``), plus
a ``specconvert`` block with what TensorRT-LLM does not report (acceptance length
per request, accepted tokens per step, per-position acceptance).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Callable, Sequence

from ..errors import InputError

MAX_KEPT_METRICS = 1000  # like TensorRT-LLM's perf_metrics_max_requests: a bounded buffer


@dataclass
class EngineRequest:
    """One generation request, already tokenised."""

    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: Sequence[str] = ()
    speculative: bool = True
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; N: the target's log-prob of each token and its N most likely


@dataclass
class Delta:
    """What one decoder step added to the output (after stop handling)."""

    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    logprobs: list[Any] | None = None  # reference.decoder.TokenLogprob per token id, when asked for
    text_offsets: list[int] | None = None  # with logprobs: where each token's text starts in the output


@dataclass
class RequestStats:
    """Per-request counters, turned into a perf_metrics entry when the request ends."""

    request_id: int
    speculative: bool
    arrival_time: float
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    first_iter: int | None = None
    last_iter: int | None = None
    accepted_per_step: list[int] = field(default_factory=list)
    drafted_depth_per_step: list[int] = field(default_factory=list)
    draft_tokens_per_step: list[int] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str | None = None

    def perf_metrics(self) -> dict[str, Any]:
        """This request in TensorRT-LLM's /perf_metrics item shape (+ a ``specconvert`` block)."""
        metrics: dict[str, Any] = {
            "first_iter": self.first_iter,
            "last_iter": self.last_iter,
            "timing_metrics": {
                "arrival_time": self.arrival_time,
                "first_scheduled_time": self.first_scheduled_time,
                "first_token_time": self.first_token_time,
                "last_token_time": self.last_token_time,
            },
        }
        total_draft = sum(self.draft_tokens_per_step)
        total_accepted = sum(self.accepted_per_step)
        if total_draft > 0:  # TensorRT-LLM leaves the block out when nothing was drafted
            metrics["speculative_decoding"] = {
                "acceptance_rate": total_accepted / total_draft,
                "total_accepted_draft_tokens": total_accepted,
                "total_draft_tokens": total_draft,
            }
        steps = len(self.accepted_per_step)
        max_depth = max(self.drafted_depth_per_step, default=0)
        per_position = []
        for i in range(max_depth):
            tried = [a for a, d in zip(self.accepted_per_step, self.drafted_depth_per_step) if d > i]
            per_position.append(sum(1 for a in tried if a > i) / len(tried) if tried else 0.0)
        return {
            "request_id": self.request_id,
            "perf_metrics": metrics,
            "specconvert": {
                "speculative": self.speculative,
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens,
                "finish_reason": self.finish_reason,
                "verify_steps": steps,
                "acceptance_length": (sum(a + 1 for a in self.accepted_per_step) / steps) if steps else None,
                "accepted_per_step": list(self.accepted_per_step),
                "drafted_depth_per_step": list(self.drafted_depth_per_step),
                "per_position_acceptance": per_position,
            },
        }


_END = object()


class ReferenceEngine:
    """Serve a :class:`~specconvert.reference.ReferenceDecoder` to concurrent async callers."""

    def __init__(self, decoder: Any, model_name: str, max_draft_len: int = 3, tree: dict[str, int] | None = None,
                 description: dict[str, Any] | None = None, speculate: bool = True):
        self.decoder = decoder
        # False when `specconvert tune` measured that drafting does not pay here: the
        # speculative model name then decodes plainly too (and says so in /v1/models).
        self.speculate = speculate
        self.tokenizer = decoder.tokenizer
        self.model_name = model_name
        self.baseline_name = f"{model_name}-baseline"
        self.max_draft_len = max_draft_len
        self.tree = tree
        self.description = description or {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference-decoder")
        self._lock = asyncio.Lock()
        self._ids = itertools.count()
        self._iteration = 0  # target forwards since start (TensorRT-LLM's iteration counter)
        self._metrics: deque[dict[str, Any]] = deque(maxlen=MAX_KEPT_METRICS)
        self.queued = 0  # requests waiting for the decoder (the one running is not counted)
        self.closed = False

    @property
    def vocab_size(self) -> int | None:
        """Token ids a prompt may hold are ``0 <= id < vocab_size`` (None: unknown, stand-in decoders)."""
        return getattr(getattr(self.decoder, "target", None), "vocab_size", None)

    @property
    def max_model_len(self) -> int | None:
        """The target's context (``max_position_embeddings``): prompt + max_tokens must fit."""
        config = getattr(getattr(self.decoder, "target", None), "config", None)
        value = getattr(config, "max_position_embeddings", None)
        return int(value) if isinstance(value, int) and value > 0 else None

    # ------------------------------------------------------------------ text

    def render_chat(self, messages: list[dict[str, Any]]) -> str:
        """The prompt text for chat messages: the tokenizer's chat template, else ``role: content`` lines."""
        tok = self.tokenizer
        if tok is not None and getattr(tok, "chat_template", None):
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        lines = [f"{m.get('role', 'user')}: {m.get('content', '')}" for m in messages]
        return "\n".join(lines) + "\nassistant:"

    def encode(self, text: str, chat: bool = False) -> list[int]:
        if self.tokenizer is None:
            raise InputError("this model has no tokenizer, so it cannot take text prompts",
                             fix="send token ids as the prompt (a list of integers)")
        # A chat template writes its own special tokens.
        has_template = chat and bool(getattr(self.tokenizer, "chat_template", None))
        return list(self.tokenizer.encode(text, add_special_tokens=not has_template))

    def decode(self, token_ids: Sequence[int]) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def token_text(self, token_id: int, as_token_id: bool = False) -> str:
        """One token as logprobs spell it: its text (special tokens kept), or vLLM's ``token_id:N`` when
        ``as_token_id`` (the request's ``return_tokens_as_token_ids``) or when there is no tokenizer."""
        if as_token_id or self.tokenizer is None:
            return token_id_spelling(token_id)
        return self.tokenizer.decode([int(token_id)], skip_special_tokens=False)

    # ------------------------------------------------------------------ generation

    def _settings(self, request: EngineRequest):
        from ..reference import DecodeSettings

        return DecodeSettings(
            max_draft_len=self.max_draft_len,
            tree=self.tree,
            temperature=request.temperature,
            top_p=request.top_p,
            top_k=request.top_k,
            seed=request.seed,
            stop_token_ids=() if request.ignore_eos else tuple(self.decoder.eos_token_ids),
            speculative=request.speculative,
            logprobs=request.logprobs,
        )

    def _work(self, request: EngineRequest, push: Callable[[Any], None], cancel: threading.Event,
              stats: RequestStats) -> None:
        """Worker thread: run the decoder, push every step (or the exception), then the end marker."""
        try:
            stats.first_scheduled_time = time.monotonic()
            stream = self.decoder.stream(request.prompt_ids, request.max_tokens, self._settings(request))
            try:
                for step in stream:
                    self._iteration += 1
                    if stats.first_iter is None:
                        stats.first_iter = self._iteration
                    stats.last_iter = self._iteration
                    push(step)
                    if cancel.is_set():
                        break
            finally:
                stream.close()
        except BaseException as exc:  # handed to the request's coroutine, which raises it there
            push(exc)
        finally:
            push(_END)

    async def generate(self, request: EngineRequest) -> AsyncIterator[Delta]:
        """Yield text/token deltas until the request finishes; the last one carries ``finish_reason``."""
        loop = asyncio.get_running_loop()
        stats = RequestStats(next(self._ids), request.speculative, time.monotonic(), prompt_tokens=len(request.prompt_ids))
        queue: asyncio.Queue = asyncio.Queue()
        cancel = threading.Event()
        waiting = True
        self.queued += 1
        try:
            async with self._lock:
                self.queued -= 1
                waiting = False
                future = loop.run_in_executor(
                    self._executor, self._work, request, lambda item: loop.call_soon_threadsafe(queue.put_nowait, item),
                    cancel, stats,
                )
                try:
                    async for delta in self._deltas(request, queue, stats, cancel):
                        yield delta
                finally:
                    # Also on client disconnect: stop the worker after its current step. The executor
                    # has one thread, so a next request cannot overlap this one even before it ends.
                    cancel.set()
        except BaseException:
            if stats.finish_reason is None:
                stats.finish_reason = "abort"
            raise
        finally:
            if waiting:
                self.queued -= 1
            self._metrics.append(stats.perf_metrics())

    async def _deltas(self, request: EngineRequest, queue: asyncio.Queue, stats: RequestStats,
                      cancel: threading.Event) -> AsyncIterator[Delta]:
        tokens: list[int] = []
        offsets: list[int] = []  # with logprobs: where each token's text starts
        sent_text = ""
        stops = [s for s in request.stop if s]
        hold = max((len(s) for s in stops), default=1) - 1  # keep back what could start a stop string
        finish: str | None = None
        while finish is None:
            item = await queue.get()
            if item is _END:
                finish = finish or "length"
                break
            if isinstance(item, BaseException):
                raise item
            step = item
            now = time.monotonic()
            if step.kind == "spec":
                stats.accepted_per_step.append(int(step.accepted))
                stats.drafted_depth_per_step.append(int(step.drafted_depth))
                stats.draft_tokens_per_step.append(int(step.tree_size))
            if not step.token_ids and step.finished is None:
                continue
            if stats.first_token_time is None:
                stats.first_token_time = now
            stats.last_token_time = now
            before = len(tokens)
            tokens.extend(step.token_ids)
            text = self.decode(tokens)
            finish = step.finished
            cut = _first_stop(text, stops)
            if cut is not None:
                # A verify step emits several tokens; the baseline emits one per step and stops at the token
                # that completes the stop string. Keep tokens only up to that one, so token_ids, usage and
                # logprobs equal the baseline's (they over-counted the rest of the step before).
                keep = next(k for k in range(before + 1, len(tokens) + 1)
                            if _first_stop(self.decode(tokens[:k]), stops) is not None)
                del tokens[keep:]
                text = self.decode(tokens)
                text, finish = text[: _first_stop(text, stops)], "stop"
                cancel.set()
            new_ids = tokens[before:]
            logprobs = None
            if step.logprobs is not None:
                logprobs = list(step.logprobs[: len(new_ids)])
                offsets.extend(len(self.decode(tokens[:k])) for k in range(before, len(tokens)))
            if finish is None:
                # Hold back an incomplete UTF-8 character and what could be the start of a stop string.
                visible = text.rstrip("\ufffd")
                if hold:
                    visible = visible[: len(visible) - hold]
            else:
                visible = text
            delta = ""
            if len(visible) > len(sent_text) and visible.startswith(sent_text):
                delta, sent_text = visible[len(sent_text):], visible
            stats.completion_tokens = len(tokens)
            if delta or new_ids or finish:
                yield Delta(delta, new_ids, finish, logprobs, offsets[before:] if logprobs is not None else None)
        stats.finish_reason = finish
        stats.completion_tokens = len(tokens)

    # ------------------------------------------------------------------ metrics

    def drain_metrics(self) -> list[dict[str, Any]]:
        """Finished requests' metrics since the last call (TensorRT-LLM's /perf_metrics also drains)."""
        items = list(self._metrics)
        self._metrics.clear()
        return items

    def close(self) -> None:
        self.closed = True  # the app answers 503 from here on
        self._executor.shutdown(wait=False, cancel_futures=True)


def token_id_spelling(token_id: int) -> str:
    """vLLM's spelling of a token by id (vllm 0.32 ``format_token_id_placeholder``): ``token_id:N``."""
    return f"token_id:{int(token_id)}"


def _first_stop(text: str, stops: list[str]) -> int | None:
    hits = [text.find(s) for s in stops]
    hits = [h for h in hits if h >= 0]
    return min(hits) if hits else None


# ---------------------------------------------------------------------- loading


def reference_settings(engine_dir: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """(engine manifest, reference settings) of a built bundle, or InputError saying to run build."""
    from ..manifest import require_manifest

    manifest = require_manifest(engine_dir, "build", "build")
    path = Path((manifest.get("artifacts") or {}).get("reference_settings") or engine_dir / "reference" / "settings.json")
    if not path.is_file():
        raise InputError(f"{path} is missing from the bundle", fix="run `specconvert build RECIPE --force`")
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise InputError(f"{path} is not valid JSON ({exc.msg})", fix="run `specconvert build RECIPE --force`") from None
    missing = [k for k in ("target_dir", "draft_dir", "aux_layer_ids") if not settings.get(k)]
    if missing:
        raise InputError(f"{path} lacks {', '.join(missing)}", fix="run `specconvert build RECIPE --force`")
    return manifest, settings


def load_engine(engine_dir: Path, model_name: str, device: str = "auto", drafter: str = "eagle",
                draft_len: int | None = None, dtype: str | None = None) -> ReferenceEngine:
    """Load the reference decoder named by a bundle's ``reference/settings.json``.

    ``draft_len``: serve a fixed chain of that many drafted tokens instead of the bundle's setting
    (bench's ``fixed-kN`` arms next to a tuned bundle). ``dtype``: compute in this dtype instead of the
    bundle's (the oracle computes in the dtype the engine it checks serves)."""
    from ..reference import ReferenceDecoder
    from ..reference.decoder import resolve_device

    _, settings = reference_settings(engine_dir)
    requested = settings.get("device") or "auto" if device == "auto" else device
    dev = str(resolve_device(requested))
    dtype = dtype or settings.get("dtype")
    decoder = ReferenceDecoder.from_dirs(
        settings["target_dir"], settings["draft_dir"], settings["aux_layer_ids"],
        device=dev, dtype=dtype or "auto", drafter=drafter,
    )
    description = {"device": dev, "dtype": dtype, "drafter": drafter,
                   "max_draft_len": settings.get("max_draft_len"), "tree": settings.get("tree"),
                   "target_dir": settings["target_dir"], "draft_dir": settings["draft_dir"]}
    speculate = settings.get("speculative", True) is not False
    max_draft_len, tree = int(settings.get("max_draft_len") or 3), settings.get("tree")
    if draft_len is not None:
        speculate, max_draft_len, tree = True, int(draft_len), None
        description.update(max_draft_len=max_draft_len, tree=None, fixed_draft_len=max_draft_len)
    description["speculative"] = speculate
    return ReferenceEngine(decoder, model_name, max_draft_len, tree, description, speculate=speculate)
