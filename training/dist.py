"""Small distributed helpers that work with and without a process group (plain single process)."""

from __future__ import annotations

import contextlib
import glob
import os
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "init_distributed",
    "rank",
    "world_size",
    "is_main",
    "barrier",
    "all_reduce_sum",
    "all_reduce_host_sum",
    "launched_world_size",
    "release_shared_memory",
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


def release_shared_memory() -> None:
    """Unlink this rank's /dev/shm buffer of DeepSpeed's CPU shared-memory allreduce
    (``deepspeed_allreduce_buffer_*_<addr>_<port>_<rank>``, 66 MB per rank and launch, never removed by DeepSpeed).

    Call only after a barrier that follows training: each rank maps every other rank's buffer when it first
    communicates, spinning until the file exists, so an earlier unlink could hang a slower rank. Mappings stay
    valid after the unlink, so later collectives of the run still work."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not (_active() and addr and port):
        return
    for path in glob.glob(f"/dev/shm/deepspeed_allreduce_buffer_*_{addr}_{port}_{rank()}"):
        with contextlib.suppress(OSError):
            os.unlink(path)


def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """In-place sum over ranks (no-op in a single process). gloo needs CPU tensors, NCCL device ones."""
    if _active() and dist.get_world_size() > 1:
        dev = x.device
        if dist.get_backend() == "gloo":
            y = x.cpu()
        elif dev.type == "cpu" and torch.cuda.is_available():
            y = x.to(torch.device("cuda", torch.cuda.current_device()))
        else:
            y = x
        dist.all_reduce(y, op=dist.ReduceOp.SUM)
        if y is not x:
            x.copy_(y.to(dev))
    return x


_HOST_GROUP: list[Any] = []


def all_reduce_host_sum(values: list[float]) -> list[float]:
    """Sum Python numbers over ranks through a gloo group: the host-side flags of every step (a stop
    request) agree on every rank without a GPU collective, so nothing waits for the device."""
    if not (_active() and dist.get_world_size() > 1):
        return list(values)
    if not _HOST_GROUP:  # created on first use, which every rank reaches at the same step
        _HOST_GROUP.append(None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo"))
    x = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(x, op=dist.ReduceOp.SUM, group=_HOST_GROUP[0])
    return x.tolist()
