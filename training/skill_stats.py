"""Per-skill telemetry of a skill-sparse model, as a trainer callback.

- ``skill_grad_norm/<skill>``: the gradient norm of each skill's parameters, every step, for the skills
  the step used (an unused skill has no gradient at all, or exact zeros under ZeRO). Exact under ZeRO-1/2,
  where each rank holds a fragment of the gradient: the squared fragments are summed over ranks. Not
  under ZeRO-3.
- ``skill_drift/<skill>``: ``||W - W0|| / ||W0||`` over the skill's tensors, from the run's initial
  weights. W0 is kept on the CPU (rank 0) and in ``<output_dir>/skill_init.safetensors``, so a resumed run
  measures from the same start. Off with ``TrainConfig.skill_drift=False``; not under ZeRO-3, where no
  rank holds the full weights.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from . import dist as D
from .callbacks import TrainerCallback

if TYPE_CHECKING:
    from .trainer import Trainer

__all__ = ["SkillStatistics"]


class SkillStatistics(TrainerCallback):
    """Args:
    skill_params: ``{skill: [params]}`` (``model.surgery.skill_parameters``).
    """

    def __init__(self, skill_params: dict[str, list[nn.Parameter]]) -> None:
        self.skill_params = skill_params
        self._norm_warned = False
        self._init: dict[str, torch.Tensor] | None = None

    # ------------------------------------------------------------------ hooks
    def on_train_start(self, trainer: Trainer) -> None:
        cfg = trainer.cfg
        if not (trainer.is_main and self.skill_params and cfg.skill_drift and trainer.zero_stage != 3):
            return
        from safetensors.torch import load_file, save_file  # noqa: PLC0415

        path = Path(cfg.output_dir) / "skill_init.safetensors"
        current = self._tensors()
        if path.is_file():
            saved = load_file(str(path))
            if set(saved) == set(current) and all(saved[k].shape == current[k].shape for k in saved):
                self._init = saved
                return
        if trainer.global_step == 0:
            self._init = {k: v.clone() for k, v in current.items()}
            tmp = path.with_name(path.name + ".tmp")
            save_file(self._init, str(tmp))
            os.replace(tmp, path)

    def on_gradients(self, trainer: Trainer) -> dict[str, float]:
        if not self.skill_params:
            return {}
        if trainer.zero_stage == 3:
            if not self._norm_warned and trainer.is_main:
                print("[trainer] per-skill grad norms are not computed under ZeRO-3", flush=True)
            self._norm_warned = True
            return {}
        names = sorted(self.skill_params)
        full = torch.zeros(len(names), dtype=torch.float64)
        frag = torch.zeros(len(names), dtype=torch.float64)
        for i, n in enumerate(names):
            for p in self.skill_params[n]:
                g, reduce = _local_grad(p)
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
        engine = trainer.engine
        if engine is not None and engine.fp16_enabled():
            scale = float(getattr(engine.optimizer, "loss_scale", 1.0) or 1.0)
        # Only skills this step used: an unused skill has no gradient at all (plain) or exact zeros (ZeRO).
        return {f"skill_grad_norm/{n}": math.sqrt(full[i] + frag[i]) / scale for i, n in enumerate(names)
                if full[i] + frag[i] > 0}

    def on_log(self, trainer: Trainer) -> dict[str, float]:
        if self._init is None:
            return {}
        now = self._tensors()
        out = {}
        for s in sorted(self.skill_params):
            keys = [k for k in now if k.split("/")[0] == s]
            diff = math.sqrt(sum(float((now[k] - self._init[k]).pow(2).sum()) for k in keys))
            base = math.sqrt(sum(float(self._init[k].pow(2).sum()) for k in keys))
            out[f"skill_drift/{s}"] = diff / base if base > 0 else diff
        return out

    # ------------------------------------------------------------------ internals
    def _tensors(self) -> dict[str, torch.Tensor]:
        return {f"{s}/{i}": p.detach().float().cpu() for s in sorted(self.skill_params)
                for i, p in enumerate(self.skill_params[s])}


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
