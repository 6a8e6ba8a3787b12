"""Whether several vLLM CPU servers fit in RAM at once (``runtime.vllm_servers: auto``; on CUDA the GPUs decide:
``placement.py``).

bench interleaves its arms (baseline, the bundle, ``fixed-kN``) only when every server is up at
once; on a small machine that may not fit, and a server that dies of the OOM killer halfway
through a bench is worse than a sequential one. The estimate per server:

- the KV cache vLLM's CPU build allocates up front: ``VLLM_CPU_KVCACHE_SPACE`` GiB
  (``runtime.vllm_kv_cache_gib``);
- the weights as vLLM holds them in ``--dtype`` (``runtime.vllm_dtype``): every 16/32/64-bit float
  tensor of the target (and the draft, for a speculative server) at the serving dtype's width, read
  from the safetensors headers, other tensors (int, bool, fp8) at their stored size. float32
  serving of a bf16 checkpoint therefore counts the weights twice their file size. ``auto`` is
  vLLM's own rule (``vllm/config/model.py`` ``_resolve_auto_dtype``, vllm-cpu 0.32.0): the
  checkpoint's ``torch_dtype``, float32 downcast to the platform's first 16-bit dtype. ``.bin``/``.pt``
  files (no header to read) count their file size scaled by serving / ``config.json`` dtype width;
- the rest of the process tree (API server, EngineCore, Worker with torch and its libraries):
  :data:`OVERHEAD_GIB`, measured on vllm-cpu 0.32.0 with SmolLM2-135M fp32 (KV 2 GiB): the three
  processes held 4.55 GiB PSS once healthy, i.e. 2.0 GiB beyond KV and weights; rounded up.

Available memory is the kernel's ``MemAvailable``, capped by a cgroup v2 ``memory.max`` minus
``memory.current`` on the process's cgroup path (the tightest wins).
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Iterable

GIB = 1024 ** 3
OVERHEAD_GIB = 2.5
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")
# Bytes per element of the float dtypes ``--dtype`` casts to (safetensors and config.json spellings).
FLOAT_WIDTH = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2,
               "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2}


def checkpoint_dtype(directory: Path) -> str | None:
    """``torch_dtype`` (transformers 5: ``dtype``) of ``directory/config.json``, when it names a float dtype."""
    try:
        config = json.loads((Path(directory) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    value = config.get("torch_dtype") or config.get("dtype") if isinstance(config, dict) else None
    return value if value in FLOAT_WIDTH else None


def serving_width(serving_dtype: str, stored: str | None) -> int | None:
    """Bytes per float element vLLM holds for ``--dtype serving_dtype`` of a checkpoint stored as ``stored``."""
    if serving_dtype != "auto":
        return FLOAT_WIDTH[serving_dtype]
    if stored is None:
        return None  # unknown: count the stored width
    return 2 if FLOAT_WIDTH[stored] >= 4 else FLOAT_WIDTH[stored]


def _safetensors_bytes(path: Path, width: int | None) -> int | None:
    """Bytes of a safetensors file's tensors with floats at ``width`` (None: as stored); None if unreadable."""
    try:
        with open(path, "rb") as fh:
            (size,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(size))
    except (OSError, ValueError, struct.error):
        return None
    total = 0
    for name, info in header.items():
        if name == "__metadata__" or not isinstance(info, dict):
            continue
        begin, end = info.get("data_offsets", (0, 0))
        dtype = info.get("dtype")
        if width is not None and dtype in FLOAT_WIDTH:
            numel = (end - begin) // FLOAT_WIDTH[dtype]
            total += numel * width
        else:
            total += end - begin
    return total


def weights_gib(dirs: Iterable[str | Path | None], serving_dtype: str = "auto") -> float:
    """The weights in ``dirs`` (symlinks followed) as vLLM holds them with ``--dtype serving_dtype``, in GiB."""
    total = 0
    for d in dirs:
        if not d or not Path(d).is_dir():
            continue
        stored = checkpoint_dtype(Path(d))
        width = serving_width(serving_dtype, stored)
        for path in Path(d).iterdir():
            if not path.name.endswith(WEIGHT_SUFFIXES):
                continue
            counted = _safetensors_bytes(path, width) if path.name.endswith(".safetensors") else None
            if counted is None:
                try:
                    counted = path.stat().st_size
                except OSError:
                    continue
                if width is not None and stored is not None:
                    counted = counted * width // FLOAT_WIDTH[stored]
            total += counted
    return total / GIB


def server_gib(kv_cache_gib: float, weights: float) -> float:
    return kv_cache_gib + weights + OVERHEAD_GIB


def _meminfo_available(meminfo: Path) -> float | None:
    try:
        for line in meminfo.read_text(encoding="utf-8").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024 / GIB
    except (OSError, ValueError, IndexError):
        return None
    return None


def _cgroup_headroom(cgroup_root: Path, proc_self_cgroup: Path) -> float | None:
    """``memory.max - memory.current`` of the tightest cgroup v2 ancestor with a limit, in GiB."""
    try:
        lines = proc_self_cgroup.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    path = next((line.split(":", 2)[2] for line in lines if line.startswith("0::")), None)
    if path is None:
        return None
    parts = [p for p in path.strip().split("/") if p]
    best = None
    for i in range(len(parts), -1, -1):
        folder = cgroup_root.joinpath(*parts[:i])
        try:
            limit = (folder / "memory.max").read_text(encoding="utf-8").strip()
            current = int((folder / "memory.current").read_text(encoding="utf-8").strip())
        except (OSError, ValueError):
            continue
        if limit == "max":
            continue
        try:
            room = (int(limit) - current) / GIB
        except ValueError:
            continue
        best = room if best is None else min(best, room)
    return best


def available_gib(meminfo: Path = Path("/proc/meminfo"), cgroup_root: Path = Path("/sys/fs/cgroup"),
                  proc_self_cgroup: Path = Path("/proc/self/cgroup")) -> float | None:
    """RAM this process could still take, in GiB (None when unknown: not Linux)."""
    found = [v for v in (_meminfo_available(meminfo), _cgroup_headroom(cgroup_root, proc_self_cgroup)) if v is not None]
    return min(found) if found else None


def choose_for(runtime: Any, servers: int, weight_dirs: Iterable[str | Path | None],
               dtype: str | None = None) -> tuple[str, str]:
    """:func:`choose` for ``servers`` vLLM servers of ``runtime`` loading the weights in ``weight_dirs`` at ``dtype``
    (default: ``runtime.vllm_dtype``, else the CPU's default, float32)."""
    dtype = dtype or getattr(runtime, "vllm_dtype", None) or "float32"
    per_server = server_gib(runtime.vllm_kv_cache_gib, weights_gib(weight_dirs, dtype))
    return choose(runtime.vllm_servers, servers, per_server, available_gib())


def choose(mode: str, servers: int, per_server_gib: float, available: float | None) -> tuple[str, str]:
    """``together`` or ``sequential`` for ``runtime.vllm_servers`` (``auto`` decided here), and why."""
    need = servers * per_server_gib
    if mode != "auto":
        return mode, f"runtime.vllm_servers: {mode}"
    if servers <= 1:
        return "together", "one server"
    if available is None:
        return "sequential", "available memory unknown"
    if need <= available:
        return "together", f"{servers} servers need about {need:.1f} GiB, {available:.1f} GiB available"
    return "sequential", (f"{servers} vLLM servers need about {need:.1f} GiB "
                          f"({per_server_gib:.1f} GiB each), only {available:.1f} GiB available")
