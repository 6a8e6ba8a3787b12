"""The `serve-test` stage: serve the bundle, prove speculation is lossless, check acceptance.

Plan, then run: pick the servers (the reference server, which serves the
speculative model and ``<name>-baseline`` in one process; or ``trtllm-serve`` twice,
with the bundle's ``llm_api_options.yaml`` and then its ``baseline.yaml``, one at a
time so both never hold GPU memory together; or vLLM's OpenAI server twice, with and
without the bundle's EAGLE-3 overlay, from ``backends.vllm``; or ``--url`` for a
running endpoint), start each on a free loopback port in its own process group, wait
for health with a deadline, send every prompt greedily (speculative, speculative
streamed, baseline), read ``/perf_metrics`` after each request (or, for a backend
with counters, their delta around it), stop the server. Every request and the
startup are bounded in time; every child is reaped, also on failure and
Ctrl-C/SIGTERM. A divergence is diagnosed from the baseline's top logprobs; for
vLLM the reference decoder then checks the engine's acceptance (the oracle).

Writes ``<workdir>/serve-test/{report.json, junit.xml, transcripts.jsonl,
server-*.log, manifest.json}`` atomically.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import output
from ..errors import EnvironmentMissing, InputError
from ..manifest import manifest_hash, require_current_engine, require_manifest, stage_dir
from ..prompts import load_samples
from ..serving import junit
from ..serving.client import OpenAIClient, RequestFailed
from ..serving.counted import engine_acceptance, per_request_stats, streamed_chunks, tokens_of
from ..serving.metrics import request_stats
from ..serving.process import ServerProcess, ServerStartError, port_in_use, sigterm_unwinds, start_healthy
from ..serving.urls import redact_url
from ..serving.verdict import BASELINE, SPECULATIVE, Outcome, evaluate
from ..workdir import workdir_lock

STAGE = "serve-test"
HOST = "127.0.0.1"


def serve_test_dir(recipe: Any) -> Path:
    return recipe.workdir_path / "serve-test"


# ---------------------------------------------------------------------- planning


@dataclass
class Prompt:
    id: str
    messages: list[dict[str, Any]] | None = None
    prompt: str | None = None
    category: str | None = None  # the sample's `category`: serve_test.min_acceptance_length_per_category

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "messages": self.messages} if self.messages is not None else {"id": self.id, "prompt": self.prompt}


@dataclass
class Launch:
    """How to start one server (None in a phase = an endpoint already running)."""

    command_for_port: Any  # callable port -> list[str]
    name: str
    env: dict[str, str] | None = None
    port: int | None = None  # fixed by the user; else a free one is picked


@dataclass
class Phase:
    """One server and the models to query on it, in order."""

    name: str
    url_for_port: Any  # callable port -> base url (or a fixed url)
    labels: list[tuple[str, str | None]]  # (speculative|baseline, model id or None = discover)
    launch: Launch | None = None
    counters: Any = None  # the backend's acceptance reader (module with snapshot/delta), e.g. backends.vllm.counters
    request_extra: dict[str, Any] | None = None  # engine-specific request fields (vLLM: return_token_ids)


@dataclass
class ServerRecord:
    phase: str
    url: str | None = None
    pid: int | None = None  # also the process group id (the server leads its own session)
    command: list[str] | None = None
    log: str | None = None
    startup_s: float | None = None
    error: str | None = None
    log_tail: list[str] = field(default_factory=list)
    exit_code: int | None = None
    died_mid_run: bool = False

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def load_prompts(recipe: Any) -> list[Prompt]:
    samples = load_samples(recipe.serve_test.prompts, "serve_test.prompts", recipe.base_dir)
    prompts = []
    for index, sample in enumerate(samples):
        pid = str(sample.get("id", index))
        if "messages" in sample:
            messages = sample["messages"]
            if not isinstance(messages, list) or not all(isinstance(m, dict) and "content" in m for m in messages):
                raise InputError(f"serve_test.prompts: sample {pid}: messages must be a list of {{role, content}}",
                                 fix='e.g. {"messages": [{"role": "user", "content": "Hi"}]}')
            prompts.append(Prompt(pid, messages=messages, category=sample.get("category")))
        else:
            prompts.append(Prompt(pid, prompt=str(sample.get("prompt", sample.get("text"))), category=sample.get("category")))
    missing = sorted(set(recipe.serve_test.min_acceptance_length_per_category) - {p.category for p in prompts})
    if missing:
        raise InputError(f"serve_test.min_acceptance_length_per_category: no prompt of {recipe.serve_test.prompts} has "
                         f"the category {', '.join(missing)}",
                         fix='give those prompts a "category" field, or drop the floor')
    return prompts


def plan(recipe: Any, recipe_path: Path, overrides: list[str], url: str | None, baseline_url: str | None,
         port: int | None, drafter: str) -> tuple[list[Phase], dict[str, Any]]:
    """The servers to run and the models to ask, before anything starts. Raises InputError/EnvironmentMissing."""
    if port is not None and port_in_use(HOST, port):
        raise InputError(f"port {port} on {HOST} is already in use", fix="pass another --port, or omit it to pick a free one")
    if url:
        phases = [Phase("endpoint", _fixed(url), [(SPECULATIVE, None)] + ([] if baseline_url else [(BASELINE, None)]))]
        if baseline_url:
            phases.append(Phase("baseline endpoint", _fixed(baseline_url), [(BASELINE, None)]))
        return phases, {"backend": "url", "url": redact_url(url), "baseline_url": redact_url(baseline_url),
                        "max_draft_len": recipe.build.max_draft_len}

    engine = recipe.workdir_path / "engine"
    manifest = require_manifest(engine, "build", "build")
    from .outputs import served_draft_len

    # requests go one at a time: the chain the bundle serves at batch 1 (a tuned bundle's, not the recipe's)
    info = {"backend": recipe.runtime.backend, "engine_manifest": manifest_hash(manifest),
            "max_draft_len": served_draft_len(manifest, recipe.runtime.backend, 1, recipe.build.max_draft_len)}
    if recipe.runtime.backend == "reference":
        name = recipe.name
        command = [sys.executable, "-m", "specconvert", "serve", str(Path(recipe_path).resolve()), "--host", HOST,
                   "--model-name", name, "--drafter", drafter]
        for item in overrides:
            command += ["--set", item]
        launch = Launch(lambda p: command + ["--port", str(p)], "reference server", port=port)
        return [Phase("reference server", _local, [(SPECULATIVE, name), (BASELINE, f"{name}-baseline")], launch)], info

    if recipe.runtime.backend == "vllm":
        return _vllm_phases(recipe, recipe_path, manifest, engine, info, port)

    exe = shutil.which("trtllm-serve")
    if exe is None:
        raise EnvironmentMissing(
            "`trtllm-serve` is not on PATH (runtime.backend: trtllm)",
            fix="run serve-test where TensorRT-LLM is installed (e.g. NVIDIA's TensorRT-LLM container), "
            "pass --url of a running trtllm-serve (with --baseline-url), or set runtime.backend: reference",
        )
    artifacts = manifest.get("artifacts") or {}
    missing = [k for k in ("target_dir", "trtllm_options", "trtllm_baseline") if not artifacts.get(k)]
    if missing:
        raise InputError(f"{engine / 'manifest.json'} lacks artifacts {', '.join(missing)}",
                         fix="run `specconvert build RECIPE --force`")
    build = recipe.build
    info.update(trtllm_serve=exe, options=artifacts["trtllm_options"], baseline_options=artifacts["trtllm_baseline"],
                trtllm_version=(manifest.get("decisions") or {}).get("trtllm_version"))

    def trtllm(options: str):
        from ..backends.launch import trtllm_serve_argv

        return lambda p: [str(word) for group in trtllm_serve_argv(str(artifacts["target_dir"]), build, HOST, p, options,
                                                                   exe=exe) for word in group]

    return [
        Phase("trtllm-serve (speculative)", _local, [(SPECULATIVE, None)],
              Launch(trtllm(artifacts["trtllm_options"]), "trtllm-serve (speculative)", port=port)),
        Phase("trtllm-serve (baseline)", _local, [(BASELINE, None)],
              Launch(trtllm(artifacts["trtllm_baseline"]), "trtllm-serve (baseline)", port=port)),
    ], info


def _vllm_phases(recipe: Any, recipe_path: Path, manifest: dict[str, Any], engine: Path, info: dict[str, Any],
                 port: int | None) -> tuple[list[Phase], dict[str, Any]]:
    """vLLM twice, speculative then baseline (same settings), one after the other: they never share cores or RAM."""
    import os

    from ..backends.vllm import counters
    from ..backends.vllm import launch as vllm

    artifacts = manifest.get("artifacts") or {}
    missing = [k for k in ("target_dir", "vllm_draft") if not artifacts.get(k)]
    if missing:
        raise InputError(f"{engine / 'manifest.json'} lacks artifacts {', '.join(missing)}",
                         fix="run `specconvert build RECIPE --force`")
    python = vllm.find_python(recipe.runtime, vllm.project_roots(recipe_path))
    info.update(vllm_python=python, vllm_draft=artifacts["vllm_draft"], servers_mode="sequential")
    phases = []
    tuned = ((manifest.get("decisions") or {}).get("tuned") or {}).get("vllm")  # the bundle's schedule, as built
    for server in vllm.launches(python, artifacts["target_dir"], artifacts["vllm_draft"], recipe.build, recipe.runtime,
                                recipe.name, tuned):
        name = f"vllm ({server.label})"
        phases.append(Phase(name, _local, [(server.label, server.served_model_name)],
                            Launch(lambda p, s=server: s.command(HOST, p), name, env={**os.environ, **server.env},
                                   port=port),
                            counters=counters, request_extra=vllm.REQUEST_EXTRA))
    return phases, info


def _fixed(url: str):
    return lambda _port: url.rstrip("/")


def _local(port: int) -> str:
    return f"http://{HOST}:{port}"


# ---------------------------------------------------------------------- running


class ServeRun:
    def __init__(self, recipe: Any, prompts: list[Prompt], out_dir: Path):
        self.recipe = recipe
        self.spec = recipe.serve_test
        self.prompts = prompts
        self.out_dir = out_dir
        self.results: dict[tuple[str, str, bool], Outcome] = {}
        self.models: dict[str, str] = {}
        self.servers: list[ServerRecord] = []
        self.transcripts: list[dict[str, Any]] = []
        self.metrics_available: dict[str, bool] = {}
        self.draft_len: int = recipe.build.max_draft_len  # the chain the bundle serves at batch 1 (set from the plan)
        self.trtllm_version: str | None = None  # set for trtllm-serve phases: its line decides where acceptance is read
        self.acceptance = None  # acceptance.Acceptance from the backend's reader, when there is one
        self.counted: list[dict[str, Any]] = []  # per speculative request: the engine counters' delta around it
        self.engine_acceptance: dict[str, Any] | None = None
        self.oracle: dict[str, Any] | None = None
        self.speculation_off: str | None = None  # why acceptance is not checked: tune turned speculation off

    # -------------------------------------------------------------- one phase

    def run_phase(self, phase: Phase) -> None:
        record = ServerRecord(phase.name)
        self.servers.append(record)
        server = None
        try:
            if phase.launch is not None:
                server, base_url = self._start(phase, record)
            else:
                base_url = phase.url_for_port(None)
                record.url = redact_url(base_url)
                started = time.monotonic()
                self._wait_endpoint(base_url)
                record.startup_s = round(time.monotonic() - started, 3)
            asyncio.run(self._requests(phase, base_url, server, record))
        except ServerStartError as exc:
            record.error = str(exc)
            record.log_tail = exc.log_tail
            record.exit_code = exc.returncode
            output.check(False, f"{phase.name}: {exc}")
            for line in exc.log_tail[-8:]:
                output.log(f"      | {line}")
            for label, _ in phase.labels:
                for prompt in self.prompts:
                    self.results.setdefault((label, prompt.id, False), Outcome(error=f"not run: {exc}", error_kind="startup"))
        finally:
            if server is not None:
                code = server.stop()
                if record.exit_code is None and record.died_mid_run:
                    record.exit_code = code

    def skip_phase(self, phase: Phase, reason: str) -> None:
        for label, _ in phase.labels:
            for prompt in self.prompts:
                self.results.setdefault((label, prompt.id, False), Outcome(error=reason, error_kind="skipped"))

    def _start(self, phase: Phase, record: ServerRecord) -> tuple[ServerProcess, str]:
        launch = phase.launch
        log_path = self.out_dir / f"server-{_slug(phase.name)}.log"

        def started(server: ServerProcess, command: list[str], base_url: str) -> None:
            record.url, record.command, record.log, record.pid = base_url, command, str(log_path), server.pid
            output.log(f"serve-test: starting {launch.name} on {base_url}: {' '.join(command)}")

        server, base_url, took = start_healthy(
            launch.command_for_port, phase.url_for_port, log_path, self.spec.startup_timeout_s,
            env_for_port=lambda port: launch.env, name=launch.name, port=launch.port, host=HOST, on_start=started,
            on_retry=lambda port: output.log(f"serve-test: port {port} was taken meanwhile; retrying on another port"))
        record.startup_s = round(took, 3)
        output.check(True, f"{launch.name} healthy after {record.startup_s:.1f} s")
        return server, base_url

    def _wait_endpoint(self, base_url: str) -> None:
        import httpx

        deadline = time.monotonic() + self.spec.startup_timeout_s
        last = "no answer"
        with httpx.Client(timeout=5.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                try:
                    response = client.get(base_url + "/health")
                    if response.status_code == 200:
                        return
                    last = f"HTTP {response.status_code}"
                except httpx.HTTPError as exc:
                    last = type(exc).__name__
                time.sleep(0.5)
        raise ServerStartError(f"{redact_url(base_url)}/health did not answer 200 within {self.spec.startup_timeout_s:g} s ({last})")

    async def _requests(self, phase: Phase, base_url: str, server: ServerProcess | None, record: ServerRecord) -> None:
        spec = self.spec
        async with OpenAIClient(base_url, request_timeout_s=spec.request_timeout_s) as client:
            for label, model in phase.labels:
                model = model or await self._discover(client, label, shared=len(phase.labels) > 1)
                if isinstance(model, RequestFailed):
                    for prompt in self.prompts:
                        self.results[(label, prompt.id, False)] = Outcome(error=model.message, error_kind=model.kind)
                    continue
                self.models[label] = model
                await self._drain(client, label)  # metrics of earlier requests (health probes, other clients)
                reader = None
                if label == SPECULATIVE and self.trtllm_version and phase.name.startswith("trtllm-serve"):
                    from ..backends.trtllm.acceptance import AcceptanceReader

                    reader = AcceptanceReader(self.trtllm_version, self.draft_len, base_url)
                    await reader.start()
                stopped: str | None = None
                for prompt in self.prompts:
                    modes = [False, True] if (label == SPECULATIVE and spec.stream) else [False]
                    for stream in modes:
                        key = (label, prompt.id, stream)
                        if stopped:
                            self.results[key] = Outcome(error=f"not run: {stopped}", error_kind="skipped")
                            continue
                        outcome = await self._one(client, label, model, prompt, stream, phase)
                        self.results[key] = outcome
                        if outcome.error_kind in ("connect", "incomplete", "timeout"):
                            stopped = self._stop_reason(outcome, server, record)
                if reader is not None and not stopped:
                    self.acceptance = await reader.finish(*self._streamed_sizes(label))

    def _streamed_sizes(self, label: str) -> tuple[list[int], list[int]]:
        """Tokens and SSE chunks of each streamed request (the stream-chunk estimate's input). A stream
        without token counts borrows them from its non-streamed twin when both texts agree (greedy)."""
        tokens, chunks = [], []
        for prompt in self.prompts:
            st, plain = self.results.get((label, prompt.id, True)), self.results.get((label, prompt.id, False))
            done = st.completion if st else None
            if not done or not done.chunks:
                continue
            count = len(done.token_ids) if done.token_ids is not None else done.completion_tokens
            if count is None and plain and plain.completion and plain.completion.text == done.text:
                count = plain.completion.completion_tokens
            if count:
                tokens.append(count)
                chunks.append(len(done.chunks))
        return tokens, chunks

    def _stop_reason(self, outcome: Outcome, server: ServerProcess | None, record: ServerRecord) -> str:
        """After a transport failure: did the server die, or hang? Either way, the phase stops here."""
        if server is not None:
            deadline = time.monotonic() + 2.0
            while server.alive() and time.monotonic() < deadline and outcome.error_kind != "timeout":
                time.sleep(0.1)
            if not server.alive():
                record.died_mid_run = True
                record.exit_code = server.proc.returncode
                record.log_tail = server.log_tail()
                record.error = f"the server exited with code {record.exit_code} during the run"
                output.check(False, f"{record.phase}: {record.error}")
                for line in record.log_tail[-8:]:
                    output.log(f"      | {line}")
                return record.error
        if outcome.error_kind == "timeout":
            record.error = f"a request hung (no answer within {self.spec.request_timeout_s:g} s); later requests not sent"
            return record.error
        record.error = record.error or f"the endpoint stopped answering ({outcome.error})"
        return record.error

    async def _discover(self, client: OpenAIClient, label: str, shared: bool) -> str | RequestFailed:
        """The model id to ask for ``label``: on a shared endpoint ``X`` and ``X-baseline``, else its first model."""
        try:
            ids = await client.models()
        except RequestFailed as exc:
            return exc
        if not ids:
            return RequestFailed("malformed", "GET /v1/models lists no model")
        base = [i for i in ids if i.endswith("-baseline")]
        if label == SPECULATIVE:
            return ([i for i in ids if i not in base] or ids)[0]
        if not shared:
            return ids[0]
        if base:
            return base[0]
        return RequestFailed("malformed", f"the endpoint serves no baseline model (models: {', '.join(ids)}); "
                             "pass --baseline-url of the same target served without speculation")

    async def _send(self, client: OpenAIClient, model: str, prompt: Prompt, max_tokens: int, stream: bool,
                    extra: dict[str, Any] | None) -> Any:
        params = dict(max_tokens=max_tokens, temperature=0.0, seed=0, stream=stream, extra=extra)
        if prompt.messages is not None:
            return await client.chat(model, prompt.messages, **params)
        return await client.complete(model, prompt.prompt, **params)

    async def _one(self, client: OpenAIClient, label: str, model: str, prompt: Prompt, stream: bool,
                   phase: Phase | None = None) -> Outcome:
        spec = self.spec
        outcome = Outcome()
        reader = phase.counters if phase is not None and label == SPECULATIVE else None
        extra = phase.request_extra if phase is not None else None
        before = await reader.snapshot(client) if reader else None
        try:
            outcome.completion = await self._send(client, model, prompt, spec.max_tokens, stream, extra)
        except RequestFailed as exc:
            outcome.error, outcome.error_kind = exc.message, exc.kind
        if reader is not None and outcome.completion is not None:
            counted = reader.delta(before, await reader.snapshot(client), requests=1)
            self.counted.append({"prompt_id": prompt.id, "stream": stream, "acceptance": counted,
                                 "tokens": tokens_of(outcome.completion), "chunks": streamed_chunks(outcome.completion)})
            if not stream and counted.available:
                outcome.stats = per_request_stats(counted)
        if label == BASELINE and outcome.completion is not None and spec.lossless.mode != "off":
            outcome.diagnosis = await self._diagnose(client, model, prompt, outcome.completion, extra)
        if outcome.error_kind not in ("connect", "incomplete", "timeout"):
            entries = await self._drain(client, label)
            if label == SPECULATIVE and not stream and entries and outcome.stats is None:
                outcome.stats = request_stats(entries[-1], self.draft_len)
        completion = outcome.completion
        mark = "✓" if completion else "✗"
        output.log(f"  {mark} {label}{' (stream)' if stream else ''} {prompt.id}: "
                   + (f"{completion.latency_s:.2f} s, {len(completion.token_ids or []) or completion.completion_tokens} tokens"
                      if completion else outcome.error))
        self.transcripts.append({
            "prompt_id": prompt.id, "label": label, "model": model, "stream": stream,
            "request": {**prompt.as_dict(), "max_tokens": spec.max_tokens, "temperature": 0.0, "seed": 0},
            "response": completion.as_dict(with_chunks=stream) if completion else None,
            "error": outcome.error, "error_kind": outcome.error_kind, "speculative_stats": outcome.stats,
        })
        return outcome

    async def _diagnose(self, client: OpenAIClient, model: str, prompt: Prompt, base: Any,
                        extra: dict[str, Any] | None) -> dict[str, Any] | None:
        """At the first divergence from the speculative output: the baseline's top logprobs there, the margin."""
        from ..serving import oracle
        from ..serving.verdict import first_divergence

        spec_outcome = self.results.get((SPECULATIVE, prompt.id, False))
        if spec_outcome is None or spec_outcome.completion is None:
            return None
        div = first_divergence(spec_outcome.completion, base)
        if div is None or "token_index" not in div:
            return None
        index = div["token_index"]
        spec_ids = spec_outcome.completion.token_ids or []
        return await oracle.diagnose_by_asking(
            lambda max_tokens, fields: self._send(client, model, prompt, max_tokens, False, fields),
            prompt.messages is not None, base.token_ids or [], spec_ids, index, self.spec.lossless.tie_margin, extra)

    async def _drain(self, client: OpenAIClient, label: str) -> list[dict[str, Any]]:
        try:
            entries = await client.perf_metrics()
        except RequestFailed:
            entries = None
        if entries is None:
            self.metrics_available.setdefault(label, False)
            return []
        self.metrics_available[label] = True
        return entries


def _slug(text: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in text.lower()).strip("-").replace("--", "-")


# ---------------------------------------------------------------------- engine acceptance and the oracle


def _tuned_off(engine_manifest: dict[str, Any], backend: str) -> str | None:
    """Why there is no speculation to check, when `specconvert tune` turned it off at batch 1 for this backend."""
    tuned = ((engine_manifest.get("decisions") or {}).get("tuned") or {}).get(backend)
    if tuned is not None and tuned.get("speculate") is False:
        return ("`specconvert tune` measured that speculation does not pay at batch size 1 here, so the bundle "
                f"serves the target alone on {backend} (engine/manifest.json decisions.tuned)")
    return None


def _oracle_enabled(recipe: Any, url: str | None) -> bool:
    """Whether the oracle is asked for: ``on`` always (then it runs or fails), ``auto`` where there is an engine whose
    acceptance it can check (a vLLM bundle, no ``--url``; it may still skip there, saying why)."""
    mode = recipe.serve_test.oracle.enabled
    if mode == "auto":
        return url is None and recipe.runtime.backend == "vllm"
    return mode == "on"


def _oracle_prompts(prompts: list[Prompt], spec: Any) -> list[Prompt]:
    """The prompts within ``oracle.prompts`` and the token budget ``oracle.max_tokens`` (whole prompts, at least one)."""
    chosen = prompts[:spec.oracle.prompts] if spec.oracle.prompts else list(prompts)
    if spec.oracle.max_tokens:
        chosen = chosen[:max(1, spec.oracle.max_tokens // spec.max_tokens)]
    return chosen


def _engine_decoding(serve: "ServeRun") -> Any:
    """What the speculative vLLM server decoded one request at a time (serve-test's concurrency): read from the
    argv it was started with. vLLM has chains only, so a `build.tree` bundle runs a chain there too."""
    from ..backends.vllm import launch as vllm
    from ..serving.oracle import Decoding

    record = _speculative_record(serve)
    if record is None or record.startup_s is None:
        return None
    k = vllm.drafted_chain(record.command, batch_size=1)
    return Decoding(k, None, "the speculative vLLM server's --speculative-config at batch 1 (one request at a time)")


def _served_ngram(serve: "ServeRun") -> dict[str, Any] | None:
    """The speculative vLLM server's n-gram ``--speculative-config`` when it serves prompt lookup, else None."""
    import json

    argv = list(getattr(_speculative_record(serve), "command", None) or [])
    if "--speculative-config" not in argv:
        return None
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    return config if config.get("method") == "ngram" else None


def _speculative_record(serve: "ServeRun") -> Any:
    """The speculative vLLM server's record (its argv in ``command``), or None where it never started."""
    return next((s for s in serve.servers if s.phase == f"vllm ({SPECULATIVE})" and s.command), None)


def _ngram_oracle(recipe: Any, prompts: list[Prompt], serve: "ServeRun", config: dict[str, Any]) -> dict[str, Any]:
    """The oracle of a bundle serving n-gram prompt lookup: the proposer replayed (``reference.ngram``) on each
    prompt's tokens (the target's tokenizer and chat template, as vLLM renders them) and the greedy output the
    engine returned, against the engine's counters of the same requests. Nothing but the tokenizer is loaded."""
    from ..acceptance import combine, unavailable
    from ..backends.vllm.launch import max_model_len
    from ..reference.decoder import load_tokenizer
    from ..reference.ngram import Replay
    from ..serving import oracle
    from ..serving.engine import reference_settings

    spec = recipe.serve_test
    chosen = _oracle_prompts(prompts, spec)
    _, settings = reference_settings(recipe.workdir_path / "engine")
    tokenizer = load_tokenizer(Path(settings["target_dir"]))
    if tokenizer is None:
        return oracle.skipped("the target has no tokenizer to render the prompts with")
    k = int(config["num_speculative_tokens"])
    replay, rows, ids = Replay(k), [], set()
    for prompt in chosen:
        outcome = serve.results.get((SPECULATIVE, prompt.id, False))
        output_ids = outcome.completion.token_ids if outcome is not None and outcome.completion is not None else None
        if output_ids is None:
            continue
        if prompt.messages is not None and getattr(tokenizer, "chat_template", None):
            text = tokenizer.apply_chat_template(prompt.messages, tokenize=False, add_generation_prompt=True)
            prompt_ids = list(tokenizer.encode(text, add_special_tokens=False))
        else:
            prompt_ids = list(tokenizer.encode(prompt.prompt if prompt.messages is None else
                                               "\n".join(f"{m.get('role')}: {m.get('content')}" for m in prompt.messages)))
        before = replay.drafts, replay.accepted
        replay.add(prompt_ids, output_ids, int(config["prompt_lookup_min"]), int(config["prompt_lookup_max"]),
                   max_model_len(recipe.build, recipe.runtime))
        ids.add(prompt.id)
        drafts, accepted = replay.drafts - before[0], replay.accepted - before[1]
        rows.append({"id": prompt.id, "prompt_tokens": len(prompt_ids), "output_tokens": len(output_ids),
                     "drafting_steps": drafts, "accepted": accepted})
    if not ids:
        return oracle.skipped("no speculative request returned token ids to replay the n-gram proposer on")
    counted = [c["acceptance"] for c in serve.counted if not c["stream"] and c["prompt_id"] in ids]
    engine = combine(counted) or unavailable("vllm counters", "no speculative request was counted")
    verdict = oracle.compare(engine, replay.acceptance(),
                             oracle.OracleTolerance(spec.oracle.tolerance, spec.oracle.per_position_tolerance))
    if engine.available and not replay.drafts:  # the engine drafted where prompt lookup finds no match at all
        verdict.update(status="disagrees", passed=False, causes=[],
                       message=f"the engine counted {engine.drafts:g} drafting steps (tau {engine.acceptance_length:.3f}) "
                               "where prompt lookup, replayed on the same prompts and outputs, finds no match")
    if verdict.get("status") == "disagrees":  # the head's causes (aux layers, d2t, norms) do not apply: no head
        verdict["causes"] = ["template"]
        verdict["message"] = (verdict["message"].split(". Likely causes")[0] + ". Likely causes: the prompt tokens "
                              "differ (the served chat template or special tokens), or the engine's proposer is not "
                              "vLLM 0.32's prompt lookup")
        verdict["fix"] = ("compare the served chat template with the target's tokenizer_config.json, and the vLLM "
                          "release with 0.32 (docs/serve.md, oracle)")
    verdict.update(decoding={"method": "ngram", **{key: config[key] for key in
                                                   ("num_speculative_tokens", "prompt_lookup_min", "prompt_lookup_max")}},
                   prompts=rows, prompts_used=sorted(ids))
    return verdict


def _oracle_device(recipe: Any) -> tuple[str | None, str]:
    """``(cpu|cuda, why)``, or ``(None, why not)`` when the wanted GPU is not there."""
    import torch

    wanted, key = recipe.serve_test.oracle.device, "serve_test.oracle.device"
    if wanted == "auto":
        wanted, key = recipe.runtime.device, "runtime.device"
    if wanted == "auto":
        return ("cuda", "runtime.device: auto, a GPU is visible") if torch.cuda.is_available() else (
            "cpu", "runtime.device: auto, no GPU visible")
    if wanted == "cuda" and not torch.cuda.is_available():
        return None, f"{key} is cuda but no CUDA device is visible"
    return wanted, f"{key}: {wanted}"


def _free_gib(device: str) -> float | None:
    from ..backends.vllm.memory import GIB, available_gib

    if device == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0] / GIB
    return available_gib()


def run_oracle(recipe: Any, prompts: list[Prompt], serve: "ServeRun", url: str | None) -> dict[str, Any]:
    """The reference decoder on the engine's prompts, head, template and draft setting, after the servers stopped;
    its verdict against the engine's counters of the same requests. Skipped, with the reason and nothing loaded,
    where it cannot compare like with like or would not fit; under ``serve_test.oracle.enabled: on`` such a skip
    fails (it was asked for), under ``auto`` it is reported as skipped."""
    verdict = _oracle_verdict(recipe, prompts, serve, url)
    if verdict["passed"] is None and recipe.serve_test.oracle.enabled == "on":
        verdict = required_but_skipped(verdict)
    if verdict["passed"] is None:
        output.log(f"serve-test: oracle {verdict['message']}")
    else:
        output.check(verdict["passed"], f"oracle: {verdict['message']}")
    return verdict


def required_but_skipped(verdict: dict[str, Any]) -> dict[str, Any]:
    """A skipped oracle verdict as a failure: ``serve_test.oracle.enabled: on`` asked for it to run."""
    return {**verdict, "passed": False, "required": True,
            "message": f"asked for (serve_test.oracle.enabled: on) but not run: {verdict['reason']}"}


def _engine_dtype(recipe: Any, target_config: dict[str, Any]) -> str:
    """The dtype vLLM served the target in: ``runtime.vllm_dtype``; for ``auto`` the config's, except that vLLM
    0.32 downcasts a float32 model to its platform's first supported dtype, bfloat16 (``config/model.py``
    ``_resolve_auto_dtype``, ``platforms/interface.py`` ``supported_dtypes``)."""
    dtype = recipe.runtime.vllm_dtype
    if dtype is None:  # the device's default, as the launch lines take it (backends.vllm.launch.DEVICE_DEFAULTS)
        from ..backends.vllm import launch

        dtype = launch.launch_values(recipe.runtime).dtype
    if dtype == "auto":
        dtype = str(target_config.get("torch_dtype") or target_config.get("dtype") or "float32")
        dtype = "bfloat16" if dtype == "float32" else dtype
    return dtype


def _oracle_fits(recipe: Any, settings: dict[str, Any], decoding: Any, chosen: list[Prompt], device: str
                 ) -> tuple[dict[str, Any], str | None]:
    """The oracle's run facts (device, dtype, estimate) and, when it would not fit in free memory, why not."""
    from ..backends.vllm import memory
    from ..models.size import dtype_bytes, read_config
    from ..serving import oracle

    spec = recipe.serve_test
    target_config = read_config(settings["target_dir"])
    dtype = _engine_dtype(recipe, target_config)
    draft_bytes = int(memory.weights_gib([settings["draft_dir"]]) * memory.GIB
                      * dtype_bytes(dtype) / dtype_bytes(None, read_config(settings["draft_dir"])))
    footprint = oracle.estimate(target_config, draft_bytes, dtype_bytes(dtype), dtype, device, len(chosen),
                                spec.max_tokens, decoding.depth)
    facts = {"decoding": decoding.as_dict(), "device": device, "dtype": dtype, "prompts_used": [p.id for p in chosen],
             "footprint": footprint.as_dict() if footprint else None}
    if footprint is None:
        return facts, None
    free = _free_gib(device)
    output.log(f"serve-test: oracle: {len(chosen)} prompt(s) x {spec.max_tokens} tokens on {device} in {dtype}: "
               f"about {footprint.need_gib:.1f} GiB ({footprint.target_parameters / 1e9:.2f} B target parameters), "
               f"{'unknown' if free is None else f'{free:.1f} GiB'} free; at most ~{footprint.seconds:.0f} s")
    if free is None or footprint.need_gib <= free:
        return facts, None
    facts["free_gib"] = round(free, 2)
    where = ("a GPU with that much free memory (serve_test.oracle.device: cuda)" if device == "cpu" else
             "a larger GPU, or serve_test.oracle.device: cpu on a machine with that much free RAM")
    return facts, (f"the reference decoder would need about {footprint.need_gib:.1f} GiB on {device} "
                   f"({footprint.target_parameters / 1e9:.2f} B target parameters in {dtype}, the head, KV cache and "
                   f"overhead) and {free:.1f} GiB is free, so nothing was loaded. It runs on {where}; "
                   "serve_test.oracle.enabled: off leaves it out")


def _oracle_verdict(recipe: Any, prompts: list[Prompt], serve: "ServeRun", url: str | None) -> dict[str, Any]:
    from ..backends.vllm import overlay
    from ..serving import oracle
    from ..acceptance import combine, unavailable
    from ..serving.engine import reference_settings

    spec = recipe.serve_test
    if url is not None:
        return oracle.skipped("--url has no bundle to decode with; run serve-test without --url")
    if serve.speculation_off:
        return oracle.skipped(f"the engine drafts nothing at batch 1: {serve.speculation_off}; there is no "
                              "acceptance to compare")
    if recipe.runtime.backend != "vllm":
        return oracle.skipped(f"the oracle checks vLLM's counters; runtime.backend is {recipe.runtime.backend} "
                              "(the reference server is the reference decoder itself)")
    decoding = _engine_decoding(serve)
    if decoding is None:
        return oracle.skipped("the speculative vLLM server did not run")
    ngram = _served_ngram(serve)
    if ngram is not None:  # the bundle serves prompt lookup (tune's choice): its acceptance is replayed, no model
        return _ngram_oracle(recipe, prompts, serve, ngram)
    if decoding.draft_len == 0:
        return oracle.skipped("the engine drafts nothing at batch 1 (tune's schedule), so there is no acceptance "
                              "to compare", decoding=decoding.as_dict())
    device, device_why = _oracle_device(recipe)
    if device is None:
        return oracle.skipped(f"{device_why}; nothing was loaded. Set serve_test.oracle.device: cpu to decode on "
                              "the CPU", decoding=decoding.as_dict())
    engine_dir = recipe.workdir_path / "engine"
    manifest, settings = reference_settings(engine_dir)
    chosen = _oracle_prompts(prompts, spec)
    facts, too_big = _oracle_fits(recipe, settings, decoding, chosen, device)
    facts["device_reason"] = device_why
    if too_big:
        return oracle.skipped(too_big, enable="serve_test.oracle.device", **facts)
    ids = {p.id for p in chosen}
    counted = [c["acceptance"] for c in serve.counted if not c["stream"] and c["prompt_id"] in ids]
    engine = combine(counted) or unavailable("vllm counters", "no speculative request was counted")
    artifacts = manifest.get("artifacts") or {}
    found = overlay.findings(Path(artifacts["vllm_draft"]), Path(artifacts["draft_dir"]),
                             (manifest.get("decisions") or {}).get("vllm_aux_layer_ids"))
    verdict = oracle.check(engine_dir, chosen, spec.max_tokens, spec.oracle, engine, decoding, device, facts["dtype"],
                           found)
    verdict.update(facts)
    return verdict


# ---------------------------------------------------------------------- the stage


@dataclass
class ServeTestResult:
    report: dict[str, Any]
    out_dir: Path


def run(recipe: Any, recipe_path: Path, overrides: list[str] | None = None, url: str | None = None,
        baseline_url: str | None = None, port: int | None = None, drafter: str = "eagle",
        verify: bool = False) -> ServeTestResult:
    """Run serve-test and write its outputs; the caller turns ``report['status']`` into an exit code.

    The workdir is locked before ``engine/`` is first read, so a build cannot swap the bundle mid-test."""
    with workdir_lock(recipe.workdir_path):
        return _run(recipe, recipe_path, overrides, url, baseline_url, port, drafter, verify)


def _run(recipe: Any, recipe_path: Path, overrides: list[str] | None, url: str | None, baseline_url: str | None,
         port: int | None, drafter: str, verify: bool = False) -> ServeTestResult:
    overrides = list(overrides or [])
    if baseline_url and not url:
        raise InputError("--baseline-url needs --url", fix="pass --url of the speculative endpoint too")
    speculation_off = None
    if url is None:
        # exit 2 when engine/ predates convert/, or convert's sealed files changed (every hash with --verify)
        engine = require_current_engine(recipe.workdir_path, verify=verify)
        speculation_off = _tuned_off(engine, recipe.runtime.backend)
    prompts = load_prompts(recipe)
    phases, info = plan(recipe, recipe_path, overrides, url, baseline_url, port, drafter)
    if recipe.serve_test.lossless.mode == "off":  # no baseline to compare with: do not start one
        for phase in phases:
            phase.labels = [(label, model) for label, model in phase.labels if label != BASELINE]
        phases = [phase for phase in phases if phase.labels]
    oracle_on = _oracle_enabled(recipe, url)  # a bundle tune turned off is a skip, said (and under `on`, failed)
    final = serve_test_dir(recipe)
    inputs = {"recipe": recipe.section("serve_test", "build", "runtime"), "plan": info, "drafter": drafter,
              "prompts": [p.as_dict() for p in prompts]}
    started = time.time()
    with sigterm_unwinds(), stage_dir(final, STAGE, inputs) as stage:
        serve = ServeRun(recipe, prompts, stage.path)
        serve.trtllm_version = info.get("trtllm_version")
        serve.draft_len = info.get("max_draft_len", serve.draft_len)
        serve.speculation_off = speculation_off
        for index, phase in enumerate(phases):
            serve.run_phase(phase)
            if serve.servers[-1].startup_s is None:  # no point in waiting for the next server too
                for later in phases[index + 1:]:
                    serve.skip_phase(later, f"not run: {phase.name} did not start")
                break
        serve.engine_acceptance = engine_acceptance(serve.counted)
        if oracle_on:  # every server has stopped: the oracle has the machine to itself
            serve.oracle = run_oracle(recipe, prompts, serve, url)
        evaluated = evaluate(serve)
        suites = evaluated.pop("junit")
        report = {
            "kind": "serve-test",
            "recipe": recipe.name,
            **info,
            "drafter": drafter,
            "models": serve.models,
            "settings": recipe.serve_test.model_dump(mode="json"),
            **evaluated,
            "servers": [s.as_dict() for s in serve.servers],
            "engine_acceptance": ({k: (v.as_dict() if hasattr(v, "as_dict") else v)
                                   for k, v in serve.engine_acceptance.items()} if serve.engine_acceptance else None),
            "oracle": serve.oracle,
            "duration_s": round(time.time() - started, 3),
        }
        if url is None and report["status"] == "passed":  # a pass vouches for the bytes served: hash every one
            require_current_engine(recipe.workdir_path, verify=True)
        _write_outputs(stage.path, final, report, suites, serve.transcripts)
        report["files"] = {name: str(final / name) for name in ("report.json", "junit.xml", "transcripts.jsonl")}
        stage.finish(recipe=recipe.name, status=report["status"], summary=report["summary"],
                     artifacts={**report["files"], "logs": [s.log for s in serve.servers if s.log]})
    return ServeTestResult(report, final)


def _write_outputs(path: Path, final: Path, report: dict[str, Any], suites: list[junit.Suite],
                   transcripts: list[dict[str, Any]]) -> None:
    from ..manifest import write_json_atomic

    # Logs live in the staging directory while running; point at where they end up.
    for server in report["servers"]:
        if server.get("log"):
            server["log"] = str(final / Path(server["log"]).name)
    write_json_atomic(path / "report.json", report)
    junit.write(path / "junit.xml", suites, f"specconvert serve-test {report['recipe']}")
    with open(path / "transcripts.jsonl", "w", encoding="utf-8") as fh:
        for item in transcripts:
            fh.write(json.dumps(item, default=str) + "\n")
