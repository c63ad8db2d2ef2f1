"""Checkpoint layout, atomic writes and rotation.

    <output_dir>/checkpoints/
        latest                      text file with the newest complete tag (written last, atomically)
        step_00000100/
            trainer_rank{r}.pt      per-rank: step, batch-source state, RNG states (exact data position)
            plain.pt                (single process) model + optimizer + scheduler
            <DeepSpeed files>       (DeepSpeed) model / ZeRO optimizer partitions / scheduler

A tag is only named in `latest` after every rank finished writing, so a crash mid-save leaves the
previous checkpoint as the one that resumes.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "atomic_torch_save",
    "atomic_write_text",
    "checkpoint_root",
    "tag_for_step",
    "read_latest",
    "rotate",
    "rng_state",
    "set_rng_state",
]


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


def rotate(root: Path, keep_last: int) -> None:
    """Delete all but the newest `keep_last` step directories (never the one `latest` names)."""
    if keep_last <= 0:
        return
    latest = read_latest(root)
    tags = sorted(p.name for p in root.glob("step_*") if p.is_dir())
    for t in tags[:-keep_last]:
        if t != latest:
            shutil.rmtree(root / t, ignore_errors=True)


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
