"""Before a trainer is built: initialise distributed (if launched) and resolve the batch geometry.

``prepare`` checks the DeepSpeed JSON against the launch, and, for a run that resumes a checkpoint written
by another number of ranks, keeps its global batch and asks DeepSpeed for a universal load
(training/reshard.py).
"""

from __future__ import annotations

from typing import Any

import torch

from . import dist as D
from .checkpoint import CheckpointManager
from .config import (
    DsConfigError,
    TrainConfig,
    load_ds_config,
    resolve_ds_config,
    resolve_warmup,
    single_rank_comm_off,
)
from .reshard import saved_geometry

__all__ = ["prepare"]


def prepare(config: TrainConfig) -> tuple[TrainConfig, dict[str, Any] | None]:
    """Initialise distributed (if launched), check the DeepSpeed JSON against the launch.

    Returns the resolved config (micro_batch_size / grad_accum filled in) and the DeepSpeed dict
    (None for a plain single-process run). Call it before building the batch source so the source
    uses the same batch geometry as the engine; Trainer calls it again (idempotent).
    """
    if config.ds_config:
        D.one_rank_without_launcher()
    _, world = D.init_distributed()
    if config.ds_config:
        raw = load_ds_config(config.ds_config)
        note = ("comm", str(config.output_dir))
        if single_rank_comm_off(raw, config, world) and D.rank() == 0 and note not in _NOTED:
            _NOTED.add(note)
            print(f"[trainer] one rank: ZeRO-{raw['zero_optimization'].get('stage')}'s overlap_comm and "
                  f"contiguous_gradients off (nothing to reduce across ranks; they would only copy every "
                  f"gradient and synchronise the device each step; pre-training's --zero-comm json keeps the JSON's)",
                  flush=True)
        saved = _resumed_on_other_world(config, world)
        if saved is None:
            ds, cfg = resolve_ds_config(raw, config, world, source=str(config.ds_config))
            return cfg, ds
        # A requeue onto another number of ranks: keep the global batch (and with it the data order) and
        # load through DeepSpeed's universal checkpoint (training/reshard.py).
        ds, cfg = resolve_ds_config(
            raw, config, world, source=str(config.ds_config), global_batch=saved["global_batch"]
        )
        ds["checkpoint"] = {**ds.get("checkpoint", {}), "load_universal": True}
        noted = (str(config.output_dir), world)
        if D.rank() == 0 and noted not in _NOTED:  # prepare runs twice (the caller's, Trainer's)
            _NOTED.add(noted)
            print(
                f"[trainer] resuming a checkpoint of {saved['world_size']} rank(s) on {world}: global batch "
                f"{saved['global_batch']} kept as micro-batch {cfg.micro_batch_size} x accumulation "
                f"{cfg.grad_accum} x {world} rank(s) (was {saved['micro_batch_size']} x {saved['grad_accum']} x "
                f"{saved['world_size']})",
                flush=True,
            )
        return cfg, ds
    if world > 1:
        raise RuntimeError(
            f"launched with {world} ranks but no --ds-config: multi-process training goes through DeepSpeed, "
            f"e.g. --ds-config ds_configs/zero2.json"
        )
    cfg = resolve_warmup(TrainConfig.from_dict({**config.__dict__}))
    cfg.micro_batch_size, cfg.grad_accum = _one_process_geometry(cfg)
    return cfg, None


def _one_process_geometry(cfg: TrainConfig) -> tuple[int, int]:
    """(micro-batch, accumulation) of a run without DeepSpeed: what is given, the rest from ``batch_size``
    (the global batch: here the batch of the one process), else micro-batch 8 without accumulation."""
    micro, accum, batch = cfg.micro_batch_size, cfg.grad_accum, cfg.batch_size
    if batch is None:
        return micro or 8, accum or 1
    if micro is not None and accum is not None:
        if micro * accum != batch:
            raise DsConfigError(f"batch_size {batch} but micro_batch_size {micro} x grad_accum {accum} = "
                                f"{micro * accum}; give two of the three")
        return micro, accum
    if micro is None and accum is None:
        return batch, 1
    name, given = ("micro_batch_size", micro) if micro is not None else ("grad_accum", accum)
    if batch % given:
        raise DsConfigError(f"batch_size {batch} is not a multiple of {name} {given}")
    return (given, batch // given) if micro is not None else (batch // given, given)


_NOTED: set[tuple[str, Any]] = set()  # what prepare (run twice) has printed


def _resumed_on_other_world(config: TrainConfig, world: int) -> dict[str, Any] | None:
    """The saved geometry of the checkpoint ``config.resume`` names when it was written by another number of
    ranks, else None (no resume, nothing to resume from, or the same world size)."""
    if not config.resume:
        return None
    keys = ("world_size", "global_batch", "micro_batch_size", "grad_accum")
    mine = torch.zeros(len(keys), dtype=torch.float64)
    error: Exception | None = None
    if D.rank() == 0:  # rank 0 decides for all: ranks must not build engines from two views of a shared disk
        try:
            tdir = CheckpointManager(config.output_dir, 0, world, config.keep_last).locate(config.resume)
            if tdir is not None:
                saved = saved_geometry(tdir)
                mine = torch.tensor([float(saved[k]) for k in keys], dtype=torch.float64)
        except (OSError, KeyError, RuntimeError) as e:  # raised after the collective: no rank is left waiting
            error, mine[0] = e, -1.0
    D.all_reduce_sum(mine)  # the others contribute zeros: a broadcast of rank 0's values
    if error is not None:
        raise error
    found = {k: int(v) for k, v in zip(keys, mine.tolist(), strict=True)}
    if found["world_size"] < 0:
        raise FileNotFoundError(f"--resume {config.resume}: rank 0 could not read the checkpoint (see its error)")
    return None if found["world_size"] in (0, world) else found
