"""Checkpoint layout, atomic writes, completeness markers, rotation and the run lock.

    <output_dir>/checkpoints/
        latest                      text file naming the newest complete tag (for people and tools)
        .run.lock                   held (flock) by every rank of the run that uses this directory
        step_00000100/
            trainer_rank{r}.pt      per-rank: step, batch-source state, RNG states (exact data position)
            plain.pt                (single process) model + optimizer + scheduler
            <DeepSpeed files>       (DeepSpeed) model / ZeRO optimizer partitions / scheduler
            complete                written last, after every rank finished writing

A checkpoint counts only once its `complete` marker exists: `--resume auto` takes the newest marked
one, so a save that was cut short (a kill, or ranks still writing when a requeued run starts) is never
loaded. A run also waits, before resuming, until no rank of an earlier run in the same directory is
alive (`hold_run_lock`), so a restart cannot read or rotate checkpoints while they are being written.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "COMPLETE_MARKER",
    "atomic_torch_save",
    "atomic_write_text",
    "checkpoint_root",
    "tag_for_step",
    "read_latest",
    "rotate",
    "mark_complete",
    "unmark_complete",
    "is_complete",
    "complete_tags",
    "latest_complete",
    "hold_run_lock",
    "rng_state",
    "set_rng_state",
]


COMPLETE_MARKER = "complete"


def checkpoint_root(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def tag_for_step(step: int) -> str:
    return f"step_{step:08d}"


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def atomic_torch_save(obj: Any, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    os.close(fd)
    try:
        torch.save(obj, tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def read_latest(root: Path) -> str | None:
    f = root / "latest"
    if not f.is_file():
        return None
    tag = f.read_text().strip()
    return tag or None


def mark_complete(ckpt_dir: Path, step: int) -> None:
    """Written by rank 0 after every rank finished writing ``ckpt_dir``: from now on it may be resumed."""
    atomic_write_text(ckpt_dir / COMPLETE_MARKER, json.dumps({"step": step, "time": time.time()}) + "\n")


def unmark_complete(ckpt_dir: Path) -> None:
    """Before files of ``ckpt_dir`` are (re)written: an old marker must not vouch for a mix of two saves."""
    (ckpt_dir / COMPLETE_MARKER).unlink(missing_ok=True)


def is_complete(ckpt_dir: Path) -> bool:
    return (ckpt_dir / COMPLETE_MARKER).is_file()


def complete_tags(root: Path) -> list[str]:
    """Tags of the complete checkpoints under ``root``, oldest first."""
    return sorted(p.name for p in root.glob("step_*") if p.is_dir() and is_complete(p))


def latest_complete(root: Path) -> str | None:
    """The newest complete checkpoint; checkpoints without a marker (a save cut short) are ignored.

    Checkpoints written before markers existed have none at all: then ``latest``, which was only ever
    written after every rank finished, still names a complete one.
    """
    tags = complete_tags(root)
    if tags:
        return tags[-1]
    legacy = read_latest(root)
    return legacy if legacy is not None and (root / legacy).is_dir() else None


def rotate(root: Path, keep_last: int) -> None:
    """Keep the newest ``keep_last`` complete checkpoints; delete older ones and the leftovers of
    interrupted saves older than the newest complete one (a newer one may still be being written)."""
    if keep_last <= 0:
        return
    done = complete_tags(root)
    if not done:
        return
    keep = set(done[-keep_last:])
    for p in root.glob("step_*"):
        if p.is_dir() and p.name not in keep and p.name < done[-1]:
            shutil.rmtree(p, ignore_errors=True)


def hold_run_lock(root: Path, rank: int, barrier: Any) -> Any:
    """Wait until no rank of an earlier run in ``root`` is still training or saving, then hold the lock
    (returns the open file: closing it releases the lock).

    Every rank holds a shared flock on ``root/.run.lock`` while it trains. Rank 0 of a new run first takes
    it exclusively, which waits for the ranks of a run that was stopped but is still writing its
    checkpoint (e.g. the single-node `deepspeed` launcher returns on SIGTERM before its ranks are done,
    and a requeue starts the next run at once). The other ranks follow once rank 0 has it. The kernel
    drops the lock when a process dies, however it dies. Where flock is not available (some network
    file systems) this only warns.
    """
    root.mkdir(parents=True, exist_ok=True)
    f = open(root / ".run.lock", "a+")  # noqa: SIM115 (the caller closes it)
    if rank == 0:
        _lock(f, exclusive_first=True, root=root)
    barrier()  # every rank passes here exactly once, whatever the lock did
    if rank != 0:
        _lock(f, exclusive_first=False, root=root)
    return f


def _lock(f: Any, exclusive_first: bool, root: Path) -> None:
    try:
        import fcntl  # noqa: PLC0415

        if exclusive_first:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(
                    f"[trainer] {root}: ranks of an earlier run are still alive (writing their checkpoint?); "
                    f"waiting for them to exit",
                    file=sys.stderr,
                    flush=True,
                )
                fcntl.flock(f, fcntl.LOCK_EX)
        fcntl.flock(f, fcntl.LOCK_SH)
    except (ImportError, OSError) as e:
        if exclusive_first:
            print(f"[trainer] {root}/.run.lock: no file lock ({e}); runs are not serialised", file=sys.stderr)


def rng_state() -> dict[str, Any]:
    st: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        st["cuda"] = torch.cuda.get_rng_state_all()
    return st


def set_rng_state(st: dict[str, Any]) -> None:
    random.setstate(st["python"])
    np.random.set_state(st["numpy"])
    torch.set_rng_state(st["torch"])
    if "cuda" in st and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(st["cuda"])
