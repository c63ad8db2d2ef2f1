"""One trainer for sparse pre-training and multi-task fine-tuning.

    trainer = Trainer(model, source, TrainConfig(...), evaluator=..., skill_params=skill_parameters(model))
    result = trainer.train()     # -> train_step() per optimizer step -> forward_backward() per micro-batch

It owns a DeepSpeed engine when ``config.ds_config`` is set (any ZeRO stage, any launcher) and a plain
PyTorch optimizer otherwise (single process). In both cases the optimizer is ``MaskedAdamW`` so that a
skill no micro-batch of the step used stays bit-identical (parameters and moments), see training/optim.py.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from . import dist as D
from .batch import Batch, BatchSource
from .checkpoint import (
    atomic_torch_save,
    atomic_write_text,
    checkpoint_root,
    complete_tags,
    hold_run_lock,
    is_complete,
    latest_complete,
    mark_complete,
    read_latest,
    rng_state,
    rotate,
    set_rng_state,
    tag_for_step,
    unmark_complete,
)
from .config import TrainConfig, load_ds_config, resolve_ds_config
from .logging import MetricsLogger, accuracy_metrics
from .optim import MaskedAdamW, build_param_groups

__all__ = ["Trainer", "TrainResult", "StepOutput", "prepare", "lr_lambda"]

MetricsFn = Callable[[Batch, Any], dict[str, tuple[float, float]]]
Evaluator = Callable[[nn.Module, int], dict[str, float]]


def prepare(config: TrainConfig) -> tuple[TrainConfig, dict[str, Any] | None]:
    """Initialise distributed (if launched), check the DeepSpeed JSON against the launch.

    Returns the resolved config (micro_batch_size / grad_accum filled in) and the DeepSpeed dict
    (None for a plain single-process run). Call it before building the batch source so the source
    uses the same batch geometry as the engine; Trainer calls it again (idempotent).
    """
    _, world = D.init_distributed()
    if config.ds_config:
        raw = load_ds_config(config.ds_config)
        ds, cfg = resolve_ds_config(raw, config, world, source=str(config.ds_config))
        return cfg, ds
    if world > 1:
        raise RuntimeError(
            f"launched with {world} ranks but no --ds-config: multi-process training goes through DeepSpeed, "
            f"e.g. --ds-config ds_configs/zero2.json"
        )
    cfg = TrainConfig.from_dict({**config.__dict__})
    cfg.micro_batch_size = cfg.micro_batch_size or 8
    cfg.grad_accum = cfg.grad_accum or 1
    return cfg, None


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
    step: int
    loss: float
    sums: dict[str, tuple[float, float]]
    tokens: float
    grad_norm: float | None
    lr: float
    skill_grad_norms: dict[str, float]
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
        skill_params: ``{skill: [params]}`` (``model.surgery.skill_parameters``) for per-skill grad norms.
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
    ) -> None:
        self.cfg, self.ds_config = prepare(config)
        self.rank, self.world_size = D.rank(), D.world_size()
        self.source = source
        self.evaluator = evaluator
        self.metrics_fn = metrics_fn
        self.loss_fn = loss_fn
        self.config_text = config_text
        self.skill_params = skill_params or {}
        self.extra_state = extra_state or {}
        self.global_step = 0
        self._stop_requested = False
        self._stop_requested_by_user = False
        self._skill_norm_warned = False
        cfg = self.cfg

        # Dropout streams differ per rank (the weights are identical: DeepSpeed broadcasts rank 0's).
        torch.manual_seed(cfg.seed + 1000 * self.rank)
        groups = param_groups if param_groups is not None else build_param_groups(model, cfg.weight_decay)
        optimizer = MaskedAdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, masked=cfg.sparse_updates)
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda(cfg))
        self.module = model
        if self.ds_config is not None:
            import deepspeed  # noqa: PLC0415

            self.engine, self.optimizer, _, self.scheduler = deepspeed.initialize(
                model=model, optimizer=optimizer, lr_scheduler=scheduler, config=self.ds_config
            )
            optimizer.init_state()  # see MaskedAdamW.init_state: ZeRO links state views after the first step
            optimizer.check_zeros_everywhere()  # flat partitions zero-fill the grads of unused parameters
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
        self._window: dict[str, list[float]] = {}
        self._window_tokens = 0.0
        self._window_time = 0.0
        self._last_saved_step = -1
        self._task_steps: dict[str, int] = {}  # micro-batches per task (objective) since the start: the mix
        self._skill_init: dict[str, torch.Tensor] | None = None

    # ------------------------------------------------------------------ public API
    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def train(self) -> TrainResult:
        cfg = self.cfg
        # Wait for the ranks of an earlier run in this directory that may still be saving (see checkpoint.py).
        run_lock = hold_run_lock(checkpoint_root(cfg.output_dir), self.rank, D.barrier)
        try:
            result = self._train()
        finally:
            run_lock.close()
        D.barrier()  # every rank has communicated: the shared-memory buffers can go
        D.release_shared_memory()
        return result

    def _train(self) -> TrainResult:
        cfg = self.cfg
        if cfg.resume:
            self.maybe_resume(cfg.resume)
        self.logger = MetricsLogger(
            cfg.output_dir, self.is_main, cfg.max_steps, self.global_step, cfg.tensorboard, cfg.progress
        )
        if self.config_text:
            self.logger.text("config", self.config_text, self.global_step)
        self._load_skill_init()
        if self.is_main:
            Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
            atomic_write_text(Path(cfg.output_dir) / "train_config.json", cfg.to_json())
        old_handlers = self._install_signal_handlers()
        last: dict[str, Any] = {}
        ckpt: str | None = None
        try:
            self._model_train(True)
            while self.global_step < cfg.max_steps:
                out = self.train_step()
                self._accumulate_window(out)
                if cfg.log_every and (
                    out.step % cfg.log_every == 0 or out.step == cfg.max_steps or out.stop or out.requested
                ):
                    last = self._flush_window(out)
                    self.logger.log(last)
                self.logger.advance(1, {"loss": f"{out.loss:.4f}"})
                if cfg.eval_every and out.step % cfg.eval_every == 0 and out.step != cfg.max_steps:
                    self.evaluate()
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
                    ckpt = self.save_checkpoint()
            if self.evaluator is not None:
                self.evaluate()
            if self._last_saved_step != self.global_step:
                ckpt = self.save_checkpoint()
            return TrainResult(self.global_step, False, last, ckpt)
        finally:
            self._restore_signal_handlers(old_handlers)
            if self.logger is not None:
                self.logger.close()

    def train_step(self) -> StepOutput:
        """One optimizer step: ``grad_accum`` micro-batches, clip, step, schedule, one all-reduce of stats."""
        cfg = self.cfg
        assert cfg.grad_accum is not None
        t0 = time.perf_counter()
        lr = float(self.base_optimizer.param_groups[0]["lr"])
        sums: dict[str, list[float]] = {}
        tokens = 0.0
        step = self.global_step + 1
        # Every step, averaged over the logging window per skill and only over the steps that used it: a
        # skill a step skipped has no gradient (or an all-zero ZeRO fragment) and is not a zero sample.
        want_skill_norms = bool(self.skill_params) and cfg.log_every > 0
        skill_norms: dict[str, float] = {}
        if self.zero_stage == 3:
            # DeepSpeed's ZeRO-3 keeps every parameter's reduced gradient in one flat buffer and overwrites
            # only the entries of parameters that get a gradient: without this, a skill this step does not
            # use would be stepped again with the gradient of its last step (MaskedAdamW skips exact zeros).
            self.engine.optimizer.grad_partitions_flat_buffer.zero_()
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
            if last_micro and want_skill_norms:
                skill_norms = self._skill_grad_norms()
            if self.engine is not None:
                self.engine.step()  # DeepSpeed only updates at the accumulation boundary
        grad_norm: float | None
        if self.engine is not None:
            gn = self.engine.get_global_grad_norm()
            grad_norm = None if gn is None else float(gn)
        else:
            params = [p for g in self.optimizer.param_groups for p in g["params"] if p.grad is not None]
            max_norm = cfg.max_grad_norm if cfg.max_grad_norm and cfg.max_grad_norm > 0 else math.inf
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
            self.optimizer.step()
            self.scheduler.step()
            self.optimizer.zero_grad(set_to_none=True)
        self.global_step = step

        if cfg.sigterm_at_step is not None and step == cfg.sigterm_at_step:
            if cfg.sigterm_group:
                if self.is_main:
                    os.killpg(os.getpgrp(), signal.SIGTERM)
            else:
                signal.raise_signal(signal.SIGTERM)
        # One small all-reduce per step: the stop flag (so every rank stops at the same step) and the
        # logging sums (so rank 0 logs global, not local, metrics).
        keys = sorted(sums)
        flags = [1.0 if self._stop_requested else 0.0, 1.0 if self._stop_requested_by_user else 0.0, tokens]
        vec = torch.tensor(flags + [x for k in keys for x in sums[k]], dtype=torch.float64)
        D.all_reduce_sum(vec)
        stop, requested = bool(vec[0].item() > 0), bool(vec[1].item() > 0)
        tokens = float(vec[2].item())
        red = {k: (float(vec[3 + 2 * i].item()), float(vec[4 + 2 * i].item())) for i, k in enumerate(keys)}
        loss_mean = red["loss"][0] / max(red["loss"][1], 1.0)
        return StepOutput(
            step,
            loss_mean,
            red,
            tokens,
            grad_norm,
            lr,
            skill_norms,
            time.perf_counter() - t0,
            stop,
            requested,
        )

    def forward_backward(self, batch: Batch) -> tuple[float, dict[str, tuple[float, float]]]:
        """Forward + backward of one micro-batch; returns (loss, metric sums) of this rank."""
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
        return float(loss.detach().float().item()), metrics

    def evaluate(self) -> dict[str, float]:
        if self.evaluator is None:
            return {}
        self._model_train(False)
        try:
            with torch.no_grad():
                res = self.evaluator(self.module, self.global_step)
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
        root = checkpoint_root(self.cfg.output_dir)
        tag = tag_for_step(self.global_step)
        (root / tag).mkdir(parents=True, exist_ok=True)
        if self.is_main:  # files of this tag are about to be rewritten: not complete until marked again
            unmark_complete(root / tag)
        D.barrier()
        state = {
            "step": self.global_step,
            "world_size": self.world_size,
            "source": self.source.state_dict(),
            "rng": rng_state(),
            "extra": {k: v.state_dict() for k, v in self.extra_state.items()},
            "train_config": self.cfg.to_json(),
            "task_steps": dict(self._task_steps),
        }
        atomic_torch_save(state, root / tag / f"trainer_rank{self.rank}.pt")
        if self.engine is not None:
            self.engine.save_checkpoint(
                str(root), tag=tag, client_state={"skillnet_step": self.global_step}, save_latest=False
            )
        else:
            atomic_torch_save(
                {
                    "model": self.module.state_dict(),
                    "optimizer": self.optimizer.state_dict(),
                    "scheduler": self.scheduler.state_dict(),
                },
                root / tag / "plain.pt",
            )
        if self.is_main:
            cfg_obj = getattr(self.module, "config", None)
            if cfg_obj is not None and hasattr(cfg_obj, "to_json_string"):
                atomic_write_text(root / tag / "model_config.json", cfg_obj.to_json_string())
        D.barrier()
        if self.is_main:  # every rank has finished writing: the marker goes last
            mark_complete(root / tag, self.global_step)
            atomic_write_text(root / "latest", tag + "\n")
            rotate(root, self.cfg.keep_last)
        D.barrier()
        self._last_saved_step = self.global_step
        return str(root / tag)

    def maybe_resume(self, resume: str) -> bool:
        """``"auto"``: resume from the newest complete checkpoint in ``<output_dir>/checkpoints`` if any;
        else a checkpoints directory (its newest complete one) or one ``step_*`` directory."""
        if resume == "auto":
            root = checkpoint_root(self.cfg.output_dir)
            tag = latest_complete(root)
            if tag is None:
                return False
        else:
            p = Path(resume)
            if (p / "latest").is_file() or complete_tags(p):
                root, tag = p, latest_complete(p)
            elif p.is_dir() and p.name.startswith("step_"):
                root, tag = p.parent, p.name
                # Without its marker the save was cut short (unless it predates markers: named by latest).
                if not is_complete(p) and read_latest(root) != tag:
                    raise FileNotFoundError(
                        f"--resume {resume}: incomplete checkpoint (no '{p.name}/complete' marker: its save "
                        f"was interrupted); resume from an earlier one or use --resume auto"
                    )
            else:
                raise FileNotFoundError(
                    f"--resume {resume}: not a checkpoint directory (no 'latest', not step_*)"
                )
            if tag is None:
                raise FileNotFoundError(f"--resume {resume}: no complete checkpoint in it")
        tdir = root / tag
        tfile = tdir / f"trainer_rank{self.rank}.pt"
        if not tfile.is_file():
            raise FileNotFoundError(
                f"{tfile} missing: the checkpoint was written by a different number of ranks? "
                f"Exact data-position resume needs the same world size."
            )
        state = torch.load(tfile, map_location="cpu", weights_only=False)
        if state["world_size"] != self.world_size:
            raise RuntimeError(
                f"{tdir}: saved with world_size={state['world_size']}, resuming with {self.world_size}; "
                f"exact data-position resume needs the same world size."
            )
        if self.engine is not None:
            load_path, _ = self.engine.load_checkpoint(
                str(root), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
            )
            if load_path is None:
                raise RuntimeError(f"DeepSpeed could not load checkpoint {tdir}")
        else:
            plain = torch.load(tdir / "plain.pt", map_location="cpu", weights_only=False)
            self.module.load_state_dict(plain["model"])
            self.optimizer.load_state_dict(plain["optimizer"])
            self.scheduler.load_state_dict(plain["scheduler"])
        self.source.load_state_dict(state["source"])
        for k, v in state.get("extra", {}).items():
            if k in self.extra_state:
                self.extra_state[k].load_state_dict(v)
        self._task_steps = {k: int(v) for k, v in state.get("task_steps", {}).items()}
        set_rng_state(state["rng"])
        self.global_step = int(state["step"])
        self._last_saved_step = self.global_step
        if self.is_main:
            print(f"[trainer] resumed from {tdir} at step {self.global_step}", flush=True)
        return True

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

    def _local_grad(self, p: nn.Parameter) -> tuple[torch.Tensor | None, bool]:
        """(gradient piece, needs_reduce): full grad if present, else this rank's ZeRO-1/2 fragment."""
        if p.grad is not None:
            return p.grad, False
        mapping = getattr(p, "_hp_mapping", None)
        if hasattr(p, "_hp_mapping"):
            if mapping is None:
                return None, True
            return mapping.get_lp_grad_fragment(p._index_in_param_group), True
        return None, False

    def _skill_grad_norms(self) -> dict[str, float]:
        if self.zero_stage == 3:
            if not self._skill_norm_warned and self.is_main:
                print("[trainer] per-skill grad norms are not computed under ZeRO-3", flush=True)
            self._skill_norm_warned = True
            return {}
        names = sorted(self.skill_params)
        full = torch.zeros(len(names), dtype=torch.float64)
        frag = torch.zeros(len(names), dtype=torch.float64)
        for i, n in enumerate(names):
            for p in self.skill_params[n]:
                g, reduce = self._local_grad(p)
                if g is None:
                    continue
                sq = float(g.detach().float().pow(2).sum().item())
                if reduce:
                    frag[i] += sq
                else:
                    full[i] += sq
        # Every rank runs this (collective), fragments are disjoint partitions: sum then sqrt.
        D.all_reduce_sum(frag)
        scale = 1.0
        if self.engine is not None and self.engine.fp16_enabled():
            scale = float(getattr(self.engine.optimizer, "loss_scale", 1.0) or 1.0)
        # Only skills this step used: an unused skill has no gradient at all (plain) or exact zeros (ZeRO).
        return {f"skill_grad_norm/{n}": math.sqrt(full[i] + frag[i]) / scale for i, n in enumerate(names)
                if full[i] + frag[i] > 0}

    def _accumulate_window(self, out: StepOutput) -> None:
        for k, (num, den) in out.sums.items():
            acc = self._window.setdefault(k, [0.0, 0.0])
            acc[0] += num
            acc[1] += den
        for k, v in out.skill_grad_norms.items():
            _add(self._window, k, v, 1.0)
        self._window_tokens += out.tokens
        self._window_time += out.seconds
        self._last_out = out

    def _flush_window(self, out: StepOutput) -> dict[str, Any]:
        rec: dict[str, Any] = {"step": out.step}
        for k in sorted(self._window):
            num, den = self._window[k]
            rec[k] = num / den if den else float("nan")
        rec["lr"] = out.lr
        if out.grad_norm is not None:
            rec["grad_norm"] = out.grad_norm
        rec["tokens_per_s"] = self._window_tokens / self._window_time if self._window_time > 0 else 0.0
        total = sum(self._task_steps.values())
        if len(self._task_steps) > 1:  # the realised task (objective) mix since the start
            rec.update({f"mix/{t}": n / total for t, n in sorted(self._task_steps.items())})
        rec.update(self._skill_drift())
        self._window, self._window_tokens, self._window_time = {}, 0.0, 0.0
        return rec

    # Per-skill weight drift from the run's initial weights: ||W - W0|| / ||W0|| over the skill's tensors.
    # W0 is kept on the CPU (rank 0) and in <output_dir>/skill_init.safetensors, so a resumed run measures
    # from the same start. Not under ZeRO-3, where no rank holds the full weights.
    def _skill_init_path(self) -> Path:
        return Path(self.cfg.output_dir) / "skill_init.safetensors"

    def _skill_tensors(self) -> dict[str, torch.Tensor]:
        return {f"{s}/{i}": p.detach().float().cpu() for s in sorted(self.skill_params)
                for i, p in enumerate(self.skill_params[s])}

    def _load_skill_init(self) -> None:
        if not (self.is_main and self.skill_params and self.cfg.skill_drift and self.zero_stage != 3):
            return
        from safetensors.torch import load_file, save_file

        path = self._skill_init_path()
        current = self._skill_tensors()
        if path.is_file():
            saved = load_file(str(path))
            if set(saved) == set(current) and all(saved[k].shape == current[k].shape for k in saved):
                self._skill_init = saved
                return
        if self.global_step == 0:
            self._skill_init = {k: v.clone() for k, v in current.items()}
            tmp = path.with_name(path.name + ".tmp")
            save_file(self._skill_init, str(tmp))
            os.replace(tmp, path)

    def _skill_drift(self) -> dict[str, float]:
        if self._skill_init is None:
            return {}
        now = self._skill_tensors()
        out = {}
        for s in sorted(self.skill_params):
            keys = [k for k in now if k.split("/")[0] == s]
            diff = math.sqrt(sum(float((now[k] - self._skill_init[k]).pow(2).sum()) for k in keys))
            base = math.sqrt(sum(float(self._skill_init[k].pow(2).sum()) for k in keys))
            out[f"skill_drift/{s}"] = diff / base if base > 0 else diff
        return out


def _add(d: dict[str, list[float]], key: str, num: float, den: float) -> None:
    acc = d.setdefault(key, [0.0, 0.0])
    acc[0] += num
    acc[1] += den
