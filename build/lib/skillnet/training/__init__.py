"""Shared training machinery for pre-training and fine-tuning (never imports DeepSpeed at import time)."""

from .batch import Batch, BatchSource
from .config import DsConfigError, TrainConfig
from .optim import MaskedAdamW
from .trainer import Trainer, TrainResult, prepare

__all__ = [
    "Batch",
    "BatchSource",
    "DsConfigError",
    "MaskedAdamW",
    "TrainConfig",
    "TrainResult",
    "Trainer",
    "prepare",
]
