"""Per-task gradient normalisation (``TrainConfig.task_grad_norm``): each task's loss is multiplied before its
backward by a factor that brings its gradient norm to the mean over tasks.

Why: multi-task training draws one task per step, and every task shares one AdamW and one gradient clip. A task
whose loss sits on a smaller scale (NER's CRF loss, per word) gives the shared encoder a gradient several times
smaller than the per-example losses of the others, so Adam's shared second moment, which the larger gradients
set, and the clip starve it (issue 49). Task t's factor is

    s_t = mean over measured tasks u of EMA_u  /  EMA_t

where EMA_t averages the global gradient norm (before clipping) of t's *unscaled* loss over t's earlier steps:
the measured norm divided by the s that step used. s_t = 1 on t's first step and while fewer than two tasks
have been measured. The trainer calls ``scale`` before each backward and ``observe`` after each optimizer step;
the logged ``<task>/loss`` stays the unscaled loss, ``<task>/grad_scale`` is the factor used. The EMAs are part
of the checkpoint (the trainer's extra state), so a resumed run goes on with the factors it would have used.

One micro-batch per optimizer step (``grad_accum`` 1): a step's norm is then one task's. A variant is one class
in ``TASK_GRAD_NORMS``; "off" builds none and costs nothing.
"""

from __future__ import annotations

import math
import statistics
from typing import TYPE_CHECKING, Any, Protocol

from .config import DsConfigError

if TYPE_CHECKING:
    import torch

    from .config import TrainConfig

__all__ = ["EMA_DECAY", "EmaTaskGradNorm", "TASK_GRAD_NORMS", "TaskBalance", "build_task_balance"]

# Each task's norm is averaged over about its last 1 / (1 - 0.9) = 10 steps of its own: enough to smooth one
# batch's noise (a factor set by one odd batch would shake that task's next steps), short enough to follow the
# norm as it drifts during training. Steps are counted per task, so a rarely drawn task is not forgotten.
EMA_DECAY = 0.9


class TaskBalance(Protocol):
    """What the trainer calls: ``scale`` before each backward, ``observe`` after each optimizer step, and the
    checkpoint's ``state_dict`` / ``load_state_dict``."""

    def scale(self, task: str, loss: torch.Tensor) -> tuple[torch.Tensor, float]: ...

    def observe(self, grad_norm: Any) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class EmaTaskGradNorm:
    """``task_grad_norm="ema"``: the factor of a task is the mean of the tasks' norm EMAs over its own."""

    def __init__(self, decay: float = EMA_DECAY) -> None:
        self.decay = decay
        self.ema: dict[str, float] = {}
        self._pending: tuple[str, float] | None = None  # (task, factor) of the step being computed

    def factor(self, task: str) -> float:
        """The factor ``task``'s next step uses."""
        if task not in self.ema or len(self.ema) < 2:
            return 1.0
        return statistics.fmean(self.ema.values()) / self.ema[task]

    def scale(self, task: str, loss: torch.Tensor) -> tuple[torch.Tensor, float]:
        """The loss to backpropagate for one micro-batch of ``task``, and the factor it carries."""
        s = self.factor(task)
        self._pending = (task, s)
        return loss * s, s

    def observe(self, grad_norm: Any) -> None:
        """Fold the step's global gradient norm (before clipping), unscaled, into its task's EMA.

        ``grad_norm`` may be a device tensor: it is read back here, once per step. That sync is the price of
        this option (the next step's factor depends on it); with "off" nothing is built and nothing read. A
        non-finite norm (a skipped, overflowed step) or a zero one (no gradient) measures nothing and is left out.
        """
        if self._pending is None:
            return
        task, s = self._pending
        self._pending = None
        if grad_norm is None:
            raise DsConfigError("task_grad_norm ema: the DeepSpeed engine reported no gradient norm for this step "
                                "(zero_optimization.compute_grad_norm false?); it needs one: turn it on, or use "
                                "task_grad_norm off")
        norm = float(grad_norm) / s
        if not math.isfinite(norm) or norm <= 0.0:
            return
        old = self.ema.get(task)
        self.ema[task] = norm if old is None else self.decay * old + (1.0 - self.decay) * norm

    def state_dict(self) -> dict[str, Any]:
        return {"ema": dict(self.ema)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.ema = {str(k): float(v) for k, v in state["ema"].items()}
        self._pending = None


# TrainConfig.task_grad_norm's values -> the class that does it (None: nothing to do).
TASK_GRAD_NORMS: dict[str, type[EmaTaskGradNorm] | None] = {"off": None, "ema": EmaTaskGradNorm}


def build_task_balance(cfg: TrainConfig, engine: Any = None) -> TaskBalance | None:
    """The balancer ``cfg.task_grad_norm`` names for a trainer whose config is resolved (``prepare``), or None
    for "off". DsConfigError (one line) where it cannot work: more than one micro-batch per step, or a
    DeepSpeed engine that keeps no global gradient norm (fp32 without ZeRO, or ZeRO told not to compute it)."""
    kind = TASK_GRAD_NORMS[cfg.task_grad_norm]
    if kind is None:
        return None
    if cfg.grad_accum != 1:
        raise DsConfigError(
            f"task_grad_norm {cfg.task_grad_norm} needs one micro-batch per optimizer step (a step's gradient norm "
            f"is then one task's), but this run accumulates {cfg.grad_accum} (the DeepSpeed JSON's "
            f"gradient_accumulation_steps, or batch_size over micro_batch_size): use grad_accum 1 or task_grad_norm "
            f"off")
    if engine is not None:
        # DeepSpeed computes the global norm in its ZeRO, fp16 and bf16 optimizers only: fp32 without ZeRO hands
        # clipping to torch and get_global_grad_norm() stays None (engine._take_model_step, DeepSpeed 0.19).
        wrapped = engine.zero_optimization_stage() > 0 or engine.fp16_enabled() or engine.bfloat16_enabled()
        if not callable(getattr(engine, "get_global_grad_norm", None)) or not wrapped:
            raise DsConfigError(
                f"task_grad_norm {cfg.task_grad_norm}: this DeepSpeed engine keeps no global gradient norm (fp32 "
                f"without ZeRO); use a ZeRO stage (e.g. ds_configs/zero2.json), run without DeepSpeed, or use "
                f"task_grad_norm off")
        # ZeRO 1/2 with zero_optimization.compute_grad_norm false skips the norm (DeepSpeed 0.19): refused at
        # start, not at the first step's observe after the whole launch's set-up
        if getattr(getattr(engine, "optimizer", None), "compute_grad_norm", True) is False:
            raise DsConfigError(
                f"task_grad_norm {cfg.task_grad_norm}: this DeepSpeed engine computes no global gradient norm "
                f"(zero_optimization.compute_grad_norm false); turn it on, or use task_grad_norm off")
    return kind()
