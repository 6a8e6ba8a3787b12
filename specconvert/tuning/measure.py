"""Running every candidate draft length for `specconvert tune`, on the reference decoder or a served engine.

Both runners fill one :class:`Measured` per (draft length, concurrency) with what really ran:
tokens, decoding wall time, request-steps and accepted drafts per position.

- Reference: in process, prompt by prompt, the order of the lengths rotating per prompt so
  machine drift hits every candidate alike. Its server decodes one request at a time, so
  concurrency 1 is measured and stands for every level.
- vLLM: one server per candidate length (k = 0 is the target alone), all up together, and
  runs interleaved level by level and length by length (A B C D A B C D ...). Acceptance comes
  from each server's Prometheus counters, tokens from the token ids vLLM returns per chunk.
  Lossless: every candidate's greedy output token ids at concurrency 1 (one request at a time)
  are compared with plain decoding's on the same prompts; batched runs are not compared. At a
  prompt's first difference the still-running plain server is asked again for its top logprobs
  there (serve-test's tie rule, ``serving.oracle.diagnose_by_asking``): a lead below the tie margin
  is a numerical tie (a verify forward scores several tokens at once, so a near-tie may flip) and
  ends the comparison of that prompt only; anything else is a divergence.
  Where RAM (or, on CUDA, the GPUs: ``backends.vllm.placement``) does not hold every server
  (``runtime.vllm_servers``), one server (or one wave of servers) at a time runs all its levels, plain
  decoding's last (so the diagnosis can ask it); the drift between candidates is then not cancelled,
  and the report says so.
  One more vLLM candidate, :data:`DRAFTER_IDLE`: a server whose schedule drafts 0 tokens at every
  batch size. A 0 in vLLM's schedule is not the baseline: vLLM 0.32 still runs the drafter's
  forward pass every step to keep its KV cache in sync (``vllm/v1/spec_decode/llm_base_proposer.py``,
  ``propose``: "No draft tokens requested (e.g. Dynamic SD decided K=0)"), so what a 0 costs is
  measured, not assumed.
  And, where the recipe lists ``ngram`` in ``bench.baselines``, :data:`NGRAM`: the target with vLLM's n-gram prompt
  lookup (no head), measured like every candidate and compared with plain decoding like them; vLLM's counters count
  its drafting steps only (a step without a match drafts nothing), so its tokens per step come from the tokens and
  the accepted count: every step makes one token plus the drafts it accepted.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence


DRAFTER_IDLE = -1  # key of the vLLM candidate "drafter loaded, schedule K = 0 everywhere"
NGRAM = -2  # key of the vLLM candidate "n-gram prompt lookup, no head" (bench.baselines: [ngram])


@dataclass
class Measured:
    """One candidate draft length at one concurrency level: what really ran."""

    draft_len: int
    concurrency: int
    tokens: int = 0
    steps: int = 0  # request-steps: target forwards summed over requests (prefill excluded)
    prefill_tokens: int = 0  # tokens in `tokens` that prefills produced (one per served request)
    decode_s: float = 0.0  # wall time of the run (the reference: its decoding steps, prefill excluded)
    accepted_per_position: list[float] = field(default_factory=list)
    # greedy output token ids equal to plain decoding's on the same prompts; None = not compared (vLLM compares
    # at concurrency 1 only: batched runs are not batch-invariant, so a near-tie may flip there legitimately)
    identical_to_plain: bool | None = True
    # the first difference that is not a numerical tie: {"prompt": i, "position": p, "diagnosis": {...} | None}
    first_divergence: dict[str, Any] | None = None
    # differences the plain run's logprobs call a numerical tie: {"prompt", "position", "margin", "tie_margin"}
    ties: list[dict[str, Any]] = field(default_factory=list)
    failed_requests: int = 0
    # where each run's acceptance came from (an engine's own label: "measured: ...", "estimated: stream chunks",
    # "unavailable: <why>"); empty where the runner counts steps itself
    acceptance_sources: list[str] = field(default_factory=list)

    @property
    def step_s(self) -> float:
        """One engine step's wall time: ``concurrency`` requests advance together in a step."""
        return self.decode_s * self.concurrency / self.steps if self.steps else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.decode_s if self.decode_s > 0 else 0.0

    @property
    def acceptance_length(self) -> float | None:
        """Tokens per request-step after the prefill (tau; 1 for plain decoding)."""
        return (self.tokens - self.prefill_tokens) / self.steps if self.steps else None

    def as_dict(self) -> dict[str, Any]:
        return {"draft_len": self.draft_len, "concurrency": self.concurrency, "tokens": self.tokens, "steps": self.steps,
                "decode_s": round(self.decode_s, 4), "step_s": round(self.step_s, 6),
                "tokens_per_second": round(self.tokens_per_second, 3),
                "acceptance_length": round(self.acceptance_length, 4) if self.acceptance_length else None,
                "identical_to_plain": self.identical_to_plain, "first_divergence": self.first_divergence,
                "numerical_ties": self.ties, "failed_requests": self.failed_requests,
                "acceptance_source": "; ".join(dict.fromkeys(self.acceptance_sources)) or None}


def per_position(m: Measured) -> list[float]:
    """Share of request-steps whose draft position i was accepted."""
    return [a / m.steps for a in m.accepted_per_position] if m.steps else [0.0] * len(m.accepted_per_position)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    """Index of the first token where two outputs differ (the shorter one's length when one is a prefix)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def differences(outputs: dict[int, dict[int, list[int] | None]]) -> dict[int, list[tuple[int, int]]]:
    """Per candidate (``outputs[k][request index]``): ``(request index, first differing token)`` of every
    request whose token ids differ from plain decoding's (k = 0) on the same prompt, in request order."""
    plain = outputs.get(0) or {}
    found: dict[int, list[tuple[int, int]]] = {}
    for k, got in outputs.items():
        if k == 0:
            continue
        for i, ids in sorted(got.items()):
            ref = plain.get(i)
            if ids is not None and ref is not None and ids != ref:
                found.setdefault(k, []).append((i, first_difference(ids, ref)))
    return found


def compare_to_plain(runs: dict[tuple[int, int], Measured], outputs: dict[int, dict[int, list[int] | None]],
                     level: int, diagnoses: dict[tuple[int, int], dict[str, Any]] | None = None) -> None:
    """Set ``identical_to_plain`` of every candidate's run at ``level`` from its output token ids per prompt
    (``outputs[k][request index]``) against plain decoding's (k = 0) on the same prompts; None where no
    request had token ids on both sides. ``diagnoses[(k, request index)]`` (``serving.oracle.diagnose``'s) of
    a difference: class ``tie`` goes to ``ties`` and ends that prompt's comparison only; any other class, or
    none, is the ``first_divergence`` and ends the comparison."""
    plain = outputs.get(0) or {}
    diagnoses = diagnoses or {}
    for k, got in outputs.items():
        m = runs.get((k, level))
        if k == 0 or m is None:
            continue
        compared = 0
        m.identical_to_plain, m.first_divergence, m.ties = True, None, []
        for i, ids in sorted(got.items()):
            ref = plain.get(i)
            if ids is None or ref is None:
                continue
            compared += 1
            if ids == ref:
                continue
            m.identical_to_plain = False
            position = first_difference(ids, ref)
            diag = diagnoses.get((k, i))
            if diag is not None and diag.get("class") == "tie":
                m.ties.append({"prompt": i, "position": position, "margin": diag.get("margin"),
                               "tie_margin": diag.get("tie_margin")})
                continue
            m.first_divergence = {"prompt": i, "position": position, "diagnosis": diag}
            break
        if not compared:
            m.identical_to_plain = None


# --- the reference decoder ---------------------------------------------------------------------


def measure_reference(decoder: Any, prompts: Sequence[Sequence[int]], lengths: Sequence[int], max_new_tokens: int,
                      on_run: Callable[[], None] | None = None) -> dict[int, Measured]:
    """Decode every prompt with every chain length (rotating order per prompt); k = 0 is plain decoding."""
    from ..reference.decoder import DecodeSettings

    stop = decoder.eos_token_ids
    out = {k: Measured(k, 1, accepted_per_position=[0] * k) for k in lengths}
    for n, ids in enumerate(prompts):
        order = list(lengths[n % len(lengths):]) + list(lengths[: n % len(lengths)])
        results = {}
        for k in order:
            settings = DecodeSettings(speculative=k > 0, max_draft_len=max(k, 1), stop_token_ids=stop)
            results[k] = decoder.generate(list(ids), max_new_tokens, settings)
            if on_run:
                on_run()
        plain_tokens = results[0].token_ids if 0 in results else None
        for k, res in results.items():
            m = out[k]
            decode = [s for s in res.step_records if s.kind != "prefill"]
            m.steps += len(decode)
            m.tokens += sum(len(s.token_ids) for s in decode)
            m.decode_s += res.wall_time_s - res.prefill_time_s  # every phase of every step, the loop included
            for s in decode:
                for i in range(min(s.accepted, k)):
                    m.accepted_per_position[i] += 1
            if plain_tokens is not None and res.token_ids != plain_tokens and m.identical_to_plain:
                m.identical_to_plain = False
                m.first_divergence = {"prompt": n, "position": first_difference(res.token_ids, plain_tokens)}
    return out


# --- vLLM ----------------------------------------------------------------------------------------


def vllm_launch(python: str, target_dir: str, overlay: str, build: Any, runtime: Any, name: str,
                draft_len: int, values: Any = None, placement: Any = None, ngram: Any = None
                ) -> tuple[list[str], dict[str, str]]:
    """argv (without --port) and environment of a vLLM server drafting ``draft_len`` tokens (0: no draft;
    :data:`DRAFTER_IDLE`: the draft loaded, a schedule of 0 at every batch size; :data:`NGRAM`: prompt lookup with
    ``ngram``'s window, no draft); ``values``: the device's launch values, ``placement``: its GPUs
    (``backends.vllm.placement``)."""
    from ..backends.vllm import launch as vllm
    from ..bench.servers import HOST

    if draft_len == NGRAM:
        server = vllm.free_launch(python, target_dir, build, runtime, name, "ngram", ngram, values)
        if placement is not None:
            server = placement.apply(server)
        return [*server.argv, "--host", HOST], {**os.environ, **server.env}
    idle = None
    if draft_len == DRAFTER_IDLE:
        idle = {"speculate": True, "num_speculative_tokens": 1,
                "num_speculative_tokens_per_batch_size": [[1, build.max_batch_size, 0]]}
    server = vllm.chain_launch(python, target_dir, overlay, build, runtime, name, max(draft_len, 0), server_label(draft_len), idle,
                               values)
    if placement is not None:
        server = placement.apply(server)
    return [*server.argv, "--host", HOST], {**os.environ, **server.env}


def measure_vllm(launches: dict[int, tuple[list[str], dict[str, str]]], payloads: Sequence[dict[str, Any]],
                 levels: Sequence[int], log_dir: Path, startup_timeout_s: float, run_timeout_s: float,
                 repeats: int = 1, on_run: Callable[[], None] | None = None,
                 together: bool = True, tie_margin: float | None = 0.05, waves: Sequence[Sequence[int]] | None = None
                 ) -> tuple[dict[tuple[int, int], Measured], list[dict[str, Any]]]:
    """Start every candidate's server, then run ``payloads`` at each level on each, interleaved
    (``together=False``: one server at a time, each running all its levels before the next starts, plain
    decoding's last; ``waves``: the candidates whose servers are up together, one group after another, plain
    decoding's in the last). While the plain server is up, each candidate's first difference per prompt at
    concurrency 1 is diagnosed against it (``tie_margin``; None: outputs are not compared at all)."""
    from ..bench.servers import started_servers

    out: dict[tuple[int, int], Measured] = {}
    outputs: dict[int, dict[int, list[int] | None]] = {}  # draft length -> request index -> token ids, at level 1
    diagnoses: dict[tuple[int, int], dict[str, Any]] = {}
    servers: list[dict[str, Any]] = []
    # one at a time: plain decoding last, so every candidate's outputs exist while its server is still up
    groups = [list(launches)] if together else [[k] for k in sorted(launches, key=lambda k: k == 0)]
    if waves is not None:
        groups = [list(w) for w in waves]
    for group in groups:
        with started_servers([(server_label(k), *launches[k], True) for k in group], log_dir, startup_timeout_s,
                             stage="tune") as started:
            urls = {k: started[server_label(k)] for k in group}
            asyncio.run(_runs(urls, payloads, levels, repeats, run_timeout_s, out, on_run, outputs))
            if 0 in urls and tie_margin is not None:
                diagnoses = asyncio.run(_diagnose(urls[0], payloads, outputs, tie_margin, run_timeout_s))
            servers += started["servers"]
    for (k, _), m in out.items():
        m.identical_to_plain = True if k == 0 else None  # compared below, at concurrency 1 only
    if tie_margin is not None:
        compare_to_plain(out, outputs, 1, diagnoses)
    return out, servers


async def _diagnose(url: str, payloads: Sequence[dict[str, Any]], outputs: dict[int, dict[int, list[int] | None]],
                    tie_margin: float, run_timeout_s: float) -> dict[tuple[int, int], dict[str, Any]]:
    """Each candidate's differences from plain decoding, in request order, asked of the plain server until the
    first that is not a tie (the comparison stops there); identical requests and difference points share one ask."""
    import json

    from ..serving.client import OpenAIClient
    from ..serving.oracle import diagnose_by_asking

    found = differences(outputs)
    if not found:
        return {}
    plain = outputs.get(0) or {}
    sent = ("messages", "prompt", "max_tokens", "temperature", "stream", "stream_options")
    done: dict[str, dict[str, Any]] = {}
    diagnoses: dict[tuple[int, int], dict[str, Any]] = {}
    async with OpenAIClient(url, request_timeout_s=run_timeout_s) as client:
        model = ((await client.models()) or [None])[0]
        for k, where in sorted(found.items()):
            for i, index in where:
                payload, ids = payloads[i], outputs[k][i] or []
                key = json.dumps([payload, index, ids[index] if index < len(ids) else None], sort_keys=True)
                if key not in done:
                    chat = "messages" in payload
                    extra = {f: v for f, v in payload.items() if f not in sent}

                    def send(max_tokens: int, fields: dict[str, Any], payload=payload, chat=chat) -> Any:
                        if chat:
                            return client.chat(model, payload["messages"], max_tokens=max_tokens, temperature=0.0, extra=fields)
                        return client.complete(model, payload["prompt"], max_tokens=max_tokens, temperature=0.0, extra=fields)

                    done[key] = await diagnose_by_asking(send, chat, plain.get(i) or [], ids, index, tie_margin, extra)
                diagnoses[(k, i)] = done[key]
                if done[key].get("class") != "tie":
                    break
    return diagnoses


def server_label(k: int) -> str:
    """The label of candidate ``k``'s server (its log file, its placement)."""
    return {DRAFTER_IDLE: "k0-drafter", NGRAM: "ngram"}.get(k, f"k{k}")


async def _runs(urls: dict[int, str], payloads: Sequence[dict[str, Any]], levels: Sequence[int], repeats: int,
                run_timeout_s: float, out: dict[tuple[int, int], Measured], on_run: Callable[[], None] | None,
                outputs: dict[int, dict[int, list[int] | None]]) -> None:
    from ..backends.vllm import counters
    from ..bench.loadgen import Endpoint, list_models, run_load
    from ..serving.client import OpenAIClient

    api = "chat" if "messages" in payloads[0] else "completions"
    clients = {k: OpenAIClient(url, request_timeout_s=run_timeout_s, max_connections=max(levels)) for k, url in urls.items()}
    try:
        models = {k: (await list_models(c) or [None])[0] for k, c in clients.items()}
        for rep in range(repeats):
            for b in levels:
                order = sorted(urls)
                shift = (rep + levels.index(b)) % len(order)
                for k in order[shift:] + order[:shift]:
                    client = clients[k]
                    counted = k > 0 or k == NGRAM  # servers that draft: vLLM's spec-decode counters
                    before = await counters.snapshot(client) if counted else None
                    records, duration = await run_load(client, Endpoint(server_label(k), urls[k], models[k], api), payloads, b,
                                                       run_timeout_s)
                    after = await counters.snapshot(client) if counted else None
                    m = out.setdefault((k, b), Measured(k, b, accepted_per_position=[0.0] * max(k, 0)))
                    ok = [r for r in records if r.ok]
                    if b == 1 and rep == 0:  # one request at a time: the same batch of one on every server
                        outputs[k] = {r.index: r.token_ids for r in ok}
                    m.failed_requests += len(records) - len(ok)
                    tokens = sum(r.output_tokens for r in ok)
                    m.tokens += tokens
                    m.prefill_tokens += len(ok)
                    m.decode_s += duration
                    if counted:
                        acc = counters.delta(before, after, requests=len(ok))
                        if k > 0:
                            m.steps += int(acc.drafts or 0)
                            rates = (acc.per_position or [])[:k]
                        else:  # n-gram: every step makes one token plus what it accepted; steps without a match count no draft
                            m.steps += max(tokens - len(ok) - int(acc.accepted_tokens or 0), 0)
                            rates = acc.per_position or []
                            m.accepted_per_position += [0.0] * max(len(rates) - len(m.accepted_per_position), 0)
                        for i, rate in enumerate(rates):
                            m.accepted_per_position[i] += rate * (acc.drafts or 0)
                    else:
                        m.steps += max(tokens - len(ok), 0)  # one token per step after the prefill's
                    if on_run:
                        on_run()
    finally:
        for c in clients.values():
            await c.aclose()
