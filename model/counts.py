"""Parameter counts: total, per skill, and *activated* per task (NLU Tables 4-6, NLG Table 6 report the
latter). Work for SkillNet-BERT and SkillNet-BART; BART's lm_head is tied to the shared embeddings, so it
counts once, as shared. What a task activates comes from the model's router (which FFNs, and how many of
them a token runs) and its task extras (heads and the like: parameters only that task uses)."""

from __future__ import annotations

import re
from collections import defaultdict

from torch import nn

from .extras import task_owners
from .registry import build_router
from .surgery import skill_base_of

_SKILL = re.compile(r"\.skill_ffn\.skills\.(\d+)\.")
# Pre-training heads: which objective uses which part of `cls`.
_OBJECTIVE_HEADS = {"mlm": "cls.predictions.", "nsp": "cls.seq_relationship."}


def _owner(name: str, p: nn.Parameter, skill_names: list[str], tasks: dict[int, str]) -> tuple[str, str]:
    m = _SKILL.search(name)
    if m:
        return "skill", skill_names[int(m.group(1))]
    if id(p) in tasks:  # a task extra (its head, its projected attention layers): that task's only
        return "head", tasks[id(p)]
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
    tasks = task_owners(model)
    for pname, p in model.named_parameters():
        kind, who = _owner(pname, p, names, tasks)
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
    # A token may run any of `candidates` and runs `k` of them (a task map: all of its skills; a token
    # gate: top-k of every expert): count the k largest, which is exact when the experts are one size.
    candidates, k = build_router(cfg).activated(task)
    active = {cfg.skill_names[i] for i in candidates}
    tasks = task_owners(model)
    total, expert_sizes = 0, defaultdict(int)
    for pname, p in model.named_parameters():
        if trainable_only and not p.requires_grad:
            continue
        kind, who = _owner(pname, p, cfg.skill_names, tasks)
        if kind == "skill" and who in active:
            expert_sizes[who] += p.numel()
        elif kind == "shared" or (kind == "head" and who == task):
            total += p.numel()
    sizes = sorted(expert_sizes.values(), reverse=True)
    return total + sum(sizes[:k])


def activated_parameters(model: nn.Module, task: str) -> int:
    """Parameters a forward pass of `task` touches: shared ones, the FFNs the router runs per token (a
    token gate: its top-k experts), and the task's own extras (head, projected attention layers)."""
    return _activated(model, task, trainable_only=False)


def trainable_activated_parameters(model: nn.Module, task: str) -> int:
    """Like `activated_parameters`, counting only parameters with requires_grad (frozen old skills excluded)."""
    return _activated(model, task, trainable_only=True)
