"""Skill-sparse BERT (SkillNet-NLU). Plain PyTorch + transformers; knows nothing about DeepSpeed."""

from transformers import AutoConfig, AutoModel, AutoModelForPreTraining

from .bert import SkillNetBertModel, SkillNetBertPreTrainedModel
from .config import DEFAULT_SKILLS, DEFAULT_TASKS, PRESETS, SkillNetBertConfig
from .counts import activated_parameters, count_parameters, trainable_activated_parameters
from .heads import SkillNetBertForMultiTask, SkillNetBertForPreTraining, TaskOutput
from .skill_ffn import SkillFFN, SkillRouting
from .surgery import (
    add_skill,
    export_skill,
    freeze_skills,
    import_skill,
    skill_parameters,
    skillnet_from_dense,
)

AutoConfig.register(SkillNetBertConfig.model_type, SkillNetBertConfig, exist_ok=True)
AutoModel.register(SkillNetBertConfig, SkillNetBertModel, exist_ok=True)
AutoModelForPreTraining.register(SkillNetBertConfig, SkillNetBertForPreTraining, exist_ok=True)

__all__ = [
    "DEFAULT_SKILLS",
    "DEFAULT_TASKS",
    "PRESETS",
    "SkillFFN",
    "SkillNetBertConfig",
    "SkillNetBertForMultiTask",
    "SkillNetBertForPreTraining",
    "SkillNetBertModel",
    "SkillNetBertPreTrainedModel",
    "SkillRouting",
    "TaskOutput",
    "activated_parameters",
    "add_skill",
    "count_parameters",
    "export_skill",
    "freeze_skills",
    "import_skill",
    "skill_parameters",
    "skillnet_from_dense",
    "trainable_activated_parameters",
]
