"""Resuming a DeepSpeed run on another number of ranks (a requeue onto more or fewer nodes).

A checkpoint written by N ranks holds N ZeRO partitions. To continue on M ranks the trainer

1. keeps the global batch G of the checkpoint and re-derives micro-batch x accumulation for M ranks
   (``training.config.derive_geometry``), so step s still reads the same G samples (pretrain/objectives.py
   lays samples out per global step, whatever the geometry);
2. converts the checkpoint once, on rank 0, into DeepSpeed's universal format (one file per parameter and
   optimizer moment, ``deepspeed.checkpoint.ds_to_universal``) under ``checkpoints/universal/<tag>``, and
   loads that with ``"checkpoint": {"load_universal": true}`` in the engine's config;
3. restores what the universal loader does not keep (ZeRO-3 copies param group 0's hyperparameters into
   every group, so bias and LayerNorm would get weight decay) and reseeds the dropout streams, which
   belonged to ranks that no longer exist.

The ZeRO stage must stay the same: the universal files of ZeRO-1/2 and of ZeRO-3 differ (ZeRO-3 keeps no
per-parameter step count), and DeepSpeed loads neither into the other.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from skillnet.common.safe_load import load as safe_load

from . import dist as D

__all__ = ["UNIVERSAL_DIR", "read_trainer_state", "saved_geometry", "ensure_universal", "group_hyperparams", "restore_group_hyperparams"]

UNIVERSAL_DIR = "universal"


def read_trainer_state(tdir: Path, rank: int = 0) -> dict[str, Any]:
    """Rank ``rank``'s trainer state of checkpoint ``tdir`` (step, world size, data position, RNG, ...)."""
    tfile = tdir / f"trainer_rank{rank}.pt"
    if not tfile.is_file():
        raise FileNotFoundError(f"{tfile} missing: {tdir} is not a complete trainer checkpoint")
    return safe_load(tfile)


def saved_geometry(tdir: Path) -> dict[str, Any]:
    """World size, global batch, micro-batch, accumulation and ZeRO stage of checkpoint ``tdir`` (read
    from rank 0's trainer state; checkpoints from before these fields were saved carry the run's config)."""
    state = read_trainer_state(tdir)
    world = int(state["world_size"])
    tc = json.loads(state.get("train_config", "{}"))
    micro = int(state.get("micro_batch_size") or tc.get("micro_batch_size") or 0)
    accum = int(state.get("grad_accum") or tc.get("grad_accum") or 0)
    return {
        "world_size": world,
        "micro_batch_size": micro,
        "grad_accum": accum,
        "global_batch": int(state.get("global_batch") or micro * accum * world),
        "zero_stage": state.get("zero_stage"),
    }


def ensure_universal(tdir: Path, rank: int) -> Path:
    """The universal copy of checkpoint ``tdir`` (``<checkpoints>/universal/<tag>``), converted by rank 0
    if it does not exist yet; every rank returns after it is complete.

    The conversion writes into a temporary folder that is renamed when done and then marked complete, so
    a conversion cut short is redone, never loaded.
    """
    udir = tdir.parent / UNIVERSAL_DIR / tdir.name
    error = ""
    if rank == 0 and not (udir / "complete").is_file():
        tmp = udir.parent / f".tmp_{tdir.name}"
        log = io.StringIO()
        try:
            t0 = time.perf_counter()
            _convert(tdir, tmp, udir, log)
            # Written after the rename: the folder is whole once the marker exists.
            (udir / "complete").write_text(json.dumps({"from": str(tdir), "seconds": time.perf_counter() - t0}))
            print(f"[trainer] converted {tdir} to the universal format in {time.perf_counter() - t0:.1f} s: "
                  f"{udir}", flush=True)
        except Exception as e:  # every rank must hear of it, or the others wait in the collective below
            shutil.rmtree(tmp, ignore_errors=True)
            error = f"{type(e).__name__}: {e}"
            print(f"[trainer] the universal conversion of {tdir} failed: {error}\n{log.getvalue()[-4000:]}",
                  flush=True)
    # Rank 0's verdict reaches every rank (the others wait here, up to the process group's timeout, while
    # it converts), so no rank goes on to load while another stops, and no rank trusts its own view of a
    # shared file system.
    failed = torch.tensor([1.0 if error else 0.0])
    D.all_reduce_sum(failed)
    if failed.item() > 0:
        raise RuntimeError(
            f"the universal conversion of {tdir} failed on rank 0" + (f": {error}" if error else " (see its log)")
        )
    return udir


def _convert(tdir: Path, tmp: Path, udir: Path, log: io.StringIO) -> None:
    from deepspeed.checkpoint import ds_to_universal  # noqa: PLC0415

    from .deepspeed_patches import safe_checkpoint_loads  # noqa: PLC0415

    shutil.rmtree(tmp, ignore_errors=True)
    shutil.rmtree(udir, ignore_errors=True)
    args = argparse.Namespace(
        input_folder=str(tdir),
        output_folder=str(tmp),
        num_extract_workers=1,  # in-process: no worker pool inside a launched rank
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        # ZeRO-1/2 checkpoints of a model without `universal_checkpoint_info` (ours: no tensor or pipeline
        # parallelism) need DeepSpeed to fill in the empty default.
        inject_missing_state=True,
    )
    with contextlib.redirect_stdout(log), safe_checkpoint_loads():
        ds_to_universal.main(args)
    tmp.rename(udir)
    (udir.parent / "latest_universal").unlink(missing_ok=True)  # names the temp folder; we pass tags


_KEEP_LOADED = ("params", "lr", "step")


def group_hyperparams(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    """Each param group's settings (weight decay, betas, peak lr, ...) before a universal load."""
    return [{k: v for k, v in g.items() if k not in _KEEP_LOADED} for g in optimizer.param_groups]


def restore_group_hyperparams(
    optimizer: torch.optim.Optimizer, saved: list[dict[str, Any]], last_lrs: list[float]
) -> None:
    """Undo ZeRO-3's universal load, which copies group 0's settings into every group: put back each
    group's own settings and its learning rate at the resumed step (the scheduler's last one)."""
    if len(saved) != len(optimizer.param_groups) or len(last_lrs) != len(saved):
        raise RuntimeError(
            f"optimizer has {len(optimizer.param_groups)} param groups after the load, {len(saved)} before and "
            f"{len(last_lrs)} scheduled learning rates"
        )
    for g, hp, lr in zip(optimizer.param_groups, saved, last_lrs, strict=True):
        g.update(hp)
        g["lr"] = lr
