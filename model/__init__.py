"""Skill-sparse BERT (SkillNet-NLU) and BART (SkillNet-NLG). Plain PyTorch + transformers; knows nothing
about DeepSpeed."""

from transformers import AutoConfig, AutoModel, AutoModelForPreTraining, AutoModelForSeq2SeqLM

from .bart import (
    BART_PRESETS,
    NLG_SKILLS,
    NLG_TASKS,
    SkillNetBartConfig,
    SkillNetBartForConditionalGeneration,
    SkillNetBartModel,
    SkillNetBartPreTrainedModel,
    SkillNetSeq2SeqLMOutput,
)
from .bert import SkillNetBertModel, SkillNetBertPreTrainedModel
from .config import DEFAULT_SKILLS, DEFAULT_TASKS, PRESETS, SkillNetBertConfig
from .counts import activated_parameters, count_parameters, trainable_activated_parameters
from .heads import SkillNetBertForMultiTask, SkillNetBertForPreTraining, TaskOutput
from .skill_ffn import SkillFFN, SkillRouting
from .skill_layout import SkillLayoutMixin
from .surgery import (
    add_skill,
    export_skill,
    freeze_skills,
    import_skill,
    skill_parameters,
    skillnet_bart_from_dense,
    skillnet_from_dense,
)

AutoConfig.register(SkillNetBertConfig.model_type, SkillNetBertConfig, exist_ok=True)
AutoModel.register(SkillNetBertConfig, SkillNetBertModel, exist_ok=True)
AutoModelForPreTraining.register(SkillNetBertConfig, SkillNetBertForPreTraining, exist_ok=True)
AutoConfig.register(SkillNetBartConfig.model_type, SkillNetBartConfig, exist_ok=True)
AutoModel.register(SkillNetBartConfig, SkillNetBartModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(SkillNetBartConfig, SkillNetBartForConditionalGeneration, exist_ok=True)

__all__ = [
    "BART_PRESETS",
    "DEFAULT_SKILLS",
    "DEFAULT_TASKS",
    "NLG_SKILLS",
    "NLG_TASKS",
    "PRESETS",
    "SkillFFN",
    "SkillNetBartConfig",
    "SkillNetBartForConditionalGeneration",
    "SkillNetBartModel",
    "SkillNetBartPreTrainedModel",
    "SkillNetBertConfig",
    "SkillNetBertForMultiTask",
    "SkillNetBertForPreTraining",
    "SkillNetBertModel",
    "SkillNetBertPreTrainedModel",
    "SkillLayoutMixin",
    "SkillNetSeq2SeqLMOutput",
    "SkillRouting",
    "TaskOutput",
    "activated_parameters",
    "add_skill",
    "count_parameters",
    "export_skill",
    "freeze_skills",
    "import_skill",
    "skill_parameters",
    "skillnet_bart_from_dense",
    "skillnet_from_dense",
    "trainable_activated_parameters",
]
