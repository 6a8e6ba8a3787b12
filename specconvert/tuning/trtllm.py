"""Measuring `specconvert tune`'s candidates on trtllm-serve (``runtime.backend: trtllm``).

Where ``tensorrt_llm`` imports and ``trtllm-serve`` is on PATH, every candidate draft length k
gets its own server: the options build would write for this recipe and the installed release
(``backends.trtllm.options``), with a fixed chain of k (``max_draft_len: k``, no tree, no
schedule, no auto-disable, so the candidate is what is measured) and, for k = 0, the baseline
options without ``speculative_config``. The argv is the bundle's own serve line
(``backends.launch.trtllm_serve_argv``). Servers run one after another, each alone on the
GPUs the process sees with the options' own KV-cache fraction: TensorRT-LLM takes its
memory up front, so two candidates would not fit beside each other, and the report says
that drift between candidates is therefore not cancelled.

Each run's acceptance is read as serve-test reads it (``backends.trtllm.acceptance``: the
sources the installed release line really serves, from
``data/trtllm/acceptance_sources.json``, else the stream-chunk estimate, else nothing, said
why), and every run names its source. TensorRT-LLM serves no per-position acceptance, so
the report has none and predicts nothing from it; the choice rests on measured tokens/s.
Tokens are counted from the usage chunk trtllm-serve appends to a stream asked with
``stream_options.include_usage`` (``tensorrt_llm/serve/postprocess_handlers.py``,
``completion_stream_post_processor`` / ``chat_stream_post_processor``: a final chunk with
``choices: []`` and ``usage``; main, stored commit 01bf192).

Lossless: trtllm-serve returns text (token ids only with ``detokenize: false`` on completions:
``completion_response_post_processor`` in the same file),
so each candidate's greedy text at concurrency 1 (one request at a time) is compared with
plain decoding's on the same prompts, character by character; a difference is not
diagnosed as a numerical tie here (serve-test asks for logprobs), so it fails tune.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .measure import Measured, compare_to_plain

# NVIDIA's release container: docs/source/quick-start-guide.md (`nvcr.io/nvidia/tensorrt-llm/release:x.y.z`, tags on
# NGC); the server's /health and /v1/models: docs/source/commands/trtllm-serve.rst (both TensorRT-LLM main, stored)
INSTALL_ROUTE = ("install TensorRT-LLM (NVIDIA's release container nvcr.io/nvidia/tensorrt-llm/release:<version>, "
                 "see docs/build.md), or measure on an engine that is installed: --set runtime.backend=vllm "
                 "(or reference); build writes TensorRT-LLM's schedule from either")
HOST = "127.0.0.1"


@dataclass(frozen=True)
class Installed:
    """The TensorRT-LLM tune measures on: the imported package's version and the trtllm-serve it starts."""

    version: str
    serve: str


def require_installed() -> Installed:
    """The installed TensorRT-LLM, or :class:`EnvironmentMissing` (exit 3) with the install route, before anything
    is measured or written."""
    import importlib

    from .._imports import installed_version
    from ..errors import EnvironmentMissing

    try:
        module = importlib.import_module("tensorrt_llm")
    except (ImportError, OSError, RuntimeError) as exc:  # absent, or its CUDA libraries do not load
        raise EnvironmentMissing(f"runtime.backend: trtllm: tune measures on trtllm-serve, and tensorrt_llm does "
                                 f"not import here ({type(exc).__name__}: {exc})", fix=INSTALL_ROUTE) from None
    version = getattr(module, "__version__", None) or installed_version("tensorrt_llm")
    if not version:
        raise EnvironmentMissing("runtime.backend: trtllm: tensorrt_llm imports but names no version",
                                 fix=INSTALL_ROUTE)
    serve = shutil.which("trtllm-serve")
    if serve is None:
        raise EnvironmentMissing(f"runtime.backend: trtllm: tensorrt_llm {version} imports but `trtllm-serve` is not "
                                 "on PATH", fix=INSTALL_ROUTE)
    return Installed(str(version), serve)


def candidate_options(recipe: Any, convert: dict[str, Any], version: str, draft_len: int,
                      iterations: int | None = None) -> dict[str, Any]:
    """The options one candidate's trtllm-serve runs with: build's options for the installed release, drafting a
    fixed chain of ``draft_len`` (0: the baseline options, no speculation). ``iterations``: the most engine
    iterations one run can take; the iteration-stats buffer keeps that many, so no run's stats are dropped before
    they are read (trtllm-serve keeps 1,000 unless ``iter_stats_max_iterations`` says otherwise:
    ``tensorrt_llm/serve/openai_server.py`` ``OpenAIServer._iteration_stats_buffer_maxlen``, main, stored
    version). A value the recipe sets (``build.extra_llm_api_options``) is kept."""
    from ..backends.trtllm import options, rules, versions
    from ..errors import InputError

    target = versions.resolve(recipe.runtime.trtllm_version, installed=version)
    build = recipe.build.model_copy(update={"max_draft_len": max(draft_len, 1), "tree": None,
                                            "disable_below_acceptance_length": None})
    report = rules.check(recipe.model_copy(update={"build": build}), convert, target)
    if report.errors:
        more = f" (and {len(report.errors) - 1} more)" if len(report.errors) > 1 else ""
        raise InputError(report.errors[0] + more, problems=report.errors)
    spec = None
    if draft_len > 0:
        spec = options.speculative_config(target, build, convert["artifacts"]["draft_dir"],
                                          [int(i) for i in convert["decisions"]["aux_layer_ids"]], report)
    written = options.llm_api_options(target, build, report, spec)
    if iterations is not None and written.get("enable_iter_perf_stats"):
        written.setdefault("iter_stats_max_iterations", max(int(iterations), 1000))
        options.assert_known(written, target.spelling.family, target.version)
    return written


def write_candidates(recipe: Any, convert: dict[str, Any], version: str, lengths: Sequence[int],
                     folder: Path, iterations: int | None = None) -> dict[int, Path]:
    """One options file per candidate length under ``folder`` (kept in tune/ beside the server logs)."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    written = {}
    for k in lengths:
        path = folder / f"trtllm-k{k}.yaml"
        path.write_text(yaml.safe_dump(candidate_options(recipe, convert, version, k, iterations), sort_keys=False),
                        encoding="utf-8")
        written[k] = path
    return written


def measure_trtllm(installed: Installed, target_dir: str, build: Any, options: dict[int, Path],
                   payloads: Sequence[dict[str, Any]], levels: Sequence[int], log_dir: Path, startup_timeout_s: float,
                   run_timeout_s: float, repeats: int = 1, on_run: Callable[[], None] | None = None,
                   compare: bool = True) -> tuple[dict[tuple[int, int], Measured], list[dict[str, Any]]]:
    """Start each candidate's trtllm-serve in turn (plain decoding first), run ``payloads`` at every level on it,
    read its acceptance around each run, stop it; then compare each candidate's greedy text at concurrency 1 with
    plain decoding's (``compare``). Returns the runs and what each server was."""
    from ..backends.launch import trtllm_serve_argv
    from ..errors import ExternalFailure
    from ..output import log
    from ..serving.process import ServerStartError, sigterm_unwinds, start_healthy

    out: dict[tuple[int, int], Measured] = {}
    texts: dict[int, dict[int, str | None]] = {}
    servers: list[dict[str, Any]] = []
    with sigterm_unwinds():
        for k in sorted(options):
            log_path = log_dir / f"server-k{k}.log"

            def command(port: int, k: int = k) -> list[str]:
                return [str(word) for group in trtllm_serve_argv(target_dir, build, HOST, port, str(options[k]),
                                                                  exe=installed.serve) for word in group]

            try:
                server, url, took = start_healthy(command, lambda port: f"http://{HOST}:{port}", log_path,
                                                  startup_timeout_s, name=f"trtllm-serve k{k}", host=HOST,
                                                  on_start=lambda s, argv, url, k=k: log(
                                                      f"tune: starting trtllm-serve for draft length {k} on {url}"))
            except ServerStartError as exc:
                tail = "; ".join(exc.log_tail[-3:])
                raise ExternalFailure(f"tune: {exc}" + (f" (log: {tail})" if tail else ""),
                                      fix=f"see {log_path}; raise tune.startup_timeout_s if it was still loading") from None
            try:
                servers.append({"label": f"k{k}", "url": url, "pid": server.pid, "command": server.command,
                                "options": str(options[k]), "log": str(log_path), "startup_s": round(took, 2)})
                texts[k] = asyncio.run(_server_runs(k, url, installed.version, payloads, levels, repeats,
                                                    run_timeout_s, out, on_run))
            finally:
                server.stop()
    for (k, _), m in out.items():
        m.identical_to_plain = True if k == 0 else None  # compared below, at concurrency 1 only
    if compare:
        compare_to_plain(out, texts, 1)
        for m in out.values():
            if m.first_divergence is not None:
                m.first_divergence["diagnosis"] = {
                    "class": "undiagnosed", "note": "trtllm-serve returned text: compared character by character "
                    "(position is a character), a numerical tie is not diagnosed here; serve-test asks for logprobs"}
    return out, servers


async def _server_runs(k: int, url: str, version: str, payloads: Sequence[dict[str, Any]], levels: Sequence[int],
                       repeats: int, run_timeout_s: float, out: dict[tuple[int, int], Measured],
                       on_run: Callable[[], None] | None) -> dict[int, str | None]:
    """Every level (``repeats`` times) on one server; the texts of its first one-at-a-time run, per request."""
    from ..backends.trtllm.acceptance import AcceptanceReader
    from ..bench.loadgen import Endpoint, list_models, run_load
    from ..serving.client import OpenAIClient

    texts: dict[int, str | None] = {}
    api = "chat" if "messages" in payloads[0] else "completions"
    async with OpenAIClient(url, request_timeout_s=run_timeout_s, max_connections=max(levels)) as client:
        model = ((await list_models(client)) or [None])[0]
        endpoint = Endpoint(f"k{k}", url, model, api)
        for rep in range(repeats):
            for b in levels:
                reader = AcceptanceReader(version, k, url) if k > 0 else None
                if reader is not None:
                    await reader.start()
                if b == 1:
                    records, duration, got = await one_at_a_time(client, endpoint, payloads, run_timeout_s)
                    if rep == 0:
                        texts = got
                else:
                    records, duration = await run_load(client, endpoint, payloads, b, run_timeout_s)
                ok = [r for r in records if r.ok]
                m = out.setdefault((k, b), Measured(k, b, accepted_per_position=[]))
                tokens = sum(r.output_tokens for r in ok)
                m.failed_requests += len(records) - len(ok)
                m.tokens += tokens
                m.prefill_tokens += len(ok)
                m.decode_s += duration
                if reader is None:
                    m.steps += max(tokens - len(ok), 0)  # one token per step after the prefill's
                else:
                    acceptance = await reader.finish([r.output_tokens for r in ok], [len(r.chunks) for r in ok])
                    m.acceptance_sources.append(acceptance.label)
                    if acceptance.available and acceptance.drafts:
                        m.steps += int(round(acceptance.drafts))
                if on_run:
                    on_run()
    return texts


async def one_at_a_time(client: Any, endpoint: Any, payloads: Sequence[dict[str, Any]], run_timeout_s: float
                        ) -> tuple[list[Any], float, dict[int, str | None]]:
    """Each payload streamed alone, in order (concurrency 1): the bench records, the wall time, and each request's
    text (for the lossless comparison; ``bench.loadgen`` keeps no text)."""
    from ..bench.loadgen import to_record
    from ..bench.metrics import RequestRecord
    from ..serving.client import RequestFailed

    records: list[Any] = []
    texts: dict[int, str | None] = {}
    sent = ("messages", "prompt", "max_tokens", "temperature", "seed", "stream", "stream_options")

    async def every() -> None:
        for index, payload in enumerate(payloads):
            body = {key: payload[key] for key in ("messages", "prompt") if key in payload}
            extra = {key: value for key, value in payload.items() if key not in sent}
            send_time = time.perf_counter()
            try:
                completion = await client.generate(endpoint.path, body, endpoint.model, max_tokens=payload["max_tokens"],
                                                   temperature=payload.get("temperature", 0.0),
                                                   seed=payload.get("seed"), stream=True, extra=extra or None)
            except RequestFailed as exc:
                records.append(RequestRecord(index=index, send_time=send_time, error=f"{exc.kind}: {exc.message}"))
                texts[index] = None
                continue
            records.append(to_record(completion, index, send_time))
            texts[index] = completion.text

    started = time.perf_counter()
    try:
        await asyncio.wait_for(every(), run_timeout_s)
    except asyncio.TimeoutError:
        pass
    duration = time.perf_counter() - started
    done = {r.index for r in records}
    records += [RequestRecord(index=i, error=f"run stopped after {run_timeout_s:g} s")
                for i in range(len(payloads)) if i not in done]
    return records, duration, texts
