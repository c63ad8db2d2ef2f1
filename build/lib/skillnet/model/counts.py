"""Parameter counts: total, per skill, and *activated* per task (Tables 4-6 report the latter)."""

from __future__ import annotations

import re
from collections import defaultdict

from torch import nn

from .surgery import encoder_of

_SKILL = re.compile(r"\.skill_ffn\.skills\.(\d+)\.")
# Pre-training heads: which objective uses which part of `cls`.
_OBJECTIVE_HEADS = {"mlm": "cls.predictions.", "nsp": "cls.seq_relationship."}


def _owner(name: str, skill_names: list[str]) -> tuple[str, str]:
    m = _SKILL.search(name)
    if m:
        return "skill", skill_names[int(m.group(1))]
    if name.startswith("heads."):
        return "head", name.split(".")[1]
    for obj, prefix in _OBJECTIVE_HEADS.items():
        if name.startswith(prefix):
            return "head", obj
    return "shared", ""


def count_parameters(model: nn.Module) -> dict:
    """{"total", "shared", "skills": {name: n}, "heads": {task: n}, "trainable"}; tied weights counted once."""
    names = encoder_of(model).config.skill_names
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


def activated_parameters(model: nn.Module, task: str) -> int:
    """Parameters a forward pass of `task` touches: shared ones, the task's skills, and its own head."""
    cfg = encoder_of(model).config
    if cfg.router == "topk":
        # MoE baseline: every token runs moe_top_k experts; all experts have the same size.
        per_expert = count_parameters(model)["skills"][cfg.skill_names[0]]
        counts = count_parameters(model)
        return counts["shared"] + cfg.moe_top_k * per_expert + counts["heads"].get(task, 0)
    active = set(cfg.task_skill_names(task))
    total = 0
    for pname, p in model.named_parameters():
        kind, who = _owner(pname, cfg.skill_names)
        if kind == "shared" or (kind == "skill" and who in active) or (kind == "head" and who == task):
            total += p.numel()
    return total


def trainable_activated_parameters(model: nn.Module, task: str) -> int:
    """Like `activated_parameters`, counting only parameters with requires_grad (frozen old skills excluded)."""
    cfg = encoder_of(model).config
    active = set(cfg.task_skill_names(task))
    total = 0
    for pname, p in model.named_parameters():
        kind, who = _owner(pname, cfg.skill_names)
        used = kind == "shared" or (kind == "skill" and who in active) or (kind == "head" and who == task)
        total += p.numel() if used and p.requires_grad else 0
    return total
