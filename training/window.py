"""What one optimizer step reports, and the logging window that sums steps until a logging step reads
them back once (the trainer's only read-back of a window)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = ["LoggingWindow", "StepOutput", "TrainResult", "add_to"]


@dataclass
class StepOutput:
    """One optimizer step. From ``train_step()`` every figure is a number summed over ranks; the trainer's
    own loop calls ``train_step(reduce=False)``, whose ``sums`` and ``grad_norm`` may still be tensors on
    the device and this rank's alone (``loss`` NaN): they are reduced and read back once per logging step."""

    step: int
    loss: float
    sums: dict[str, tuple[Any, Any]]
    tokens: float
    grad_norm: Any
    lr: float
    stats: dict[str, float]  # from the callbacks' on_gradients: averaged over the steps that report them
    seconds: float
    stop: bool
    requested: bool = False
    slots: float = 0.0  # row slots (real tokens + padding) of the step's micro-batches, summed over ranks


@dataclass
class TrainResult:
    step: int
    stopped_by_signal: bool
    last_record: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None
    stop_reason: str = "max_steps"  # "max_steps" | "signal" (SIGTERM/SIGINT) | "requested" (request_stop)


def add_to(d: dict[str, list[float]], key: str, num: float, den: float) -> None:
    """Add (num, den) to the running sums of ``key``."""
    acc = d.setdefault(key, [0.0, 0.0])
    acc[0] += num
    acc[1] += den


class LoggingWindow:
    """The trainer's logging window: steps are summed here (``sums``, ``stats``, real tokens and row slots)
    and timed by a clock that evaluation and saving pause; a logging step reduces them over ranks in one
    read-back and turns them into one log record. Mixed into `Trainer`, whose state it reads."""

    _window: dict[str, list[Any]]
    _window_stats: dict[str, list[float]]
    _window_tokens: float
    _window_slots: float
    _window_time: float
    _window_steps: int
    _clock: float | None

    def _clock_resume(self) -> None:
        self._clock = time.perf_counter()

    def _clock_pause(self) -> None:
        """Stop the window's clock once the device has finished the queued steps (evaluation and saving
        are not training time; the steps before them are)."""
        if self._clock is None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self._window_time += time.perf_counter() - self._clock
        self._clock = None

    def _accumulate_window(self, out: StepOutput) -> None:
        for k, (num, den) in out.sums.items():
            acc = self._window.setdefault(k, [0.0, 0.0])
            acc[0] = acc[0] + num
            acc[1] = acc[1] + den
        for k, v in out.stats.items():
            add_to(self._window_stats, k, v, 1.0)
        self._window_tokens += out.tokens
        self._window_slots += out.slots
        self._window_steps += 1

    def _flush_window(self, out: StepOutput) -> dict[str, Any]:
        # The callbacks' figures may be device tensors: read back with the window's sums, in one transfer.
        logged: dict[str, Any] = {}
        for cb in self.callbacks:
            logged.update(cb.on_log(self))
        red = self._reduce({k: (v[0], v[1]) for k, v in self._window.items()}, out.grad_norm, logged)
        self._clock_pause()  # after the read-back: the window's steps have run
        rec: dict[str, Any] = {"step": out.step}
        for k in sorted(red["sums"]):
            num, den = red["sums"][k]
            rec[k] = num / den if den else float("nan")
        rec.update({k: num / den for k, (num, den) in sorted(self._window_stats.items())})
        rec["lr"] = out.lr
        if red["grad_norm"] is not None:
            rec["grad_norm"] = red["grad_norm"]
        per_s = 1.0 / self._window_time if self._window_time > 0 else 0.0
        # Real (non-padding) tokens/s, the figure that counts, beside the rows' padded size per second.
        rec["tokens_per_s"] = rec["real_tokens_per_s"] = self._window_tokens * per_s
        rec["padded_tokens_per_s"] = self._window_slots * per_s
        rec["real_token_share"] = self._window_tokens / self._window_slots if self._window_slots else float("nan")
        # wall time per optimizer step over the window (what padded tokens/s and MFU are computed from)
        rec["seconds_per_step"] = self._window_time / max(self._window_steps, 1)
        # Each task's (objective's) last logged loss: a window that drew only some of them keeps the others'.
        self._postfix.update({k.removesuffix("/loss"): f"{v:.4f}" for k, v in rec.items() if k.endswith("/loss")})
        if self.skipped_steps:
            rec["skipped_steps"] = self.skipped_steps
        total = sum(self._task_steps.values())
        if len(self._task_steps) > 1:  # the realised task (objective) mix since the start
            rec.update({f"mix/{t}": n / total for t, n in sorted(self._task_steps.items())})
        # A callback's NaN means "nothing to say in this window" (e.g. a skill no step used).
        rec.update({k: v for k, v in red["extra"].items() if not (isinstance(v, float) and math.isnan(v))})
        self._window, self._window_tokens, self._window_time, self._window_stats = {}, 0.0, 0.0, {}
        self._window_steps, self._window_slots = 0, 0.0
        self._clock_resume()
        return rec
