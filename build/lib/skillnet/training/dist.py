"""Small distributed helpers that work with and without a process group (plain single process)."""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

__all__ = [
    "init_distributed",
    "rank",
    "world_size",
    "is_main",
    "barrier",
    "all_reduce_sum",
    "launched_world_size",
]


def launched_world_size() -> int:
    """World size announced by a launcher (deepspeed, torchrun, Slurm via the launcher); 1 otherwise."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed() -> tuple[int, int]:
    """Initialise the process group if a launcher started several ranks (idempotent).

    CPU uses gloo (DeepSpeed's CPU default, oneCCL, is not installed); GPUs use NCCL.
    Returns (rank, world_size).
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        import deepspeed  # noqa: PLC0415  (slow import, only when a launcher is used)

        backend = "nccl" if torch.cuda.is_available() else "gloo"
        deepspeed.init_distributed(dist_backend=backend)
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _active() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if _active() else 0


def world_size() -> int:
    return dist.get_world_size() if _active() else 1


def is_main() -> bool:
    return rank() == 0


def barrier() -> None:
    if _active():
        dist.barrier()


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks (no-op in a single process). gloo needs CPU tensors."""
    if _active() and dist.get_world_size() > 1:
        dev = x.device
        y = x.cpu() if dist.get_backend() == "gloo" else x
        dist.all_reduce(y, op=dist.ReduceOp.SUM)
        if y is not x:
            x.copy_(y.to(dev))
    return x
