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
import signal
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from skillnet.common.files import atomic_write_text
from torch import nn

from . import deepspeed_patches as dsp
from . import dist as D
from .batch import Batch, BatchSource
from .callbacks import TrainerCallback
from .checkpoint import CheckpointManager, ResumeError, is_complete, reseed, rng_state, set_rng_state
from .compile import compile_blocks
from .config import TrainConfig, lr_lambda
from .launch import prepare
from .logging import MetricsLogger, accuracy_metrics
from .optim import MaskedAdamW, build_param_groups
from .profile import StepProfiler
from .rank_death import watch_peers
from .reshard import saved_geometry
from .task_balance import build_task_balance
from .window import LoggingWindow, StepOutput, TrainResult, add_to

__all__ = ["Trainer", "TrainResult", "StepOutput", "prepare", "lr_lambda"]

MetricsFn = Callable[[Batch, Any], dict[str, tuple[float, float]]]
Evaluator = Callable[[nn.Module, int], dict[str, float]]


class Trainer(LoggingWindow):
    """Generic trainer; see docs/training.md ("Trainer API") for the contract.

    Args:
        model: ``model(task=..., **tensors)`` returns an object with ``.loss`` (and ``.logits``).
        source: a ``BatchSource`` for this rank (one ``Batch`` per micro-step).
        config: ``TrainConfig`` (resolved with ``prepare`` or raw: resolved again here).
        evaluator: ``evaluator(model, step) -> {name: value}``, called on every rank (it may use
            collectives) every ``eval_every`` steps and at the end; logged as ``eval/<name>`` on rank 0.
        metrics_fn: per-micro-batch ``{name: (numerator, denominator)}``; logged as ``<task>/<name>``.
        callbacks: ``TrainerCallback`` objects (see callbacks.py), called in order; e.g.
            ``SkillStatistics(skill_parameters(model))`` for per-skill grad norms and drift.
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
        self.callbacks: list[TrainerCallback] = list(callbacks or [])
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

            guard = dsp.device_overflow_guard(self.ds_config, optimizer)
            self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
                model=model, optimizer=optimizer, lr_scheduler=scheduler, config=self.ds_config
            )
            optimizer.init_state()  # see MaskedAdamW.init_state: ZeRO links state views after the first step
            optimizer.check_zeros_everywhere()  # flat partitions zero-fill the grads of unused parameters
            if guard:
                optimizer.found_inf_fn = self._guard_flag
                dsp.sync_free_clip(self.engine.optimizer)
                dsp.foreach_grad_norm(self.engine.optimizer)
            self.device = self.engine.device
            self.zero_stage = int(self.engine.zero_optimization_stage())
        else:
            self.engine = None
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            model.to(self.device)
            self.optimizer, self.scheduler = optimizer, scheduler
            self.zero_stage = -1
        self.base_optimizer: MaskedAdamW = optimizer
        # Per-task gradient normalisation (task_balance.py; None when off): its EMAs go with the extra state.
        self.task_balance = build_task_balance(cfg, self.engine)
        if self.task_balance is not None:
            self.extra_state = {**self.extra_state, "task_grad_norm": self.task_balance}
        self.logger: MetricsLogger | None = None
        self._window: dict[str, list[Any]] = {}
        self._window_tokens = 0.0
        self._window_slots = 0.0
        self._window_time = 0.0
        self._window_steps = 0
        self._clock: float | None = None  # wall time since the window's clock last (re)started
        self._postfix: dict[str, str] = {}  # the progress bar shows the last logged loss of each task
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
            self._guard_step = (step, dsp.nonfinite_norm(self.engine.optimizer))
        return self._guard_step[1]

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def train(self) -> TrainResult:
        # Wait for the ranks of an earlier run in this directory that may still be saving (see checkpoint.py).
        run_lock = self.checkpoints.hold_run_lock()
        try:
            with watch_peers(self.cfg.output_dir, self.rank, self.world_size):  # a dead peer is named: rank_death.py
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
            if (self.evaluator is not None and cfg.eval_every and 0 < self.global_step < cfg.max_steps
                    and self.global_step % cfg.eval_every == 0 and self._evaluated_step is not None
                    and self._evaluated_step < self.global_step):
                self.evaluate()  # due at the step a stop signal saved before evaluating (see _save_on_signal)
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
                if out.stop:
                    # A stop signal (time limit, preemption): save at once, before an evaluation due at this
                    # step, so the save starts inside the scheduler's kill window; the resumed run evaluates it.
                    ckpt = self._save_on_signal(out.step)
                    return TrainResult(out.step, True, last, ckpt, stop_reason="signal")
                if cfg.eval_every and out.step % cfg.eval_every == 0 and out.step != cfg.max_steps:
                    self._clock_pause()
                    self.evaluate()
                    self._clock_resume()
                    if self._sync_flag(self._stop_requested_by_user):
                        ckpt = self.save_checkpoint()
                        self.logger.message(f"[trainer] stop requested by the evaluator at step {out.step}")
                        return TrainResult(out.step, False, last, ckpt, stop_reason="requested")
                if out.requested:
                    ckpt = self.save_checkpoint()
                    return TrainResult(out.step, False, last, ckpt, stop_reason="requested")
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

        Nothing is read back from the device (but the gradient norm under task_grad_norm ema, which the next
        step's factor needs): losses and metric sums stay device tensors, and the plain
        path skips a non-finite step on the device when the optimizer is sync-free (GPU). ``reduce=True``
        (the default for callers) then sums them over ranks and reads them back; the training loop passes
        False and does that once per logging window. The stop flags agree over ranks through a host-side
        (gloo) all-reduce every step, which no GPU work waits for."""
        cfg = self.cfg
        assert cfg.grad_accum is not None
        t0 = time.perf_counter()
        lr = float(self.base_optimizer.param_groups[0]["lr"])
        sums: dict[str, list[Any]] = {}
        tokens = slots = 0.0
        step = self.global_step + 1
        # The callbacks' gradient statistics, every step of a run that logs (see callbacks.py).
        want_stats = bool(self.callbacks) and cfg.log_every > 0
        stats: dict[str, float] = {}
        if self.engine is not None:  # ZeRO's gradient buffers keep an unused skill's last gradient
            dsp.clear_stale_gradients(self.engine.optimizer, self.zero_stage)
        for k in range(cfg.grad_accum):
            batch = next(self.source)
            loss, metrics = self.forward_backward(batch)
            add_to(sums, f"{batch.task}/loss", loss, 1.0)
            self._task_steps[batch.task] = self._task_steps.get(batch.task, 0) + 1
            for name, (num, den) in metrics.items():
                add_to(sums, f"{batch.task}/{name}", num, den)
            real, n_slots = batch.num_tokens(), batch.num_slots()
            tokens += real
            slots += n_slots
            # The share of the rows' slots that hold real tokens, per objective: what padding costs.
            add_to(sums, f"{batch.task}/real_token_share", float(real), float(n_slots))
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
        if self.task_balance is not None:  # reads the norm back each step (only this option does)
            self.task_balance.observe(grad_norm)
        self.global_step = step

        # The stop flags (so every rank stops at the same step) and the token count: host numbers, summed
        # on the host.
        stop_f, req_f, tokens, slots = D.all_reduce_host_sum(
            [1.0 if self._stop_requested else 0.0, 1.0 if self._stop_requested_by_user else 0.0, tokens, slots]
        )
        out = StepOutput(step, math.nan, sums, tokens, grad_norm, lr, stats, time.perf_counter() - t0,
                         stop_f > 0, req_f > 0, slots)
        if reduce:
            red = self._reduce({k: tuple(v) for k, v in sums.items()}, grad_norm)
            out.sums, out.grad_norm = red["sums"], red["grad_norm"]
            # The step's micro-batches, whatever their tasks: a figure for this step's callers, not the logs
            # (which keep each task's own <task>/loss).
            parts = [v for k, v in out.sums.items() if k.endswith("/loss")]
            out.loss = sum(n for n, _ in parts) / max(sum(d for _, d in parts), 1.0)
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
        out = (self.module if self.engine is None else self.engine)(task=batch.task, **batch.tensors)
        loss = out.loss if self.loss_fn is None else self.loss_fn(batch, out)
        scaled, factor = loss, None
        if self.task_balance is not None:  # the task's factor goes into the backward, not into the logged loss
            scaled, factor = self.task_balance.scale(batch.task, loss)
        if self.engine is not None:
            self.engine.backward(scaled)
        else:
            assert self.cfg.grad_accum is not None
            (scaled / self.cfg.grad_accum).backward()
        metrics = self.metrics_fn(batch, out) if self.metrics_fn is not None else {}
        if factor is not None:
            metrics = {**metrics, "grad_scale": (factor, 1.0)}
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

    def _save_on_signal(self, step: int) -> str:
        """The stop signal's checkpoint, with the log saying before the save which checkpoint stays the resume
        point should the save be cut short (Slurm's KillWait, a launcher's grace: no 'complete' marker, so
        --resume auto skips it), and after it that the new one is."""
        previous = self.checkpoints.locate("auto") if self._last_saved_step >= 0 else None
        assert self.logger is not None
        self.logger.message(
            f"[trainer] stop requested (SIGTERM) at step {step}: saving its checkpoint now; if the save is cut "
            f"short the resume point stays {previous.name if previous is not None else 'the start (none saved yet)'}"
        )
        t0 = time.perf_counter()
        ckpt = self.save_checkpoint()
        self.logger.message(f"[trainer] stop requested (SIGTERM) at step {step}: checkpoint {ckpt} saved in "
                            f"{time.perf_counter() - t0:.1f} s: the resume point")
        return ckpt

    def maybe_resume(self, resume: str) -> bool:
        """``"auto"``: resume from the newest complete checkpoint in ``<output_dir>/checkpoints`` if any;
        else a checkpoints directory (its newest complete one) or one ``step_*`` directory."""
        tdir = self.checkpoints.locate(resume)
        if tdir is None:
            return False
        saved_world = saved_geometry(tdir)["world_size"]
        if saved_world != self.world_size and not getattr(self.source, "resumes_on_any_world_size", False):
            raise ResumeError(
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
            cut = sorted(p.name for p in tdir.parent.glob("step_*") if p.name > tdir.name and not is_complete(p))
            skipped = f"; skipped {', '.join(cut)} (no 'complete' marker: its save was cut short)" if cut else ""
            print(f"[trainer] resumed from {tdir}{moved} at step {self.global_step}{skipped}", flush=True)
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
