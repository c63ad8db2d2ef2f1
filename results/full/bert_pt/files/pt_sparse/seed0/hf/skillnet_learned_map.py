"""The learned task-skill map (learnable skill combination, Eq. 1-8) and its router, ``"learned"``: task and
skill embeddings whose sigmoid similarity, thresholded, picks each task's skills, with two estimators of
the threshold's gradient (straight-through, or Eq. 6 as written)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from .skillnet_routers import Derivation, Router, SkillIdsArg, TaskArg, register_router
from .skillnet_skill_ffn import SkillGroup, SkillRouting

LEARNED_ESTIMATORS = ("ste", "eq6")


@dataclass(kw_only=True, repr=False, eq=False)
class LearnedMapSettings:
    r"""The ``"learned"`` router's config fields (SkillNet-BERT's config mixes them in).

    learned_embed_dim / learned_threshold: embedding size d and threshold s_t of the map.
    learned_estimator: ``"ste"`` (hard threshold forward, gradient of sigmoid(sharpness*(alpha - s_t))
        backward) or ``"eq6"`` (Eq. 6 as written).
    learned_sharpness: Eq. 6's alpha (the paper uses 1e9).
    orth_loss_coef: the orthogonality loss weight beta (Eq. 11).
    """

    learned_embed_dim: int = 64
    learned_threshold: float = 0.35
    learned_estimator: str = "ste"
    learned_sharpness: float = 10.0
    orth_loss_coef: float = 1e-3

    def validate_learned_map_settings(self) -> None:
        if self.learned_estimator not in LEARNED_ESTIMATORS:
            raise ValueError(f"learned_estimator={self.learned_estimator!r}; valid: {LEARNED_ESTIMATORS}")


class _StraightThrough(torch.autograd.Function):
    """Forward: the hard map 1[alpha > s_t]; backward: the gradient of sigmoid(kappa (alpha - s_t))."""

    @staticmethod
    def forward(ctx, alpha: torch.Tensor, threshold: float, sharpness: float) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(alpha)
        ctx.threshold, ctx.sharpness = threshold, sharpness
        return (alpha > threshold).to(alpha.dtype)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        (alpha,) = ctx.saved_tensors
        s = torch.sigmoid(ctx.sharpness * (alpha - ctx.threshold))
        return grad * ctx.sharpness * s * (1 - s), None, None


class LearnedSkillMap(nn.Module):
    """The learnable task-skill map (learnable skill combination, Eq. 2-8).

    alpha_ij = sigmoid((W_ij E_t(j) + b_ij) . E_s(i)) for skill i and task j (Eq. 3); skill i serves task j
    when alpha_ij > s_t (Eq. 5). Eq. 6 replaces the indicator by 2 sigmoid(kappa ReLU(alpha - s_t)) - 1,
    which with the paper's kappa = 1e9 passes no gradient in fp32 (ReLU is flat below s_t, the sigmoid
    saturates to exactly 1 above it), so the default estimator is straight-through: the hard map forward,
    the gradient of sigmoid(kappa (alpha - s_t)) backward. The generic skill is always on (weight 1), so
    Eq. 8's denominator is never 0.

    Parameters: ``task_embed`` [n, d], ``skill_embed`` [N, d], ``proj_weight`` [N, n, d, d] and
    ``proj_bias`` [N, n, d] (one projection per task-skill pair, as Eq. 3's W_ij, b_ij).
    """

    def __init__(self, tasks: Sequence[str], num_skills: int, dim: int, generic: int | None,
                 threshold: float, estimator: str, sharpness: float) -> None:
        super().__init__()
        self.tasks = list(tasks)
        self.generic = generic
        self.threshold, self.estimator, self.sharpness = threshold, estimator, sharpness
        n, N = len(self.tasks), num_skills
        self.task_embed = nn.Parameter(torch.empty(n, dim))
        self.skill_embed = nn.Parameter(torch.empty(N, dim))
        self.proj_weight = nn.Parameter(torch.empty(N, n, dim, dim))
        self.proj_bias = nn.Parameter(torch.empty(N, n, dim))
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        # Components of std d^-1/4 make E_t . E_s ~ N(0, 1), and W = I, b = 0 start the projection as the
        # identity: alpha starts spread around 0.5 (about a quarter of the cells below s_t = 0.35), a
        # random map the training must then shape, not a saturated one.
        d = self.task_embed.shape[1]
        std = d**-0.25
        self.task_embed.normal_(0.0, std)
        self.skill_embed.normal_(0.0, std)
        self.proj_weight.copy_(torch.eye(d).expand_as(self.proj_weight))
        self.proj_bias.zero_()

    def task_index(self, task: str) -> int:
        try:
            return self.tasks.index(task)
        except ValueError:
            raise KeyError(f"task {task!r} has no row in the learned skill map; "
                           f"tasks: {', '.join(self.tasks)}") from None

    def alpha(self) -> torch.Tensor:
        """alpha [n tasks, N skills] (Eq. 3)."""
        proj_NnD = torch.einsum("snde,ne->snd", self.proj_weight, self.task_embed) + self.proj_bias
        return torch.sigmoid(torch.einsum("snd,sd->ns", proj_NnD, self.skill_embed))

    def hard_map(self) -> torch.Tensor:
        """Bool [n, N]: the skills each task uses (Eq. 5), generic skill always on."""
        with torch.no_grad():
            hard = self.alpha() > self.threshold
        if self.generic is not None:
            hard[:, self.generic] = True
        return hard

    def task_skills(self) -> dict[str, list[int]]:
        hard = self.hard_map()
        return {t: hard[j].nonzero().view(-1).tolist() for j, t in enumerate(self.tasks)}

    def weights(self, alpha_nN: torch.Tensor) -> torch.Tensor:
        """alpha* of Eq. 6 (or its straight-through form), with the generic skill fixed at 1."""
        if self.estimator == "ste":
            w = _StraightThrough.apply(alpha_nN, self.threshold, self.sharpness)
        else:
            w = 2 * torch.sigmoid(self.sharpness * torch.relu(alpha_nN - self.threshold)) - 1
        if self.generic is not None:
            on = torch.zeros_like(w, dtype=torch.bool)
            on[:, self.generic] = True
            w = torch.where(on, torch.ones_like(w), w)
        return w

    def orthogonality_loss(self) -> torch.Tensor:
        """Eq. 4: |E_s E_s^T (1 - I)|_F^2 / (N (N - 1))."""
        E = self.skill_embed
        N = E.shape[0]
        if N < 2:
            return E.sum() * 0.0
        gram = E @ E.t()
        off = gram * (1 - torch.eye(N, device=E.device, dtype=E.dtype))
        return off.pow(2).sum() / (N * (N - 1))

    def routing(self, task: str | Sequence[str], device: torch.device | str) -> SkillRouting:
        """Rows grouped by task. In evaluation: the hard map (plain averages, the fused path). In training:
        per-skill weights that carry the map's gradient; a skill that is off in the forward pass but gets
        a straight-through gradient is a *probe*: its output enters with weight 0, computed without a
        graph to its own weights, so it learns nothing from the step while the map learns whether to
        switch it on."""
        names = [task] if isinstance(task, str) else list(task)
        order: dict[str, list[int]] = {}
        for i, t in enumerate(names):
            order.setdefault(t, []).append(i)
        rows_of = {t: (None if isinstance(task, str) or len(order) == 1 else
                       torch.tensor(r, dtype=torch.long, device=device)) for t, r in order.items()}
        idx = [self.task_index(t) for t in order]
        if not self.training:
            hard = self.hard_map()
            groups = [SkillGroup(rows_of[t], tuple(hard[j].nonzero().view(-1).tolist()))
                      for t, j in zip(order, idx)]
        else:
            w_nN = self.weights(self.alpha()[idx])
            groups = []
            for t, w_N in zip(order, w_nN):
                on = (w_N.detach() > 0).nonzero().view(-1).tolist()
                probe = [] if self.estimator != "ste" else [
                    i for i in range(w_N.shape[0]) if i not in on]
                ids = tuple(on + probe)
                groups.append(SkillGroup(rows_of[t], tuple(on), weights=w_N[list(ids)], probe=tuple(probe)))
        if len(groups) == 1:
            g = groups[0]
            return SkillRouting((SkillGroup(None, g.skill_ids, g.weights, g.probe),), None)
        perm = [i for t in order for i in order[t]]
        inverse = torch.empty(len(perm), dtype=torch.long)
        inverse[torch.tensor(perm)] = torch.arange(len(perm))
        return SkillRouting(tuple(groups), inverse.to(device))


@register_router("learned")
class LearnedMapRouter(Router):
    """Learnable skill combination: a `LearnedSkillMap` (``backbone.skill_map``) picks each task's skills;
    explicit ``skill_ids`` bypass it. Its orthogonality loss (Eq. 4) is weighted by ``orth_loss_coef``."""

    model_types = ("skillnet-bert",)
    own_lr_params = "skill_map."

    @classmethod
    def derive(cls, config: Any, **settings: Any) -> Derivation:
        return Derivation({"router": cls.name, **settings}, new_params=("skill_map.",))

    def attach(self, backbone: nn.Module) -> None:
        c = self.config
        gen = c.skill_index(c.generic_skill) if c.generic_skill is not None else None
        backbone.skill_map = LearnedSkillMap(
            list(c.task_heads) or list(c.tasks), c.num_skills, c.learned_embed_dim, gen,
            c.learned_threshold, c.learned_estimator, c.learned_sharpness)

    def learned_map(self, backbone: nn.Module) -> LearnedSkillMap | None:
        return backbone.skill_map

    def route(self, backbone: nn.Module, task: TaskArg, skill_ids: SkillIdsArg, *,
              token_mask_BT: torch.Tensor | None = None, device: torch.device | str = "cpu",
              batch_size: int | None = None) -> SkillRouting:
        if skill_ids is not None:
            return super().route(backbone, task, skill_ids, device=device, batch_size=batch_size)
        if task is None:
            raise ValueError("the learned skill map routes by task: pass task= (or explicit skill_ids=)")
        return backbone.skill_map.routing(task, device)

    def aux_losses(self, backbone: nn.Module, routings: Sequence[SkillRouting]) -> dict[str, torch.Tensor]:
        return {"orth": backbone.skill_map.orthogonality_loss()} if backbone.training else {}

    def aux_weights(self) -> dict[str, float]:
        return {"orth": self.config.orth_loss_coef}

    def task_skills(self, backbone: nn.Module) -> dict[str, list[str]]:
        names = self.config.skill_names
        return {t: [names[i] for i in ids] for t, ids in backbone.skill_map.task_skills().items()}

    def plain_mixture(self, backbone: nn.Module, task: str) -> list[tuple[int, float]]:
        """Evaluation routes by the hard map (`LearnedSkillMap.routing`): a plain average of the skills over
        the threshold (the soft weights are a training-time estimator only)."""
        ids = backbone.skill_map.task_skills()[task] if task in backbone.skill_map.tasks else self.skill_ids(task)
        return [(i, 1.0 / len(ids)) for i in ids]

    def before_save(self, backbone: nn.Module) -> None:
        for t, skills in self.task_skills(backbone).items():
            self.config.tasks[t] = list(skills)
