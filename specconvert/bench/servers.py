"""Servers bench starts itself (RECIPE mode, no --url), through serve's ``ServerProcess`` lifecycle.

- reference backend: one ``specconvert serve RECIPE`` process; it serves ``<name>``
  (speculative) and ``<name>-baseline`` (plain target) from the same decoder.
- trtllm backend: the bundle's ``trtllm/serve.sh`` twice, speculative and with
  ``OPTIONS=baseline.yaml``, all up at once so runs can interleave; each gets an equal share
  of the bundle's ``kv_cache_config.free_gpu_memory_fraction`` (derived option files
  written into the bench directory).
- vllm backend: ``python -m vllm.entrypoints.openai.api_server`` twice, speculative and
  baseline, argv from ``backends.vllm.launch`` (the same the bundle's serve scripts hold).
  Where they run (``backends.vllm.placement``, :func:`vllm_placement`): on CUDA each on GPUs of its own
  (``CUDA_VISIBLE_DEVICES``), all at once when there are enough, else in waves; on the CPU build all at once when
  RAM holds them. ``together`` starts all here; otherwise the bench stage starts one wave at a time through
  :func:`vllm_server`.

``fixed`` (bench's ``fixed-kN`` arms): one more server per length N, serving the same head with
a fixed chain of N: ``serve --draft-len N`` (reference), a ``--speculative-config`` with
``num_speculative_tokens: N`` and no per-batch schedule (vLLM), an options file with
``max_draft_len: N`` and no ``draft_len_schedule`` (TensorRT-LLM).
"""

from __future__ import annotations

import os
import shutil
import sys
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any, Iterator, Sequence

from .. import output
from ..backends.names import fixed_chain_model
from ..errors import ExternalFailure, InputError

HOST = "127.0.0.1"
# (label, argv, env or None = inherit, whether the port is an argument rather than PORT= in the environment)
Launch = tuple[str, list[str], "dict[str, str] | None", bool]


def fixed_label(draft_len: int) -> str:
    return f"fixed-k{draft_len}"


@contextmanager
def recipe_servers(recipe: Any, recipe_path: Path, overrides: list[str], engine_dir: Path, log_dir: Path,
                   startup_timeout_s: float, fixed: Sequence[int] = (), placement: Any = None) -> Iterator[dict[str, Any]]:
    """Start the bundle's server(s); yield ``{"speculative": url, "baseline": url, "fixed-kN": url, "servers": [...]}``;
    always reap. ``placement``: where vLLM's servers run (:func:`vllm_placement`)."""
    launches: list[Launch] = []
    backend = recipe.runtime.backend
    if backend == "vllm":
        launches = vllm_launches(recipe, recipe_path, engine_dir, fixed, placement=placement)
    elif backend == "reference":
        command = [sys.executable, "-m", "specconvert", "serve", str(Path(recipe_path).resolve()), "--host", HOST,
                   "--model-name", recipe.name]
        for item in overrides:
            command += ["--set", item]
        launches.append(("speculative+baseline", command, None, True))
        for n in fixed:
            fixed_command = [*command, "--draft-len", str(n)]
            fixed_command[fixed_command.index("--model-name") + 1] = fixed_chain_model(recipe.name, n)
            launches.append((fixed_label(n), fixed_command, None, True))
    else:
        trt = engine_dir / "trtllm"
        script = trt / "serve.sh"
        if not script.is_file():
            raise InputError(f"{script} is missing", fix="run `specconvert build RECIPE --force`")
        if shutil.which("trtllm-serve") is None:
            from ..errors import EnvironmentMissing

            raise EnvironmentMissing(
                "trtllm-serve is not on PATH (runtime.backend: trtllm)",
                fix="run bench inside NVIDIA's TensorRT-LLM container, or start the servers yourself and pass "
                "--url/--baseline-url")
        arms = [("speculative", trt / "llm_api_options.yaml", None), ("baseline", trt / "baseline.yaml", None)]
        arms += [(fixed_label(n), trt / "llm_api_options.yaml", n) for n in fixed]
        if "ngram" in recipe.bench.baselines:  # bench.baselines: build's NGram options (no head)
            if not (trt / "ngram.yaml").is_file():
                raise InputError(f"{trt / 'ngram.yaml'} is missing: the bundle was built without bench.baselines",
                                 fix="run `specconvert build RECIPE` (it rebuilds when bench.baselines changes)")
            arms.append(("ngram", trt / "ngram.yaml", None))
        for label, options, draft_len in arms:
            shared = _shared_memory_options(options, log_dir / f"{label}_options.yaml", len(arms), draft_len)
            launches.append((label, ["bash", str(script)], {**os.environ, "OPTIONS": str(shared)}, False))
    with started_servers(launches, log_dir, startup_timeout_s) as info:
        yield info


def _vllm_bundle(recipe: Any, recipe_path: Path, engine_dir: Path) -> tuple[dict[str, Any], Any, str, Any]:
    """(artifacts, the bundle's tuned vLLM schedule, the Python that runs vLLM, the launch values for its device)."""
    from ..backends.vllm import launch as vllm
    from ..manifest import require_manifest

    manifest = require_manifest(engine_dir, "build", "build")
    artifacts = manifest.get("artifacts") or {}
    tuned = ((manifest.get("decisions") or {}).get("tuned") or {}).get("vllm")  # the bundle's schedule, as built
    if not artifacts.get("target_dir") or not artifacts.get("vllm_draft"):
        raise InputError(f"{engine_dir / 'manifest.json'} names no vLLM draft overlay",
                         fix="run `specconvert build RECIPE --force`")
    python = vllm.find_python(recipe.runtime, vllm.project_roots(recipe_path))
    values = vllm.launch_values(recipe.runtime, *vllm.launch_device(recipe.runtime, vllm.is_cpu_build(python)))
    return artifacts, tuned, python, values


def vllm_placement(recipe: Any, recipe_path: Path, engine_dir: Path, labels: Sequence[str]) -> Any:
    """Where bench's vLLM servers (one per label, in run order) run: ``backends.vllm.placement.place``."""
    from ..backends.vllm import placement

    artifacts, _, _, values = _vllm_bundle(recipe, recipe_path, engine_dir)
    return placement.place(labels, recipe.runtime, recipe.build, values,
                           [artifacts.get("target_dir"), artifacts.get("vllm_draft")])


def vllm_launches(recipe: Any, recipe_path: Path, engine_dir: Path, fixed: Sequence[int] = (),
                  only: Sequence[str] | str | None = None, placement: Any = None) -> list[Launch]:
    """(label, argv, env) of the vLLM speculative server, its baseline twin and the ``fixed`` arms
    (``only``: those labels), each on its GPUs when ``placement`` gives them."""
    from ..backends.vllm import launch as vllm

    artifacts, tuned, python, values = _vllm_bundle(recipe, recipe_path, engine_dir)
    out = []
    servers = vllm.launches(python, artifacts["target_dir"], artifacts["vllm_draft"], recipe.build, recipe.runtime,
                            recipe.name, tuned, values)
    servers += [vllm.chain_launch(python, artifacts["target_dir"], artifacts["vllm_draft"], recipe.build, recipe.runtime,
                                  recipe.name, n, fixed_label(n), values=values) for n in fixed]
    servers += [vllm.free_launch(python, artifacts["target_dir"], recipe.build, recipe.runtime, recipe.name, method,
                                 recipe.bench.ngram, values) for method in recipe.bench.baselines]  # bench.baselines
    # seeded sampled requests: the CPU build must not split a prompt (launch.whole_prefill_args)
    whole = (vllm.whole_prefill_args(recipe.build, recipe.runtime)
             if recipe.bench.temperature > 0 and vllm.is_cpu_build(python) else [])
    wanted = [only] if isinstance(only, str) else only
    for server in servers:
        if placement is not None:
            server = placement.apply(server)
        if wanted is None or server.label in wanted:
            # argv ends with --host/--port, added per start (a free port each time)
            out.append((server.label, [*server.argv, *whole, "--host", HOST], {**os.environ, **server.env}, True))
    return out


@contextmanager
def vllm_server(recipe: Any, recipe_path: Path, engine_dir: Path, label: Sequence[str] | str, log_dir: Path,
                startup_timeout_s: float, fixed: Sequence[int] = (), placement: Any = None) -> Iterator[dict[str, Any]]:
    """One vLLM server (``label``: speculative | baseline | fixed-kN), or one wave of them (a list of labels), for
    servers that do not all run at once."""
    with started_servers(vllm_launches(recipe, recipe_path, engine_dir, fixed, only=label, placement=placement),
                         log_dir, startup_timeout_s) as info:
        yield info


@contextmanager
def started_servers(launches: list[Launch], log_dir: Path, startup_timeout_s: float,
                    stage: str = "bench") -> Iterator[dict[str, Any]]:
    """Start every launch (through ``serving.process.start_healthy``: free port, retried once when taken) and yield
    ``{label: url, ..., "servers": [...]}``; every server is stopped when the block ends. A server that does not
    come up is exit 4 (:class:`ExternalFailure`) naming its log."""
    from ..serving.process import ServerStartError, sigterm_unwinds, start_healthy

    info: dict[str, Any] = {"servers": []}
    with ExitStack() as stack, sigterm_unwinds():
        for label, command, env, port_argument in launches:
            log_path = log_dir / f"server-{label.replace('+', '-')}.log"
            try:
                server, url, took = start_healthy(
                    lambda port, command=command, by_argument=port_argument: (
                        command + ["--port", str(port)] if by_argument else command),
                    lambda port: f"http://{HOST}:{port}", log_path, startup_timeout_s,
                    env_for_port=lambda port, env=env, by_argument=port_argument: (
                        env if by_argument else {**env, "HOST": HOST, "PORT": str(port)}),
                    name=f"{label} server", host=HOST,
                    on_start=lambda server, argv, url, label=label: output.log(
                        f"{stage}: starting {label} server on {url}"),
                    on_retry=lambda port: output.log(f"{stage}: port {port} was taken meanwhile; retrying on another"))
            except ServerStartError as exc:
                tail = "; ".join(exc.log_tail[-3:])
                raise ExternalFailure(f"{stage}: {exc}" + (f" (log: {tail})" if tail else ""),
                                      fix=f"see {log_path}; raise {stage}.startup_timeout_s if it was still loading") from None
            stack.callback(server.stop)
            info["servers"].append({"label": label, "url": url, "pid": server.pid, "command": server.command,
                                    "log": str(log_path), "startup_s": round(took, 2)})
            for side in label.split("+"):
                info[side] = url
        yield info


def _shared_memory_options(source: Path, dest: Path, servers: int, draft_len: int | None = None) -> Path:
    """A copy of an options file with 1/``servers`` of its KV-cache memory fraction (the servers share the GPU);
    ``draft_len``: a fixed chain of that length (``max_draft_len``, no ``draft_len_schedule``)."""
    import yaml

    data = yaml.safe_load(source.read_text(encoding="utf-8")) or {}
    kv = dict(data.get("kv_cache_config") or {})
    kv["free_gpu_memory_fraction"] = round(float(kv.get("free_gpu_memory_fraction", 0.9)) / servers, 3)
    data["kv_cache_config"] = kv
    if draft_len is not None:
        spec = dict(data.get("speculative_config") or {})
        spec.pop("draft_len_schedule", None)
        spec["max_draft_len"] = int(draft_len)
        data["speculative_config"] = spec
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return dest
