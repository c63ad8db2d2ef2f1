"""Parameter counts: total, per skill, and *activated* per task (NLU Tables 4-6, NLG Table 6 report the
latter). Work for SkillNet-BERT and SkillNet-BART; BART's lm_head is tied to the shared embeddings, so it
counts once, as shared."""

from __future__ import annotations

import re
from collections import defaultdict

from torch import nn

from .surgery import skill_base_of

_SKILL = re.compile(r"\.skill_ffn\.skills\.(\d+)\.")
_PALS = re.compile(r"(?:^|\.)pals\.tasks\.([^.]+)\.")
# Pre-training heads: which objective uses which part of `cls`.
_OBJECTIVE_HEADS = {"mlm": "cls.predictions.", "nsp": "cls.seq_relationship."}


def _owner(name: str, skill_names: list[str]) -> tuple[str, str]:
    m = _SKILL.search(name)
    if m:
        return "skill", skill_names[int(m.group(1))]
    if name.startswith("heads."):
        return "head", name.split(".")[1]
    m = _PALS.search(name)
    if m:  # a task's projected attention layers: used by that task only, like its head
        return "head", m.group(1)
    for obj, prefix in _OBJECTIVE_HEADS.items():
        if name.startswith(prefix):
            return "head", obj
    return "shared", ""


def count_parameters(model: nn.Module) -> dict:
    """{"total", "shared", "skills": {name: n}, "heads": {task: n}, "trainable"}; tied weights counted once."""
    names = skill_base_of(model).config.skill_names
    out: dict = {
        "total": 0,
        "shared": 0,
        "skills": defaultdict(int),
        "heads": defaultdict(int),
        "trainable": 0,
    }
    for pname, p in model.named_parameters():
        kind, who = _owner(pname, names)
        n = p.numel()
        out["total"] += n
        out["trainable"] += n if p.requires_grad else 0
        if kind == "shared":
            out["shared"] += n
        else:
            out[kind + "s"][who] += n
    out["skills"] = dict(out["skills"])
    out["heads"] = dict(out["heads"])
    return out


def _activated(model: nn.Module, task: str, trainable_only: bool) -> int:
    cfg = skill_base_of(model).config
    # MoE baseline: each token runs moe_top_k of the experts (all the same size): count that many.
    experts = cfg.moe_top_k if getattr(cfg, "router", "task") == "topk" else None  # SkillNet-BART: task only
    active = set(cfg.skill_names if experts else cfg.task_skill_names(task))
    total, expert_sizes = 0, defaultdict(int)
    for pname, p in model.named_parameters():
        if trainable_only and not p.requires_grad:
            continue
        kind, who = _owner(pname, cfg.skill_names)
        if kind == "skill" and who in active:
            expert_sizes[who] += p.numel()
        elif kind == "shared" or (kind == "head" and who == task):
            total += p.numel()
    sizes = sorted(expert_sizes.values(), reverse=True)
    return total + sum(sizes[:experts] if experts else sizes)


def activated_parameters(model: nn.Module, task: str) -> int:
    """Parameters a forward pass of `task` touches: shared ones, the task's skills (MoE: top-k experts per
    token), and its own head and PALs."""
    return _activated(model, task, trainable_only=False)


def trainable_activated_parameters(model: nn.Module, task: str) -> int:
    """Like `activated_parameters`, counting only parameters with requires_grad (frozen old skills excluded)."""
    return _activated(model, task, trainable_only=True)
