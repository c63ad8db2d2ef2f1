"""SkillNet-BERT behind transformers' Auto task classes and pipelines, and SkillNet-BART's text2text pipeline.

An export names these classes in its ``auto_map`` (model/hub.py), so plain transformers serves it:

* `SkillNetBertForMaskedLM` (``AutoModelForMaskedLM``, ``fill-mask``): the pre-trained model, MLM skills;
* `SkillNetBertForSequenceClassification` (``text-classification``): classification, pair and regression
  tasks;
* `SkillNetBertForTokenClassification` (``token-classification``): NER; with a CRF head the logits are the
  CRF's max-marginals, whose per-token argmax is the constrained Viterbi path (the project's decode);
* `SkillNetBertForQuestionAnswering`: span tasks (start/end logits);
* `SkillNetText2TextPipeline` (``text2text-generation``, a custom pipeline): the task's source prefix and
  generation settings, then `generate`.

Which task a class serves when no ``task=`` is given: the config's ``default_task`` when its head fits the
class, else the one task whose head fits. The class then names that task's labels in ``config.id2label``.
Passing ``task=`` to the model still runs any task of the model (its labels are then the caller's to map).

The standard pipelines (fill-mask, feature-extraction, text-classification, token-classification) are
served by subclasses that an export registers in ``custom_pipelines`` under the same names (model/hub.py):
they are transformers' own, plus ``task=`` per call (``clf(text, task="topic")``) or ``task_name=`` when
built (``pipeline("text-classification", model=p, trust_remote_code=True, task_name="topic")``; the
pipeline's own ``task`` argument is its kind). The task runs with its skills and head, and the labels are
that task's; a task the pipeline cannot run (no head of its kind, or not a task of the model) is a
``ValueError`` naming those it can, instead of the default task's answer.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import (
    FeatureExtractionPipeline,
    FillMaskPipeline,
    Pipeline,
    TextClassificationPipeline,
    TokenClassificationPipeline,
)
from transformers.modeling_outputs import (
    MaskedLMOutput,
    QuestionAnsweringModelOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)

from .skillnet_config import SkillNetBertConfig
from .skillnet_heads import SkillNetBertForMultiTask, SkillNetBertForPreTraining, TokenCRFHead

# Head types each task class serves.
SERVES: dict[str, tuple[str, ...]] = {
    "sequence_classification": ("classification", "regression"),
    "token_classification": ("token_crf",),
    "question_answering": ("span",),
}


def serving_task(config: SkillNetBertConfig, kind: str) -> str | None:
    """The task a `kind` class runs without ``task=``: the default task if its head fits, else the only task
    whose head fits, else None."""
    heads = config.task_heads or {}
    fits = [t for t, h in heads.items() if h.get("type") in SERVES[kind]]
    if config.default_task in fits:
        return config.default_task
    return fits[0] if len(fits) == 1 else None


def task_max_len(config: Any, task: str | None) -> int | None:
    """The task's max_seq_len as fine-tuning cut its inputs (``config.task_max_seq_len``, written by the
    export), or None where the export does not say (the tokenizer's ``model_max_length`` then cuts)."""
    limit = (getattr(config, "task_max_seq_len", None) or {}).get(task)
    return int(limit) if limit else None


def task_labels(config: SkillNetBertConfig, task: str) -> list[str] | None:
    labels = (config.task_heads or {}).get(task, {}).get("labels")
    return [str(x) for x in labels] if labels else None


class _TaskModel(SkillNetBertForMultiTask):
    """A multi-task model that serves one kind of head to a pipeline."""

    kind = ""

    def __init__(self, config: SkillNetBertConfig) -> None:
        super().__init__(config)
        self.serving = serving_task(config, self.kind)
        labels = task_labels(config, self.serving) if self.serving else None
        if labels:  # pipelines name predictions from the config
            config.id2label = dict(enumerate(labels))
            config.label2id = {x: i for i, x in enumerate(labels)}

    def _task(self, task: str | None) -> str:
        if task is not None:
            return task
        if self.serving is None:
            heads = {t: h.get("type") for t, h in (self.config.task_heads or {}).items()}
            raise ValueError(
                f"{type(self).__name__} serves heads {SERVES[self.kind]}, and neither default_task="
                f"{self.config.default_task!r} nor a single task has one (task heads: {heads}): pass task="
            )
        return self.serving


class SkillNetBertForSequenceClassification(_TaskModel):
    kind = "sequence_classification"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, *, task: str | None = None,
                labels: torch.Tensor | None = None, **unused: Any) -> SequenceClassifierOutput:
        out = super().forward(task=self._task(task), input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids, labels=labels)
        logits = out.logits if out.logits.dim() == 2 else out.logits[:, None]  # regression: [B, 1]
        return SequenceClassifierOutput(loss=out.loss, logits=logits)


def crf_max_marginals(em_TL: torch.Tensor, start_L: torch.Tensor, trans_LL: torch.Tensor,
                      end_L: torch.Tensor) -> torch.Tensor:
    """[T, L]: the score of the best path through (t, tag). Its argmax at every t is the Viterbi path (up to
    ties), and its softmax over tags is a confidence in the CRF's own terms."""
    T = em_TL.shape[0]
    alpha = [start_L + em_TL[0]]
    for t in range(1, T):
        alpha.append(em_TL[t] + (alpha[-1][:, None] + trans_LL).max(0).values)
    beta = [end_L]
    for t in range(T - 2, -1, -1):
        beta.append((trans_LL + (em_TL[t + 1] + beta[-1])[None, :]).max(1).values)
    return torch.stack(alpha) + torch.stack(beta[::-1])


class SkillNetBertForTokenClassification(_TaskModel):
    """Without ``word_mask``, the words are every attended token but the first ([CLS]) and the last
    ([SEP]): one token per word, as for Chinese text (a word split into pieces is tagged per piece)."""

    kind = "token_classification"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, *, task: str | None = None,
                labels: torch.Tensor | None = None, word_mask: torch.Tensor | None = None,
                **unused: Any) -> TokenClassifierOutput:
        task = self._task(task)
        if word_mask is None:
            att = attention_mask.bool() if attention_mask is not None else torch.ones_like(input_ids, dtype=torch.bool)
            last = att.long().cumsum(1).argmax(1)  # the last attended position
            word_mask = att.clone()
            word_mask[:, 0] = False
            word_mask[torch.arange(len(last), device=last.device), last] = False
        out = super().forward(task=task, input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids, labels=labels, word_mask=word_mask)
        head = self.heads[task]
        logits = out.logits
        if isinstance(head, TokenCRFHead):
            tr = {k: v.float() for k, v in head._transitions().items()}
            logits = logits.float().clone()
            for b in range(logits.shape[0]):
                pos = word_mask[b].bool().nonzero().view(-1)
                if len(pos):
                    logits[b, pos] = crf_max_marginals(logits[b, pos], tr["start_transitions"], tr["transitions"],
                                                       tr["end_transitions"])
        return TokenClassifierOutput(loss=out.loss, logits=logits)


class SkillNetBertForQuestionAnswering(_TaskModel):
    kind = "question_answering"

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, *, task: str | None = None,
                start_positions: torch.Tensor | None = None, end_positions: torch.Tensor | None = None,
                context_mask: torch.Tensor | None = None, **unused: Any) -> QuestionAnsweringModelOutput:
        out = super().forward(task=self._task(task), input_ids=input_ids, attention_mask=attention_mask,
                              token_type_ids=token_type_ids, start_positions=start_positions,
                              end_positions=end_positions, context_mask=context_mask)
        start, end = out.logits.unbind(-1)
        return QuestionAnsweringModelOutput(loss=out.loss, start_logits=start, end_logits=end)


class SkillNetBertForMaskedLM(SkillNetBertForPreTraining):
    """The pre-trained model's MLM head over every position, with the MLM objective's skills unless
    ``task=`` says otherwise."""

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None, *, task: str | None = None,
                labels: torch.Tensor | None = None, **unused: Any) -> MaskedLMOutput:
        if task is None:
            task = "mlm" if "mlm" in self.config.tasks else self.config.default_task
        enc = self.bert(input_ids, attention_mask, token_type_ids, task=task)
        logits = self.cls.predictions.decoder(self.cls.predictions.transform(enc.last_hidden_state))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.flatten(0, 1), labels.view(-1), ignore_index=-100)
        return MaskedLMOutput(loss=loss, logits=logits)


class _TaskPipeline:
    """Mixin over a transformers pipeline: ``task=`` (a call) or ``task_name=`` (the pipeline) picks the model
    task it runs. ``heads``: the head types it can use; None: any task of the model (for its skills)."""

    heads: tuple[str, ...] | None = None
    cuts = False  # whether its preprocess takes the tokenizer's truncation arguments (text classification)

    def _sanitize_parameters(self, task: str | None = None, task_name: str | None = None,
                             **kwargs: Any) -> tuple[dict, dict, dict]:
        pre, fwd, post = super()._sanitize_parameters(**kwargs)  # type: ignore[misc]
        chosen = task if task is not None else task_name
        if chosen is not None:
            cfg = self.model.config  # type: ignore[attr-defined]
            fits = [t for t in cfg.tasks if self.heads is None
                    or (cfg.task_heads or {}).get(t, {}).get("type") in self.heads]
            if chosen not in fits:
                kind = f"a head of type {'/'.join(self.heads)}" if self.heads else "skills in this model"
                raise ValueError(f"task={chosen!r}: this {self.task} pipeline runs tasks with {kind}: "  # type: ignore[attr-defined]
                                 f"{', '.join(fits) or 'none'}")
            fwd["task"] = post["task"] = chosen
        limit = task_max_len(self.model.config, chosen or getattr(self.model, "serving", None))  # type: ignore[attr-defined]
        if self.cuts and limit is not None and "max_length" not in pre:
            # predict cuts a text (a pair: longest first) at the task's max_seq_len: so does this pipeline
            pre.update(truncation=True, max_length=limit)
        return pre, fwd, post

    def _forward(self, model_inputs: dict[str, Any], task: str | None = None) -> Any:
        if task is not None:  # every one of these pipelines calls model(**model_inputs)
            model_inputs = {**model_inputs, "task": task}
        return super()._forward(model_inputs)  # type: ignore[misc]

    def postprocess(self, model_outputs: Any, task: str | None = None, **kwargs: Any) -> Any:
        labels = task_labels(self.model.config, task) if task is not None else None  # type: ignore[attr-defined]
        if not labels:
            return super().postprocess(model_outputs, **kwargs)  # type: ignore[misc]
        # The pipeline names classes from config.id2label: the chosen task's for this output only.
        cfg = self.model.config  # type: ignore[attr-defined]
        saved = cfg.id2label, cfg.label2id
        cfg.id2label, cfg.label2id = dict(enumerate(labels)), {x: i for i, x in enumerate(labels)}
        try:
            return super().postprocess(model_outputs, **kwargs)  # type: ignore[misc]
        finally:
            cfg.id2label, cfg.label2id = saved


class SkillNetTextClassificationPipeline(_TaskPipeline, TextClassificationPipeline):
    heads = SERVES["sequence_classification"]
    cuts = True


class SkillNetTokenClassificationPipeline(_TaskPipeline, TokenClassificationPipeline):
    heads = SERVES["token_classification"]


class SkillNetFeatureExtractionPipeline(_TaskPipeline, FeatureExtractionPipeline):
    pass


class SkillNetFillMaskPipeline(_TaskPipeline, FillMaskPipeline):
    pass


class SkillNetText2TextPipeline(Pipeline):
    """``pipeline("text2text-generation", model=folder, trust_remote_code=True)`` for SkillNet-BART: the
    source prefix of the task (``config.task_prefixes``) goes before the text, the export's
    generation_config holds the task's beams and length, and the output is decoded as the project does
    (no spaces between Chinese characters)."""

    _load_tokenizer = True
    _load_feature_extractor = False
    _load_image_processor = False
    _load_processor = False

    def _sanitize_parameters(self, task: str | None = None, **generate_kwargs: Any) -> tuple[dict, dict, dict]:
        pre = {"task": task} if task is not None else {}
        fwd = dict(generate_kwargs)
        if task is not None:
            fwd["task"] = task
        return pre, fwd, {}

    def preprocess(self, text: str, task: str | None = None) -> dict[str, torch.Tensor]:
        task = task or self.model.config.default_task
        prefix = (getattr(self.model.config, "task_prefixes", None) or {}).get(task, "")
        # fine-tuning and predict cut the source at the task's max_seq_len with the prefix on top
        # (finetune/task_types/generation.py): the same cut here, not the tokenizer's model_max_length
        limit = task_max_len(self.model.config, task)
        cut = {} if limit is None else {
            "max_length": limit + len(self.tokenizer(prefix, add_special_tokens=False)["input_ids"] if prefix else [])}
        enc = self.tokenizer(prefix + text, return_tensors="pt", truncation=True, **cut)
        return {k: v for k, v in enc.items() if k != "token_type_ids"}  # BART has no segments

    def _forward(self, inputs: dict[str, torch.Tensor], **generate_kwargs: Any) -> dict[str, torch.Tensor]:
        return {"ids": self.model.generate(**inputs, **generate_kwargs)}

    def postprocess(self, outputs: dict[str, torch.Tensor]) -> list[dict[str, str]]:
        return [{"generated_text": decode_text(self.tokenizer, row)} for row in outputs["ids"].tolist()]


def decode_text(tokenizer: Any, ids: list[int]) -> str:
    """Generated ids as text: [PAD] [CLS] [SEP] [MASK] dropped, WordPiece ``##`` joined, and no space between two
    tokens unless both are Latin letters or digits (as ``finetune.tasks.TaskData.decode_text``)."""
    special = {tokenizer.pad_token_id, tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.mask_token_id}
    toks = tokenizer.convert_ids_to_tokens([i for i in ids if i not in special])
    out = ""
    for t in toks:
        if t.startswith("##"):
            out += t[2:]
        elif out and out[-1].isascii() and out[-1].isalnum() and t[:1].isascii() and t[:1].isalnum():
            out += " " + t
        else:
            out += t
    return out
