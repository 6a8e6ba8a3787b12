"""`specconvert doctor`: can this machine run the recipe's backend, and is the recipe's feature mix valid?

Reads versions without importing heavy packages where it can (torch is imported
only to ask CUDA), runs ``nvidia-smi`` when present, and applies the same EAGLE-3
combination rules as ``build``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__
from ._imports import installed_version
from .backends.trtllm import rules, versions
from .manifest import read_manifest


@dataclass
class Check:
    name: str
    status: str  # ok | warn | fail | missing | info
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


@dataclass
class DoctorReport:
    checks: list[Check] = field(default_factory=list)
    exit_code: int = 0
    reason: str | None = None
    fix: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)

    def add(self, name: str, status: str, detail: str) -> None:
        self.checks.append(Check(name, status, detail))

    def fail(self, code: int, reason: str, fix: str | None = None) -> None:
        # The first problem of a kind is reported; input problems (2) outrank a missing
        # environment (3): the recipe has to be fixed first.
        if self.exit_code == 0 or (code == 2 and self.exit_code != 2):
            self.exit_code, self.reason, self.fix = code, reason, fix

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.exit_code == 0,
            "exit_code": self.exit_code,
            "reason": self.reason,
            "fix": self.fix,
            "checks": [c.as_dict() for c in self.checks],
            **self.facts,
        }


def nvidia_smi() -> list[dict[str, str]] | None:
    """GPUs as nvidia-smi reports them; None when nvidia-smi is absent or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,driver_version,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=20, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    gpus = []
    for line in out.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 4:
            gpus.append({"name": parts[0], "driver": parts[1], "memory_total_mib": parts[2], "memory_free_mib": parts[3]})
    return gpus


def torch_cuda() -> dict[str, Any]:
    if installed_version("torch") is None:
        return {"torch": None, "cuda_available": False}
    import torch

    available = bool(torch.cuda.is_available())
    return {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "cuda_available": available,
        "device_count": torch.cuda.device_count() if available else 0,
        "devices": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if available else [],
    }


def _dir_size(path: Path) -> int:
    total = 0
    for item in path.rglob("*"):
        try:
            if item.is_file() and not item.is_symlink():
                total += item.stat().st_size
        except OSError:
            continue
    return total


def _existing_parent(path: Path) -> Path:
    path = path.resolve()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def run(recipe: Any | None) -> DoctorReport:
    """Inspect the environment (and the recipe when given)."""
    report = DoctorReport()
    report.add("python", "info", sys.version.split()[0])
    report.add("specconvert", "info", __version__)

    gpus = nvidia_smi()
    if gpus:
        for i, gpu in enumerate(gpus):
            report.add(f"gpu {i}", "ok", f"{gpu['name']}, driver {gpu['driver']}, "
                       f"{gpu['memory_free_mib']}/{gpu['memory_total_mib']} MiB free")
    else:
        report.add("nvidia-smi", "missing", "not found or failed (no NVIDIA driver visible)")
    cuda = torch_cuda()
    if cuda["torch"] is None:
        report.add("torch", "missing", "not installed")
    else:
        detail = f"{cuda['torch']} (built for CUDA {cuda['torch_cuda'] or 'none: CPU build'})"
        report.add("torch", "ok", detail)
        report.add(
            "torch.cuda",
            "ok" if cuda["cuda_available"] else "missing",
            f"{cuda['device_count']} device(s): {', '.join(cuda['devices'])}" if cuda["cuda_available"] else "no CUDA device",
        )
    libs = {}
    for dist, label in (("transformers", "transformers"), ("nvidia-modelopt", "modelopt"), ("tensorrt_llm", "tensorrt_llm")):
        version = installed_version(dist)
        libs[label] = version
        report.add(label, "ok" if version else "missing", version or "not installed")
    report.facts["environment"] = {"gpus": gpus or [], **cuda, "libraries": libs}

    if recipe is None:
        report.add("recipe", "info", "none given: environment only")
        return report

    report.add("recipe", "ok", f"'{recipe.name}' valid (backend {recipe.runtime.backend}, workdir {recipe.workdir_path})")
    convert = read_manifest(recipe.workdir_path / "convert")
    _disk(report, recipe, convert)
    target = versions.resolve(recipe.runtime.trtllm_version)
    report.add("trtllm spellings", "info",
               f"TensorRT-LLM {target.version} ({target.source}) -> {target.spelling.family}.x: "
               f"decoding_type {target.spelling.decoding_type}, {target.spelling.model_key}")
    combos = rules.check(recipe, convert, target)
    report.facts["combinations"] = combos.as_dict()
    report.facts["trtllm_target"] = target.as_dict()
    for message in combos.errors:
        report.add("combination", "fail", message)
    for message in target.warnings:
        report.add("trtllm version", "warn", message)
    for message in combos.warnings:
        report.add("combination", "warn", message)
    if not combos.errors:
        report.add("combinations", "ok", "EAGLE-3 feature combination is valid"
                   + (f" (with fixes: {combos.fixes})" if combos.fixes else ""))
    else:
        report.fail(2, combos.errors[0])

    backend = recipe.runtime.backend
    if backend == "trtllm":
        if libs["tensorrt_llm"] is None:
            report.fail(3, "runtime.backend is trtllm but tensorrt_llm is not installed",
                        "install TensorRT-LLM on a GPU machine (or NVIDIA's container), or set runtime.backend: reference")
        if not cuda["cuda_available"]:
            report.fail(3, "runtime.backend is trtllm but no CUDA GPU is visible",
                        "run on a machine with an NVIDIA GPU, or set runtime.backend: reference")
    else:
        missing = [name for name in ("torch", "transformers") if (cuda["torch"] if name == "torch" else libs[name]) is None]
        if missing:
            report.fail(3, f"the reference backend needs {', '.join(missing)}", f"pip install {' '.join(missing)}")
        if recipe.runtime.device == "cuda" and not cuda["cuda_available"]:
            report.fail(3, "runtime.device is cuda but no CUDA device is visible", "set runtime.device: cpu (or auto)")
    return report


def _disk(report: DoctorReport, recipe: Any, convert: dict[str, Any] | None) -> None:
    where = _existing_parent(recipe.workdir_path)
    free = shutil.disk_usage(where).free
    needed = None
    if convert:
        arts = convert.get("artifacts") or {}
        sizes = [_dir_size(Path(arts[k])) for k in ("target_dir", "draft_dir") if arts.get(k) and Path(arts[k]).is_dir()]
        needed = sum(sizes) if sizes else None
    report.facts["disk"] = {"path": str(where), "free_bytes": free, "model_bytes": needed}
    if needed is None:
        report.add("disk", "info", f"{_gib(free)} free at {where} (model size unknown until `convert` has run; "
                   "the bundle itself points at the models and stays small)")
    elif free < needed:
        report.add("disk", "warn", f"{_gib(free)} free at {where}, less than the target + draft ({_gib(needed)}) "
                   "that a quantized re-export or engine cache may need")
    else:
        report.add("disk", "ok", f"{_gib(free)} free at {where}; target + draft take {_gib(needed)}")
