"""Routers: which skill FFNs each token uses and with what weight, the first method seam.

A `Router` is built from the model config (``config.router`` names it in `ROUTERS`) and answers three
questions for the model that holds it: the `SkillRouting` of a forward (rows grouped by skill set, or a
token gate per layer), the auxiliary losses of that forward (returned by the layers through the routing,
weighted by the router's own config fields), and which FFNs a forward of a task runs (for parameter and
FLOP counts). The FFN bank and its fused kernel are the same for every router.

* ``"task"``, `TaskMapRouter` (SkillNet): the config's task -> skills table.
* ``"dense"``, `DenseRouter`: one FFN that every task uses (dense joint fine-tuning, PALs' encoder).
* ``"learned"``, `LearnedMapRouter` (learnable skill combination, Eq. 1-8): `LearnedSkillMap`, task and
  skill embeddings whose sigmoid similarity, thresholded, picks each task's skills; two estimators.
* ``"topk"``, `TokenGateRouter` (the MoE baseline): a `TokenGate` per skill layer, fairseq's
  ``top2gating`` design with a capacity per expert, padding excluded and a per-layer balancing loss.

Adding a router is one subclass and one `register_router` line, inside this package or outside it.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn

from .skill_ffn import SkillGroup, SkillRouting

TaskArg = str | Sequence[str] | None
SkillIdsArg = Sequence[int] | Sequence[Sequence[int]] | torch.Tensor | None

ROUTERS: dict[str, type[Router]] = {}


def register_router(name: str) -> Callable[[type[Router]], type[Router]]:
    """Class decorator: ``config.router == name`` picks this class (the name is what checkpoints store)."""

    def add(cls: type[Router]) -> type[Router]:
        if name in ROUTERS and ROUTERS[name] is not cls:
            raise ValueError(f"router {name!r} is already registered ({ROUTERS[name].__qualname__})")
        cls.name = name
        ROUTERS[name] = cls
        return cls

    return add


def router_class(name: str) -> type[Router]:
    try:
        return ROUTERS[name]
    except KeyError:
        raise ValueError(f"router={name!r}; valid: {tuple(ROUTERS)}") from None


def build_router(config: Any) -> Router:
    return router_class(config.router)(config)


@dataclass(frozen=True)
class Derivation:
    """How a router's model is derived from a SkillNet (task map) model: config changes, which skill of the
    reference each new skill copies (None: the same skills), and name fragments of new parameters."""

    changes: dict[str, Any]
    skill_source: list[int] | None = None
    new_params: tuple[str, ...] = ()


class Router:
    """Which FFNs each row or token uses. Defaults: the task's skills from the config, no parameters of its
    own, no auxiliary loss. Holds the model's config (the same object, so edits to it are seen)."""

    name: ClassVar[str] = ""
    # Backbones (config.model_type) it is defined for; None = every one.
    model_types: ClassVar[tuple[str, ...] | None] = None
    # Name fragments of parameters that can be in the graph with an all-zero gradient (the optimizer must
    # check for them) and of parameters that train with their own learning rate (train.skill_map_lr).
    zero_grad_params: ClassVar[tuple[str, ...]] = ()
    own_lr_params: ClassVar[str | None] = None
    # Whether tasks pick skills through config.tasks (new skills, frozen old skills, skill ablations apply).
    uses_task_skills: ClassVar[bool] = False
    # Whether each layer routes tokens itself (`route` then needs the padding mask of the stack's tokens).
    routes_tokens: ClassVar[bool] = False

    def __init__(self, config: Any) -> None:
        self.config = config

    # ---- configuration ---------------------------------------------------------------------------
    def validate(self) -> None:
        """Checks of the router's own config fields (called by the config's validation)."""
        if self.model_types is not None and self.config.model_type not in self.model_types:
            raise ValueError(f"router={self.name!r} is not available for {self.config.model_type} models "
                             f"(it is defined for {', '.join(self.model_types)})")

    @classmethod
    def derive(cls, config: Any, **settings: Any) -> Derivation:
        """This router's model from a task-map model: by default the same skills, ``router`` set."""
        return Derivation({"router": cls.name, **settings})

    # ---- construction ------------------------------------------------------------------------------
    def attach(self, backbone: nn.Module) -> None:
        """Register the router's model-level modules on the backbone (none by default)."""

    def layer_gate(self, hidden_size: int) -> nn.Module | None:
        """A module for each skill layer's FFN bank that picks experts per token (None: rows are routed)."""
        return None

    # ---- a forward -------------------------------------------------------------------------------------
    def skill_ids(self, task: str) -> list[int]:
        """Sorted ids of the FFNs the rows of `task` run."""
        return self.config.skill_ids(task)

    def route(self, backbone: nn.Module, task: TaskArg, skill_ids: SkillIdsArg, *,
              token_mask_BT: torch.Tensor | None = None, device: torch.device | str = "cpu",
              batch_size: int | None = None) -> SkillRouting:
        """The routing of one forward: rows grouped by the skills of their task, or explicit skill ids."""
        return task_routing(self.config, task, skill_ids, device, batch_size, self.skill_ids)

    def aux_losses(self, backbone: nn.Module, routings: Sequence[SkillRouting]) -> dict[str, torch.Tensor]:
        """Raw auxiliary losses of a forward, by name, from what its layers returned into `routings`."""
        return {}

    def aux_weights(self) -> dict[str, float]:
        """Weight of each auxiliary loss in the training loss (from the config)."""
        return {}

    def weighted(self, aux: dict[str, torch.Tensor]) -> torch.Tensor | None:
        if not aux:
            return None
        w = self.aux_weights()
        return sum(w[k] * v for k, v in aux.items())

    # ---- counts and the learned map ----------------------------------------------------------------
    def activated(self, task: str) -> tuple[list[int], int]:
        """(the FFNs a token of `task` may run, how many of them it runs) in each skill layer."""
        ids = self.skill_ids(task)
        return ids, len(ids)

    def learned_map(self, backbone: nn.Module) -> LearnedSkillMap | None:
        """The task-skill map the router learns, if it learns one."""
        return None

    def before_save(self, backbone: nn.Module) -> None:
        """Bring the config up to date with what the router learnt (it is saved with the weights)."""


def task_routing(config: Any, task: TaskArg, skill_ids: SkillIdsArg, device: torch.device | str,
                 batch_size: int | None, ids_of: Callable[[str], list[int]]) -> SkillRouting:
    """Skill routing from a task name, one task per row, or explicit skill ids ([k] or [B, k], -1 pads).
    `batch_size`, when given, must equal the number of rows of a per-row choice."""
    if (task is None) == (skill_ids is None):
        raise ValueError("pass exactly one of task= (a name or one name per row) or skill_ids=")
    if isinstance(task, str):
        return SkillRouting.uniform(ids_of(task))
    if task is not None:
        rows = [ids_of(t) for t in task]
    else:
        ids = skill_ids.tolist() if isinstance(skill_ids, torch.Tensor) else list(skill_ids)
        rows = ids if ids and isinstance(ids[0], (list, tuple)) else None
        bad = [i for r in (rows or [ids]) for i in r if i >= config.num_skills]
        if bad:
            raise ValueError(f"skill ids {bad} out of range: the model has {config.num_skills} skills")
        if rows is None:
            return SkillRouting.uniform(ids)
    if batch_size is not None and len(rows) != batch_size:
        raise ValueError(f"skills given for {len(rows)} rows, but the batch has {batch_size} rows")
    return SkillRouting.per_row(rows, device)


# ---------------------------------------------------------------------------------------- task map
@register_router("task")
class TaskMapRouter(Router):
    """SkillNet: each task runs the skills ``config.tasks`` lists (plus the generic skill), averaged."""

    uses_task_skills = True


_DENSE_SKILL = [{"name": "shared", "description": "one FFN shared by all tasks"}]


@register_router("dense")
class DenseRouter(Router):
    """One FFN that every row runs, whatever its task: a dense model in the skill layout."""

    def validate(self) -> None:
        super().validate()
        if self.config.num_skills != 1:
            raise ValueError(f"router='dense' runs one FFN per layer, but the model has {self.config.num_skills} skills")

    @classmethod
    def derive(cls, config: Any, **settings: Any) -> Derivation:
        """The dense FFN is the reference's generic skill (the one every objective trained)."""
        if config.generic_skill is None:
            raise ValueError("dense-FFN methods take the reference's generic skill as the shared FFN, "
                             "but the model has no generic_skill")
        tasks = {t: ["shared"] for t in config.tasks}
        changes = {"router": cls.name, "skills": copy.deepcopy(_DENSE_SKILL), "tasks": tasks,
                   "generic_skill": None, **settings}
        return Derivation(changes, skill_source=[config.skill_index(config.generic_skill)])

    def skill_ids(self, task: str) -> list[int]:
        if task not in self.config.tasks:  # a misspelt task is still an error
            raise KeyError(f"unknown task {task!r}; valid tasks: {', '.join(self.config.tasks)}")
        return [0]


# ---------------------------------------------------------------------------------------- learned map
LEARNED_ESTIMATORS = ("ste", "eq6")


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

    def before_save(self, backbone: nn.Module) -> None:
        for t, skills in self.task_skills(backbone).items():
            self.config.tasks[t] = list(skills)


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


class TokenGate(nn.Linear):
    """One skill layer's gate: a bias-free linear map to expert logits, then top-k with capacity
    (`top_k_gating`); training and evaluation have their own capacity factor."""

    def __init__(self, hidden_size: int, num_experts: int, top_k: int, capacity_factor: float,
                 eval_capacity_factor: float) -> None:
        super().__init__(hidden_size, num_experts, bias=False)
        self.top_k = top_k
        self.capacity_factor, self.eval_capacity_factor = capacity_factor, eval_capacity_factor

    def logits(self, x_ND: torch.Tensor) -> torch.Tensor:
        return super().forward(x_ND)

    def forward(self, x_ND: torch.Tensor, keep_N: torch.Tensor | None = None) -> GateOutput:  # type: ignore[override]
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        return top_k_gating(self.logits(x_ND), self.top_k, factor, keep_N)


@register_router("topk")
class TokenGateRouter(Router):
    """The MoE baseline: a `TokenGate` in every skill layer picks ``moe_top_k`` FFNs per token; the task
    only picks the head (a misspelt one is still an error). The per-layer balancing losses, averaged over
    the layers that ran, are weighted by ``moe_aux_loss_coef``."""

    # experts whose tokens all miss the loss are in the graph with a zero gradient
    zero_grad_params = (".skill_ffn.skills.",)
    routes_tokens = True

    def validate(self) -> None:
        super().validate()
        c = self.config
        if not 0 < c.moe_top_k <= c.num_skills:
            raise ValueError(f"moe_top_k={c.moe_top_k} must be in 1..{c.num_skills}")
        if c.skill_layernorm != "shared":
            # The token-gate path computes plain FFN experts; per-skill LayerNorm would lose the residual
            # and the layer's LayerNorm without a word.
            raise ValueError(f"router='topk' needs skill_layernorm='shared', not {c.skill_layernorm!r}")
        eval_factor = c.moe_eval_capacity_factor
        if not (c.moe_capacity_factor > 0 and (eval_factor is None or eval_factor > 0)):
            raise ValueError("moe_capacity_factor and moe_eval_capacity_factor must be > 0 "
                             "(moe_eval_capacity_factor may be None: no capacity limit in evaluation)")

    @classmethod
    def derive(cls, config: Any, **settings: Any) -> Derivation:
        """Top-2 (or every skill, if fewer) over as many experts as skills; expert i = skill i."""
        changes = {"router": cls.name, "moe_top_k": min(2, config.num_skills), **settings}
        return Derivation(changes, new_params=(".gate.",))

    def capacity_factors(self) -> tuple[float, float]:
        """(training, evaluation) capacity factors. No evaluation limit (None) is the factor at which every
        token fits: ``experts / top_k`` gives capacity = tokens."""
        c = self.config
        eval_factor = c.moe_eval_capacity_factor
        if eval_factor is None:
            eval_factor = c.num_skills / max(c.moe_top_k, 1)
        return c.moe_capacity_factor, eval_factor

    def layer_gate(self, hidden_size: int) -> nn.Module | None:
        return TokenGate(hidden_size, self.config.num_skills, self.config.moe_top_k, *self.capacity_factors())

    def route(self, backbone: nn.Module, task: TaskArg, skill_ids: SkillIdsArg, *,
              token_mask_BT: torch.Tensor | None = None, device: torch.device | str = "cpu",
              batch_size: int | None = None) -> SkillRouting:
        if task is not None:
            for t in [task] if isinstance(task, str) else task:
                self.config.task_skill_names(t)
        return SkillRouting.token_gate(self.config.num_skills, token_mask_BT)

    def aux_losses(self, backbone: nn.Module, routings: Sequence[SkillRouting]) -> dict[str, torch.Tensor]:
        # Per layer, then averaged: a loss over all layers' tokens concatenated would let one layer's
        # imbalance hide behind another's (transformers #28255).
        per_layer = [loss for r in routings for loss in r.aux]
        return {"moe_balance": torch.stack(per_layer).mean()} if per_layer else {}

    def aux_weights(self) -> dict[str, float]:
        return {"moe_balance": self.config.moe_aux_loss_coef}

    def activated(self, task: str) -> tuple[list[int], int]:
        return list(range(self.config.num_skills)), self.config.moe_top_k
