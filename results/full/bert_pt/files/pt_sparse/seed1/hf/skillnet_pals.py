"""Projected attention layers (BERT and PALs, Stickland & Murray 2019, §3; the second method seam:
what a task adds beside the shared layers).

Per task: one encoder projection V^E (d -> d_m) and one decoder projection V^D (d_m -> d), shared by all
layers, and in every layer a multi-head self-attention in the projected space, without output projection:

    PAL_l(h) = GELU(V^D MHA_l(V^E h))

The layer adds it inside its FFN residual, before the LayerNorm, as the public Bert-n-PALs code does:
LN(FFN(a) + a + PAL_l(h)), with h the layer's input and a the attention output.

Parameters per task: d*d_m + d_m (V^E) + d_m*d + d (V^D) + L * 3 * (d_m^2 + d_m) (query, key, value of
each layer).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .skillnet_extras import LayerHook, TaskExtras, register_extras


class ProjectedSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.value = nn.Linear(dim, dim)
        self.dropout_p = dropout

    def forward(self, x_BTM: torch.Tensor, mask_B11T: torch.Tensor | None) -> torch.Tensor:
        B, T, M = x_BTM.shape
        H = self.heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, T, H, M // H).transpose(1, 2)

        o = F.scaled_dot_product_attention(
            split(self.query(x_BTM)), split(self.key(x_BTM)), split(self.value(x_BTM)), attn_mask=mask_B11T,
            dropout_p=self.dropout_p if self.training else 0.0,
        )
        return o.transpose(1, 2).reshape(B, T, M)


class TaskPAL(nn.Module):
    """One task's projected attention layers: ``down`` = V^E, ``up`` = V^D, ``layers.{l}`` = MHA_l."""

    def __init__(self, hidden: int, dim: int, heads: int, num_layers: int, dropout: float) -> None:
        super().__init__()
        self.down = nn.Linear(hidden, dim)
        self.up = nn.Linear(dim, hidden)
        self.layers = nn.ModuleList(ProjectedSelfAttention(dim, heads, dropout) for _ in range(num_layers))

    def forward(self, layer: int, h_BTD: torch.Tensor, mask_B11T: torch.Tensor | None) -> torch.Tensor:
        return F.gelu(self.up(self.layers[layer](self.down(h_BTD), mask_B11T)))


@dataclass(kw_only=True, repr=False, eq=False)
class ProjectedAttentionSettings:
    r"""The projected attention layers' config fields (SkillNet-BERT's config mixes them in).

    pals_dim: 0 = none; else the projected size d_m (204 at hidden 768), ``pals_heads`` attention heads.
    """

    pals_dim: int = 0
    pals_heads: int = 6

    def validate_projected_attention_settings(self) -> None:
        if self.pals_dim < 0 or (self.pals_dim and self.pals_dim % self.pals_heads):
            raise ValueError(f"pals_dim={self.pals_dim} must be 0 (no PALs) or a multiple of "
                             f"pals_heads={self.pals_heads}")

    @staticmethod
    def pals_dim_for(hidden_size: int, heads: int = 6) -> int:
        """d_m scaled from the paper's 204 at hidden 768, rounded up to a multiple of the heads."""
        return max(heads, -(-round(hidden_size * 204 / 768) // heads) * heads)


@register_extras("pals")
class ProjectedAttentionLayers(TaskExtras, nn.Module):
    """``pals.tasks.{task}``: a `TaskPAL` per fine-tuning task. Rows of a mixed-task batch use their own
    task's. Built when ``config.pals_dim`` > 0, for the config's tasks with heads."""

    plain_refusal = ("PALs add a projected attention per task inside every layer's residual, which a stock "
                     "BertLayer has no place for")

    def __init__(self, tasks: Sequence[str], hidden: int, dim: int, heads: int, num_layers: int,
                 dropout: float) -> None:
        super().__init__()
        self.shape = (hidden, dim, heads, num_layers, dropout)
        self.tasks = nn.ModuleDict({t: TaskPAL(*self.shape) for t in tasks})

    @classmethod
    def from_config(cls, config: Any) -> ProjectedAttentionLayers | None:
        if not getattr(config, "pals_dim", 0):
            return None
        return cls(list(config.task_heads), config.hidden_size, config.pals_dim, config.pals_heads,
                   config.num_hidden_layers, config.attention_probs_dropout_prob)

    def task_modules(self) -> dict[str, nn.Module]:
        return dict(self.tasks.items())

    def add_task(self, task: str, *args: Any) -> TaskPAL:
        self.tasks[task] = TaskPAL(*self.shape)
        return self.tasks[task]

    def layer_hook(self, task: str | Sequence[str] | None, mask_B11T: torch.Tensor | None,
                   device: torch.device | str) -> LayerHook | None:
        rows = {t: (None if r is None else r.to(device)) for t, r in task_rows(task).items()}
        if not rows:
            return None

        def hook(layer: int, h_BTD: torch.Tensor) -> torch.Tensor | None:
            return self(layer, h_BTD, mask_B11T, rows)

        return hook

    def __call__(self, layer: int, h_BTD: torch.Tensor, mask_B11T: torch.Tensor | None,
                 rows: dict[str, torch.Tensor | None]) -> torch.Tensor | None:
        """Sum over the batch's tasks of their PAL on their rows; None when no task of the batch has one."""
        out = None
        for task, idx in rows.items():
            if task not in self.tasks:
                continue
            if idx is None:
                return self.tasks[task](layer, h_BTD, mask_B11T)
            m = None if mask_B11T is None else mask_B11T.index_select(0, idx)
            y = self.tasks[task](layer, h_BTD.index_select(0, idx), m)
            out = (torch.zeros_like(h_BTD) if out is None else out).index_copy(0, idx, y)
        return out


def task_rows(task: str | Sequence[str] | None) -> dict[str, torch.Tensor | None]:
    """{task: row indices} of a batch (None = every row), in first-appearance order."""
    if task is None:
        return {}
    if isinstance(task, str):
        return {task: None}
    order: dict[str, list[int]] = {}
    for i, t in enumerate(task):
        order.setdefault(t, []).append(i)
    if len(order) == 1:
        return {next(iter(order)): None}
    return {t: torch.tensor(r, dtype=torch.long) for t, r in order.items()}
