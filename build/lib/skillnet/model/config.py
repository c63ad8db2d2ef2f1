"""SkillNet-BERT configuration: skills, the task -> skills map, and where skills live.

The config is the single source of truth for which skills a task activates; a checkpoint carries it,
so a saved model always knows its own skills and tasks.
"""

from __future__ import annotations

import copy
from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import BertConfig

# Table 1 of skillnet-nlu.md.
DEFAULT_SKILLS: list[dict[str, str]] = [
    {"name": "s1", "description": "get the semantic meaning of a sequence"},
    {"name": "s2", "description": "get the semantic meaning of a token"},
    {"name": "s3", "description": "understand how two text segments interact"},
    {"name": "s4", "description": "understand the sentiment of texts"},
    {"name": "s5", "description": "understand natural language questions"},
    {"name": "s6", "description": "understand texts in finance domain"},
    {"name": "s7", "description": "generic skill"},
]

# Table 2 (T1-T6) plus the sparse pre-training objectives of §3.5.
DEFAULT_TASKS: dict[str, list[str]] = {
    "sentiment": ["s1", "s4", "s7"],  # T1 ChnSentiCorp
    "nli": ["s1", "s3", "s7"],  # T2 OCNLI
    "similarity": ["s1", "s3", "s6", "s7"],  # T3 AFQMC
    "text_classification": ["s1", "s7"],  # T4 TNEWS
    "ner": ["s2", "s7"],  # T5 OntoNotes
    "mrc": ["s2", "s3", "s5", "s7"],  # T6 CMRC 2018
    "mlm": ["s2", "s7"],
    "nsp": ["s1", "s3", "s7"],
}

HEAD_TYPES = ("classification", "regression", "token_crf", "span", "matching")
FFN_IMPLS = ("fused", "loop")
SKILL_LAYERNORMS = ("shared", "per_skill")
ROUTERS = ("task", "topk", "learned")
LEARNED_ESTIMATORS = ("ste", "eq6")

# Named sizes. "tiny" is for tests (2 layers, hidden 64); "small" trains on a CPU in minutes;
# "base" is BERT-base as in the paper. Vocab defaults to bert-base-chinese (21,128).
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        vocab_size=21128,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        max_position_embeddings=512,
    ),
    "small": dict(
        vocab_size=21128,
        hidden_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=1024,
        max_position_embeddings=512,
    ),
    "base": dict(
        vocab_size=21128,
        hidden_size=768,
        num_hidden_layers=12,
        num_attention_heads=12,
        intermediate_size=3072,
        max_position_embeddings=512,
    ),
}


@strict
class SkillNetBertConfig(BertConfig):
    r"""BERT config plus the skill layout of SkillNet-NLU.

    skills: ordered list of ``{"name", "description"}``; a skill's id is its position.
    tasks: task or pre-training objective name -> names of the skills it activates.
    task_heads: fine-tuning head per task, e.g. ``{"type": "classification", "num_labels": 2}``.
    generic_skill: skill added to every task's set (``None`` disables, e.g. for the "w/o s7" ablation).
    skill_layers: which encoder layers hold skill FFNs: ``"all"``, ``"every_other"`` (odd layers, as
        SkillNet-NLG), ``"top:N"`` (the top N layers, Table 7), or an explicit list of layer ids.
        Other layers keep one dense FFN shared by all tasks.
    ffn_impl: ``"fused"`` (one wide GEMM pair over the active skills) or ``"loop"`` (reference).
    skill_layernorm: ``"shared"`` (paper: average, then the layer's residual + LayerNorm) or
        ``"per_skill"`` (public SkillNet-NLG code: each skill has its own LayerNorm, averaged after it).
    router: which FFNs a token uses (the first method seam, see shared/DESIGN.md):
        ``"task"`` (SkillNet: the task picks the skills), ``"topk"`` (the MoE baseline: a learned gate
        picks the top ``moe_top_k`` FFNs per token, fairseq-style capacity; tasks are ignored by the
        FFNs) or ``"learned"`` (learnable skill combination: a task-skill map learned from task and
        skill embeddings, learnable-skill-combination.md Eq. 1-8).
    moe_capacity_factor / moe_eval_capacity_factor: MoE expert capacity in training / evaluation,
        ``ceil(factor * top_k * tokens / experts)``; tokens over capacity get 0 from the FFN.
    learned_*: the learned map: embedding size d, threshold s_t, estimator (``"ste"``: hard threshold
        forward, gradient of sigmoid(sharpness*(alpha - s_t)) backward; ``"eq6"``: Eq. 6 as written),
        sharpness (Eq. 6's alpha; the paper uses 1e9), and the orthogonality loss weight beta (Eq. 11).
    pals_dim: projected attention layers (the second seam: what a task adds beside the shared layers):
        0 = none; else the projected size d_m (204 at hidden 768), ``pals_heads`` attention heads.
    """

    model_type = "skillnet-bert"

    skills: list | None = None
    tasks: dict | None = None
    task_heads: dict | None = None
    generic_skill: str | None = "s7"
    skill_layers: str | list | None = "all"
    ffn_impl: str = "fused"
    skill_layernorm: str = "shared"
    router: str = "task"
    moe_top_k: int = 2
    moe_aux_loss_coef: float = 0.01
    moe_capacity_factor: float = 1.0
    moe_eval_capacity_factor: float = 2.0
    learned_embed_dim: int = 64
    learned_threshold: float = 0.35
    learned_estimator: str = "ste"
    learned_sharpness: float = 10.0
    orth_loss_coef: float = 1e-3
    pals_dim: int = 0
    pals_heads: int = 6

    def __post_init__(self, **kwargs: Any) -> None:
        if self.skills is None:
            self.skills = copy.deepcopy(DEFAULT_SKILLS)
        if self.tasks is None:
            self.tasks = copy.deepcopy(DEFAULT_TASKS)
        if self.task_heads is None:
            self.task_heads = {}
        self.skills = [s if isinstance(s, dict) else {"name": str(s), "description": ""} for s in self.skills]
        super().__post_init__(**kwargs)
        self.validate_skills()

    # ---- construction helpers -------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> SkillNetBertConfig:
        if name not in PRESETS:
            raise KeyError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})

    def validate_skills(self) -> None:
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
        for task, head in self.task_heads.items():
            if task not in self.tasks:
                raise KeyError(
                    f"task_heads has {task!r}, which is not in tasks; valid tasks: {', '.join(self.tasks)}"
                )
            if head.get("type") not in HEAD_TYPES:
                raise ValueError(f"task {task!r}: head type {head.get('type')!r} is not one of {HEAD_TYPES}")
        if self.ffn_impl not in FFN_IMPLS:
            raise ValueError(f"ffn_impl={self.ffn_impl!r}; valid: {FFN_IMPLS}")
        if self.skill_layernorm not in SKILL_LAYERNORMS:
            raise ValueError(f"skill_layernorm={self.skill_layernorm!r}; valid: {SKILL_LAYERNORMS}")
        if self.router not in ROUTERS:
            raise ValueError(f"router={self.router!r}; valid: {ROUTERS}")
        if self.router == "topk" and not 0 < self.moe_top_k <= self.num_skills:
            raise ValueError(f"moe_top_k={self.moe_top_k} must be in 1..{self.num_skills}")
        if self.router == "topk" and not (self.moe_capacity_factor > 0 and self.moe_eval_capacity_factor > 0):
            raise ValueError("moe_capacity_factor and moe_eval_capacity_factor must be > 0")
        if self.learned_estimator not in LEARNED_ESTIMATORS:
            raise ValueError(f"learned_estimator={self.learned_estimator!r}; valid: {LEARNED_ESTIMATORS}")
        if self.pals_dim < 0 or (self.pals_dim and self.pals_dim % self.pals_heads):
            raise ValueError(f"pals_dim={self.pals_dim} must be 0 (no PALs) or a multiple of pals_heads={self.pals_heads}")
        self.skill_layer_ids()  # raises on a bad spec

    def _unknown_skill_msg(self, name: str, where: str) -> str:
        return f"unknown skill {name!r} in {where}; valid skills: {', '.join(self.skill_names)}"

    @classmethod
    def dense_joint(cls, **kwargs: Any) -> SkillNetBertConfig:
        """The "Joint fine-tuning (Dense)" baseline: one FFN shared by every task."""
        tasks = {t: ["shared"] for t in kwargs.pop("tasks", DEFAULT_TASKS)}
        return cls(
            skills=[{"name": "shared", "description": "dense FFN"}], tasks=tasks, generic_skill=None, **kwargs
        )

    @classmethod
    def top2_moe(cls, **kwargs: Any) -> SkillNetBertConfig:
        """The "Joint fine-tuning (MoE)" baseline: 7 FFNs per layer, a gate activates the top 2 per token."""
        return cls(router="topk", moe_top_k=2, **kwargs)

    @staticmethod
    def pals_dim_for(hidden_size: int, heads: int = 6) -> int:
        """d_m scaled from the paper's 204 at hidden 768, rounded up to a multiple of the heads."""
        return max(heads, -(-round(hidden_size * 204 / 768) // heads) * heads)

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

    def skill_layer_ids(self) -> list[int]:
        n = self.num_hidden_layers
        spec = self.skill_layers
        if spec is None or spec == "all":
            return list(range(n))
        if spec == "every_other":
            return list(range(1, n, 2))
        if isinstance(spec, str) and spec.startswith("top:"):
            try:
                k = int(spec[4:])
            except ValueError:
                raise ValueError(f"skill_layers={spec!r}: expected 'top:N' with an integer N") from None
            if not 0 < k <= n:
                raise ValueError(f"skill_layers={spec!r}: N must be in 1..{n}")
            return list(range(n - k, n))
        if isinstance(spec, list) and all(isinstance(i, int) and 0 <= i < n for i in spec):
            return sorted(set(spec))
        raise ValueError(
            f"skill_layers={spec!r}; valid: 'all', 'every_other', 'top:N', or a list of layer ids in 0..{n - 1}"
        )

    # ---- edits (used by surgery, fine-tuning and ablations) ----------------------------------------
    def add_skill(self, name: str, description: str = "") -> int:
        if name in self.skill_names:
            raise ValueError(f"skill {name!r} already exists")
        self.skills.append({"name": name, "description": description})
        return len(self.skills) - 1

    def set_task(self, task: str, skills: list[str], head: dict | None = None) -> None:
        for s in skills:
            if s not in self.skill_names:
                raise KeyError(self._unknown_skill_msg(s, f"task {task!r}"))
        self.tasks[task] = list(skills)
        if head is not None:
            if head.get("type") not in HEAD_TYPES:
                raise ValueError(f"task {task!r}: head type {head.get('type')!r} is not one of {HEAD_TYPES}")
            self.task_heads[task] = dict(head)

    def drop_skill(self, name: str) -> None:
        """Ablation (Table 6): no task activates `name` any more. Its weights stay in the model."""
        self.skill_index(name)
        tasks = {t: [s for s in skills if s != name] for t, skills in self.tasks.items()}
        generic = None if self.generic_skill == name else self.generic_skill
        empty = [t for t, skills in tasks.items() if not skills and generic is None]
        if empty:
            raise ValueError(f"dropping {name!r} leaves tasks with no skill: {empty}")
        self.tasks, self.generic_skill = tasks, generic
