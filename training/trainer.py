"""One trainer for sparse pre-training and multi-task fine-tuning.

    trainer = Trainer(model, source, TrainConfig(...), evaluator=..., callbacks=[SkillStatistics(...)])
    result = trainer.train()     # -> train_step() per optimizer step -> forward_backward() per micro-batch

It owns a DeepSpeed engine when ``config.ds_config`` is set (any ZeRO stage, any launcher) and a plain
PyTorch optimizer otherwise (single process). In both cases the optimizer is ``MaskedAdamW`` so that a
skill no micro-batch of the step used stays bit-identical (parameters and moments), see training/optim.py.
Checkpoints are written and found by ``checkpoint.CheckpointManager``; telemetry beyond loss, metrics,
learning rate, gradient norm, throughput and the task mix comes from callbacks (``callbacks.py``), e.g.
the per-skill statistics of ``skill_stats.SkillStatistics``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import dist as D
from .batch import Batch, BatchSource
from .callbacks import TrainerCallback
from .checkpoint import CheckpointManager, ResumeError, atomic_write_text, reseed, rng_state, set_rng_state
from .config import TrainConfig
from .launch import prepare
from .logging import MetricsLogger, accuracy_metrics
from .optim import MaskedAdamW, build_param_groups
from .profile import StepProfiler
from .reshard import saved_geometry
from .skill_stats import SkillStatistics

__all__ = ["Trainer", "TrainResult", "StepOutput", "prepare", "lr_lambda"]

MetricsFn = Callable[[Batch, Any], dict[str, tuple[float, float]]]
Evaluator = Callable[[nn.Module, int], dict[str, float]]


def lr_lambda(cfg: TrainConfig) -> Callable[[int], float]:
    """Linear warmup over ``warmup_steps`` then linear decay to 0 at ``decay_steps`` (or flat).

    Step s (0-based) uses factor (s+1)/warmup during warmup so the first step does not waste a
    zero learning rate.
    """
    warm = max(0, cfg.warmup_steps)
    total = cfg.decay_steps if cfg.decay_steps is not None else cfg.max_steps
    constant = cfg.schedule == "constant"

    def f(s: int) -> float:
        if warm and s < warm:
            return (s + 1) / warm
        if constant:
            return 1.0
        return max(0.0, (total - s) / max(1, total - warm))

    return f


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


@dataclass
class TrainResult:
    step: int
    stopped_by_signal: bool
    last_record: dict[str, Any] = field(default_factory=dict)
    checkpoint: str | None = None
    stop_reason: str = "max_steps"  # "max_steps" | "signal" (SIGTERM/SIGINT) | "requested" (request_stop)


class Trainer:
    """Generic trainer; see docs/pretrain.md ("Trainer API") for the contract.

    Args:
        model: ``model(task=..., **tensors)`` returns an object with ``.loss`` (and ``.logits``).
        source: a ``BatchSource`` for this rank (one ``Batch`` per micro-step).
        config: ``TrainConfig`` (resolved with ``prepare`` or raw: resolved again here).
        evaluator: ``evaluator(model, step) -> {name: value}``, called on every rank (it may use
            collectives) every ``eval_every`` steps and at the end; logged as ``eval/<name>`` on rank 0.
        metrics_fn: per-micro-batch ``{name: (numerator, denominator)}``; logged as ``<task>/<name>``.
        callbacks: ``TrainerCallback`` objects (see callbacks.py), called in order.
        skill_params: ``{skill: [params]}`` (``model.surgery.skill_parameters``): shorthand for a
            ``SkillStatistics(skill_params)`` callback before ``callbacks`` (per-skill grad norms, drift).
        extra_state: objects with state_dict/load_state_dict saved in (and restored from) checkpoints.
        param_groups: optimizer groups (default ``build_param_groups(model, weight_decay)``); a group's
            own ``lr`` is its peak learning rate under the shared schedule.
        loss_fn: ``loss_fn(batch, output) -> loss`` in place of ``output.loss`` (e.g. label smoothing from
            the logits); the model's own loss is used when None.
        config_text: the run's configuration, written to TensorBoard as text at the start.
    """

    def __init__(
        self,
        model: nn.Module,
        source: BatchSource,
        config: TrainConfig,
        *,
        evaluator: Evaluator | None = None,
        metrics_fn: MetricsFn | None = accuracy_metrics,
        skill_params: dict[str, list[nn.Parameter]] | None = None,
        extra_state: dict[str, Any] | None = None,
        param_groups: list[dict[str, Any]] | None = None,
        loss_fn: Callable[[Batch, Any], torch.Tensor] | None = None,
        config_text: str | None = None,
        callbacks: Sequence[TrainerCallback] | None = None,
    ) -> None:
        self.cfg, self.ds_config = prepare(config)
        self.rank, self.world_size = D.rank(), D.world_size()
        self.source = source
        self.evaluator = evaluator
        self.metrics_fn = metrics_fn
        self.loss_fn = loss_fn
        self.config_text = config_text
        self.callbacks: list[TrainerCallback] = [SkillStatistics(skill_params)] if skill_params else []
        self.callbacks += list(callbacks or [])
        self.extra_state = extra_state or {}
        self.global_step = 0
        self._stop_requested = False
        self._stop_requested_by_user = False
        cfg = self.cfg
        self.checkpoints = CheckpointManager(cfg.output_dir, self.rank, self.world_size, cfg.keep_last)

        # Dropout streams differ per rank (the weights are identical: DeepSpeed broadcasts rank 0's).
        torch.manual_seed(cfg.seed + 1000 * self.rank)
        groups = param_groups if param_groups is not None else build_param_groups(model, cfg.weight_decay)
        optimizer = MaskedAdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, masked=cfg.sparse_updates,
                               impl=cfg.optim_impl)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
        if cfg.compile:
            compile_blocks(model)
        self.module = model
        if self.ds_config is not None:
            import deepspeed  # noqa: PLC0415

            guard = _device_overflow_guard(self.ds_config, optimizer)
            self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
                model=model, optimizer=optimizer, lr_scheduler=scheduler, config=self.ds_config
            )
            optimizer.init_state()  # see MaskedAdamW.init_state: ZeRO links state views after the first step
            optimizer.check_zeros_everywhere()  # flat partitions zero-fill the grads of unused parameters
            if guard:
                optimizer.found_inf_fn = self._guard_flag
                _sync_free_clip(self.engine.optimizer)
                _foreach_grad_norm(self.engine.optimizer)
            self.device = self.engine.device
            self.zero_stage = int(self.engine.zero_optimization_stage())
        else:
            self.engine = None
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model.to(self.device)
            self.optimizer, self.scheduler = optimizer, scheduler
            self.zero_stage = -1
        self.base_optimizer: MaskedAdamW = optimizer
        self.logger: MetricsLogger | None = None
        self._window: dict[str, list[Any]] = {}
        self._window_tokens = 0.0
        self._window_time = 0.0
        self._window_steps = 0
        self._clock: float | None = None  # wall time since the window's clock last (re)started
        self._postfix: dict[str, str] = {}  # the progress bar shows the last logged loss
        self._skipped_dev: torch.Tensor | None = None  # sync-free plain path: skipped steps, on the device
        self._window_stats: dict[str, list[float]] = {}  # the callbacks' statistics: (sum, count) per name
        self._last_saved_step = -1
        # The step of the last evaluation: saved with each checkpoint, so that a run resumed from its final
        # checkpoint (killed before it wrote its results) does not evaluate that step a second time. None: a
        # checkpoint from before this was saved, whose final evaluation is repeated as it always was.
        self._evaluated_step: int | None = -1
        self._task_steps: dict[str, int] = {}  # micro-batches per task (objective) since the start: the mix
        # Optimizer steps skipped for non-finite gradients: DeepSpeed's own count (fp16 loss scaling) plus
        # this base (the plain path's skips, the device guard's once read back, and a resumed run's total).
        self._skipped_base = 0
        self._guard_step: tuple[int, torch.Tensor | None] = (-1, None)  # the bf16 guard's flag, per engine step

    # ------------------------------------------------------------------ public API
    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped for non-finite gradients (fp16 overflow, a bad batch), since the run began."""
        return self._skipped_base + int(getattr(self.engine, "skipped_steps", 0) or 0)

    @skipped_steps.setter
    def skipped_steps(self, total: int) -> None:
        self._skipped_base = int(total) - int(getattr(self.engine, "skipped_steps", 0) or 0)

    def _guard_flag(self) -> torch.Tensor | None:
        """The bf16 guard's found_inf for this engine step: computed once, however many times DeepSpeed
        steps the optimizer (once per param group or ZeRO-3 sub-group)."""
        step = int(self.engine.global_steps)
        if self._guard_step[0] != step:
            self._guard_step = (step, _nonfinite_norm(self.engine.optimizer))
        return self._guard_step[1]

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def train(self) -> TrainResult:
        # Wait for the ranks of an earlier run in this directory that may still be saving (see checkpoint.py).
        run_lock = self.checkpoints.hold_run_lock()
        try:
            result = self._train()
        finally:
            run_lock.close()
            close = getattr(self.source, "close", None)  # a source's prefetching workers
            if callable(close):
                close()
        D.barrier()  # every rank has communicated: the shared-memory buffers can go
        D.release_shared_memory()
        return result

    def _train(self) -> TrainResult:
        cfg = self.cfg
        if cfg.resume:
            self.maybe_resume(cfg.resume)
        # an evaluation logged at the resumed step after its checkpoint was saved is repeated: its line goes
        self.logger = MetricsLogger(
            cfg.output_dir, self.is_main, cfg.max_steps, self.global_step, cfg.tensorboard, cfg.progress,
            drop_eval_at_initial=(self.global_step > 0 and self._evaluated_step is not None
                                  and self._evaluated_step != self.global_step),
        )
        if self.config_text:
            self.logger.text("config", self.config_text, self.global_step)
        for cb in self.callbacks:
            cb.on_train_start(self)
        if self.is_main:
            Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
            atomic_write_text(Path(cfg.output_dir) / "train_config.json", cfg.to_json())
        old_handlers = self._install_signal_handlers()
        profiler = (StepProfiler(cfg.profile_steps, Path(cfg.output_dir) / "profile", self.rank, self.device)
                    if cfg.profile_steps else None)
        last: dict[str, Any] = {}
        ckpt: str | None = None
        try:
            self._model_train(True)
            self._clock_resume()
            while self.global_step < cfg.max_steps:
                if profiler is not None:
                    profiler.before(self.global_step + 1)
                out = self.train_step(reduce=False)
                if profiler is not None:
                    profiler.after(out.step)
                self._accumulate_window(out)
                if cfg.log_every and (self._logs_at(out.step) or out.stop or out.requested):
                    last = self._flush_window(out)
                    self.logger.log(last)
                self.logger.advance(1, self._postfix)
                if cfg.eval_every and out.step % cfg.eval_every == 0 and out.step != cfg.max_steps:
                    self._clock_pause()
                    self.evaluate()
                    self._clock_resume()
                    if self._sync_flag(self._stop_requested_by_user):
                        ckpt = self.save_checkpoint()
                        self.logger.message(f"[trainer] stop requested by the evaluator at step {out.step}")
                        return TrainResult(out.step, False, last, ckpt, stop_reason="requested")
                if out.stop or out.requested:
                    if out.requested and not out.stop:
                        ckpt = self.save_checkpoint()
                        return TrainResult(out.step, False, last, ckpt, stop_reason="requested")
                    ckpt = self.save_checkpoint()
                    self.logger.message(
                        f"[trainer] stop requested (SIGTERM) at step {out.step}: checkpoint {ckpt}"
                    )
                    return TrainResult(out.step, True, last, ckpt, stop_reason="signal")
                if cfg.save_every and out.step % cfg.save_every == 0:
                    self._clock_pause()
                    ckpt = self.save_checkpoint()
                    self._clock_resume()
            if self.evaluator is not None and self._evaluated_step != self.global_step:
                self.evaluate()
            if self._last_saved_step != self.global_step:
                ckpt = self.save_checkpoint()
            return TrainResult(self.global_step, False, last, ckpt)
        finally:
            self._restore_signal_handlers(old_handlers)
            if self.logger is not None:
                self.logger.close()

    def _logs_at(self, step: int) -> bool:
        return bool(self.cfg.log_every) and (step % self.cfg.log_every == 0 or step == self.cfg.max_steps)

    def train_step(self, reduce: bool = True) -> StepOutput:
        """One optimizer step: ``grad_accum`` micro-batches, clip, step, schedule.

        Nothing is read back from the device: losses and metric sums stay device tensors, and the plain
        path skips a non-finite step on the device when the optimizer is sync-free (GPU). ``reduce=True``
        (the default for callers) then sums them over ranks and reads them back; the training loop passes
        False and does that once per logging window. The stop flags agree over ranks through a host-side
        (gloo) all-reduce every step, which no GPU work waits for."""
        cfg = self.cfg
        assert cfg.grad_accum is not None
        t0 = time.perf_counter()
        lr = float(self.base_optimizer.param_groups[0]["lr"])
        sums: dict[str, list[Any]] = {}
        tokens = 0.0
        step = self.global_step + 1
        # The callbacks' gradient statistics, every step of a run that logs (see callbacks.py).
        want_stats = bool(self.callbacks) and cfg.log_every > 0
        stats: dict[str, float] = {}
        if self.zero_stage == 3:
            # DeepSpeed's ZeRO-3 keeps every parameter's reduced gradient in one flat buffer and overwrites
            # only the entries of parameters that get a gradient: without this, a skill this step does not
            # use would be stepped again with the gradient of its last step (MaskedAdamW skips exact zeros).
            self.engine.optimizer.grad_partitions_flat_buffer.zero_()
        elif self.zero_stage in (1, 2) and getattr(self.engine.optimizer, "cpu_offload", False):
            # The same for ZeRO-1/2 with offload_optimizer: the fp32 gradient partition is a host buffer that
            # keeps the last gradient of a parameter this step does not reach (found by bench/real_size.py).
            for master in self.engine.optimizer.single_partition_of_fp32_groups:
                if master.grad is not None:
                    master.grad.zero_()
        for k in range(cfg.grad_accum):
            batch = next(self.source)
            loss, metrics = self.forward_backward(batch)
            _add(sums, f"{batch.task}/loss", loss, 1.0)
            _add(sums, "loss", loss, 1.0)
            self._task_steps[batch.task] = self._task_steps.get(batch.task, 0) + 1
            for name, (num, den) in metrics.items():
                _add(sums, f"{batch.task}/{name}", num, den)
            tokens += batch.num_tokens()
            last_micro = k == cfg.grad_accum - 1
            if last_micro and want_stats:
                for cb in self.callbacks:
                    stats.update(cb.on_gradients(self))
            if self.engine is not None:
                self.engine.step()  # DeepSpeed only updates at the accumulation boundary
                if last_micro and self.base_optimizer.found_inf_fn is not None and self._guard_step[1] is not None:
                    flag = self._guard_step[1]  # this step's, if the guard ran: counted once
                    self._skipped_dev = flag if self._skipped_dev is None else self._skipped_dev + flag
                    self._guard_step = (self._guard_step[0], None)
        grad_norm: Any
        if self.engine is not None:
            grad_norm = self.engine.get_global_grad_norm()  # a float or a device tensor: read when logged
            # fp16: DeepSpeed's loss scaler skips a step whose gradients overflowed (optimizer and schedule
            # untouched, the scale lowered); its count is part of skipped_steps, so the log shows it.
        else:
            grad_norm = self._plain_update()
        self.global_step = step

        if cfg.sigterm_at_step is not None and step == cfg.sigterm_at_step:
            if cfg.sigterm_group:
                if self.is_main:
                    os.killpg(os.getpgrp(), signal.SIGTERM)
            else:
                signal.raise_signal(signal.SIGTERM)
        # The stop flags (so every rank stops at the same step) and the token count: host numbers, summed
        # on the host.
        stop_f, req_f, tokens = D.all_reduce_host_sum(
            [1.0 if self._stop_requested else 0.0, 1.0 if self._stop_requested_by_user else 0.0, tokens]
        )
        out = StepOutput(step, math.nan, sums, tokens, grad_norm, lr, stats, time.perf_counter() - t0,
                         stop_f > 0, req_f > 0)
        if reduce:
            red = self._reduce({k: tuple(v) for k, v in sums.items()}, grad_norm)
            out.sums, out.grad_norm = red["sums"], red["grad_norm"]
            out.loss = out.sums["loss"][0] / max(out.sums["loss"][1], 1.0)
        return out

    def _plain_update(self) -> Any:
        """Clip, step and schedule without DeepSpeed; returns the gradient norm (a tensor when sync-free).

        A step whose gradients are not finite changes no weight and no Adam moment, as DeepSpeed's loss
        scaler skips an overflowed step, so one bad batch cannot write inf/NaN into the model. With the
        count optimizer (CPU) the host checks the norm and leaves the step counts and the schedule as they
        were too; with the sync-free optimizer (GPU) the device skips the update and the clock goes on, as
        under torch's GradScaler, and the skips are counted on the device until the next log."""
        cfg = self.cfg
        params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
        max_norm = cfg.max_grad_norm if cfg.max_grad_norm and cfg.max_grad_norm > 0 else math.inf
        if not params:
            self.optimizer.zero_grad(set_to_none=True)
            return 0.0
        if self.base_optimizer.sync_free(params[0].device):
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
            found_inf = (~torch.isfinite(norm)).float()
            self.optimizer.step(found_inf=found_inf)
            self.scheduler.step()
            self._skipped_dev = found_inf if self._skipped_dev is None else self._skipped_dev + found_inf
            self.optimizer.zero_grad(set_to_none=True)
            return norm.detach()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
        if math.isfinite(grad_norm):
            self.optimizer.step()
            self.scheduler.step()
        else:
            self._skipped_base += 1
        self.optimizer.zero_grad(set_to_none=True)
        return grad_norm

    def _reduce(
        self, sums: dict[str, tuple[Any, Any]], grad_norm: Any, logged: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Sum ``sums`` over ranks and read them back, with the gradient norm, the device's count of
        skipped steps and this rank's ``logged`` figures, in one transfer: the only read-back of a
        logging window."""
        keys = sorted(sums)
        vals: list[Any] = [x for k in keys for x in sums[k]]
        logged = logged or {}
        extra: list[Any] = [*logged.values(), grad_norm if grad_norm is not None else 0.0]
        if self._skipped_dev is not None:
            extra.append(self._skipped_dev)
        dev = next((v.device for v in vals + extra if isinstance(v, torch.Tensor)), torch.device("cpu"))
        parts = [v.detach().reshape(()).to(dev, torch.float64) if isinstance(v, torch.Tensor)
                 else torch.tensor(float(v), dtype=torch.float64, device=dev) for v in vals]
        vec = torch.stack(parts) if parts else torch.zeros(0, dtype=torch.float64, device=dev)
        D.all_reduce_sum(vec)  # ranks' sums: a device collective on NCCL
        local = torch.stack([v.detach().reshape(()).to(dev, torch.float64) if isinstance(v, torch.Tensor)
                             else torch.tensor(float(v), dtype=torch.float64, device=dev) for v in extra])
        flat = torch.cat([vec, local]).tolist()  # the window's one read-back
        red = {k: (flat[2 * i], flat[2 * i + 1]) for i, k in enumerate(keys)}
        at = len(vals)
        got = dict(zip(logged, flat[at : at + len(logged)]))
        at += len(logged)
        gn = None if grad_norm is None else flat[at]
        if self._skipped_dev is not None:
            self._skipped_base += int(flat[at + 1])
            self._skipped_dev = None
        return {"sums": red, "grad_norm": gn, "extra": got}

    def forward_backward(self, batch: Batch) -> tuple[Any, dict[str, tuple[Any, Any]]]:
        """Forward + backward of one micro-batch; returns (loss, metric sums) of this rank, as detached
        tensors on the device where the model made them (nothing is read back)."""
        batch = batch.to(self.device)
        if self.engine is not None:
            out = self.engine(task=batch.task, **batch.tensors)
            loss = out.loss if self.loss_fn is None else self.loss_fn(batch, out)
            self.engine.backward(loss)
        else:
            out = self.module(task=batch.task, **batch.tensors)
            loss = out.loss if self.loss_fn is None else self.loss_fn(batch, out)
            assert self.cfg.grad_accum is not None
            (loss / self.cfg.grad_accum).backward()
        metrics = self.metrics_fn(batch, out) if self.metrics_fn is not None else {}
        return loss.detach().float(), metrics

    def evaluate(self) -> dict[str, float]:
        if self.evaluator is None:
            return {}
        self._model_train(False)
        try:
            with torch.no_grad():
                res = self.evaluator(self.module, self.global_step)
            self._evaluated_step = self.global_step
        finally:
            self._model_train(True)
        if self.logger is not None:
            self.logger.log({"step": self.global_step, **res}, prefix="eval")
        return res

    def request_stop(self) -> None:
        """Stop after the current step / evaluation (e.g. early stopping from the evaluator).

        Safe to call on a single rank: the flag is all-reduced, so every rank stops at the same step.
        train() then checkpoints and returns ``stop_reason="requested"`` (``stopped_by_signal=False``).
        """
        self._stop_requested_by_user = True

    def _sync_flag(self, flag: bool) -> bool:
        v = torch.tensor([1.0 if flag else 0.0], dtype=torch.float64)
        D.all_reduce_sum(v)
        return bool(v.item() > 0)

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self) -> str:
        if self._skipped_dev is not None:  # the device's count of skipped steps since the last log
            self._skipped_base += int(self._skipped_dev.item())
            self._skipped_dev = None
        state = {
            "step": self.global_step,
            "world_size": self.world_size,
            # What a resume on another number of ranks needs before it builds the engine (reshard.py).
            "global_batch": int(self.cfg.micro_batch_size or 0) * int(self.cfg.grad_accum or 0) * self.world_size,
            "micro_batch_size": self.cfg.micro_batch_size,
            "grad_accum": self.cfg.grad_accum,
            "zero_stage": self.zero_stage if self.engine is not None else None,
            "source": self.source.state_dict(),
            "rng": rng_state(),
            "extra": {k: v.state_dict() for k, v in self.extra_state.items()},
            "train_config": self.cfg.to_json(),
            "task_steps": dict(self._task_steps),
            "skipped_steps": self.skipped_steps,
            "evaluated_step": self._evaluated_step,
        }
        path = self.checkpoints.save(
            self.global_step, state, engine=self.engine, plain=self._plain_state(),
            model_config=getattr(self.module, "config", None),
        )
        self._last_saved_step = self.global_step
        return path

    def maybe_resume(self, resume: str) -> bool:
        """``"auto"``: resume from the newest complete checkpoint in ``<output_dir>/checkpoints`` if any;
        else a checkpoints directory (its newest complete one) or one ``step_*`` directory."""
        tdir = self.checkpoints.locate(resume)
        if tdir is None:
            return False
        saved_world = saved_geometry(tdir)["world_size"]
        if saved_world != self.world_size and not getattr(self.source, "resumes_on_any_world_size", False):
            raise RuntimeError(
                f"{tdir}: written by {saved_world} rank(s), resumed by {self.world_size}; this run's batch source "
                f"({type(self.source).__name__}) continues its data order only on the world size it was written "
                f"with: relaunch with {saved_world} rank(s)"
            )
        state = self.checkpoints.load(tdir, engine=self.engine, plain=self._plain_state())
        self.source.load_state_dict(state["source"])
        for k, v in state.get("extra", {}).items():
            if k in self.extra_state:
                self.extra_state[k].load_state_dict(v)
        self.global_step = int(state["step"])
        self._check_schedule(tdir, state.get("train_config"))
        self._last_saved_step = self.global_step
        self._evaluated_step = state.get("evaluated_step")
        self.skipped_steps = int(state.get("skipped_steps", 0))
        if "resharded_from" in state:
            # Rank 0's counts of micro-batches per task, rescaled to this run's accumulation; the dropout
            # streams of the old ranks cannot be split over new ones: fresh ones, a function of the step.
            scale = (self.cfg.grad_accum or 1) / max(1, int(state.get("grad_accum") or 1))
            self._task_steps = {k: round(int(v) * scale) for k, v in state.get("task_steps", {}).items()}
            reseed(self.cfg.seed + 1000 * self.rank + 1_000_003 * self.global_step)
        else:
            self._task_steps = {k: int(v) for k, v in state.get("task_steps", {}).items()}
            set_rng_state(state["rng"])
        if self.is_main:
            moved = f" (written by {state['resharded_from']} rank(s))" if "resharded_from" in state else ""
            print(f"[trainer] resumed from {tdir}{moved} at step {self.global_step}", flush=True)
        return True

    def _check_schedule(self, tdir: Any, saved_json: str | None) -> None:
        """A resume with another LR schedule (a new --max-steps, --lr, warm-up or decay end) would restart the
        decay from wherever the new curve is at this step: refused unless ``cfg.new_schedule``, which applies
        it and prints the new curve."""
        if not saved_json:  # checkpoints from before the trainer saved its settings
            return
        known = {f for f in TrainConfig.__dataclass_fields__}
        old = TrainConfig.from_dict({k: v for k, v in json.loads(saved_json).items() if k in known})
        new = self.cfg

        def shape(c: TrainConfig) -> tuple[Any, ...]:
            return (c.lr, c.warmup_steps, c.schedule, c.decay_steps if c.decay_steps is not None else c.max_steps)

        if shape(old) == shape(new):
            return
        s = self.global_step  # 0-based index of the next step
        lr_old, lr_new = old.lr * lr_lambda(old)(s), new.lr * lr_lambda(new)(s)
        what = (f"the checkpoint's LR schedule (peak {old.lr:g}, warmup {old.warmup_steps}, {old.schedule}, decay "
                f"end {shape(old)[3]}) differs from this run's (peak {new.lr:g}, warmup {new.warmup_steps}, "
                f"{new.schedule}, decay end {shape(new)[3]}): at step {s + 1} the LR moves from {lr_old:.3g} to "
                f"{lr_new:.3g}")
        if not new.new_schedule:
            raise ResumeError(
                f"{tdir}: {what}. Pass --new-schedule to continue on this run's schedule, or resume with the "
                f"checkpoint's settings (e.g. --max-steps {old.max_steps})")
        # The loaded optimizer holds the old curve's LR for the next step: set this run's (peak and factor).
        factor = lr_lambda(new)(s)
        self.scheduler.base_lrs = [new.lr for _ in self.scheduler.base_lrs]
        for group in self.base_optimizer.param_groups:
            group["initial_lr"], group["lr"] = new.lr, new.lr * factor
        self.scheduler._last_lr = [g["lr"] for g in self.base_optimizer.param_groups]
        if self.is_main:
            end = max(s + 1, int(shape(new)[3]))
            points = sorted({s + 1, *(s + 1 + (end - s - 1) * i // 4 for i in range(1, 5))})
            curve = ", ".join(f"step {p} {new.lr * lr_lambda(new)(p - 1):.3g}" for p in points)
            print(f"[trainer] warning: {what} (--new-schedule). LR from here: {curve}", flush=True)

    def _plain_state(self) -> dict[str, Any] | None:
        """What a plain (non-DeepSpeed) checkpoint holds besides the trainer state; DeepSpeed's engine
        saves its own."""
        if self.engine is not None:
            return None
        return {"model": self.module, "optimizer": self.optimizer, "scheduler": self.scheduler}

    # ------------------------------------------------------------------ internals
    def _model_train(self, mode: bool) -> None:
        (self.engine if self.engine is not None else self.module).train(mode)

    def _install_signal_handlers(self) -> dict[int, Any]:
        old = {}

        def handler(signum: int, frame: Any) -> None:
            if self._stop_requested and signum == signal.SIGINT:
                raise KeyboardInterrupt
            self._stop_requested = True

        for s in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: no handlers
                old[s] = signal.signal(s, handler)
        return old

    @staticmethod
    def _restore_signal_handlers(old: dict[int, Any]) -> None:
        for s, h in old.items():
            signal.signal(s, h)

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
            _add(self._window_stats, k, v, 1.0)
        self._window_tokens += out.tokens
        self._window_steps += 1
        self._last_out = out

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
        rec["tokens_per_s"] = self._window_tokens / self._window_time if self._window_time > 0 else 0.0
        # wall time per optimizer step over the window (what padded tokens/s and MFU are computed from)
        rec["seconds_per_step"] = self._window_time / max(self._window_steps, 1)
        if "loss" in rec:
            self._postfix = {"loss": f"{rec['loss']:.4f}"}
        if self.skipped_steps:
            rec["skipped_steps"] = self.skipped_steps
        total = sum(self._task_steps.values())
        if len(self._task_steps) > 1:  # the realised task (objective) mix since the start
            rec.update({f"mix/{t}": n / total for t, n in sorted(self._task_steps.items())})
        # A callback's NaN means "nothing to say in this window" (e.g. a skill no step used).
        rec.update({k: v for k, v in red["extra"].items() if not (isinstance(v, float) and math.isnan(v))})
        self._window, self._window_tokens, self._window_time, self._window_stats = {}, 0.0, 0.0, {}
        self._window_steps = 0
        self._clock_resume()
        return rec


def compile_blocks(model: nn.Module) -> int:
    """torch.compile every block of every ``nn.ModuleList`` in ``model`` (BERT's ``encoder.layer``, BART's
    encoder and decoder ``layers``), in place: the parameter names, hence checkpoints and exports, do not
    change. Blocks of one class share their compiled code, so a 12-layer encoder compiles once per input
    kind (each objective's or task's skill set is one). Returns the number of blocks."""
    chosen: list[str] = []
    for name, mod in model.named_modules():  # parents first: a block's own lists (its skills) stay inside it
        if not isinstance(mod, nn.ModuleList) or any(name.startswith(c + ".") for c in chosen):
            continue
        for i, block in enumerate(mod):
            if not isinstance(block, nn.ModuleList):
                block.compile()
                chosen.append(f"{name}.{i}")
    return len(chosen)


def _device_overflow_guard(ds_config: dict[str, Any], optimizer: MaskedAdamW) -> bool:
    """bf16 on a GPU: replace DeepSpeed's overflow check by the optimizer's device-side one.

    DeepSpeed 0.19 checks every gradient tensor for inf/NaN before a bf16 step (``check_grad_overflow``,
    on by default): five small kernels per tensor and a host read-back, ~80 ms of a BERT-base step on an
    H100. The sync-free MaskedAdamW skips a step whose gradient norm is not finite on the device instead
    (weights and moments untouched, as DeepSpeed's check would leave them; the step count goes on). Only
    where that path runs (CUDA) and the JSON does not set ``bf16.check_grad_overflow`` itself."""
    bf16 = ds_config.get("bf16") or ds_config.get("bfloat16") or {}
    if not (bf16.get("enabled") and torch.cuda.is_available() and optimizer.sync_free(torch.device("cuda"))):
        return False
    offload = ((ds_config.get("zero_optimization") or {}).get("offload_optimizer") or {}).get("device", "none")
    if offload not in ("none", None):  # the optimizer steps CPU partitions: the count path, no device flag
        return False
    if "check_grad_overflow" in bf16:
        return False
    bf16["check_grad_overflow"] = False
    return True


def _sync_free_clip(zero_optimizer: Any) -> None:
    """Gradient clipping under the device guard without a host read-back.

    DeepSpeed 0.19's ZeRO ``unscale_and_clip_grads`` asks ``bool(norm is invalid)`` on the host before it
    clips: one wait for the device per step, after which the GPU idles while the host issues the optimizer
    and the next forward. Here an invalid norm becomes inf on the device instead (DeepSpeed's own
    replacement), giving the same scale; the guard's found_inf then skips that step in the optimizer."""
    if not callable(getattr(zero_optimizer, "unscale_and_clip_grads", None)):
        return
    original = zero_optimizer.unscale_and_clip_grads

    def unscale_and_clip_grads(grad_groups_flat: list[Any], total_norm: Any) -> None:
        opt = zero_optimizer
        if not isinstance(total_norm, torch.Tensor) or opt.clip_grad <= 0.0:
            return original(grad_groups_flat, total_norm)
        bad = ~torch.isfinite(total_norm) | (total_norm < 0)
        norm = torch.where(bad, torch.full_like(total_norm, math.inf), total_norm)
        clip = torch.clamp(((norm / opt.loss_scale) + 1e-6) / opt.clip_grad, min=1.0)
        inv = 1.0 / (clip * opt.loss_scale)
        for grad in grad_groups_flat:
            for g in grad if isinstance(grad, list) else [grad]:
                g.data.mul_(inv)
        return None

    zero_optimizer.unscale_and_clip_grads = unscale_and_clip_grads


def _foreach_grad_norm(zero_optimizer: Any) -> None:
    """ZeRO's global gradient norm in one foreach kernel instead of one norm per tensor.

    DeepSpeed 0.19's ``get_grad_norm_direct`` launches a norm (and a cast) for every gradient of the
    partition: a SkillNet-BERT-base step has ~500 of them, unused skills' zero-filled ones included, which
    keeps the host busier than the device. Same selection, same sum of squares, same all-reduces and the
    same -1 for inf/NaN; falls back to DeepSpeed's method where model or pipeline parallelism is on."""
    from deepspeed import comm as dist  # noqa: PLC0415
    from deepspeed.runtime.utils import mask_nan_or_inf_with_val_inplace  # noqa: PLC0415
    from deepspeed.runtime.zero.utils import get_norm_dtype  # noqa: PLC0415

    original = getattr(zero_optimizer, "get_grad_norm_direct", None)
    if not callable(original):
        return

    def get_grad_norm_direct(gradients: list[torch.Tensor], params: list[Any], norm_type: float = 2) -> Any:
        opt = zero_optimizer
        if float(norm_type) != 2.0 or getattr(opt, "model_parallel_rank", 0) != 0 or any(
                getattr(p, "ds_pipe_replicated", False) for p in params):
            return original(gradients, params, norm_type)
        grads = [g for g in gradients if not getattr(g, "_zero_padding", False)][: len(params)]
        dtype = get_norm_dtype()
        if grads:
            norms = torch._foreach_norm([g.detach() for g in grads], 2, dtype=dtype)
            total = torch.stack(norms).pow(2).sum().float()
        else:
            total = torch.tensor(0.0, dtype=torch.float32, device=opt.device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=opt.dp_process_group)
        opt._model_parallel_all_reduce(tensor=total, op=dist.ReduceOp.SUM)
        total = total.pow(0.5)
        mask_nan_or_inf_with_val_inplace(total, device=opt.device)
        return total

    zero_optimizer.get_grad_norm_direct = get_grad_norm_direct


def _nonfinite_norm(zero_optimizer: Any) -> torch.Tensor | None:
    """1.0 where DeepSpeed's global gradient norm of this step is inf/NaN (it reports those as -1), on the
    device; None if it keeps no norm."""
    norm = getattr(zero_optimizer, "_global_grad_norm", None)
    if not isinstance(norm, torch.Tensor):
        return None
    return ((norm < 0) | ~torch.isfinite(norm)).float().reshape(())


def _add(d: dict[str, list[float]], key: str, num: float, den: float) -> None:
    acc = d.setdefault(key, [0.0, 0.0])
    acc[0] += num
    acc[1] += den
