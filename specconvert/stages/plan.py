"""`specconvert plan`: where each stage of a recipe runs and the memory it needs, from ``config.json`` alone.

Nothing is loaded: the target's config comes from a local folder or a few KB from the hub, the head's
from its folder when it can be read (else it is estimated from the target's shape, and the plan says
so). Every figure comes from :mod:`specconvert.models.size`, the one memory model; the oracle's row is
the estimate serve-test itself decides with (:func:`specconvert.serving.oracle.estimate`). A stage that
does not fit is named with its need, its room and the fix; the command then exits 2.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ..errors import InputError
from ..models import size

PLAN_VERSION = 1
SYNTHESIS_PROMPT_TOKENS = 512  # prompt tokens assumed per synthesized answer (prompts are not tokenized here)


@dataclass(frozen=True)
class Hardware:
    """The GPUs a plan is made for: ``gpus`` devices of ``gpu_gib`` each (0 = CPU only, against ``host_gib``)."""

    gpus: int
    gpu_gib: float
    source: str
    host_gib: float | None = None


@dataclass
class StagePlan:
    """One stage (or server) of the recipe: where it runs, its peak per GPU and in host RAM, whether it fits."""

    stage: str
    runs: bool
    where: str
    gpus_used: int = 0
    per_gpu_gib: float = 0.0
    host_gib: float = 0.0
    room_gib: float | None = None
    fits: bool = True
    fix: str | None = None
    detail: str = ""
    estimated: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def problem(self) -> str:
        unit = "per GPU" if self.gpus_used else "host RAM"
        need = self.per_gpu_gib if self.gpus_used else self.host_gib
        room = "n/a" if self.room_gib is None else f"{self.room_gib:.1f} GiB"
        return f"{self.stage}: needs {need:.1f} GiB {unit} ({self.where}), room {room}; fix: {self.fix}"


# --------------------------------------------------------------------------- inputs


def read_model_config(spec: str, key: str, base_dir: Path, revision: str | None = None) -> tuple[dict[str, Any], str]:
    """``config.json`` of a recipe model string (local folder, hub id, or ``gguf://``) and where it came from.

    A hub id reads only ``config.json`` (``hf_hub_download``; ``HF_HUB_OFFLINE`` is honoured by
    huggingface_hub, which then answers from its cache or refuses)."""
    path = Path(spec).expanduser()
    path = path if path.is_absolute() else (base_dir / path)
    if spec.startswith("gguf://"):
        from ..models.sources import resolve_model

        resolved = resolve_model(spec, key, base_dir, revision)
        return _read_json(resolved.path / "config.json", key), f"{spec} (converted folder)"
    if path.exists():
        return _read_json(path / "config.json", key), str(path.resolve())
    if spec.count("/") != 1 or spec.startswith((".", "/", "~")):
        raise InputError(f"{key}: path '{path}' does not exist",
                         fix="check the path (relative paths are relative to the recipe file), or give a hub id")
    from .._imports import require

    hub = require("huggingface_hub", purpose=f"read {spec}'s config.json")
    try:
        local = hub.hf_hub_download(spec, "config.json", revision=revision)
    except Exception as exc:  # offline, auth, missing repo: all the user's to fix
        reason = str(exc).splitlines()[0][:160] if str(exc) else type(exc).__name__
        raise InputError(f"{key}: cannot read config.json of hub id '{spec}' ({type(exc).__name__}: {reason})",
                         fix=f"point {key} at a local folder holding its config.json (a config-only folder is "
                             "enough for plan), or check your access (`hf auth login`)") from None
    return _read_json(Path(local), key), f"hub {spec} (config.json only)"


def _read_json(path: Path, key: str) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise InputError(f"{key}: cannot read {path} ({type(exc).__name__})",
                         fix="point it at a checkpoint folder whose config.json is the JSON object transformers saves") from None
    if not isinstance(data, dict) or size.model_shape(data) is None:
        raise InputError(f"{key}: {path} lacks hidden_size / num_hidden_layers / vocab_size",
                         fix="point it at a decoder-only checkpoint's config.json")
    return data


def detect_hardware() -> Hardware | None:
    """This machine's GPUs: torch.cuda when it imports and sees one, else ``nvidia-smi``; None when there are none."""
    try:
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 0:
            totals = [torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count())]
            return Hardware(len(totals), round(min(totals) / size.GIB, 2), "torch.cuda (this machine)")
    except ImportError:
        pass
    smi = shutil.which("nvidia-smi")
    if not smi:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return hardware_from_nvidia_smi(out)


def hardware_from_nvidia_smi(text: str) -> Hardware | None:
    """``nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits`` (MiB per line) as a Hardware."""
    mib = []
    for line in text.splitlines():
        try:
            mib.append(float(line.strip()))
        except ValueError:
            continue
    if not mib:
        return None
    return Hardware(len(mib), round(min(mib) / 1024, 2), "nvidia-smi (this machine)")


def host_memory_gib(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """This machine's RAM (``MemTotal``), in GiB."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 ** 2, 2)
    except (OSError, ValueError, IndexError):
        return None
    return None


# --------------------------------------------------------------------------- the plan


@dataclass
class PlanModels:
    target: dict[str, Any]
    target_source: str
    dtype: str
    head_params: int
    head_bytes: int
    head_note: str
    draft_vocab: int | None
    estimated: list[str]


def _dtype_name(recipe: Any, config: dict[str, Any]) -> str:
    if recipe.target.dtype != "auto":
        return recipe.target.dtype
    return str(config.get("torch_dtype") or config.get("dtype") or "float32").replace("torch.", "")


def read_models(recipe: Any) -> PlanModels:
    target, source = read_model_config(recipe.target.model, "target.model", recipe.base_dir, recipe.target.revision)
    dtype = _dtype_name(recipe, target)
    estimated: list[str] = []
    head_config: dict[str, Any] | None = None
    train = recipe.draft.train
    draft_vocab = (train.draft_vocab_size if train else None) or recipe.draft.draft_vocab_size
    if recipe.draft.model:
        try:
            head_config, where = read_model_config(recipe.draft.model, "draft.model", recipe.base_dir)
            note = f"read from {where}"
        except InputError as exc:
            note = f"estimated from the target's shape (head config unreadable: {exc.message})"
            estimated.append("draft head")
    else:
        note = "built here from the target's shape" + (" (draft vocab %d)" % draft_vocab if draft_vocab else "")
    params = size.eagle3_head_parameters(target, draft_vocab, head_config) or 0
    head_dtype = (head_config or {}).get("torch_dtype") or dtype
    head_bytes = params * size.dtype_bytes(str(head_dtype), None)
    return PlanModels(target, source, dtype, params, head_bytes, note, draft_vocab, estimated)


def _device(recipe: Any, hw: Hardware) -> str:
    device = recipe.runtime.device
    if device == "auto":
        return "cuda" if hw.gpus > 0 else "cpu"
    return device


def _gpu_stage(name: str, hw: Hardware, gpus_needed: int, per_gpu: float, host: float, where: str, detail: str,
               fix_more: str, room: float | None = None) -> StagePlan:
    """A stage on ``gpus_needed`` GPUs needing ``per_gpu`` bytes on each; checked against ``room`` (default: a GPU)."""
    room_gib = hw.gpu_gib if room is None else room
    stage = StagePlan(name, True, where, gpus_needed, size.gib(per_gpu), size.gib(host), round(room_gib, 2), True,
                      None, detail)
    if hw.gpus == 0:
        stage.fits = False
        stage.fix = ("it runs on CUDA (runtime.device, or a GPU-only engine): plan for your GPUs with --gpus N "
                     "--gpu-memory-gib G")
    elif gpus_needed > hw.gpus:
        stage.fits = False
        stage.fix = f"it needs {gpus_needed} GPUs and {hw.gpus} are planned for: {fix_more}"
    elif per_gpu / size.GIB > room_gib:
        stage.fits = False
        stage.fix = fix_more
    return stage


def _cpu_stage(name: str, hw: Hardware, need: float, where: str, detail: str, fix: str) -> StagePlan:
    room = hw.host_gib
    stage = StagePlan(name, True, where, 0, 0.0, size.gib(need), room, True, None, detail)
    if room is not None and need / size.GIB > room:
        stage.fits = False
        stage.fix = fix
    return stage


def _skipped(name: str, why: str) -> StagePlan:
    return StagePlan(name, False, f"not run: {why}")


def _context() -> float:
    return size.CUDA_CONTEXT_GIB * size.GIB


def _host_gpu_process(processes: int = 1) -> float:
    return processes * (size.HOST_PROCESS_GIB + size.LOAD_BUFFER_GIB) * size.GIB


def calibration(recipe: Any, m: PlanModels, hw: Hardware, device: str) -> StagePlan:
    """Quantization calibration: the whole target in its dtype, on one GPU when it fits there, else spread over
    every GPU (convert loads it with a device map; see :func:`specconvert.models.size.calibration_placement`)."""
    q = recipe.quantize
    if q.format == "none":
        return _skipped("calibration (quantize)", "quantize.format: none")
    weights = size.weight_bytes(m.target, m.dtype) or 0
    act = size.forward_activation_bytes(m.target, q.calib_seq_len, size.dtype_bytes(m.dtype, m.target))
    if device == "cpu":
        return _cpu_stage("calibration (quantize)", hw, weights + act + size.HOST_PROCESS_GIB * size.GIB, "CPU",
                          f"target {size.gib(weights)} GiB in {m.dtype} + activations {size.gib(act)} GiB",
                          "a machine with more RAM, or calibrate on GPUs")
    gpus, per_gpu = size.calibration_placement(weights, act, [int(hw.gpu_gib * size.GIB)] * max(hw.gpus, 1))
    where = "1 GPU" if gpus == 1 else f"{gpus} GPUs (device map: layers spread, one GPU busy at a time)"
    need_gpus = size.calibration_gpus_needed(weights, act, int(hw.gpu_gib * size.GIB))
    return _gpu_stage(
        "calibration (quantize)", hw, gpus, per_gpu, _host_gpu_process(), where,
        f"target {size.gib(weights)} GiB in {m.dtype} / {gpus} GPU(s) + activations {size.gib(act)} GiB "
        f"({q.calib_seq_len} tokens) + CUDA context {size.CUDA_CONTEXT_GIB:g} GiB",
        f"more GPUs: at least {need_gpus} of {hw.gpu_gib:g} GiB (convert spreads calibration over every visible "
        "GPU), or start from a pre-quantized checkpoint and quantize.format: none")


def training(recipe: Any, m: PlanModels, hw: Hardware, device: str) -> list[StagePlan]:
    """Synthesis (its server or in-process generate) and features + training, per rank."""
    train = recipe.draft.train
    if train is None:
        why = "the head is imported (draft.model)" if recipe.draft.model else "draft.init: random"
        return [_skipped("synthesis", why), _skipped("features + training", why)]
    rows = [synthesis(recipe, m, hw, device)]
    value = size.dtype_bytes(m.dtype, m.target)
    ranks = train.num_processes
    sharded = train.target_sharding == "fsdp"
    weights = size.weight_bytes(m.target, m.dtype) or 0
    held = weights / ranks if sharded else weights
    tokens = train.batch_size * train.seq_len
    act = size.forward_activation_bytes(m.target, tokens, value, logits=False)
    from ..training.pipeline import param_dtype, train_dtype

    tdtype = train_dtype(train.dtype, device)
    pbytes = size.dtype_bytes(param_dtype(tdtype))
    rank = size.training_rank_bytes(m.target, held, tokens, m.head_params, pbytes, m.draft_vocab, train.ttt_steps, value)
    head = rank - held - act
    detail = (f"target {size.gib(held)} GiB {'(1/%d, FSDP)' % ranks if sharded else '(whole, per rank)'} + its forward "
              f"{size.gib(act)} GiB ({train.batch_size} x {train.seq_len} tokens) + head, optimizer and activations "
              f"{size.gib(head)} GiB ({m.head_params / 1e6:.0f} M parameters, {tdtype}, {train.ttt_steps} draft steps)")
    name = "features + training (per rank)"
    if device == "cpu":
        rows.append(_cpu_stage(name, hw, ranks * (held + act + head) + size.HOST_PROCESS_GIB * size.GIB, f"CPU, {ranks} process(es)",
                               detail, "a machine with more RAM, or train on GPUs"))
        return rows
    where = f"{ranks} GPU(s), one process each" + (", target sharded (FSDP)" if sharded else "")
    fix = ("draft.train.target_sharding: fsdp with more processes (each holds 1/N of the target), or a smaller "
           "draft.train.batch_size / seq_len" if not sharded else
           "more processes (draft.train.num_processes) on more GPUs, or a smaller batch_size / seq_len")
    rows.append(_gpu_stage(name, hw, ranks, held + act + head + _context(), _host_gpu_process(ranks), where,
                           detail + f" + CUDA context {size.CUDA_CONTEXT_GIB:g} GiB", fix))
    return rows


def synthesis(recipe: Any, m: PlanModels, hw: Hardware, device: str) -> StagePlan:
    train = recipe.draft.train
    if not train.synthesize:
        return _skipped("synthesis", "draft.train.synthesize: false")
    engine = train.synthesis.engine
    if engine == "url":
        return _skipped("synthesis", "draft.train.synthesis.engine: url (your servers answer)")
    kv_value = size.kv_value_bytes("auto", m.target, m.dtype)
    seq = SYNTHESIS_PROMPT_TOKENS + train.max_new_tokens
    weights = size.weight_bytes(m.target, m.dtype) or 0
    if engine == "vllm":
        tp = recipe.build.tensor_parallel_size
        kv = size.kv_bytes_per_token(m.target, kv_value) * seq * train.synthesis.concurrency / tp
        need = weights / tp + kv + _context()
        detail = (f"vLLM server: target {size.gib(weights / tp)} GiB per GPU + KV {size.gib(kv)} GiB "
                  f"({train.synthesis.concurrency} x {seq} tokens) + CUDA context")
        if device == "cpu":
            return _cpu_stage("synthesis (vLLM server)", hw, need + size.HOST_PROCESS_GIB * size.GIB, "CPU", detail,
                              "a machine with more RAM, or synthesis on GPUs")
        fraction = recipe.runtime.vllm_memory_fraction
        return _gpu_stage("synthesis (vLLM server)", hw, tp, need, _host_gpu_process(tp), f"{tp} GPU(s), tensor parallel {tp}",
                          detail + f"; vLLM may take {fraction:g} of each GPU",
                          "raise runtime.vllm_memory_fraction, use more GPUs (build.tensor_parallel_size), "
                          "or synthesis.engine: url with your own servers", room=hw.gpu_gib * fraction)
    batch = train.synthesis_batch_size
    kv = size.kv_bytes_per_token(m.target, kv_value) * seq * batch
    act = size.forward_activation_bytes(m.target, batch * SYNTHESIS_PROMPT_TOKENS, size.dtype_bytes(m.dtype, m.target),
                                        logits=False) + batch * (size.model_shape(m.target) or {}).get("vocab", 0) * 4
    detail = (f"in-process generate: target {size.gib(weights)} GiB + KV {size.gib(kv)} GiB ({batch} x {seq} tokens) "
              f"+ activations {size.gib(act)} GiB")
    if device == "cpu":
        return _cpu_stage("synthesis (in-process)", hw, weights + kv + act + size.HOST_PROCESS_GIB * size.GIB, "CPU",
                          detail, "a smaller draft.train.synthesis_batch_size, or synthesis.engine: vllm / url")
    return _gpu_stage("synthesis (in-process)", hw, 1, weights + kv + act + _context(), _host_gpu_process(), "1 GPU", detail,
                      "a smaller draft.train.synthesis_batch_size or max_new_tokens, or synthesis.engine: url with "
                      "your serving cluster")


@dataclass
class _Server:
    label: str
    gpus: int
    per_gpu: float
    detail: str
    room: float | None
    fix: str


def served_server(recipe: Any, m: PlanModels, hw: Hardware, device: str, batch: int | None = None) -> _Server:
    """One server of the bundle (the served target + head) at ``build.max_seq_len`` x ``batch`` of KV cache."""
    b = recipe.build
    backend = recipe.runtime.backend
    batch = batch or b.max_batch_size
    if backend == "trtllm":
        fmt = recipe.quantize.format
        weights = size.weight_bytes(m.target, m.dtype, fmt) or 0
        kv_value = size.kv_value_bytes(b.kv_cache.dtype, m.target, m.dtype)
        tp, room = b.tensor_parallel_size, None
        served = m.dtype if fmt == "none" else f"{fmt} ({m.dtype} embeddings and lm_head)"
        fix = ("more GPUs (build.tensor_parallel_size)" + (", quantize.format: fp8" if fmt == "none" else "")
               + ", or a smaller KV cache (build.max_batch_size x build.max_seq_len"
               + (", build.kv_cache.dtype: fp8)" if b.kv_cache.dtype != "fp8" else ")"))
    elif backend == "vllm":
        vdtype = recipe.runtime.vllm_dtype
        if vdtype == "auto":
            vdtype = "bfloat16" if m.dtype == "float32" else m.dtype
        weights = size.weight_bytes(m.target, vdtype) or 0
        kv_value = size.kv_value_bytes("auto", m.target, vdtype)
        tp = b.tensor_parallel_size
        room = hw.gpu_gib * recipe.runtime.vllm_memory_fraction if device == "cuda" else None
        served = vdtype
        fix = ("raise runtime.vllm_memory_fraction, serve in bfloat16 (runtime.vllm_dtype), more GPUs "
               "(build.tensor_parallel_size), or a smaller KV cache (build.max_batch_size x max_seq_len)")
    else:  # the reference decoder serves one request at a time on one device
        weights = size.weight_bytes(m.target, m.dtype) or 0
        kv_value = size.dtype_bytes(m.dtype, m.target)  # its KV cache is kept in the model's dtype
        tp, room, batch, served = 1, None, 1, m.dtype
        fix = "a GPU with more memory, or a smaller build.max_seq_len"
    tokens = b.max_seq_len * batch
    kv = size.kv_bytes_per_token(m.target, kv_value) * tokens
    act = size.forward_activation_bytes(m.target, min(b.max_num_tokens, tokens), min(size.dtype_bytes(m.dtype, m.target), 2),
                                        logits=False)
    per_gpu = (weights + kv + act) / tp + m.head_bytes + _context()
    detail = (f"target {size.gib(weights / tp)} GiB in {served} + KV cache {size.gib(kv / tp)} GiB ({b.max_seq_len} x "
              f"{batch} tokens at {kv_value} byte(s)) + activations {size.gib(act / tp)} GiB + head "
              f"{size.gib(m.head_bytes)} GiB + CUDA context, per rank" + (f" of {tp}" if tp > 1 else ""))
    return _Server(backend, tp, per_gpu, detail, room, fix)


def served_bundle(recipe: Any, m: PlanModels, hw: Hardware, device: str) -> StagePlan:
    s = served_server(recipe, m, hw, device)
    name = f"served bundle ({recipe.runtime.backend})"
    if device == "cpu" and recipe.runtime.backend != "trtllm":  # TensorRT-LLM serves on GPUs only
        return _cpu_stage(name, hw, s.per_gpu * s.gpus + size.HOST_PROCESS_GIB * size.GIB, "CPU", s.detail, s.fix)
    where = f"{s.gpus} GPU(s), tensor parallel {s.gpus}" if s.gpus > 1 else "1 GPU"
    return _gpu_stage(name, hw, s.gpus, s.per_gpu, _host_gpu_process(s.gpus), where, s.detail, s.fix, room=s.room)


def servers(recipe: Any, m: PlanModels, hw: Hardware, device: str) -> list[StagePlan]:
    """Each server tune, serve-test and bench start, and whether they run together or one after another."""
    b, backend = recipe.build, recipe.runtime.backend
    lossless = recipe.serve_test.lossless.mode != "off"
    tune_lens = list(range(1, (recipe.tune.max_draft_len or b.max_draft_len) + 1))
    counts = {
        "tune": len(tune_lens) + (1 if backend == "vllm" and lossless else 0),
        "serve-test": 1 + (1 if lossless else 0),
        "bench": 1 + (1 if recipe.bench.compare_baseline else 0)
                 + (len(recipe.bench.fixed_draft_lens) if isinstance(recipe.bench.fixed_draft_lens, list) else 0),
    }
    s = served_server(recipe, m, hw, device)
    rows = []
    for command, n in counts.items():
        name = f"{command} servers ({n} x {backend})"
        if (device == "cpu" and backend != "trtllm") or backend == "reference":
            row = (_cpu_stage(name, hw, s.per_gpu + size.HOST_PROCESS_GIB * size.GIB, "CPU, one after another", s.detail, s.fix)
                   if device == "cpu" else
                   _gpu_stage(name, hw, 1, s.per_gpu, _host_gpu_process(), "1 GPU, one after another", s.detail, s.fix))
        else:
            together = command != "serve-test" and n * s.gpus <= hw.gpus
            forced = backend == "vllm" and recipe.runtime.vllm_servers == "together" and command == "bench"
            where = (f"together on {n * s.gpus} GPUs ({s.gpus} each)" if together else
                     f"one after another on {s.gpus} GPU(s)")
            row = _gpu_stage(name, hw, s.gpus, s.per_gpu, _host_gpu_process(s.gpus), where,
                             s.detail + " (each server)", s.fix, room=s.room)
            if forced and not together and row.fits:
                row.fits = False
                row.fix = (f"runtime.vllm_servers: together needs {n * s.gpus} GPUs and {hw.gpus} are planned for: "
                           "runtime.vllm_servers: auto or sequential (one server after another)")
        rows.append(row)
    return rows


def oracle(recipe: Any, m: PlanModels, hw: Hardware, device: str) -> StagePlan:
    """serve-test's reference decoder, with serve-test's own estimate (serving.oracle.estimate)."""
    from ..serving import oracle as oracle_mod

    spec = recipe.serve_test.oracle
    on = spec.enabled == "on" or (spec.enabled == "auto" and recipe.runtime.backend == "vllm")
    if not on:
        return _skipped("oracle (reference decoder)", f"serve_test.oracle.enabled: {spec.enabled} with "
                        f"runtime.backend: {recipe.runtime.backend}")
    where_device = spec.device if spec.device != "auto" else device
    vdtype = recipe.runtime.vllm_dtype
    dtype = ("bfloat16" if m.dtype == "float32" else m.dtype) if vdtype == "auto" else vdtype
    depth = recipe.build.tree.depth if recipe.build.tree else recipe.build.max_draft_len
    head_bytes = int(m.head_params * size.dtype_bytes(dtype))
    fp = oracle_mod.estimate(m.target, head_bytes, size.dtype_bytes(dtype), dtype, where_device, 1,
                             recipe.serve_test.max_tokens, depth)
    need = (fp.need_gib if fp else 0.0) * size.GIB
    detail = (f"target {fp.weights_gib:.2f} GiB + head in {dtype} + KV {fp.kv_cache_gib:.3f} GiB + overhead "
              "(serve-test's own estimate; it skips the oracle when this does not fit)") if fp else "sizes unknown"
    fix = ("serve_test.oracle.device: cpu on a machine with that much RAM, or serve_test.oracle.enabled: off"
           if where_device == "cuda" else "serve_test.oracle.device: cuda, or serve_test.oracle.enabled: off")
    if where_device == "cpu":
        return _cpu_stage("oracle (reference decoder)", hw, need, "CPU, after the engine's servers stop", detail, fix)
    return _gpu_stage("oracle (reference decoder)", hw, 1, need, _host_gpu_process(), "1 GPU, after the engine's servers stop",
                      detail, fix)


def make_plan(recipe: Any, hw: Hardware) -> dict[str, Any]:
    """The whole plan as one JSON-able document (``ok`` false when any stage does not fit)."""
    m = read_models(recipe)
    device = _device(recipe, hw)
    stages = [*training(recipe, m, hw, device), calibration(recipe, m, hw, device), oracle(recipe, m, hw, device),
              *servers(recipe, m, hw, device), served_bundle(recipe, m, hw, device)]
    for stage in stages:
        stage.estimated = list(m.estimated)
    refused = [s for s in stages if s.runs and not s.fits]
    shape = size.model_shape(m.target) or {}
    return {
        "plan_version": PLAN_VERSION,
        "recipe": recipe.name,
        "hardware": asdict(hw),
        "device": device,
        "target": {"source": m.target_source, "dtype": m.dtype, "parameters": size.parameter_count(m.target),
                   "weights_gib": size.gib(size.weight_bytes(m.target, m.dtype) or 0), **shape},
        "draft": {"parameters": m.head_params, "bytes_gib": size.gib(m.head_bytes), "source": m.head_note,
                  "estimated": bool(m.estimated)},
        "assumptions": {
            "cuda_context_gib": size.CUDA_CONTEXT_GIB, "host_process_gib": size.HOST_PROCESS_GIB,
            "load_buffer_gib": size.LOAD_BUFFER_GIB, "synthesis_prompt_tokens": SYNTHESIS_PROMPT_TOKENS,
            "note": "weights from config.json (parameters x dtype bytes; quantized linear layers at their width), KV "
                    "cache = 2 x layers x kv_heads x head_dim x tokens x bytes, activations of one forward "
                    "(float32 logits, one MLP); no weights are read",
        },
        "stages": [s.as_dict() for s in stages],
        "ok": not refused,
        "problems": [s.problem() for s in refused],
    }


def hardware_for(gpus: int | None, gpu_memory_gib: float | None) -> Hardware:
    """The hardware a plan is made for: the flags, else this machine's GPUs; an InputError when neither says."""
    host = host_memory_gib()
    if gpus is not None and gpus < 0:
        raise InputError(f"--gpus {gpus}: a count of GPUs is 0 or more", fix="pass e.g. --gpus 4")
    if gpu_memory_gib is not None and gpu_memory_gib <= 0:
        raise InputError(f"--gpu-memory-gib {gpu_memory_gib}: memory per GPU is a positive number", fix="pass e.g. --gpu-memory-gib 80")
    if gpus == 0:
        return Hardware(0, 0.0, "--gpus 0 (CPU only)", host)
    if gpus is not None and gpu_memory_gib is not None:
        return Hardware(gpus, float(gpu_memory_gib), "--gpus / --gpu-memory-gib", host)
    found = detect_hardware()
    if found is None:
        raise InputError("no GPU is visible on this machine (torch.cuda and nvidia-smi found none), so plan cannot "
                         "default --gpus / --gpu-memory-gib",
                         fix="pass the GPUs you will run on, e.g. --gpus 4 --gpu-memory-gib 80 (or --gpus 0 for CPU only)")
    return Hardware(gpus if gpus is not None else found.gpus,
                    float(gpu_memory_gib) if gpu_memory_gib is not None else found.gpu_gib,
                    found.source + (" + flags" if gpus is not None or gpu_memory_gib is not None else ""), host)


def minimum_gpus(n_bytes: float, gpu_gib: float) -> int:
    """GPUs of ``gpu_gib`` needed to hold ``n_bytes`` spread evenly (for messages)."""
    return max(1, math.ceil(n_bytes / (gpu_gib * size.GIB)))

