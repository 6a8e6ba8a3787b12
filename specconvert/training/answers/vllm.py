"""Answers from the project's own vLLM: started on loopback for synthesis, reaped on every exit path.

The launch line is ``backends.vllm.launch``'s, the one tune and bench use (``runtime.vllm_python``,
``python -m vllm.entrypoints.openai.api_server``, the ``runtime.vllm_*`` settings), for the target
alone, in the dtype the in-process target has (so the probe compares like with like), with
``--max-num-seqs`` at least ``synthesis.concurrency``. The process lifecycle is
``serving.process.ServerProcess`` (own process group; SIGTERM, then SIGKILL; SIGTERM to convert
unwinds through it). Requests then go through :class:`.url.ServedSource`.
"""

from __future__ import annotations

import os
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Sequence

from ...errors import ExternalFailure
from . import AnswerSource, Emit, Key, Sampling
from .url import ServedSource

HOST = "127.0.0.1"
SYNTHESIS_NEEDS = "draft.train.synthesis.engine: vllm"
SYNTHESIS_INSTEAD = "set draft.train.synthesis.engine: inprocess (slower: transformers generate in convert's process)"


class VllmSource(AnswerSource):
    served = True
    name = "vLLM"

    def __init__(self, spec: Any, recipe: Any, target_path: Path, target_dtype: str, stop_ids: Sequence[int],
                 tokenizer: Any, log_dir: Path):
        self.spec = spec
        self.recipe = recipe
        self.target_path = Path(target_path)
        self.target_dtype = target_dtype
        self.stop_ids = list(stop_ids)
        self.tokenizer = tokenizer
        self.log_path = Path(log_dir) / "synthesis-vllm.log"
        self._stack: ExitStack | None = None
        self._client: ServedSource | None = None
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

    def start(self) -> "VllmSource":
        from ... import output
        from ...backends.vllm import launch
        from ...serving.process import ServerProcess, ServerStartError, free_port, sigterm_unwinds

        python = launch.find_python(self.recipe.runtime, launch.project_roots(self.recipe.base_dir / "recipe.yaml"),
                                    SYNTHESIS_NEEDS, SYNTHESIS_INSTEAD)
        port = free_port(HOST)
        argv, env = self.command(python, port)
        url = f"http://{HOST}:{port}"
        stack = ExitStack()
        try:
            stack.enter_context(sigterm_unwinds())
            server = stack.enter_context(ServerProcess(argv, url, self.log_path, env=env, name="synthesis vLLM server"))
            output.log(f"synthesis: starting vLLM on {url} (log {self.log_path})")
            try:
                self.startup_s = server.wait_healthy(self.spec.startup_timeout_s)
            except ServerStartError as exc:
                tail = "; ".join(exc.log_tail[-3:])
                raise ExternalFailure(f"draft.train.synthesis: {exc}" + (f" (log: {tail})" if tail else ""),
                                      fix=f"see {self.log_path}; raise draft.train.synthesis.startup_timeout_s "
                                      "if it was still loading") from None
        except BaseException:
            stack.close()
            raise
        self._stack = stack
        self._client = ServedSource([url], f"{self.recipe.name}-synthesis", self.stop_ids,
                                    concurrency=self.spec.concurrency, timeout_s=self.spec.timeout_s,
                                    retries=self.spec.retries, request_extra=self.spec.request_extra,
                                    tokenizer=self.tokenizer, name="vLLM")
        return self

    def __enter__(self) -> "VllmSource":
        return self  # started on first use: a run whose answers are all cached starts no server

    def endpoints(self) -> list[ServedSource]:
        if self._client is None:
            self.start()
        assert self._client is not None
        return [self._client]

    def answer(self, jobs: Sequence[tuple[Key, list[int]]], max_new_tokens: int, sampling: Sampling, emit: Emit) -> None:
        if self._client is None:
            self.start()
        assert self._client is not None
        self._client.answer(jobs, max_new_tokens, sampling, emit)

    def close(self) -> None:
        if self._stack is not None:
            self._stack.close()
            self._stack = None
