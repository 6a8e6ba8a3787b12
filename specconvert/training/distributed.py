"""Data-parallel training: one process per device, launched by torchrun.

``draft.train.num_processes: N`` makes ``specconvert convert`` re-launch itself as
``torchrun --standalone --nproc-per-node N -m specconvert convert ...``. Every process
loads the target on its own device, synthesizes its share of the prompts (the shares
are then exchanged), and trains on its own slice of each global batch; gradients are
averaged across processes after every backward pass, so every process holds the same
head. Process 0 alone writes checkpoints and the stage directory. NCCL on CUDA, gloo
on CPU (which is how the tests exercise it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Sequence


@dataclass(frozen=True)
class World:
    rank: int = 0
    size: int = 1
    local_rank: int = 0

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


def init(world: World, device: str) -> str:
    """Join the process group; returns this process's device (``cuda:<local rank>`` on GPUs)."""
    if not world.parallel:
        return device
    import torch
    import torch.distributed as dist

    if device.startswith("cuda"):
        torch.cuda.set_device(world.local_rank)
        device = f"cuda:{world.local_rank}"
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device.startswith("cuda") else "gloo")
    return device


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
    """Every process's ``obj``, in rank order."""
    if not world.parallel:
        return [obj]
    import torch.distributed as dist

    out: list[Any] = [None] * world.size
    dist.all_gather_object(out, obj)
    return out


def barrier(world: World) -> None:
    if world.parallel:
        import torch.distributed as dist

        dist.barrier()
