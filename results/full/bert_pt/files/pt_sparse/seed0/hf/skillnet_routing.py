"""Routing of a SkillNet model, BERT or BART: task names or skill ids -> a `SkillRouting` through the config's
router, for a whole model and for a BART encoder or decoder run alone (as `generate` runs the encoder); and the
save that lets the router write what it learnt into the config first."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from .skillnet_hub import has_tokenizer, save_tokenizer, write_remote_code
from .skillnet_registry import Router, build_router
from .skillnet_routers import task_routing
from .skillnet_skill_ffn import SkillRouting


class SkillRoutingMixin:
    """Task names / skill ids -> `SkillRouting`, for any module with a SkillNet config at `.config`. Put before
    transformers' `PreTrainedModel` in the bases, so that its `save_pretrained` runs first."""

    config: Any

    def save_pretrained(self, save_directory: str | os.PathLike, *args: Any, **kwargs: Any) -> None:
        """HF save, plus the modeling code and ``auto_map`` (plain transformers loads the folder with
        ``trust_remote_code=True``) and the tokenizer of the checkpoint this model came from, if it had one.
        The router first brings the config up to date (a learned task-skill map is written into
        ``config.tasks``, so the saved config names exactly the skills the map selects now)."""
        self.router.before_save(self.base_model)
        super().save_pretrained(save_directory, *args, **kwargs)  # type: ignore[misc]
        if not kwargs.get("is_main_process", True):
            return
        write_remote_code(save_directory, self.config.model_type)
        src = getattr(self.config, "_name_or_path", "") or ""
        if src and Path(src).is_dir() and has_tokenizer(src) and not has_tokenizer(save_directory):
            save_tokenizer(save_directory, source=src)

    @property
    def router(self) -> Router:
        """The config's router (routers.py): routing, auxiliary losses, counts."""
        return build_router(self.config)

    def routing(
        self,
        task: str | Sequence[str] | None = None,
        skill_ids: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor | None = None,
        device: torch.device | str = "cpu",
        batch_size: int | None = None,
    ) -> SkillRouting:
        """Skill routing from a task name, one task per row (by the config's task map), or skill ids ([k] or
        [B, k], -1 pads); neither: the config's ``default_task``. `batch_size`, when given, must equal the number
        of rows of a per-row choice. A forward routes through its router (`router.route`)."""
        return task_routing(self.config, task, skill_ids, device, batch_size, self.config.skill_ids)

    def stack_routing(
        self,
        task: str | Sequence[str] | None,
        skill_ids: Sequence[int] | Sequence[Sequence[int]] | torch.Tensor | None,
        token_mask_BT: torch.Tensor | None,
        seq_len: int,
        device: torch.device | str,
        batch_size: int | None,
    ) -> SkillRouting:
        """The router's routing of one stack (encoder or decoder) over its `seq_len` new tokens; padding
        (False in `token_mask_BT`) takes no part where the router routes tokens."""
        if task is None and skill_ids is None:
            task = self.config.default_task
        router = self.router
        keep = _token_mask(token_mask_BT, seq_len) if router.routes_tokens else None
        return router.route(self, task, skill_ids, token_mask_BT=keep, device=device, batch_size=batch_size)

    def skill_id_rows(self, tasks: Sequence[str]) -> torch.Tensor:
        """[B, k] skill ids of one task per row, -1 padded: the form that survives HF's beam expansion."""
        rows = [self.config.skill_ids(t) for t in tasks]
        out = torch.full((len(rows), max(map(len, rows))), -1, dtype=torch.long)
        for i, r in enumerate(rows):
            out[i, : len(r)] = torch.tensor(r)
        return out


def _rows(*tensors: torch.Tensor | None) -> tuple[int | None, torch.device, int]:
    """(rows, device, tokens per row) of the first tensor given ([B, T, ...] ids or embeddings)."""
    t = next((t for t in tensors if t is not None), None)
    return (None, torch.device("cpu"), 0) if t is None else (t.shape[0], t.device, t.shape[1])


def _token_mask(mask: torch.Tensor | None, seq_len: int) -> torch.Tensor | None:
    """[B, seq_len] bool, False at padding, from a [B, T] attention mask. With a KV cache the decoder's mask
    covers the cached tokens too ([B, past + new]): the new tokens are its last `seq_len` columns."""
    if mask is None:
        return None
    if mask.dim() != 2:
        raise ValueError(f"a token-routing router needs a 2-D [batch, tokens] attention mask, got shape {tuple(mask.shape)}")
    return mask[:, mask.shape[1] - seq_len :].bool()


def start_routings(routings_out: list[SkillRouting] | None, *routings: SkillRouting) -> None:
    """A forward's routings (the encoder's and the decoder's; one object twice when shared) start empty: a
    routing passed in again keeps only this forward's auxiliary losses. Each is appended once to
    ``routings_out``."""
    for r in {id(r): r for r in routings}.values():
        r.aux.clear()
        if routings_out is not None:
            routings_out.append(r)
