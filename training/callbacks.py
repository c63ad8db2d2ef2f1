"""The trainer's callback interface: telemetry that is not part of every training loop plugs in here.

    trainer = Trainer(model, source, cfg, callbacks=[SkillStatistics(skill_parameters(model))])

Every hook runs on every rank at the same point of the same step, so a hook may use collectives
(all-reduce); what it returns is logged by rank 0 only. The trainer calls, per run and per step:

- ``on_train_start(trainer)``: once, after a resume (``trainer.global_step`` is where the run continues)
  and before the first step.
- ``on_gradients(trainer) -> {name: value}``: once per optimizer step, on the last micro-batch, when the
  step's gradients are complete and before the optimizer (or clipping) touches them; only when the run
  logs (``log_every > 0``). Each value is averaged over the logging window's steps that reported it, so a
  statistic a step has nothing to say about is left out, not a zero sample.
- ``on_log(trainer) -> {name: value}``: at each logging step; merged into that record as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from torch import nn

    from .config import TrainConfig

__all__ = ["TrainerCallback", "TrainerState"]


class TrainerState(Protocol):
    """What a hook may read of the trainer (training.Trainer is one): callbacks depend on this, not on the
    trainer's module, so the trainer can import its callbacks' interface without a circle."""

    @property
    def cfg(self) -> TrainConfig: ...

    @property
    def global_step(self) -> int: ...

    @property
    def is_main(self) -> bool: ...

    @property
    def zero_stage(self) -> int: ...  # -1: plain PyTorch

    @property
    def engine(self) -> Any: ...  # the DeepSpeed engine, or None

    @property
    def module(self) -> nn.Module: ...


class TrainerCallback:
    """Base class with no-op hooks: subclasses override the ones they need."""

    def on_train_start(self, trainer: TrainerState) -> None:
        return None

    def on_gradients(self, trainer: TrainerState) -> dict[str, float]:
        return {}

    def on_log(self, trainer: TrainerState) -> dict[str, float]:
        return {}
