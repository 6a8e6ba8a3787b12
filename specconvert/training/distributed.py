"""Data-parallel training: one process per device, launched by torchrun.

``draft.train.num_processes: N`` makes ``specconvert convert`` re-launch itself as
``torchrun --standalone --nproc-per-node N -m specconvert convert ...``. Every process
loads the target on its own device, synthesizes its share of the prompts (the shares
are then exchanged), and trains on its own slice of each global batch; gradients are
averaged across processes after every backward pass, so every process holds the same
head. Process 0 alone writes checkpoints and the stage directory. NCCL on CUDA, gloo
on CPU (which is how the tests exercise it).

The data phase (self:N prompts, synthesis; hours on a real dataset) runs **before** the
process group exists: its exchanges (:func:`gather`) go through files in the workdir
(:class:`FileExchange`), which wait as long as the work takes. A collective has a timeout
(torch's NCCL default is 10 minutes), so processes waiting in one while process 0
synthesizes would be killed. The group is joined after the data (:func:`init`), and its
collectives then pair up within seconds. torchrun still ends every process when one dies.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

TIMEOUT_ENV = "SPECCONVERT_COLLECTIVE_TIMEOUT_S"  # seconds a collective of the training group waits (torch's default)


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    exchange: "FileExchange | None" = field(default=None, compare=False)  # before the group: gather through files

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.size > 1


def current() -> World:
    """The process's place in a torchrun launch (a single process when not launched by torchrun)."""
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if size <= 1:
        return World()
    return World(int(os.environ.get("RANK", "0")), size, int(os.environ.get("LOCAL_RANK", "0")))


def device_for(world: World, device: str) -> str:
    """This process's device (``cuda:<local rank>`` on GPUs), made current; needs no process group."""
    if not world.parallel or not device.startswith("cuda"):
        return device
    import torch

    torch.cuda.set_device(world.local_rank)
    return f"cuda:{world.local_rank}"


def init(world: World, device: str) -> str:
    """Join the process group; returns this process's device (``cuda:<local rank>`` on GPUs).

    Join it after the data phase (:func:`before_group`): its collectives time out after torch's
    default, or ``SPECCONVERT_COLLECTIVE_TIMEOUT_S`` seconds when that is set.
    """
    if not world.parallel:
        return device
    import torch.distributed as dist

    device = device_for(world, device)
    if not dist.is_initialized():
        options: dict[str, Any] = {}
        if os.environ.get(TIMEOUT_ENV):
            from datetime import timedelta

            options["timeout"] = timedelta(seconds=float(os.environ[TIMEOUT_ENV]))
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo", **options)
    return device


class FileExchange:
    """:func:`gather` before the process group exists: each process writes its part as a JSON file
    (temp file + rename) and waits, without a timeout, for the others' parts of the same round.

    One folder per launch (torchrun's run id) under the workdir's cache, on the one host of a
    ``--standalone`` launch. Every process calls :func:`gather` in the same order (as with a
    collective), so round ``n`` of every process pairs up.
    """

    def __init__(self, folder: Path, world: World, poll_s: float = 0.2):
        self.folder = Path(folder)
        self.rank, self.size = world.rank, world.size
        self.poll_s = poll_s
        self.rounds = 0
        self.folder.mkdir(parents=True, exist_ok=True)

    def gather(self, obj: Any) -> list[Any]:
        n = self.rounds
        self.rounds += 1
        mine = self.folder / f"{n}-{self.rank}.json"
        partial = mine.with_name(mine.name + ".partial")
        partial.write_text(json.dumps(obj), encoding="utf-8")
        os.replace(partial, mine)
        out = []
        for rank in range(self.size):
            path = self.folder / f"{n}-{rank}.json"
            while not path.is_file():  # as long as process `rank`'s work takes; torchrun ends us if it dies
                time.sleep(self.poll_s)
            out.append(json.loads(path.read_text(encoding="utf-8")))
        return out


def launch_id() -> str:
    """The same name in every process of one launch: torchrun's run id, else the rendezvous address."""
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if run and run != "none":
        return run
    return f"{os.environ.get('MASTER_ADDR', 'local')}-{os.environ.get('MASTER_PORT', '0')}"


def before_group(world: World, folder: Path) -> World:
    """``world`` for the data phase: its :func:`gather` goes through files under ``folder``
    (one subfolder per launch; process 0 clears those of earlier, killed launches)."""
    if not world.parallel:
        return world
    mine = Path(folder) / launch_id()
    if world.main and Path(folder).is_dir():
        for old in Path(folder).iterdir():
            if old != mine and old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
    return replace(world, exchange=FileExchange(mine, world))


def end_data_phase(world: World) -> World:
    """After :func:`init`: once every process has read every part (a barrier), process 0 removes the files."""
    if world.exchange is None:
        return world
    barrier(world)
    if world.main:
        shutil.rmtree(world.exchange.folder, ignore_errors=True)
    return replace(world, exchange=None)


def finish(world: World) -> None:
    if world.parallel:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def average_gradients(params: Sequence[Any], world: World) -> None:
    if not world.parallel:
        return
    import torch.distributed as dist

    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad.div_(world.size)


def any_true(flag: bool, world: World) -> bool:
    """True on every process when it is true on any (a budget every process stops at together)."""
    if not world.parallel:
        return flag
    import torch
    import torch.distributed as dist

    backend = dist.get_backend()
    value = torch.tensor([1 if flag else 0], device=f"cuda:{world.local_rank}" if backend == "nccl" else "cpu")
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def gather(obj: Any, world: World) -> list[Any]:
    """Every process's ``obj``, in rank order (through files in the data phase: ``obj`` must be JSON then)."""
    if not world.parallel:
        return [obj]
    if world.exchange is not None:
        return world.exchange.gather(obj)
    import torch.distributed as dist

    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, obj)
    return out


def barrier(world: World) -> None:
    if world.parallel:
        import torch.distributed as dist

        dist.barrier()


def free_memory_fraction(runtime: Any, headroom: float = 0.9) -> float | None:
    """The ``--gpu-memory-utilization`` of a server started on GPU 0 beside this process.

    On CUDA (``runtime.device: cuda``, or ``auto`` with a GPU) and when the recipe sets no
    ``runtime.vllm_memory_fraction``: ``headroom`` of the share of GPU 0's memory free now (what other
    processes hold stays theirs; vLLM refuses to start when the share of the whole GPU it asks for is
    not free). Otherwise the recipe's value (on the CPU build, a fraction of RAM).
    """
    if runtime.device == "cpu" or runtime.vllm_memory_fraction is not None:
        return runtime.vllm_memory_fraction  # None: the device's default (backends.vllm.launch.DEVICE_DEFAULTS)
    import torch

    if not torch.cuda.is_available():
        return runtime.vllm_memory_fraction
    free, total = torch.cuda.mem_get_info(0)
    return max(0.01, int(100 * headroom * free / total) / 100)
