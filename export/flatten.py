"""One task of a SkillNet model as a stock transformers model: no modeling code, no ``trust_remote_code``.

A skill layer's residual and LayerNorm come after the weighted sum of its active skills, and that sum is one
FFN whose width is the sum of theirs:

    sum_i w_i (W2_i act(W1_i x + b1_i) + b2_i)
        == [w_1 W2_1 | .. | w_k W2_k] act([W1_1; ..; W1_k] x + [b1_1; ..; b1_k]) + sum_i w_i b2_i

(w_i = 1/k for SkillNet's average). A task whose routing is one choice for all its tokens (the fixed map, the
learned map in evaluation, one dense FFN) is therefore a stock BERT or BART with FFN width k*f, computed
exactly. A stock config has one FFN width per stack, so a narrower layer (one without skills) is
zero-padded to the widest: zero rows of W1 and b1 give act(0) = 0, and zero columns of W2 add nothing.

What has no such form is refused with `NotFlattenable`: a router that picks FFNs per token (a token gate),
task extras inside the layers (a projected attention beside each layer), and per-skill LayerNorm over more than one skill (an average of k LayerNorms
is not one LayerNorm).
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from typing import Any

import torch
from skillnet.model.registry import build_router
from skillnet.model.routers import REMOTE_CODE_EXPORT, NotFlattenable
from skillnet.model.skill_ffn import SkillFFN
from torch import nn
from transformers import BartConfig, BertConfig, PreTrainedModel
from transformers.activations import ACT2FN

__all__ = ["HEAD_CLASSES", "NotFlattenable", "FlatFFN", "merge_skills", "plain_bart", "plain_bert", "task_mixture"]


@dataclass
class FlatFFN:
    w1: torch.Tensor  # [W, D]
    b1: torch.Tensor  # [W]
    w2: torch.Tensor  # [D, W]
    b2: torch.Tensor  # [D]
    # Per-skill LayerNorm with one skill: that skill's LayerNorm is the layer's (weight, bias).
    layer_norm: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def width(self) -> int:
        return self.w1.shape[0]

    def padded(self, width: int, act: str) -> FlatFFN:
        extra = width - self.width
        if extra == 0:
            return self
        if ACT2FN[act](torch.zeros(1)).item() != 0.0:
            raise NotFlattenable(f"hidden_act={act!r} is not 0 at 0, so a narrower layer cannot be zero-padded "
                                 "to the stock config's one FFN width; " + REMOTE_CODE_EXPORT)
        return FlatFFN(torch.cat([self.w1, self.w1.new_zeros(extra, self.w1.shape[1])]),
                       torch.cat([self.b1, self.b1.new_zeros(extra)]),
                       torch.cat([self.w2, self.w2.new_zeros(self.w2.shape[0], extra)], 1), self.b2, self.layer_norm)


@torch.no_grad()
def merge_skills(bank: SkillFFN, mixture: list[tuple[int, float]]) -> FlatFFN:
    """The one FFN that computes ``sum_i w_i FFN_i`` of a bank (see the module docstring)."""
    sk = [(bank.skills[i], w) for i, w in mixture]
    ln = None
    if bank.per_skill_layernorm:
        if len(sk) > 1:
            raise NotFlattenable(
                f"skill_layernorm='per_skill' averages {len(sk)} LayerNorm outputs, which no single stock layer "
                "computes; " + REMOTE_CODE_EXPORT)
        norm = sk[0][0].output.LayerNorm
        ln = (norm.weight.detach().clone(), norm.bias.detach().clone())
    return FlatFFN(torch.cat([s.intermediate.dense.weight for s, _ in sk]),
                   torch.cat([s.intermediate.dense.bias for s, _ in sk]),
                   torch.cat([w * s.output.dense.weight for s, w in sk], 1),
                   sum(w * s.output.dense.bias for s, w in sk), ln)


def _dense(fc1: nn.Linear, fc2: nn.Linear) -> FlatFFN:
    return FlatFFN(fc1.weight.detach(), fc1.bias.detach(), fc2.weight.detach(), fc2.bias.detach())


def task_mixture(backbone: nn.Module, task: str) -> list[tuple[int, float]]:
    """(skill id, weight) of the FFNs `task` runs in every skill layer; refuses what cannot be flattened."""
    config = backbone.config
    if task not in config.tasks:
        raise KeyError(f"unknown task {task!r}; valid tasks: {', '.join(config.tasks)}")
    extras = getattr(backbone, "task_extras", lambda: [])()
    for m in extras:
        if task in m.task_modules():
            raise NotFlattenable(f"task {task!r}: {m.plain_refusal}; {REMOTE_CODE_EXPORT}")
    mixture = build_router(config).plain_mixture(backbone, task)
    total = sum(w for _, w in mixture)
    if not mixture or abs(total - 1.0) > 1e-6:
        raise ValueError(f"router {config.router!r} gave task {task!r} weights summing to {total}, not 1")
    return mixture


def _stock_config(config: Any, cls: type, **changes: Any) -> Any:
    """`cls` (BertConfig, BartConfig) with the SkillNet config's fields that `cls` has (the skill layout
    fields are dropped), then `changes`."""
    keep = set(cls().to_dict()) - {"model_type", "architectures", "transformers_version", "_name_or_path",
                                   "id2label", "label2id", "auto_map"}
    fields = {k: v for k, v in config.to_dict().items() if k in keep}
    return cls(**{**fields, **changes})


def _load(model: PreTrainedModel, state: dict[str, torch.Tensor]) -> PreTrainedModel:
    """Load `state` into the stock `model`; every parameter and persistent buffer must come from it."""
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or {})
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise RuntimeError(f"flattened weights do not fit {type(model).__name__}: missing {missing[:5]}, "
                           f"unexpected {unexpected[:5]}")
    return model.eval()


# ---- SkillNet-BERT ---------------------------------------------------------------------------------------
# Head type -> (stock class, our head's parameter prefix -> the stock class's, number of outputs or None for
# the head's num_labels).
HEAD_CLASSES: dict[str, tuple[str, dict[str, str], int | None]] = {
    "classification": ("BertForSequenceClassification", {"classifier.": "classifier."}, None),
    "regression": ("BertForSequenceClassification", {"classifier.": "classifier."}, 1),
    "matching": ("BertForSequenceClassification", {"scorer.": "classifier."}, 1),
    "span": ("BertForQuestionAnswering", {"qa_outputs.": "qa_outputs."}, 2),
    "token_crf": ("BertForTokenClassification", {"classifier.": "classifier."}, None),
}
_MLM = ("BertForMaskedLM", {"predictions.": "cls.predictions."})
_POOLED = ("BertModel", "BertForSequenceClassification")
_BERT_SHARED = re.compile(r"^(embeddings\.|pooler\.|encoder\.layer\.\d+\.(attention\.|output\.LayerNorm\.))")


@dataclass
class PlainModel:
    model: PreTrainedModel
    mixture: list[tuple[int, float]]  # (skill id, weight)
    widths: list[int]  # each layer's own FFN width before padding (BART: encoder, then decoder)
    head: str | None  # the task's head type (None: features; "mlm": the pre-training MLM head)


@torch.no_grad()
def plain_bert(model: PreTrainedModel, task: str, features: bool = False) -> PlainModel:
    """`task` of a SkillNet-BERT (multi-task, pre-training or bare encoder) as the stock class of its head, or
    as `BertModel` with ``features=True`` (or when the model has no head for the task)."""
    from transformers import (
        BertForMaskedLM,
        BertForQuestionAnswering,
        BertForSequenceClassification,
        BertForTokenClassification,
        BertModel,
    )

    stock = {c.__name__: c for c in (BertForMaskedLM, BertForQuestionAnswering, BertForSequenceClassification,
                                     BertForTokenClassification, BertModel)}
    backbone = getattr(model, "bert", model)
    cfg = backbone.config
    mixture = task_mixture(backbone, task)
    flat = [merge_skills(layer.skill_ffn, mixture) if layer.has_skills
            else _dense(layer.intermediate.dense, layer.output.dense) for layer in backbone.encoder.layer]
    widths = [f.width for f in flat]
    head_spec = (cfg.task_heads or {}).get(task) if hasattr(model, "heads") else None
    labels = None
    changes: dict[str, Any] = {"intermediate_size": max(widths)}
    if features:
        cls_name, head_map, head_kind, head_module = "BertModel", {}, None, None
    elif head_spec is not None:
        cls_name, head_map, n = HEAD_CLASSES[head_spec["type"]]
        head_kind, head_module = head_spec["type"], model.heads[task]
        labels = head_spec.get("labels")
        if cls_name != "BertForQuestionAnswering":
            changes["num_labels"] = n or int(head_spec.get("num_labels", len(labels or [])))
        if head_kind == "regression":
            changes["problem_type"] = "regression"
    elif hasattr(model, "cls"):  # the pre-trained model: its MLM head with the task's skills
        (cls_name, head_map), head_kind, head_module = _MLM, "mlm", model.cls
    else:
        raise ValueError(f"task {task!r} has no head in this model: export its features (BertModel) instead")
    if labels and cls_name != "BertForQuestionAnswering":
        changes["id2label"] = dict(enumerate(str(x) for x in labels))
        changes["label2id"] = {str(x): i for i, x in enumerate(labels)}
    plain_cfg = _stock_config(cfg, BertConfig, **changes)
    plain_cfg.architectures = [cls_name]
    state: dict[str, torch.Tensor] = {}
    for k, v in backbone.state_dict().items():
        if _BERT_SHARED.match(k) and (cls_name in _POOLED or not k.startswith("pooler.")):
            state[k] = v
    for i, f in enumerate(flat):
        f = f.padded(max(widths), cfg.hidden_act)
        state.update({f"encoder.layer.{i}.intermediate.dense.weight": f.w1, f"encoder.layer.{i}.intermediate.dense.bias": f.b1,
                      f"encoder.layer.{i}.output.dense.weight": f.w2, f"encoder.layer.{i}.output.dense.bias": f.b2})
        if f.layer_norm is not None:
            state[f"encoder.layer.{i}.output.LayerNorm.weight"], state[f"encoder.layer.{i}.output.LayerNorm.bias"] = f.layer_norm
    if cls_name != "BertModel":
        state = {f"bert.{k}": v for k, v in state.items()}
        for k, v in head_module.state_dict().items():
            for ours, theirs in head_map.items():
                if k.startswith(ours):
                    state[theirs + k[len(ours):]] = v
    plain = _load(stock[cls_name](plain_cfg), state)
    return PlainModel(plain, mixture, widths, head_kind)


# ---- SkillNet-BART ---------------------------------------------------------------------------------------
@torch.no_grad()
def plain_bart(model: PreTrainedModel, task: str) -> PlainModel:
    """`task` of a SkillNet-BART as a stock `BartForConditionalGeneration`: each stack's FFNs at the width of
    its widest layer (the skill layers' k*f; the layers without skills zero-padded to it)."""
    from transformers import BartForConditionalGeneration

    cfg = model.config
    base = model.model
    mixture = task_mixture(base, task)
    stacks = {"encoder": base.encoder.layers, "decoder": base.decoder.layers}
    flat = {s: [merge_skills(layer.skill_ffn, mixture) if layer.has_skills else _dense(layer.fc1, layer.fc2)
                for layer in layers] for s, layers in stacks.items()}
    width = {s: max(f.width for f in fs) for s, fs in flat.items()}
    plain_cfg = _stock_config(cfg, BartConfig, encoder_ffn_dim=width["encoder"], decoder_ffn_dim=width["decoder"])
    plain_cfg.architectures = ["BartForConditionalGeneration"]
    ffn = re.compile(r"^model\.(encoder|decoder)\.layers\.\d+\.(skill_ffn\.|fc1\.|fc2\.)")
    state = {k: v for k, v in model.state_dict().items() if not ffn.match(k)}
    for s, fs in flat.items():
        for i, f in enumerate(fs):
            f = f.padded(width[s], cfg.activation_function)
            p = f"model.{s}.layers.{i}."
            state.update({p + "fc1.weight": f.w1, p + "fc1.bias": f.b1, p + "fc2.weight": f.w2, p + "fc2.bias": f.b2})
            if f.layer_norm is not None:
                state[p + "final_layer_norm.weight"], state[p + "final_layer_norm.bias"] = f.layer_norm
    plain = _load(BartForConditionalGeneration(plain_cfg), state)
    plain.generation_config = copy.deepcopy(model.generation_config)  # the task's settings go on the copy
    return PlainModel(plain, mixture, [f.width for fs in flat.values() for f in fs], "generation")
