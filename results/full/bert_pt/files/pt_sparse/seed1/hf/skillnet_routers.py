"""Routers: which skill FFNs each token uses and with what weight, the first method seam.

A `Router` is built from the model config (``config.router`` names it in `ROUTERS`) and answers three
questions for the model that holds it: the `SkillRouting` of a forward (rows grouped by skill set, or a
token gate per layer), the auxiliary losses of that forward (returned by the layers through the routing,
weighted by the router's own config fields), and which FFNs a forward of a task runs (for parameter and
FLOP counts). The FFN bank and its fused kernel are the same for every router.

* ``"task"``, `TaskMapRouter` (SkillNet): the config's task -> skills table.
* ``"dense"``, `DenseRouter`: one FFN that every task uses (dense joint fine-tuning, PALs' encoder).
* ``"learned"``, `LearnedMapRouter` (learned_map.py; learnable skill combination, Eq. 1-8): task and
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

from .skillnet_skill_ffn import SkillRouting

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


# Where a method that cannot be written as a stock transformers model points instead.
REMOTE_CODE_EXPORT = ("export it with its own modeling code instead: python -m skillnet.pretrain.export "
                      "--checkpoint FOLDER --out OUT --task TASK (loads with trust_remote_code=True)")


class NotFlattenable(ValueError):
    """A model (method) whose task cannot be written as a stock transformers model, with the reason."""


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
    # Whether a model saved with this router can start a fine-tuning run (model.init): its weights are a
    # plain skill layout, with no gate or map of the router's own for a method to inherit by accident.
    starts_runs: ClassVar[bool] = False

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

    def learned_map(self, backbone: nn.Module) -> nn.Module | None:
        """The task-skill map the router learns, if it learns one."""
        return None

    def plain_mixture(self, backbone: nn.Module, task: str) -> list[tuple[int, float]]:
        """(skill id, weight) of the FFNs every token of `task` runs in evaluation, weights summing to 1.
        One choice for the whole task is what lets a plain export merge them into one FFN (export/flatten.py);
        a router that chooses per token raises `NotFlattenable`."""
        ids = self.skill_ids(task)
        return [(i, 1.0 / len(ids)) for i in ids]

    def before_save(self, backbone: nn.Module) -> None:
        """Bring the config up to date with what the router learnt (it is saved with the weights)."""


def task_routing(config: Any, task: TaskArg, skill_ids: SkillIdsArg, device: torch.device | str,
                 batch_size: int | None, ids_of: Callable[[str], list[int]]) -> SkillRouting:
    """Skill routing from a task name, one task per row, or explicit skill ids ([k] or [B, k], -1 pads).
    `batch_size`, when given, must equal the number of rows of a per-row choice. Neither given: the
    config's ``default_task`` (an export's), else the error."""
    if task is None and skill_ids is None:
        task = getattr(config, "default_task", None)
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
    starts_runs = True


_DENSE_SKILL = [{"name": "shared", "description": "one FFN shared by all tasks"}]


@register_router("dense")
class DenseRouter(Router):
    """One FFN that every row runs, whatever its task: a dense model in the skill layout."""

    starts_runs = True

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


# ---------------------------------------------------------------------------------------- token gate (MoE)
@dataclass(frozen=True)
class GateOutput:
    combine_NE: torch.Tensor  # weight of expert e for token n (0 where not routed or dropped)
    dispatch_NE: torch.Tensor  # bool: token n is computed by expert e (within capacity)
    aux_loss: torch.Tensor  # load balance: E * sum_e mean_prob_e * frac_top1_e (fairseq: E^2 * mean_e)
    capacity: int
    dropped: int  # (token, expert) assignments over capacity


def top_k_gating(logits_NE: torch.Tensor, k: int, capacity_factor: float,
                 keep_N: torch.Tensor | None = None, order_M: torch.Tensor | None = None) -> GateOutput:
    """Top-k token routing with capacity, after fairseq's ``top2gating`` (deterministic second choice).

    Softmax in fp32. Each expert takes at most ``capacity = ceil(capacity_factor * k * tokens / E)``
    assignments, filled first by every token's first choice (in token order), then by second choices, as
    fairseq does; an assignment over capacity is dropped and the gates are renormalised over the experts
    that kept the token, so a token dropped everywhere gets 0 from the FFN and rides the residual.
    ``keep_N`` (False = padding) removes tokens from routing, from the capacity count and from the loss.
    ``order_M`` (the real tokens' indices in priority order) replaces token order where the layout is not
    the samples' order (packed rows), so that a packed batch drops exactly what the padded one drops.
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
        if order_M is None:
            loc_NE = torch.cumsum(m_NE, 0) - 1 + filled_E
        else:  # positions counted in priority order; tokens outside the order are padding (routed nowhere)
            loc_NE = torch.zeros_like(m_NE).index_copy(0, order_M, torch.cumsum(m_NE[order_M], 0)) - 1 + filled_E
        filled_E = filled_E + m_NE.sum(0)
        kept_masks.append(m_NE * (loc_NE < capacity))
    dispatch = torch.stack(kept_masks).sum(0)
    dropped = int(sum(m.sum() for m in masks) - dispatch.sum())
    gates_NE = probs_NE * dispatch
    combine = gates_NE / gates_NE.sum(-1, keepdim=True).clamp(min=torch.finfo(gates_NE.dtype).eps)
    return GateOutput(combine.to(logits_NE.dtype), dispatch.bool(), aux, capacity, dropped)


@dataclass(kw_only=True, repr=False, eq=False)
class TokenGateSettings:
    r"""The ``"topk"`` router's config fields, mixed into both backbones' configs (`SkillLayoutMixin`).

    moe_top_k: FFNs each token runs (of as many as there are skills).
    moe_aux_loss_coef: weight of the load-balancing loss (computed per layer, averaged over layers)
        added to the training loss.
    moe_capacity_factor / moe_eval_capacity_factor: expert capacity in training / evaluation,
        ``ceil(factor * top_k * tokens / experts)``; tokens over capacity get 0 from the FFN and ride the
        residual. ``factor >= experts / top_k`` never drops a token; ``moe_eval_capacity_factor=None``
        means exactly that (no capacity limit in evaluation).
    """

    moe_top_k: int = 2
    moe_aux_loss_coef: float = 0.01
    moe_capacity_factor: float = 1.0
    moe_eval_capacity_factor: float | None = 2.0


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

    def forward(self, x_ND: torch.Tensor, keep_N: torch.Tensor | None = None,  # type: ignore[override]
                order_M: torch.Tensor | None = None) -> GateOutput:
        factor = self.capacity_factor if self.training else self.eval_capacity_factor
        return top_k_gating(self.logits(x_ND), self.top_k, factor, keep_N, order_M)


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

    def plain_mixture(self, backbone: nn.Module, task: str) -> list[tuple[int, float]]:
        raise NotFlattenable(
            "router='topk' (MoE) picks FFNs per token, so no single FFN computes a task; " + REMOTE_CODE_EXPORT)
