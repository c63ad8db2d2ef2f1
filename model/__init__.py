"""Skill-sparse BERT (SkillNet-NLU) and BART (SkillNet-NLG). Plain PyTorch + transformers; knows nothing
about DeepSpeed."""

import transformers

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
from .spec import MODEL_FAMILIES, ModelSpec, family_of_model_type, model_family, register_model_family
from .surgery import (
    add_skill,
    export_skill,
    freeze_skills,
    import_skill,
    skill_parameters,
    skillnet_bart_from_dense,
    skillnet_from_dense,
)


def _register_auto_classes() -> None:
    """Every built-in family's classes in transformers' Auto API, as its spec lists them (a family registered
    later, from outside this package, registers its own where it wants the Auto API)."""
    for spec in MODEL_FAMILIES.values():
        config = spec.load("config")
        for auto, part in spec.auto_classes:
            if auto == "AutoConfig":
                transformers.AutoConfig.register(spec.model_type, config, exist_ok=True)
            else:
                getattr(transformers, auto).register(config, spec.load(part), exist_ok=True)


_register_auto_classes()

__all__ = [
    "BART_PRESETS",
    "DEFAULT_SKILLS",
    "DEFAULT_TASKS",
    "MODEL_FAMILIES",
    "NLG_SKILLS",
    "NLG_TASKS",
    "PRESETS",
    "ModelSpec",
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
    "family_of_model_type",
    "freeze_skills",
    "import_skill",
    "model_family",
    "register_model_family",
    "skill_parameters",
    "skillnet_bart_from_dense",
    "skillnet_from_dense",
    "trainable_activated_parameters",
]
