"""Small distributed helpers that work with and without a process group (plain single process)."""

from __future__ import annotations

import contextlib
import errno
import glob
import hashlib
import os
import socket
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "init_distributed",
    "rank",
    "world_size",
    "barrier",
    "all_reduce_sum",
    "all_reduce_host_sum",
    "release_shared_memory",
    "remove_stale_shared_memory",
    "LaunchError",
    "check_master_port",
    "prepare_extensions",
    "extensions_dir",
    "one_rank_without_launcher",
]


class LaunchError(ValueError):
    """A launch that cannot work as set up (the message says what to change)."""


def check_master_port() -> None:
    """Rank 0 of a launch: fail in one line when MASTER_PORT is taken (another job on this node?) instead of
    a DistNetworkError traceback from every rank. The other ranks cannot tell their own rank 0's port from
    a stranger's; the launcher stops them when rank 0 exits. Under torchrun (its elastic agent sets
    TORCHELASTIC_RUN_ID in every rank) the port is the launcher's: its agent hosts the rendezvous store there
    before any rank starts (and fails itself, in its own words, when the port is taken), so it is left alone."""
    port, rank = os.environ.get("MASTER_PORT"), os.environ.get("RANK")
    if not port or rank != "0" or "TORCHELASTIC_RUN_ID" in os.environ:
        return
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        # As torch's TCPStore binds: a port whose last run's connections linger in TIME_WAIT (a requeued job
        # on the same port seconds later) is free for it; only a live listener is another job.
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("", int(port)))
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                return
            raise LaunchError(
                f"port {port} is in use (another job on this node?): add --master_port N with a free port to the "
                f"deepspeed command (or set MASTER_PORT)"
            ) from None


def prepare_extensions(ops: Sequence[str] | None = None) -> Path:
    """Where DeepSpeed/torch build their C++ ops: one folder per Python environment (unless
    TORCH_EXTENSIONS_DIR says otherwise), so a build in another venv cannot block this one; and no launch left
    waiting forever on the lock a killed build leaves there (training/op_build.py guard_op_builds: prebuilt
    ops, else the lock patch, else a notice; `ops`: those the run builds, default the launch's). Call before any
    op is built."""
    from .op_build import LAUNCH_OPS, guard_op_builds  # noqa: PLC0415

    d = extensions_dir()
    os.environ["TORCH_EXTENSIONS_DIR"] = str(d)
    guard_op_builds(d, tuple(LAUNCH_OPS) if ops is None else ops)
    return d


def extensions_dir() -> Path:
    """TORCH_EXTENSIONS_DIR, else this Python environment's own folder under ~/.cache/skillnet/torch_extensions."""
    if d := os.environ.get("TORCH_EXTENSIONS_DIR"):
        return Path(d)
    env = hashlib.sha1(os.path.realpath(sys.prefix).encode()).hexdigest()[:10]
    return Path.home() / ".cache" / "skillnet" / "torch_extensions" / f"py{sys.version_info[0]}{sys.version_info[1]}-{env}"


# What a launcher (deepspeed, torchrun, srun under our sbatch scripts, mpirun) leaves in a rank's environment.
_LAUNCHED = ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "MV2_COMM_WORLD_RANK")


def one_rank_without_launcher() -> bool:
    """A DeepSpeed run started with plain `python` (an interactive node, a debugger): declare it rank 0 of 1
    on a free local port, so DeepSpeed initialises as one rank instead of falling back to MPI discovery (an
    mpi4py traceback where mpi4py is not installed). Returns whether it did; a launched rank is left alone."""
    if any(k in os.environ for k in _LAUNCHED) or (dist.is_available() and dist.is_initialized()):
        return False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                       "MASTER_ADDR": os.environ.get("MASTER_ADDR", "127.0.0.1"),
                       "MASTER_PORT": os.environ.get("MASTER_PORT", str(port))})
    print("[skillnet] no launcher: running as one rank (for several: deepspeed --num_gpus N ..., or srun with "
          "scripts/slurm/*.sbatch)", file=sys.stderr, flush=True)
    return True


def init_distributed() -> tuple[int, int]:
    """Initialise the process group if a launcher started several ranks (idempotent).

    CPU uses gloo (DeepSpeed's CPU default, oneCCL, is not installed); GPUs use NCCL.
    Returns (rank, world_size).
    """
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        check_master_port()
        prepare_extensions()
        if os.environ.get("LOCAL_RANK", "0") == "0" and not torch.cuda.is_available():
            remove_stale_shared_memory()
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


def barrier() -> None:
    if _active():
        dist.barrier()


# DeepSpeed's CPU allreduce buffers: /dev/shm/<prefix><...>_<addr>_<port>_<rank>
_SHM_PREFIX = "deepspeed_allreduce_buffer_"


def release_shared_memory() -> None:
    """Unlink this rank's /dev/shm buffer of DeepSpeed's CPU shared-memory allreduce
    (``deepspeed_allreduce_buffer_*_<addr>_<port>_<rank>``, 66 MB per rank and launch, never removed by DeepSpeed).

    Call only after a barrier that follows training: each rank maps every other rank's buffer when it first
    communicates, spinning until the file exists, so an earlier unlink could hang a slower rank. Mappings stay
    valid after the unlink, so later collectives of the run still work."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not (_active() and addr and port):
        return
    for path in glob.glob(f"/dev/shm/{_SHM_PREFIX}*_{addr}_{port}_{rank()}"):
        with contextlib.suppress(OSError):
            os.unlink(path)


def _mapped_shm() -> set[int]:
    """Inodes of the allreduce buffers that some process of this user maps now (/proc/<pid>/maps; by inode, as a
    process in another mount namespace shows another path)."""
    mapped: set[int] = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        with contextlib.suppress(OSError, ValueError), open(maps, encoding="utf-8", errors="replace") as f:
            mapped.update(int(line.split()[4]) for line in f if _SHM_PREFIX in line)
    return mapped


def remove_stale_shared_memory() -> list[str]:
    """Unlink the /dev/shm allreduce buffers that killed CPU launches left (66 MB per rank and launch: a killed
    rank never reaches `release_shared_memory`). Docker's default /dev/shm is 64 MB, so one left-over buffer
    there makes the next launch die with a bus error. A buffer is left over when it is this user's, no process
    this user can see maps it, and it is older than a minute (a launch starting beside this one creates and
    maps its buffers within that time). A process in another PID namespace (a container sharing /dev/shm) is
    not seen: a rank that has mapped its buffer keeps working, only the file's name goes. Returns the paths
    removed, and says so in one line."""
    now, removed, size = time.time(), [], 0
    candidates = []
    for path in glob.glob(f"/dev/shm/{_SHM_PREFIX}*"):
        with contextlib.suppress(OSError):
            st = os.stat(path)
            if st.st_uid == os.getuid() and now - st.st_mtime >= 60.0:
                candidates.append((path, st.st_ino, st.st_size))
    if not candidates:
        return []
    mapped = _mapped_shm()
    for path, ino, n in candidates:
        if ino in mapped:
            continue
        with contextlib.suppress(OSError):
            if os.stat(path).st_ino != ino:  # replaced meanwhile by a launch starting now
                continue
            os.unlink(path)
            removed.append(path)
            size += n
    if removed:
        print(f"[skillnet] removed {len(removed)} DeepSpeed allreduce buffers ({size / 2**20:.0f} MB) that killed "
              "launches had left in /dev/shm", file=sys.stderr, flush=True)
    return removed


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
