"""Answers from the project's own vLLM: started on loopback for synthesis, reaped on every exit path.

The launch line is ``backends.vllm.launch``'s, the one tune and bench use (``runtime.vllm_python``,
``python -m vllm.entrypoints.openai.api_server``, the ``runtime.vllm_*`` settings), for the target
alone, in the dtype the in-process target has (so the probe compares like with like), with
``--max-num-seqs`` at least ``synthesis.concurrency``. The process lifecycle is
``serving.process.ServerProcess`` (own process group; SIGTERM, then SIGKILL; SIGTERM to convert
unwinds through it), started by ``serving.process.start_healthy``, serve-test's start loop (a free
port taken by another process before vLLM binds it is retried on another), and then asked
``GET /v1/models``: the server on that port must list this run's served name. Requests then go
through :class:`.url.ServedSource`. When the server dies (at start or mid-run) the error quotes
the last error lines of its log (``cache/train/synthesis-vllm.log``), where the cause is.
"""

from __future__ import annotations

import os
import re
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Callable, Sequence

from ...errors import ExternalFailure, InputError
from . import AnswerSource, Emit, Key, Sampling
from .url import ServedSource

HOST = "127.0.0.1"
SYNTHESIS_NEEDS = "draft.train.synthesis.engine: vllm"
SYNTHESIS_INSTEAD = "set draft.train.synthesis.engine: inprocess (slower: transformers generate in convert's process)"


class VllmSource(AnswerSource):
    served = True
    name = "vLLM"

    def __init__(self, spec: Any, recipe: Any, target_path: Path, target_dtype: str, stop_ids: Sequence[int],
                 tokenizer: Any, log_dir: Path, end_of_turn: int | None = None):
        self.spec = spec
        self.recipe = recipe
        self.target_path = Path(target_path)
        self.target_dtype = target_dtype
        self.stop_ids = list(stop_ids)
        self.tokenizer = tokenizer
        self.log_path = Path(log_dir) / "synthesis-vllm.log"
        self._stack: ExitStack | None = None
        self._client: ServedSource | None = None
        self._server: Any = None
        self.end_of_turn = end_of_turn
        self.startup_s: float | None = None

    @property
    def concurrency(self) -> int:
        return int(self.spec.concurrency)

    @property
    def running(self) -> bool:
        return self._stack is not None

    def describe(self) -> str:
        return f"vLLM ({self._client.urls[0]})" if self._client else "vLLM"

    def command(self, python: str, port: int) -> tuple[list[str], dict[str, str]]:
        """argv and environment of the synthesis server."""
        from ...backends.vllm import launch

        from ... import threads

        # The synthesis server runs alone while convert waits on it: it gets the synthesis phase's thread budget
        # (`runtime.threads`, `auto` = the CPUs nobody else keeps busy), not `runtime.vllm_threads`, which sizes
        # each of the servers tune, bench and serve-test run side by side.
        from ..distributed import free_memory_fraction

        # on CUDA: sized from the GPU memory free now (convert holds no copy of the target during synthesis)
        runtime = self.recipe.runtime.model_copy(
            update={"vllm_dtype": self.target_dtype, "vllm_threads": threads.resolve(self.recipe.runtime.threads),
                    "vllm_memory_fraction": free_memory_fraction(self.recipe.runtime)})
        build = self.recipe.build.model_copy(
            update={"max_batch_size": max(self.recipe.build.max_batch_size, self.spec.concurrency)})
        args = launch.server_args(str(self.target_path), None, build, runtime, f"{self.recipe.name}-synthesis")
        if launch.is_cpu_build(python):
            # every request here may be seeded (self:N always is): the CPU build must not split a prompt
            args += launch.whole_prefill_args(build, runtime)
        argv = [python, "-m", launch.MODULE, *args, "--host", HOST, "--port", str(port)]
        return argv, {**os.environ, **launch.server_env(runtime)}

    def identity(self) -> dict[str, Any]:
        """Who answers: this project's vLLM for the target (its port changes every run, so it is left out)."""
        return {"engine": "vllm", "model": f"{self.recipe.name}-synthesis", "dtype": self.target_dtype,
                "request_extra": dict(self.spec.request_extra)}

    def start(self) -> "VllmSource":
        from ... import output
        from ...backends.vllm import launch
        from ...serving.process import ServerStartError, sigterm_unwinds, start_healthy
        from . import ProbeRule

        python = launch.find_python(self.recipe.runtime, launch.project_roots(self.recipe.base_dir / "recipe.yaml"),
                                    SYNTHESIS_NEEDS, SYNTHESIS_INSTEAD)
        stack = ExitStack()
        try:
            stack.enter_context(sigterm_unwinds())
            # serve-test's start loop: a free port another process takes before vLLM binds it is retried on another
            server, url, self.startup_s = start_healthy(
                lambda port: self.command(python, port)[0], lambda port: f"http://{HOST}:{port}", self.log_path,
                self.spec.startup_timeout_s, env_for_port=lambda port: self.command(python, port)[1],
                name="synthesis vLLM server", host=HOST,
                on_start=lambda server, command, url: output.log(f"synthesis: starting vLLM on {url} (log {self.log_path})"),
                on_retry=lambda port: output.warn(f"synthesis: port {port} was taken before vLLM bound it; another port"))
            stack.callback(server.stop)
            self._server = server
            client = ServedSource([url], f"{self.recipe.name}-synthesis", self.stop_ids,
                                  concurrency=self.spec.concurrency, timeout_s=self.spec.timeout_s,
                                  retries=self.spec.retries, request_extra=self.spec.request_extra,
                                  tokenizer=self.tokenizer, name="vLLM", end_of_turn=self.end_of_turn,
                                  probe_rule=ProbeRule.of(self.recipe), engine="vllm")
            # the served model id must be ours: a server that took the port meanwhile lists another
            try:
                self._guard(client.connect)
            except InputError as exc:
                raise ExternalFailure(f"draft.train.synthesis: the server on {url} is not this run's vLLM: {exc}",
                                      fix="another server took the port: rerun (a fresh port is picked)") from None
        except ServerStartError as exc:
            stack.close()
            raise ExternalFailure(f"draft.train.synthesis: {exc}{self._quote(exc.log_tail)}",
                                  fix=f"see {self.log_path}; raise draft.train.synthesis.startup_timeout_s "
                                  "if it was still loading") from None
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        self._client = client
        return self

    def _quote(self, lines: Sequence[str]) -> str:
        """The server log's last error lines (the cause; a client only sees a closed connection)."""
        errors = [line.strip() for line in lines if re.search(r"error|exception|unsupported|killed|fatal", line, re.I)]
        chosen = (errors or [line.strip() for line in lines])[-3:]
        return f" (server log: {' | '.join(chosen)})" if chosen else ""

    def _guard(self, call: Callable[[], Any]) -> Any:
        """Run ``call``; when it fails because the server died, say so with the log's own last errors."""
        from ...serving.process import tail

        try:
            return call()
        except ExternalFailure:
            server = self._server
            deadline = time.monotonic() + 2.0  # a dying engine closes its sockets a moment before it exits
            while server is not None and server.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
            if server is None or server.alive():
                raise
            raise ExternalFailure(
                f"draft.train.synthesis: the vLLM server exited with code {server.proc.returncode} while it was asked "
                f"for answers{self._quote(tail(self.log_path, 60))}",
                fix=f"see {self.log_path}; finished answers are kept, rerun to resume (or engine: inprocess)") from None

    def __enter__(self) -> "VllmSource":
        return self  # started on first use: a run whose answers are all cached starts no server

    def endpoints(self) -> list["VllmSource"]:
        """Itself: the probe's requests go through :meth:`answer_scored`, which names the cause if the server dies."""
        if self._client is None:
            self.start()
        return [self]

    @property
    def probe_rule(self) -> Any:
        return self._client.probe_rule if self._client is not None else None

    def answer_scored(self, jobs: Sequence[tuple[Key, list[int]]], max_new_tokens: int) -> Any:
        if self._client is None:
            self.start()
        client = self._client
        assert client is not None
        return self._guard(lambda: client.answer_scored(jobs, max_new_tokens))

    def answer(self, jobs: Sequence[tuple[Key, list[int]]], max_new_tokens: int, sampling: Sampling, emit: Emit) -> None:
        if self._client is None:
            self.start()
        client = self._client
        assert client is not None
        self._guard(lambda: client.answer(jobs, max_new_tokens, sampling, emit))

    def close(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None
            self._server = None
