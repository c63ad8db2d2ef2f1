"""Shared training machinery for pre-training and fine-tuning (never imports DeepSpeed at import time).

The names below load on first use, so that importing one light module of the package does not import torch.
The command-line conventions and output-folder rules live below it, in skillnet.common."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_WHERE = {
    "Batch": "batch",
    "BatchSource": "batch",
    "CheckpointManager": "checkpoint",
    "DsConfigError": "config",
    "MaskedAdamW": "optim",
    "SkillStatistics": "skill_stats",
    "TrainConfig": "config",
    "TrainResult": "window",
    "Trainer": "trainer",
    "TrainerCallback": "callbacks",
    "prepare": "launch",
}

__all__ = ["Batch", "BatchSource", "CheckpointManager", "DsConfigError", "MaskedAdamW", "SkillStatistics",
           "TrainConfig", "TrainResult", "Trainer", "TrainerCallback", "prepare"]

if TYPE_CHECKING:
    from .batch import Batch, BatchSource
    from .callbacks import TrainerCallback
    from .checkpoint import CheckpointManager
    from .config import DsConfigError, TrainConfig
    from .launch import prepare
    from .optim import MaskedAdamW
    from .skill_stats import SkillStatistics
    from .trainer import Trainer
    from .window import TrainResult


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    globals()[name] = value
    return value
