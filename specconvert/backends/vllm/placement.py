"""Where the vLLM servers of tune and bench run, and how many at once (``runtime.vllm_servers``).

tune starts one server per draft length, bench one per arm. On the CPU build the question is RAM
(``memory.choose``: all together, or one after another). On CUDA it is the GPUs (``backends.gpus``):

- a GPU has room for a server when its free memory is at least the server's memory fraction of its total:
  vLLM refuses to start otherwise ("Free memory on device ... is less than desired GPU memory utilization",
  ``vllm/v1/worker/utils.py``, vllm 0.32); the fraction is the recipe's, else vLLM's own 0.92;
- each server gets ``build.tensor_parallel_size`` GPUs with room, its own (``CUDA_VISIBLE_DEVICES``);
- ``auto``: as many servers at once as there are such GPU groups: all together when every server has its own
  group, else in waves of that many (one after another on a single group). Servers are never squeezed onto a
  shared GPU unasked: a smaller memory fraction means a smaller KV cache, i.e. another server than the one
  deployed;
- ``sequential``: one at a time, each on the first group;
- ``together`` with fewer groups than servers: the servers share the groups round-robin, each with an equal
  share of the fraction (the fraction is a per-instance limit, ``vllm/config/cache.py``), refused (exit 2) when a
  share is below what one server needs (``models.size.server_floor_bytes``);
- no inventory (no nvidia-smi, a CPU torch): one server at a time, wherever vLLM puts it.

The decision and its reason go into the tune and bench reports (``Placement.as_dict``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from ...errors import EnvironmentMissing, InputError
from .. import gpus
from .launch import ENGINE_MEMORY_FRACTION, LaunchValues, ServerLaunch, placed

GIB = 1024 ** 3


@dataclass(frozen=True)
class Placement:
    """Which servers start together (``waves``, one after the other), on which GPUs, with which memory fraction."""

    device: str
    waves: tuple[tuple[str, ...], ...]
    why: str
    env: dict[str, dict[str, str]] = field(default_factory=dict)  # label -> {"CUDA_VISIBLE_DEVICES": ...}
    memory_fraction: dict[str, float] = field(default_factory=dict)  # label -> a cut --gpu-memory-utilization
    inventory: dict[str, Any] | None = None

    @property
    def together(self) -> bool:
        return len(self.waves) <= 1

    @property
    def mode(self) -> str:
        if self.together:
            return "together"
        if all(len(w) == 1 for w in self.waves):
            return "sequential"
        return f"in waves of {max(len(w) for w in self.waves)}"

    def apply(self, server: ServerLaunch) -> ServerLaunch:
        """``server`` with its GPUs and memory fraction (unchanged where the placement sets none)."""
        env = self.env.get(server.label, {})
        fraction = self.memory_fraction.get(server.label)
        return placed(server, env, fraction) if env or fraction is not None else server

    def as_dict(self) -> dict[str, Any]:
        wave_of = {label: i for i, wave in enumerate(self.waves) for label in wave}
        return {"device": self.device, "mode": self.mode, "why": self.why, "gpus": self.inventory,
                "servers": [{"label": label, "wave": wave_of[label],
                             "cuda_visible_devices": self.env.get(label, {}).get("CUDA_VISIBLE_DEVICES"),
                             "gpu_memory_utilization": self.memory_fraction.get(label)}
                            for wave in self.waves for label in wave]}


def place(labels: Sequence[str], runtime: Any, build: Any, values: LaunchValues,
          weight_dirs: Iterable[str | Path | None], inventory: gpus.Inventory | None = None) -> Placement:
    """The placement of one server per label, in ``labels``' order (waves are consecutive runs of it)."""
    labels = list(labels)
    if values.device != "cuda":
        from . import memory

        mode, why = memory.choose_for(runtime, len(labels), weight_dirs, values.dtype)
        waves = [labels] if mode == "together" else [[label] for label in labels]
        return Placement("cpu", tuple(tuple(w) for w in waves), why)
    dirs = [d for d in weight_dirs if d]
    floor = _floor_bytes(dirs, values.dtype, build)
    return place_on_gpus(labels, runtime.vllm_servers, build.tensor_parallel_size, values.memory_fraction,
                         inventory or gpus.inventory(), floor)


def _floor_bytes(dirs: list[str | Path], dtype: str, build: Any) -> int | None:
    from ...models import size
    from .launch import max_model_len

    if not dirs:
        return None
    draft = size.parameter_count(size.read_config(dirs[1])) if len(dirs) > 1 else 0
    return size.server_floor_bytes(size.read_config(dirs[0]), dtype, build.tensor_parallel_size,
                                   int(build.max_seq_len), draft or 0)


def _groups(inventory: gpus.Inventory, tp: int, fraction: float) -> tuple[list[list[gpus.Gpu]], list[gpus.Gpu]]:
    """GPU groups of ``tp`` with room for ``fraction`` of each GPU, and the GPUs without that room."""
    room = [g for g in inventory.gpus if g.free_bytes >= fraction * g.total_bytes]
    busy = [g for g in inventory.gpus if g not in room]
    return [room[i * tp:(i + 1) * tp] for i in range(len(room) // tp)], busy


def _env(group: list[gpus.Gpu]) -> dict[str, str]:
    return {"CUDA_VISIBLE_DEVICES": ",".join(g.visible_id for g in group)}


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def place_on_gpus(labels: list[str], mode: str, tp: int, fraction: float | None, inventory: gpus.Inventory,
                  floor_bytes: int | None = None) -> Placement:
    """The CUDA placement (pure: the inventory is given). ``fraction``: each server's memory fraction (None:
    vLLM's own); ``floor_bytes``: what one server needs per GPU at the least (None: unknown, not checked)."""
    n, tp = len(labels), max(int(tp), 1)
    asked = fraction if fraction is not None else ENGINE_MEMORY_FRACTION
    facts = inventory.as_dict()
    if not inventory.count:
        if mode == "together":
            share = math.floor(asked / n * 100) / 100
            return Placement("cuda", (tuple(labels),), f"GPU inventory unknown ({inventory.source}); "
                             f"runtime.vllm_servers: together: {n} servers share the GPUs vLLM finds, "
                             f"--gpu-memory-utilization {share:g} each",
                             memory_fraction={label: share for label in labels} if n > 1 else {}, inventory=facts)
        return Placement("cuda", tuple((label,) for label in labels),
                         f"GPU inventory unknown ({inventory.source}): one server at a time, on the GPUs vLLM finds",
                         inventory=facts)
    groups, busy = _groups(inventory, tp, asked)
    skipped = ("; without room, skipped: " + ", ".join(
        f"GPU {g.visible_id} ({_gib(g.free_bytes)} of {_gib(g.total_bytes)} free)" for g in busy)) if busy else ""
    if not groups:
        raise EnvironmentMissing(
            f"no {tp} GPU(s) with room for a vLLM server: each asks {asked:g} of a GPU's memory free at start "
            f"(vLLM's own check), and " + ", ".join(f"GPU {g.visible_id} has {_gib(g.free_bytes)} of "
                                                     f"{_gib(g.total_bytes)} free" for g in inventory.gpus),
            fix="free the GPUs, set runtime.vllm_memory_fraction lower, or build.tensor_parallel_size to the GPUs "
                "there are")
    per = f"{tp} GPU{'s' if tp > 1 else ''} each (build.tensor_parallel_size: {tp})"
    have = f"{len(groups)} group(s) of {tp} GPU(s) with room for {asked:g} of their memory"
    if mode == "sequential" or (mode == "auto" and len(groups) == 1 and n > 1):
        why = ("runtime.vllm_servers: sequential" if mode == "sequential" else
               f"{have}, {n} servers: one at a time") + f", on GPUs {_env(groups[0])['CUDA_VISIBLE_DEVICES']}"
        return Placement("cuda", tuple((label,) for label in labels), why + skipped,
                         env={label: _env(groups[0]) for label in labels}, inventory=facts)
    if len(groups) >= n:
        return Placement("cuda", (tuple(labels),), f"{have}: all {n} servers at once, {per}, none shared" + skipped,
                         env={label: _env(groups[i]) for i, label in enumerate(labels)}, inventory=facts)
    if mode == "together":
        sharing = math.ceil(n / len(groups))
        share = math.floor(asked / sharing * 100) / 100
        smallest = min(g.total_bytes for group in groups for g in group)
        if floor_bytes is not None and share * smallest < floor_bytes:
            raise InputError(
                f"runtime.vllm_servers: together: {n} servers on {have} would share a GPU {sharing} ways, "
                f"--gpu-memory-utilization {share:g} ({_gib(share * smallest)}) each, and one server needs about "
                f"{_gib(floor_bytes)} (weights, one sequence of build.max_seq_len, overhead)",
                fix="set runtime.vllm_servers: auto (servers in waves on their own GPUs) or sequential")
        return Placement("cuda", (tuple(labels),),
                         f"runtime.vllm_servers: together: {n} servers on {have}, {sharing} per group, "
                         f"--gpu-memory-utilization {share:g} each" + skipped,
                         env={label: _env(groups[i % len(groups)]) for i, label in enumerate(labels)},
                         memory_fraction={label: share for label in labels}, inventory=facts)
    size = len(groups)
    waves = [labels[i:i + size] for i in range(0, n, size)]
    env = {label: _env(groups[i]) for wave in waves for i, label in enumerate(wave)}
    return Placement("cuda", tuple(tuple(w) for w in waves),
                     f"{have}, {n} servers: {size} at a time, {per}, none shared" + skipped, env=env, inventory=facts)
