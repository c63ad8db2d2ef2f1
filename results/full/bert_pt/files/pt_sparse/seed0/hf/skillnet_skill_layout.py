"""The backbone-independent half of a SkillNet config: skills, the task -> skills map, the generic skill,
where skills live, and which router picks the FFNs (routers.py).

`SkillLayoutMixin` is a dataclass mixed into an HF config dataclass (``class SkillNetBertConfig(
SkillLayoutMixin, BertConfig)``). It contributes the fields both backbones share with the same meaning
(skills, tasks, FFN implementation, LayerNorm placement, router and token-gate settings), and holds the queries
(``skill_ids(task)`` ...), the edits (``add_skill`` ...) and their validation, so SkillNet-BERT and
SkillNet-BART name, check and edit skills the same way. A backbone declares its own defaults
(``generic_skill``, ``skill_layers``), its default tables (``default_skills``, ``default_tasks``), its
``presets`` and ``validate_skill_layers`` (which layers exist); each router checks its own fields and
the backbones it is defined for.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, ClassVar

from .skillnet_registry import TokenGateSettings, build_router

FFN_IMPLS = ("fused", "loop")

# Below this width a new model's weights are drawn with std d^-0.5, from it up with the papers' 0.02.
PAPER_INIT_WIDTH = 768


def width_init_std(width: int) -> float:
    """Init std of a model built from scratch at this hidden width.

    0.02 is tuned for d = 768-1024. At d = 128 with tied embeddings it leaves a BART decoder unable to
    use its encoder for thousands of steps (one output for every input); std = d^-0.5 keeps each
    projection's output at unit scale and learns in hundreds (``bench/init_sweep.py`` measures both).
    """
    if width <= 0:
        raise ValueError(f"width must be positive, got {width}")
    return 0.02 if width >= PAPER_INIT_WIDTH else width**-0.5
SKILL_LAYERNORMS = ("shared", "per_skill")


@dataclass(kw_only=True, repr=False, eq=False)
class SkillLayoutMixin(TokenGateSettings):
    r"""Skill layout and router fields shared by SkillNet-BERT and SkillNet-BART.

    skills: ordered list of ``{"name", "description"}``; a skill's id is its position. A bare name is
        accepted and becomes ``{"name": ..., "description": ""}``.
    tasks: task (or pre-training objective) name -> names of the skills it activates.
    generic_skill: skill added to every task's set (``None`` disables, e.g. for the "w/o generic" ablation).
    skill_layers: which layers hold skill FFNs: ``"all"``, ``"every_other"`` (layers 0, 2, 4, ..., as the
        public SkillNet-NLG code's ``i % 2 == 0``), ``"top:N"`` (the top N layers, NLU Table 7), or a list
        of layer ids. Other layers keep one dense FFN shared by all tasks.
    ffn_impl: ``"fused"`` (one wide GEMM pair over the active skills) or ``"loop"`` (reference).
    skill_layernorm: ``"shared"`` (the papers: average the skills' FFN outputs, then the layer's dropout,
        residual and LayerNorm) or ``"per_skill"`` (public SkillNet-NLG code: each skill does dropout,
        residual and its own LayerNorm; the outputs are averaged after the LayerNorms).
    router: which FFNs a token uses: a name in ``routers.ROUTERS``: ``"task"`` (SkillNet: the task picks
        the skills), ``"dense"`` (one FFN for every task), ``"topk"`` (a learned gate per skill layer picks
        the top k FFNs per token; its fields are `TokenGateSettings`') or ``"learned"`` (the learned
        task-skill map; SkillNet-BERT only).
    default_task: the task a call without ``task=`` / ``skill_ids=`` runs (an export's; set by
        ``export --task``). ``None``: such a call is an error.

    The backbone's init std field (``initializer_range`` / ``init_std``) defaults to ``None``, which
    becomes `width_init_std` of its width; a saved config carries the number, so a checkpoint (or a
    converted dense one) keeps the std it was built with for any weights added later.
    """

    # Declared by the backbone (its own defaults and tables).
    default_skills: ClassVar[list[dict[str, str]]]
    default_tasks: ClassVar[dict[str, list[str]]]
    presets: ClassVar[dict[str, dict[str, Any]]]
    init_std_field: ClassVar[str]  # the HF config's init std attribute
    width_field: ClassVar[str]  # the HF config's hidden width attribute

    skills: list | None = None
    tasks: dict | None = None
    generic_skill: str | None = None
    skill_layers: str | list | None = "all"
    ffn_impl: str = "fused"
    skill_layernorm: str = "shared"
    router: str = "task"
    default_task: str | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        # A dense config's dict passed as kwargs says model_type="bert"/"bart": the class's own type must
        # win, or the instance (and whatever dispatches on it) would take the model for a dense one.
        kwargs.pop("model_type", None)
        if self.skills is None:
            self.skills = copy.deepcopy(self.default_skills)
        if self.tasks is None:
            self.tasks = copy.deepcopy(self.default_tasks)
        self.skills = [s if isinstance(s, dict) else {"name": str(s), "description": ""} for s in self.skills]
        if getattr(self, self.init_std_field) is None:
            setattr(self, self.init_std_field, width_init_std(getattr(self, self.width_field)))
        super().__post_init__(**kwargs)  # type: ignore[misc]  # the HF config's
        self.validate_skills()

    # ---- construction helpers -------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> Any:
        if name not in cls.presets:
            raise KeyError(f"unknown preset {name!r}; valid presets: {', '.join(cls.presets)}")
        return cls(**{**cls.presets[name], **overrides})

    # ---- validation (HF's strict dataclass also runs every ``validate_*`` at save time) ------------
    def validate_skills(self) -> None:
        """Every check of the layout and the router; a backbone adds its own (heads, extras)."""
        self.validate_skill_layout()
        self.validate_router()
        self.validate_skill_layers()

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
        if self.default_task is not None and self.default_task not in self.tasks:
            raise KeyError(f"default_task {self.default_task!r} is not a task; valid tasks: {', '.join(self.tasks)}")
        if self.ffn_impl not in FFN_IMPLS:
            raise ValueError(f"ffn_impl={self.ffn_impl!r}; valid: {FFN_IMPLS}")
        if self.skill_layernorm not in SKILL_LAYERNORMS:
            raise ValueError(f"skill_layernorm={self.skill_layernorm!r}; valid: {SKILL_LAYERNORMS}")

    def validate_router(self) -> None:
        build_router(self).validate()

    def validate_skill_layers(self) -> None:
        raise NotImplementedError  # the backbone knows its stacks

    def _unknown_skill_msg(self, name: str, where: str) -> str:
        return f"unknown skill {name!r} in {where}; valid skills: {', '.join(self.skill_names)}"

    # ---- queries --------------------------------------------------------------------------------
    @property
    def skill_names(self) -> list[str]:
        return [s["name"] for s in self.skills]

    @property
    def num_skills(self) -> int:
        return len(self.skills)

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
        """Ablation (NLU Table 6): no task activates `name` any more. Its weights stay in the model."""
        self.skill_index(name)
        tasks = {t: [s for s in skills if s != name] for t, skills in self.tasks.items()}
        generic = None if self.generic_skill == name else self.generic_skill
        empty = [t for t, skills in tasks.items() if not skills and generic is None]
        if empty:
            raise ValueError(f"dropping {name!r} leaves tasks with no skill: {empty}")
        self.tasks, self.generic_skill = tasks, generic


def layer_ids_from_spec(spec: Any, n: int, key: str) -> list[int]:
    """Layer ids of a ``skill_layers`` spec for a stack of `n` layers.

    ``"all"`` (or None), ``"every_other"`` (0, 2, 4, ...: the public SkillNet-NLG code's ``i % 2 == 0``),
    ``"top:N"``, or a list of ids. `key` names the config field in the error.
    """
    if spec is None or spec == "all":
        return list(range(n))
    if spec == "every_other":
        return list(range(0, n, 2))
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
