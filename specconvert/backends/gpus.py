"""The GPUs this process may use: how many, and each one's total and free memory. The one place that reads them.

Read from ``nvidia-smi`` first, then ``torch.cuda``, else none:
- ``nvidia-smi --query-gpu=index,uuid,memory.total,memory.free --format=csv,noheader,nounits`` (MiB) asks the
  driver (NVML) and creates no CUDA context. ``torch.cuda.mem_get_info`` does: about half a GiB on every GPU,
  held by the bench/tune parent for as long as its servers run, which is memory they then lack. nvidia-smi lists
  every GPU of the machine, so the list is cut to ``CUDA_VISIBLE_DEVICES`` (indices or ``GPU-`` UUID prefixes).
- ``torch.cuda`` where nvidia-smi is missing (its count and ``mem_get_info`` per device), only when torch is
  installed with CUDA.
- Neither: an empty inventory (``source`` says why). That is not "no GPU" on a box whose specconvert venv has a
  CPU torch and no nvidia-smi on PATH while vLLM's own venv has CUDA: callers treat it as unknown.

``Gpu.visible_id`` is what a child's ``CUDA_VISIBLE_DEVICES`` must name to get that GPU: a child's variable
replaces the parent's, so it is the parent's own entry, not the position in the parent's list.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass, field

GIB = 1024 ** 3
MIB = 1024 ** 2
QUERY = "index,uuid,memory.total,memory.free"


@dataclass(frozen=True)
class Gpu:
    visible_id: str  # the token a child's CUDA_VISIBLE_DEVICES names it by
    total_bytes: int
    free_bytes: int

    def as_dict(self) -> dict[str, object]:
        return {"id": self.visible_id, "total_gib": round(self.total_bytes / GIB, 2),
                "free_gib": round(self.free_bytes / GIB, 2)}


@dataclass(frozen=True)
class Inventory:
    gpus: tuple[Gpu, ...] = field(default_factory=tuple)
    source: str = "none"  # nvidia-smi | torch.cuda | none (why)

    @property
    def count(self) -> int:
        return len(self.gpus)

    def as_dict(self) -> dict[str, object]:
        return {"source": self.source, "count": self.count, "gpus": [g.as_dict() for g in self.gpus]}


def _visible_tokens() -> list[str] | None:
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        return None
    return [t.strip() for t in value.split(",") if t.strip()]


def parse_nvidia_smi(text: str, visible: list[str] | None = None) -> list[Gpu] | None:
    """GPUs from ``nvidia-smi --query-gpu=QUERY --format=csv,noheader,nounits`` output, cut to ``visible``
    (``CUDA_VISIBLE_DEVICES`` tokens, in their order; CUDA stops at the first token it cannot match). None when
    the text is not that output."""
    rows = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            return None
        try:
            index, uuid, total, free = int(parts[0]), parts[1], int(float(parts[2])), int(float(parts[3]))
        except ValueError:
            return None
        rows[index] = (uuid, total * MIB, free * MIB)
    if visible is None:
        return [Gpu(str(i), t, f) for i, (_, t, f) in sorted(rows.items())]
    found = []
    for token in visible:
        match = None
        if token.lstrip("-").isdigit():
            match = rows.get(int(token))
        elif token.startswith("GPU-"):
            match = next((row for row in rows.values() if row[0].startswith(token)), None)
        if match is None:
            break  # CUDA ignores the list from an invalid entry on
        found.append(Gpu(token, match[1], match[2]))
    return found


def _from_nvidia_smi(exe: str) -> Inventory | None:
    try:
        done = subprocess.run([exe, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode != 0:
        return None
    gpus = parse_nvidia_smi(done.stdout, _visible_tokens())
    return None if gpus is None else Inventory(tuple(gpus), "nvidia-smi")


def _from_torch() -> Inventory | None:
    try:
        import torch
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        tokens = _visible_tokens()
        gpus = []
        for i in range(torch.cuda.device_count()):
            free, total = torch.cuda.mem_get_info(i)
            gpus.append(Gpu(tokens[i] if tokens and i < len(tokens) else str(i), int(total), int(free)))
    except RuntimeError:
        return None
    return Inventory(tuple(gpus), "torch.cuda")


def inventory() -> Inventory:
    """The GPUs this process may use, read now (free memory changes: never cached)."""
    exe = shutil.which("nvidia-smi")
    found = _from_nvidia_smi(exe) if exe else None
    if found is None:
        found = _from_torch()
    if found is None:
        return Inventory((), "none: no nvidia-smi on PATH" + (" that answered" if exe else "")
                         + ", and torch sees no CUDA device")
    return found
