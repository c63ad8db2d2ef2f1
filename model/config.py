"""SkillNet-BERT configuration: skills, the task -> skills map, and where skills live.

The config is the single source of truth for which skills a task activates; a checkpoint carries it,
so a saved model always knows its own skills and tasks.
"""

from __future__ import annotations

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import BertConfig

from .learned_map import LEARNED_ESTIMATORS
from .skill_layout import SkillLayoutMixin, layer_ids_from_spec

# Table 1 of SkillNet-NLU.
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
class SkillNetBertConfig(SkillLayoutMixin, BertConfig):
    r"""BERT config plus the skill layout of SkillNet-NLU.

    The skill layout and the router (``skills``, ``tasks``, ``generic_skill``, ``skill_layers``,
    ``ffn_impl``, ``skill_layernorm``, ``router``, ``moe_*``) are `SkillLayoutMixin`'s fields, with the
    same meaning for SkillNet-BART; defaults here: Table 1's skills s1-s7, Table 2's tasks plus the
    pre-training objectives, ``generic_skill="s7"``, skills in ``"all"`` layers. BERT also has:

    task_heads: fine-tuning head per task, e.g. ``{"type": "classification", "num_labels": 2}``.
    router: also ``"learned"`` (a task-skill map learned from task and skill embeddings, the learned skill
        combination's Eq. 1-8; learned_map.py); with ``"topk"`` the task only picks the head.
    learned_*: the learned map: embedding size d, threshold s_t, estimator (``"ste"``: hard threshold
        forward, gradient of sigmoid(sharpness*(alpha - s_t)) backward; the other estimator: Eq. 6 as written),
        sharpness (Eq. 6's alpha; the paper uses 1e9), and the orthogonality loss weight beta (Eq. 11).
    pals_dim: projected attention layers (the second seam: what a task adds beside the shared layers):
        0 = none; else the projected size d_m (204 at hidden 768), ``pals_heads`` attention heads.
    """

    model_type = "skillnet-bert"
    default_skills = DEFAULT_SKILLS
    default_tasks = DEFAULT_TASKS
    presets = PRESETS

    generic_skill: str | None = "s7"
    task_heads: dict | None = None
    learned_embed_dim: int = 64
    learned_threshold: float = 0.35
    learned_estimator: str = "ste"
    learned_sharpness: float = 10.0
    orth_loss_coef: float = 1e-3
    pals_dim: int = 0
    pals_heads: int = 6

    def __post_init__(self, **kwargs: Any) -> None:
        if self.task_heads is None:
            self.task_heads = {}
        super().__post_init__(**kwargs)

    def validate_skills(self) -> None:
        super().validate_skills()
        for task, head in self.task_heads.items():
            if task not in self.tasks:
                raise KeyError(
                    f"task_heads has {task!r}, which is not in tasks; valid tasks: {', '.join(self.tasks)}"
                )
            _check_head(task, head)
        if self.learned_estimator not in LEARNED_ESTIMATORS:
            raise ValueError(f"learned_estimator={self.learned_estimator!r}; valid: {LEARNED_ESTIMATORS}")
        if self.pals_dim < 0 or (self.pals_dim and self.pals_dim % self.pals_heads):
            raise ValueError(f"pals_dim={self.pals_dim} must be 0 (no projected attention layers) or a multiple of pals_heads={self.pals_heads}")

    def validate_skill_layers(self) -> None:
        self.skill_layer_ids()  # raises on a bad spec

    def skill_layer_ids(self) -> list[int]:
        return layer_ids_from_spec(self.skill_layers, self.num_hidden_layers, "skill_layers")

    @staticmethod
    def pals_dim_for(hidden_size: int, heads: int = 6) -> int:
        """d_m scaled from the paper's 204 at hidden 768, rounded up to a multiple of the heads."""
        return max(heads, -(-round(hidden_size * 204 / 768) // heads) * heads)

    def set_task(self, task: str, skills: list[str], head: dict | None = None) -> None:
        if head is not None:
            _check_head(task, head)
        super().set_task(task, skills)
        if head is not None:
            self.task_heads[task] = dict(head)


def _check_head(task: str, head: dict) -> None:
    if head.get("type") not in HEAD_TYPES:
        raise ValueError(f"task {task!r}: head type {head.get('type')!r} is not one of {HEAD_TYPES}")
