"""The two architectures fine-tuning serves, as data: SkillNet-BERT for NLU tasks (one head per task) and
SkillNet-BART for generation (the shared LM head). Which one a run uses follows from ``model.init``'s
``model_type`` (a SkillNet export or a dense HF checkpoint), else from ``model.arch`` (a preset), else from
the task types (generation tasks need the encoder-decoder)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Arch:
    name: str
    skillnet_type: str  # model_type of a SkillNet export
    dense_type: str  # model_type of the dense HF checkpoint it can start from
    has_heads: bool  # one head per task (BERT) or the shared LM head (BART)
    config_cls: Callable[[], Any]
    model_cls: Callable[[], Any]
    from_dense: Callable[[], Callable[..., Any]]
    presets: Callable[[], dict[str, dict[str, Any]]]


def _bert_config() -> Any:
    from skillnet.model.config import SkillNetBertConfig

    return SkillNetBertConfig


def _bert_model() -> Any:
    from skillnet.model.heads import SkillNetBertForMultiTask

    return SkillNetBertForMultiTask


def _bert_from_dense() -> Callable[..., Any]:
    from skillnet.model.heads import SkillNetBertForMultiTask
    from skillnet.model.surgery import skillnet_from_dense

    def build(path: str) -> Any:
        # The encoder first: a dense BertForPreTraining folder also holds `cls.*` heads, which have no
        # place in the multi-task model.
        enc = skillnet_from_dense(path)
        model = SkillNetBertForMultiTask(enc.config)
        model.bert.load_state_dict(enc.state_dict())
        return model

    return build


def _bert_presets() -> dict[str, dict[str, Any]]:
    from skillnet.model.config import PRESETS

    return PRESETS


def _bart_presets() -> dict[str, dict[str, Any]]:
    from skillnet.model.bart import BART_PRESETS

    return BART_PRESETS


def _bart_config() -> Any:
    from skillnet.model.bart import SkillNetBartConfig

    return SkillNetBartConfig


def _bart_model() -> Any:
    from skillnet.model.bart import SkillNetBartForConditionalGeneration

    return SkillNetBartForConditionalGeneration


def _bart_from_dense() -> Callable[..., Any]:
    from skillnet.model.surgery import skillnet_bart_from_dense

    return skillnet_bart_from_dense


ARCHS: dict[str, Arch] = {
    "bert": Arch("bert", "skillnet-bert", "bert", True, _bert_config, _bert_model, _bert_from_dense, _bert_presets),
    "bart": Arch("bart", "skillnet-bart", "bart", False, _bart_config, _bart_model, _bart_from_dense, _bart_presets),
}


def arch_of_model_type(model_type: str | None) -> Arch | None:
    for a in ARCHS.values():
        if model_type in (a.skillnet_type, a.dense_type):
            return a
    return None
