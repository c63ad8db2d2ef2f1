"""Routers: which skill FFNs a token uses, and with what weight (the first method seam, shared/DESIGN.md).

* task map (SkillNet): the config's task -> skills table; built in ``SkillNetBertPreTrainedModel.routing``.
* learned map (learnable-skill-combination.md Eq. 1-8): `LearnedSkillMap`, task and skill embeddings whose
  sigmoid similarity, thresholded, picks each task's skills.
* token gate (the MoE baseline, skillnet-nlu.md §4.1): `top_k_gating`, fairseq's ``top2gating`` design
  with a capacity per expert, padding excluded and a per-layer load-balancing loss.

All of them produce data (a `SkillRouting`, or per-token expert weights) that `SkillFFN` consumes; the FFN
bank and its fused kernel are the same for every method.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from .skill_ffn import SkillGroup, SkillRouting


# ---------------------------------------------------------------------------------------- token gate (MoE)
@dataclass(frozen=True)
class GateOutput:
    combine_NE: torch.Tensor  # weight of expert e for token n (0 where not routed or dropped)
    dispatch_NE: torch.Tensor  # bool: token n is computed by expert e (within capacity)
    aux_loss: torch.Tensor  # load balance: E * sum_e mean_prob_e * frac_top1_e (fairseq: E^2 * mean_e)
    capacity: int
    dropped: int  # (token, expert) assignments over capacity


def top_k_gating(logits_NE: torch.Tensor, k: int, capacity_factor: float,
                 keep_N: torch.Tensor | None = None) -> GateOutput:
    """Top-k token routing with capacity, after fairseq's ``top2gating`` (deterministic second choice).

    Softmax in fp32. Each expert takes at most ``capacity = ceil(capacity_factor * k * tokens / E)``
    assignments, filled first by every token's first choice (in token order), then by second choices, as
    fairseq does; an assignment over capacity is dropped and the gates are renormalised over the experts
    that kept the token, so a token dropped everywhere gets 0 from the FFN and rides the residual.
    ``keep_N`` (False = padding) removes tokens from routing, from the capacity count and from the loss.
    """
    probs_NE = logits_NE.float().softmax(-1)
    N, E = probs_NE.shape
    keep = torch.ones(N, dtype=torch.bool, device=logits_NE.device) if keep_N is None else keep_N.bool()
    n_real = int(keep.sum())
    capacity = max(1, math.ceil(capacity_factor * k * n_real / E))
    top_NK = probs_NE.topk(k, dim=-1).indices
    # masks[j]: token's j-th choice, one-hot; padding routes nowhere
    masks = [torch.nn.functional.one_hot(top_NK[:, j], E).to(probs_NE.dtype) * keep[:, None] for j in range(k)]
    # Balancing loss on the first choice before capacity, over real tokens only (padding would pull the
    # mean towards whatever the gate does with pad embeddings: transformers PR #28517).
    denom = max(n_real, 1)
    mean_prob_E = (probs_NE * keep[:, None]).sum(0) / denom
    frac_top1_E = masks[0].sum(0) / denom
    aux = E * (mean_prob_E * frac_top1_E).sum()
    # Position of each assignment in its expert's buffer: first choices first, then second choices.
    filled_E = torch.zeros(E, dtype=probs_NE.dtype, device=probs_NE.device)
    kept_masks = []
    for m_NE in masks:
        loc_NE = torch.cumsum(m_NE, 0) - 1 + filled_E
        filled_E = filled_E + m_NE.sum(0)
        kept_masks.append(m_NE * (loc_NE < capacity))
    dispatch = torch.stack(kept_masks).sum(0)
    dropped = int(sum(m.sum() for m in masks) - dispatch.sum())
    gates_NE = probs_NE * dispatch
    combine = gates_NE / gates_NE.sum(-1, keepdim=True).clamp(min=torch.finfo(gates_NE.dtype).eps)
    return GateOutput(combine.to(logits_NE.dtype), dispatch.bool(), aux, capacity, dropped)


# ---------------------------------------------------------------------------------------- learned map
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
    """The learnable task-skill map (learnable-skill-combination.md Eq. 2-8).

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
