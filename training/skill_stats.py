"""Per-skill telemetry of a skill-sparse model, as a trainer callback.

- ``skill_grad_norm/<skill>``: the gradient norm of each skill's parameters, every step, for the skills
  the step used (an unused skill has no gradient at all, or exact zeros under ZeRO), averaged over the
  logging window. Exact under ZeRO-1/2, where each rank holds a fragment of the gradient: the squared
  fragments are summed over ranks. Not under ZeRO-3. The norms stay on the device until the logging step,
  which reads the window's back at once: a read per step would make every step wait for the GPU.
- ``skill_drift/<skill>``: ``||W - W0|| / ||W0||`` over the skill's tensors, from the run's initial
  weights. W0 is kept on the CPU (rank 0) and in ``<output_dir>/skill_init.safetensors``, so a resumed run
  measures from the same start. Off with ``TrainConfig.skill_drift=False``; not under ZeRO-3, where no
  rank holds the full weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from skillnet.common.files import atomic_write_bytes
from torch import nn

from . import dist as D
from .callbacks import TrainerCallback, TrainerState

__all__ = ["SkillStatistics"]


class SkillStatistics(TrainerCallback):
    """Args:
    skill_params: ``{skill: [params]}`` (``model.surgery.skill_parameters``).
    """

    def __init__(self, skill_params: dict[str, list[nn.Parameter]]) -> None:
        self.skill_params = skill_params
        self._norm_warned = False
        self._init: dict[str, torch.Tensor] | None = None
        self._init_dev: dict[str, torch.Tensor] | None = None
        # (squared norms of full grads [skills], of ZeRO fragments [skills], loss scale) per step since the log
        self._pending: list[tuple[torch.Tensor, torch.Tensor, float]] = []

    # ------------------------------------------------------------------ hooks
    def on_train_start(self, trainer: TrainerState) -> None:
        cfg = trainer.cfg
        if not (trainer.is_main and self.skill_params and cfg.skill_drift and trainer.zero_stage != 3):
            return
        from safetensors.torch import load_file, save  # noqa: PLC0415

        path = Path(cfg.output_dir) / "skill_init.safetensors"
        current = self._tensors()
        if path.is_file():
            saved = load_file(str(path))
            if set(saved) == set(current) and all(saved[k].shape == current[k].shape for k in saved):
                self._init = saved
                return
        if trainer.global_step == 0:
            self._init = {k: v.clone() for k, v in current.items()}
            # safetensors writes a path, not a stream: its bytes go through the one atomic write
            atomic_write_bytes(path, save(self._init))

    def on_gradients(self, trainer: TrainerState) -> dict[str, float]:
        """Queue this step's squared gradient norm per skill, on the device (nothing is read back here)."""
        if not self.skill_params:
            return {}
        if trainer.zero_stage == 3:
            if not self._norm_warned and trainer.is_main:
                print("[trainer] per-skill grad norms are not computed under ZeRO-3", flush=True)
            self._norm_warned = True
            return {}
        full, frag = [], []
        dev = next(p.device for ps in self.skill_params.values() for p in ps)
        for n in sorted(self.skill_params):
            pieces: dict[bool, list[torch.Tensor]] = {False: [], True: []}
            for p in self.skill_params[n]:
                g, reduce = _local_grad(p)
                if g is not None:
                    pieces[reduce].append(g.detach())
            full.append(_sq_norm(pieces[False], dev))
            frag.append(_sq_norm(pieces[True], dev))
        scale = 1.0
        engine = trainer.engine
        if engine is not None and engine.fp16_enabled():
            scale = float(getattr(engine.optimizer, "loss_scale", 1.0) or 1.0)
        self._pending.append((torch.stack(full), torch.stack(frag), scale))
        return {}

    def on_log(self, trainer: TrainerState) -> dict[str, Any]:
        out = self._grad_norms()
        if self._init is not None:
            out.update(self._drift())
        return out

    # ------------------------------------------------------------------ internals
    def _grad_norms(self) -> dict[str, Any]:
        """The window's per-skill gradient norms: the mean over the steps that used the skill (an unused
        skill has no gradient at all, or exact zeros under ZeRO: NaN, which the log leaves out). One
        collective; 0-dim device tensors, which the trainer reads back with the rest of the window."""
        if not self._pending:
            return {}
        names = sorted(self.skill_params)
        full = torch.stack([f for f, _, _ in self._pending]).double()  # [steps, skills]
        frag = torch.stack([g for _, g, _ in self._pending]).double()
        scale = torch.tensor([s for _, _, s in self._pending], dtype=torch.float64, device=full.device)
        self._pending = []
        # Every rank runs this (collective); ZeRO-1/2 fragments are disjoint partitions: sum, then sqrt.
        D.all_reduce_sum(frag)
        norm = (full + frag).sqrt() / scale[:, None]
        used = norm > 0
        mean = torch.where(used, norm, 0.0).sum(0) / used.sum(0)  # 0 / 0: NaN for a skill no step used
        return {f"skill_grad_norm/{n}": mean[i] for i, n in enumerate(names)}

    def _drift(self) -> dict[str, Any]:
        """``||W - W0|| / ||W0||`` per skill, computed where the weights live (0-dim tensors)."""
        init = self._init
        assert init is not None
        names = sorted(self.skill_params)
        params = {f"{s}/{i}": p for s in names for i, p in enumerate(self.skill_params[s])}
        dev = next(iter(params.values())).device
        if self._init_dev is None:
            self._init_dev = _resident_copies(init, dev)
        sums = []
        for s in names:
            keys = [k for k in params if k.split("/")[0] == s]
            diff = [params[k].detach().float() - self._init_dev[k].to(dev, non_blocking=True).float() for k in keys]
            base = [self._init_dev[k].to(dev, non_blocking=True).float() for k in keys]
            sums.append(torch.stack([_sq_norm(diff, dev), _sq_norm(base, dev)]))
        diff, base = torch.stack(sums).double().sqrt().t()
        drift = torch.where(base > 0, diff / base, diff)
        return {f"skill_drift/{s}": drift[i] for i, s in enumerate(names)}

    def _tensors(self) -> dict[str, torch.Tensor]:
        return {f"{s}/{i}": p.detach().float().cpu() for s in sorted(self.skill_params)
                for i, p in enumerate(self.skill_params[s])}


def _sq_norm(ts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """Sum of squares of a list of tensors as one 0-dim fp32 tensor on ``device``, in a few fused kernels.
    (An empty list makes its zero there: a host zero copied over would wait for the device.)"""
    if not ts:
        return torch.zeros((), dtype=torch.float32, device=device)
    # fp32 accumulation without an fp32 copy of each bf16/fp16 gradient
    norms = torch._foreach_norm(ts, 2, dtype=torch.float32)
    return torch.stack(norms).pow(2).sum().to(device)  # offloaded fragments: on the CPU


def _resident_copies(init: dict[str, torch.Tensor], dev: torch.device) -> dict[str, torch.Tensor]:
    """The start weights where the drift is computed: on the GPU while all of them take little of its free
    memory (no copy per log), else in pinned host memory (one asynchronous copy per log)."""
    if dev.type != "cuda":
        return init
    free, _ = torch.cuda.mem_get_info(dev)
    total = sum(w.numel() * w.element_size() for w in init.values())
    return {k: (w.to(dev) if total * 8 < free else w.pin_memory()) for k, w in init.items()}


def _local_grad(p: nn.Parameter) -> tuple[torch.Tensor | None, bool]:
    """(gradient piece, needs_reduce): full grad if present, else this rank's ZeRO-1/2 fragment."""
    if p.grad is not None:
        return p.grad, False
    mapping = getattr(p, "_hp_mapping", None)
    if hasattr(p, "_hp_mapping"):
        if mapping is None:
            return None, True
        return mapping.get_lp_grad_fragment(p._index_in_param_group), True
    return None, False
