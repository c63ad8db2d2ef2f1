"""One `ModelSpec` per model family (SkillNet-BERT, SkillNet-BART): everything the stages need to know of a
family, in one record that pre-training, fine-tuning, export and `save_pretrained`'s remote code all read.

A spec names its classes and functions by reference (``"module:name"``; ``".module:name"`` for a module of
this package), or holds the object itself; `ModelSpec.load` imports a reference on use. Reading a spec
therefore imports neither torch nor the model code, and this module imports nothing of the package: an
export copies it beside model/hub.py as remote code.

Adding a family is one spec and one `register_model_family` line, inside this package or outside it
(tests/test_model_family_plugin.py).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

Ref = str | Any  # "module:name" (".module:name": of this package), or the object itself


@dataclass(frozen=True)
class ModelSpec:
    """A model family.

    name: what ``--arch`` (pre-training) and ``model.arch`` (fine-tuning) take.
    title: how logs and export records name its skill-sparse models.
    model_type: ``config.model_type`` of its SkillNet models (its config class's).
    dense_type: ``model_type`` of the dense HF checkpoint it starts from (``from_dense``).
    config: its config class (``preset(name, **overrides)``, ``presets``, ``from_json_file``).
    base_model: the backbone without heads (``AutoModel``).
    pretraining_model: what pre-training trains and its checkpoints hold.
    task_model: what fine-tuning trains: the multi-task model (heads per task) or the generator.
    from_dense: ``f(path, model_class=..., **config_overrides)``: a SkillNet model whose skills are copies of
        a dense checkpoint's FFN.
    objectives: its pre-training objectives (task names in the config's task map), the default set.
    auto_classes: (transformers Auto class, the field above it serves), in ``auto_map`` order.
    task_heads: one head per task (BERT), else the tasks share the LM head (BART).
    sparse_export: its skill-sparse pre-training checkpoints export as SkillNet folders.
    dense_export: (HF config, HF model) a dense pre-training checkpoint exports as, or None.
    """

    name: str
    title: str
    model_type: str
    dense_type: str
    config: Ref
    base_model: Ref
    pretraining_model: Ref
    task_model: Ref
    from_dense: Ref
    objectives: tuple[str, ...]
    auto_classes: tuple[tuple[str, str], ...]
    task_heads: bool
    sparse_export: bool = False
    dense_export: tuple[Ref, Ref] | None = None

    def load(self, part: str) -> Any:
        """The object that field `part` names ("config", "task_model", ...), imported now."""
        return resolve(getattr(self, part))

    def presets(self) -> dict[str, dict[str, Any]]:
        """Preset name -> config fields (the config class's own table)."""
        return self.load("config").presets

    def reference(self, part: str) -> tuple[str, str]:
        """(module, name) of field `part`; a module of this package by its own name ("bert")."""
        return split_ref(getattr(self, part))

    def served_auto_classes(self) -> list[tuple[str, str, str]]:
        """(Auto class, module, class name) of each class `save_pretrained` names in ``auto_map``."""
        return [(auto, *self.reference(part)) for auto, part in self.auto_classes]


MODEL_FAMILIES: dict[str, ModelSpec] = {}


def register_model_family(spec: ModelSpec) -> ModelSpec:
    """Make `spec` a family every stage knows (its name and model types must be new)."""
    for other in MODEL_FAMILIES.values():
        if other.name != spec.name and {spec.model_type, spec.dense_type} & {other.model_type, other.dense_type}:
            raise ValueError(f"model family {spec.name!r}: model_type {spec.model_type!r} / {spec.dense_type!r} "
                             f"is already family {other.name!r}'s")
    if spec.name in MODEL_FAMILIES and MODEL_FAMILIES[spec.name] != spec:
        raise ValueError(f"model family {spec.name!r} is already registered")
    MODEL_FAMILIES[spec.name] = spec
    return spec


def model_family(name: str) -> ModelSpec:
    try:
        return MODEL_FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown model family {name!r}; valid: {', '.join(MODEL_FAMILIES)}") from None


def family_of_model_type(model_type: str | None) -> ModelSpec | None:
    """The family whose SkillNet or dense checkpoints have `model_type`, or None."""
    for spec in MODEL_FAMILIES.values():
        if model_type in (spec.model_type, spec.dense_type):
            return spec
    return None


def skillnet_family(model_type: str | None) -> ModelSpec | None:
    """The family whose SkillNet models (not dense checkpoints) have `model_type`, or None."""
    family = family_of_model_type(model_type)
    return family if family is not None and family.model_type == model_type else None


def split_ref(ref: Ref) -> tuple[str, str]:
    if isinstance(ref, str):
        module, _, name = ref.partition(":")
        return module.removeprefix("."), name
    module = ref.__module__
    if __package__ and module.startswith(f"{__package__}."):
        module = module[len(__package__) + 1:]
    return module, ref.__qualname__


def resolve(ref: Ref) -> Any:
    if not isinstance(ref, str):
        return ref
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module, __package__), name)


BERT = register_model_family(ModelSpec(
    name="bert",
    title="SkillNet-BERT",
    model_type="skillnet-bert",
    dense_type="bert",
    config=".config:SkillNetBertConfig",
    base_model=".bert:SkillNetBertModel",
    pretraining_model=".heads:SkillNetBertForPreTraining",
    task_model=".heads:SkillNetBertForMultiTask",
    from_dense=".surgery:skillnet_from_dense",
    objectives=("mlm", "nsp"),
    auto_classes=(("AutoConfig", "config"), ("AutoModel", "base_model"),
                  ("AutoModelForPreTraining", "pretraining_model")),
    task_heads=True,
    sparse_export=True,
    dense_export=("transformers:BertConfig", "transformers:BertForPreTraining"),
))
BART = register_model_family(ModelSpec(
    name="bart",
    title="SkillNet-BART",
    model_type="skillnet-bart",
    dense_type="bart",
    config=".bart:SkillNetBartConfig",
    base_model=".bart:SkillNetBartModel",
    pretraining_model=".bart:SkillNetBartForConditionalGeneration",
    task_model=".bart:SkillNetBartForConditionalGeneration",
    from_dense=".surgery:skillnet_bart_from_dense",
    objectives=("denoise",),
    auto_classes=(("AutoConfig", "config"), ("AutoModel", "base_model"), ("AutoModelForSeq2SeqLM", "task_model")),
    task_heads=False,
    dense_export=("transformers:BartConfig", "transformers:BartForConditionalGeneration"),
))
