"""The backbone-independent half of a SkillNet config: skills, the task -> skills map, the generic skill,
and where skills live.

`SkillLayoutMixin` is mixed into an HF config dataclass that declares the fields ``skills`` (list of
``{"name", "description"}``), ``tasks`` (task -> skill names), ``generic_skill``, ``ffn_impl`` and
``skill_layernorm``. It holds the queries (``skill_ids(task)`` ...), the edits (``add_skill`` ...) and
their validation, so SkillNet-BERT and SkillNet-BART name, check and edit skills the same way.
"""

from __future__ import annotations

import copy
from typing import Any

from .config import FFN_IMPLS, SKILL_LAYERNORMS


class SkillLayoutMixin:
    skills: list
    tasks: dict
    generic_skill: str | None
    ffn_impl: str
    skill_layernorm: str

    def _fill_skill_layout(self, default_skills: list[dict], default_tasks: dict[str, list[str]]) -> None:
        """Defaults for unset fields; a bare skill name becomes ``{"name": ..., "description": ""}``."""
        if self.skills is None:
            self.skills = copy.deepcopy(default_skills)
        if self.tasks is None:
            self.tasks = copy.deepcopy(default_tasks)
        self.skills = [s if isinstance(s, dict) else {"name": str(s), "description": ""} for s in self.skills]

    def validate_skill_layout(self) -> None:
        names = self.skill_names
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate skill names in config.skills: {names}")
        if not names:
            raise ValueError("config.skills is empty: a SkillNet model needs at least one skill")
        if self.generic_skill is not None and self.generic_skill not in names:
            raise KeyError(self._unknown_skill_msg(self.generic_skill, "generic_skill"))
        for task, skills in self.tasks.items():
            for s in skills:
                if s not in names:
                    raise KeyError(self._unknown_skill_msg(s, f"task {task!r}"))
            if not self._task_skill_names(task):
                raise ValueError(f"task {task!r} activates no skill (and no generic skill is set)")
        if self.ffn_impl not in FFN_IMPLS:
            raise ValueError(f"ffn_impl={self.ffn_impl!r}; valid: {FFN_IMPLS}")
        if self.skill_layernorm not in SKILL_LAYERNORMS:
            raise ValueError(f"skill_layernorm={self.skill_layernorm!r}; valid: {SKILL_LAYERNORMS}")

    def _unknown_skill_msg(self, name: str, where: str) -> str:
        return f"unknown skill {name!r} in {where}; valid skills: {', '.join(self.skill_names)}"

    # ---- queries --------------------------------------------------------------------------------
    @property
    def skill_names(self) -> list[str]:
        return [s["name"] for s in self.skills]

    @property
    def num_skills(self) -> int:
        return len(self.skills)

    @property
    def task_names(self) -> list[str]:
        return list(self.tasks)

    def skill_index(self, name: str) -> int:
        try:
            return self.skill_names.index(name)
        except ValueError:
            raise KeyError(self._unknown_skill_msg(name, "a lookup")) from None

    def _task_skill_names(self, task: str) -> list[str]:
        names = list(self.tasks[task])
        if self.generic_skill is not None and self.generic_skill not in names:
            names.append(self.generic_skill)
        return names

    def task_skill_names(self, task: str) -> list[str]:
        if task not in self.tasks:
            raise KeyError(f"unknown task {task!r}; valid tasks: {', '.join(self.tasks)}")
        return self._task_skill_names(task)

    def skill_ids(self, task: str) -> list[int]:
        """Sorted ids of the skills `task` activates (its own plus the generic skill)."""
        return sorted(self.skill_index(s) for s in self.task_skill_names(task))

    # ---- edits (used by surgery, fine-tuning and ablations) ----------------------------------------
    def add_skill(self, name: str, description: str = "") -> int:
        if name in self.skill_names:
            raise ValueError(f"skill {name!r} already exists")
        self.skills.append({"name": name, "description": description})
        return len(self.skills) - 1

    def set_task(self, task: str, skills: list[str]) -> None:
        for s in skills:
            if s not in self.skill_names:
                raise KeyError(self._unknown_skill_msg(s, f"task {task!r}"))
        self.tasks[task] = list(skills)

    def drop_skill(self, name: str) -> None:
        """Ablation: no task activates `name` any more. Its weights stay in the model."""
        self.skill_index(name)
        tasks = {t: [s for s in skills if s != name] for t, skills in self.tasks.items()}
        generic = None if self.generic_skill == name else self.generic_skill
        empty = [t for t, skills in tasks.items() if not skills and generic is None]
        if empty:
            raise ValueError(f"dropping {name!r} leaves tasks with no skill: {empty}")
        self.tasks, self.generic_skill = tasks, generic


def layer_ids_from_spec(spec: Any, n: int, key: str, every_other_first: int) -> list[int]:
    """Layer ids of a ``skill_layers`` spec for a stack of `n` layers.

    ``"all"`` (or None), ``"every_other"`` (``every_other_first``, +2, ...), ``"top:N"``, or a list of ids.
    `key` names the config field in the error.
    """
    if spec is None or spec == "all":
        return list(range(n))
    if spec == "every_other":
        return list(range(every_other_first, n, 2))
    if isinstance(spec, str) and spec.startswith("top:"):
        try:
            k = int(spec[4:])
        except ValueError:
            raise ValueError(f"{key}={spec!r}: expected 'top:N' with an integer N") from None
        if not 0 < k <= n:
            raise ValueError(f"{key}={spec!r}: N must be in 1..{n}")
        return list(range(n - k, n))
    if isinstance(spec, list) and all(type(i) is int and 0 <= i < n for i in spec):
        return sorted(set(spec))
    raise ValueError(
        f"{key}={spec!r}; valid: 'all', 'every_other', 'top:N', or a list of layer ids in 0..{n - 1}"
    )
