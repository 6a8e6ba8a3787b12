"""A fake CUDA box for tests: N GPUs with given total and free memory, as ``specconvert.backends.gpus`` sees them.

The one reader of GPUs (``backends/gpus.py``) asks ``nvidia-smi`` first, so the fake is an executable
``nvidia-smi`` put first on PATH: it answers ``--query-gpu=FIELDS --format=csv,noheader,nounits`` for the
fields it knows (index, uuid, name, memory.total, memory.free, memory.used; MiB), ``-L`` and a bare call, like
the real one. Being on PATH it is seen by child processes too (a stage run through the CLI, a server).
``CUDA_VISIBLE_DEVICES`` is cleared, so the parent sees every fake GPU unless a test sets it.

    def test_x(fake_cuda):
        box = fake_cuda(4, total_gib=80)              # 4 idle 80 GiB GPUs
        box = fake_cuda([(80, 80), (80, 10)])         # GPU 1 mostly taken by someone else

Outside pytest: ``with fake_cuda_box(tmp_dir, gpus): ...`` sets and restores PATH itself.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Sequence

import pytest

H100 = "NVIDIA H100 80GB HBM3"

_SCRIPT = r'''
import json, sys
GPUS = json.loads(__GPUS__)
args = sys.argv[1:]
fields = {"index": lambda i, g: str(i), "uuid": lambda i, g: g["uuid"], "name": lambda i, g: g["name"],
          "memory.total": lambda i, g: str(g["total_mib"]), "memory.free": lambda i, g: str(g["free_mib"]),
          "memory.used": lambda i, g: str(g["total_mib"] - g["free_mib"])}
query = next((a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")), None)
if query is not None:
    names = [f.strip() for f in query.split(",")]
    bad = [f for f in names if f not in fields]
    if bad:
        print(f'Field "{bad[0]}" is not a valid field to query.', file=sys.stderr)
        sys.exit(2)
    units = "nounits" not in ",".join(args)
    for i, g in enumerate(GPUS):
        cells = [fields[f](i, g) + (" MiB" if units and f.startswith("memory.") else "") for f in names]
        print(", ".join(cells))
elif "-L" in args:
    for i, g in enumerate(GPUS):
        print(f"GPU {i}: {g['name']} (UUID: {g['uuid']})")
else:
    for i, g in enumerate(GPUS):
        print(f"| {i}  {g['name']}  |  {g['total_mib'] - g['free_mib']}MiB / {g['total_mib']}MiB |")
'''


@dataclass(frozen=True)
class FakeGpu:
    total_gib: float
    free_gib: float
    name: str = H100

    def as_json(self, index: int) -> dict:
        return {"name": self.name, "uuid": f"GPU-fake0000-0000-0000-0000-{index:012d}",
                "total_mib": int(self.total_gib * 1024), "free_mib": int(self.free_gib * 1024)}


def gpus_of(spec: int | Sequence[tuple[float, float] | FakeGpu], total_gib: float = 80.0,
            free_gib: float | None = None) -> list[FakeGpu]:
    """``spec``: a count of identical GPUs (``total_gib``, ``free_gib`` default all free), or (total, free) pairs."""
    if isinstance(spec, int):
        return [FakeGpu(total_gib, total_gib if free_gib is None else free_gib) for _ in range(spec)]
    return [g if isinstance(g, FakeGpu) else FakeGpu(float(g[0]), float(g[1])) for g in spec]


def write_nvidia_smi(bin_dir: Path, gpus: Sequence[FakeGpu]) -> Path:
    """An executable ``bin_dir/nvidia-smi`` answering for ``gpus`` (an empty list: a driver with no GPU)."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    exe = bin_dir / "nvidia-smi"
    data = json.dumps([g.as_json(i) for i, g in enumerate(gpus)])
    exe.write_text(f"#!{sys.executable}\n" + _SCRIPT.replace("__GPUS__", repr(data)), encoding="utf-8")
    exe.chmod(0o755)
    return exe


@dataclass
class FakeBox:
    gpus: list[FakeGpu]
    nvidia_smi: Path

    @property
    def count(self) -> int:
        return len(self.gpus)


@contextmanager
def fake_cuda_box(tmp_dir: Path, spec: int | Sequence[tuple[float, float] | FakeGpu], total_gib: float = 80.0,
                  free_gib: float | None = None) -> Iterator[FakeBox]:
    """PATH (and CUDA_VISIBLE_DEVICES) set for the fake GPUs while the block runs; restored after."""
    gpus = gpus_of(spec, total_gib, free_gib)
    exe = write_nvidia_smi(Path(tmp_dir) / "fake-cuda-bin", gpus)
    saved = {k: os.environ.get(k) for k in ("PATH", "CUDA_VISIBLE_DEVICES")}
    os.environ["PATH"] = f"{exe.parent}{os.pathsep}{saved['PATH'] or ''}"
    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
    try:
        yield FakeBox(gpus, exe)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture
def fake_cuda(tmp_path, monkeypatch):
    """``install(spec, total_gib=80, free_gib=None) -> FakeBox``: the fake GPUs for this test (PATH via monkeypatch,
    so it is undone after the test; a second call replaces the first box)."""
    def install(spec: int | Sequence[tuple[float, float] | FakeGpu], total_gib: float = 80.0,
                free_gib: float | None = None) -> FakeBox:
        gpus = gpus_of(spec, total_gib, free_gib)
        exe = write_nvidia_smi(tmp_path / f"fake-cuda-bin-{len(gpus)}-{abs(hash(tuple(gpus)))}", gpus)
        monkeypatch.setenv("PATH", f"{exe.parent}{os.pathsep}{os.environ.get('PATH', '')}")
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
        return FakeBox(gpus, exe)

    return install
