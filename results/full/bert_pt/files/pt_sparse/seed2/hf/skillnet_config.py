"""SkillNet-BERT configuration: skills, the task -> skills map, and where skills live.

The config is the single source of truth for which skills a task activates; a checkpoint carries it,
so a saved model always knows its own skills and tasks.
"""

from __future__ import annotations

from typing import Any

from huggingface_hub.dataclasses import strict
from transformers import BertConfig

from .skillnet_registry import LearnedMapSettings, ProjectedAttentionSettings
from .skillnet_skill_layout import SkillLayoutMixin, layer_ids_from_spec, width_init_std  # noqa: F401  (re-exported)

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
def _size(hidden: int, layers: int, heads: int, ffn: int) -> dict[str, int]:
    return dict(
        vocab_size=21128, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        intermediate_size=ffn, max_position_embeddings=512,
    )


PRESETS: dict[str, dict[str, Any]] = {
    "tiny": _size(64, 2, 4, 128),
    "small": _size(256, 4, 4, 1024),
    "base": _size(768, 12, 12, 3072),
}


@strict
class SkillNetBertConfig(SkillLayoutMixin, LearnedMapSettings, ProjectedAttentionSettings, BertConfig):
    r"""BERT config plus the skill layout of SkillNet-NLU.

    The skill layout and the router (``skills``, ``tasks``, ``generic_skill``, ``skill_layers``,
    ``ffn_impl``, ``skill_layernorm``, ``router``, ``moe_*``) are `SkillLayoutMixin`'s fields, with the
    same meaning for SkillNet-BART; defaults here: Table 1's skills s1-s7, Table 2's tasks plus the
    pre-training objectives, ``generic_skill="s7"``, skills in ``"all"`` layers. BERT also has:

    task_heads: fine-tuning head per task, e.g. ``{"type": "classification", "num_labels": 2}``.
    router: also ``"learned"`` (a task-skill map learned from task and skill embeddings, the learned skill
        combination's Eq. 1-8; its fields are `LearnedMapSettings`'); with ``"topk"`` the task only picks
        the head.
    The projected attention layers' fields (a task extra) are `ProjectedAttentionSettings`'.
    """

    model_type = "skillnet-bert"
    default_skills = DEFAULT_SKILLS
    default_tasks = DEFAULT_TASKS
    presets = PRESETS
    init_std_field = "initializer_range"
    width_field = "hidden_size"

    generic_skill: str | None = "s7"
    initializer_range: float | None = None  # None: width_init_std(hidden_size)
    task_heads: dict | None = None

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
        self.validate_learned_map_settings()
        self.validate_projected_attention_settings()

    def validate_skill_layers(self) -> None:
        self.skill_layer_ids()  # raises on a bad spec

    def skill_layer_ids(self) -> list[int]:
        return layer_ids_from_spec(self.skill_layers, self.num_hidden_layers, "skill_layers")

    def set_task(self, task: str, skills: list[str], head: dict | None = None) -> None:
        if head is not None:
            _check_head(task, head)
        super().set_task(task, skills)
        if head is not None:
            self.task_heads[task] = dict(head)


def _check_head(task: str, head: dict) -> None:
    if head.get("type") not in HEAD_TYPES:
        raise ValueError(f"task {task!r}: head type {head.get('type')!r} is not one of {HEAD_TYPES}")
