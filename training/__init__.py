"""Shared training machinery for pre-training and fine-tuning (never imports DeepSpeed at import time)."""

from .batch import Batch, BatchSource
from .callbacks import TrainerCallback
from .checkpoint import CheckpointManager
from .config import DsConfigError, TrainConfig
from .launch import prepare
from .optim import MaskedAdamW
from .skill_stats import SkillStatistics
from .trainer import Trainer, TrainResult

__all__ = [
    "Batch",
    "BatchSource",
    "CheckpointManager",
    "DsConfigError",
    "MaskedAdamW",
    "SkillStatistics",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "TrainerCallback",
    "prepare",
]
