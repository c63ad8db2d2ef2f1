"""Task heads on top of SkillNet-BERT (SkillNet-NLU §3.2, §3.5, §4.3) and the task-level models.

`SkillNetBertForPreTraining` keeps HF's ``cls.predictions`` / ``cls.seq_relationship`` names so a dense
``BertForPreTraining`` checkpoint loads; each step runs one objective (``task="mlm"`` or ``"nsp"``) with
that objective's skills. `SkillNetBertForMultiTask` holds one head per fine-tuning task in ``heads``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN
from transformers.utils import ModelOutput

try:
    from torchcrf import CRF
except ImportError:  # an export loaded with plain transformers: the same parameters and likelihood
    from .skillnet_crf import CRF

from .skillnet_bert import SkillNetBertModel, SkillNetBertPreTrainedModel
from .skillnet_config import HEAD_TYPES, SkillNetBertConfig
from .skillnet_crf import crf_log_likelihood
from .skillnet_extras import TaskExtras
from .skillnet_packed import PackedLayout
from .skillnet_span_qa import MAX_ANSWER_LEN  # one default for training's head and served windows


@dataclass
class TaskOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    # Cheap no-grad figures for logging (e.g. accuracy counts); never part of the loss. Tensors stay on the
    # device: the trainer reads them back once per logging step, not once per forward.
    metrics: dict[str, float | torch.Tensor] | None = None


def _with_aux(out: TaskOutput, enc: Any) -> TaskOutput:
    """Add the method's weighted auxiliary losses to the task loss, and report each raw value."""
    if enc.aux_loss is None:
        return out
    if out.loss is not None:
        out.loss = out.loss + enc.aux_loss
    out.metrics = {**(out.metrics or {}), **{f"aux_{k}": v.detach() for k, v in enc.aux_losses.items()}}
    return out


# ---- pre-training -------------------------------------------------------------------------------------
class _PredictionTransform(nn.Module):
    def __init__(self, config: SkillNetBertConfig) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.act = ACT2FN[config.hidden_act]
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.act(self.dense(h)))


class _LMPrediction(nn.Module):
    def __init__(self, config: SkillNetBertConfig) -> None:
        super().__init__()
        self.transform = _PredictionTransform(config)
        self.decoder = nn.Linear(config.hidden_size, config.vocab_size, bias=True)
        self.bias = self.decoder.bias


class _PreTrainingHeads(nn.Module):
    def __init__(self, config: SkillNetBertConfig) -> None:
        super().__init__()
        self.predictions = _LMPrediction(config)
        self.seq_relationship = nn.Linear(config.hidden_size, 2)


class SkillNetBertForPreTraining(SkillNetBertPreTrainedModel):
    _tied_weights_keys = {
        "cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias",
    }

    def __init__(self, config: SkillNetBertConfig) -> None:
        super().__init__(config)
        self.bert = SkillNetBertModel(config)
        self.cls = _PreTrainingHeads(config)
        self.post_init()

    def get_output_embeddings(self) -> nn.Linear:
        return self.cls.predictions.decoder

    def set_output_embeddings(self, new: nn.Linear) -> None:
        self.cls.predictions.decoder = new
        self.cls.predictions.bias = new.bias

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        *,
        task: str,
        labels: torch.Tensor | None = None,
        next_sentence_label: torch.Tensor | None = None,
        mlm_positions: torch.Tensor | None = None,
        **unused: Any,
    ) -> TaskOutput:
        """One objective per call. MLM logits are returned only at predicted positions ([M, V]):
        running the 21k-way decoder on every token would cost more than the encoder at small sizes.
        ``mlm_positions`` ([M], indices into the flattened [B*T] batch, the positions whose label is not
        -100, in order) lets the data loader find them on the host: selecting by the labels' boolean mask
        instead makes the host wait for the device to count them, once per MLM batch."""
        if task not in ("mlm", "nsp"):
            raise ValueError(f"pre-training task must be 'mlm' or 'nsp', got {task!r}")
        # Packed rows (training/packing.py) carry their layout; NSP then reads each pair's own [CLS].
        enc = self.bert(input_ids, attention_mask, token_type_ids, task=task, packed=PackedLayout.take(unused))
        if task == "mlm":
            if labels is None:
                logits = self.cls.predictions.decoder(self.cls.predictions.transform(enc.last_hidden_state))
                return TaskOutput(logits=logits)
            if mlm_positions is not None:
                h_MD = enc.last_hidden_state.flatten(0, 1).index_select(0, mlm_positions)
                target = labels.reshape(-1).index_select(0, mlm_positions)
            else:
                sel = labels != -100
                h_MD, target = enc.last_hidden_state[sel], labels[sel]
            logits = self.cls.predictions.decoder(self.cls.predictions.transform(h_MD))
            loss = F.cross_entropy(logits, target) if target.numel() else logits.sum() * 0.0
            with torch.no_grad():
                correct = (logits.argmax(-1) == target).sum()
            return TaskOutput(
                loss=loss, logits=logits, metrics={"mlm_correct": correct, "mlm_count": target.numel()}
            )
        logits = self.cls.seq_relationship(enc.pooler_output)
        if next_sentence_label is None:
            return TaskOutput(logits=logits)
        loss = F.cross_entropy(logits, next_sentence_label.view(-1))
        with torch.no_grad():
            correct = (logits.argmax(-1) == next_sentence_label.view(-1)).sum()
        return TaskOutput(
            loss=loss,
            logits=logits,
            metrics={"nsp_correct": correct, "nsp_count": next_sentence_label.numel()},
        )


def sample_rows(batch: dict[str, Any], layout: PackedLayout | None, hidden_RTD: torch.Tensor | None = None
                ) -> tuple[dict[str, Any], torch.Tensor | None]:
    """A packed batch whose head reads every token (a `layout` with ``unpack_index`` [B, W]) back in one
    sample per row: its [R, T] token tensors as [B, W] (-100 / 0 past a sample's end, as padding) and the
    encoder's ``hidden_RTD`` as [B, W, D] (0 there). The head then sees exactly the padded batch. Anything
    else is returned as it is."""
    index = None if layout is None else layout.unpack_index
    if index is None:
        return batch, hidden_RTD
    out = dict(batch)
    keep, at = index >= 0, index.clamp(min=0)
    rows = (hidden_RTD if hidden_RTD is not None else batch["input_ids"]).shape[:2]
    for k, v in out.items():
        if isinstance(v, torch.Tensor) and v.shape == rows:
            out[k] = torch.where(keep, v.flatten()[at], -100 if k == "labels" else 0)
    if hidden_RTD is not None:
        hidden_RTD = torch.where(keep[..., None], hidden_RTD.flatten(0, 1)[at], 0.0)
    return out, hidden_RTD


# ---- fine-tuning heads ---------------------------------------------------------------------------------
class ClassificationHead(nn.Module):
    """[CLS] (pooled) -> softmax (T1-T4, single sentence or pair)."""

    def __init__(self, config: SkillNetBertConfig, num_labels: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)

    def forward(self, enc: Any, batch: dict[str, torch.Tensor]) -> TaskOutput:
        logits = self.classifier(self.dropout(enc.pooler_output))
        labels = batch.get("labels")
        loss = F.cross_entropy(logits, labels.view(-1)) if labels is not None else None
        return TaskOutput(loss=loss, logits=logits)

    def predict(self, out: TaskOutput, batch: dict[str, torch.Tensor]) -> list[int]:
        return out.logits.argmax(-1).tolist()


class RegressionHead(ClassificationHead):
    def __init__(self, config: SkillNetBertConfig, num_labels: int, dropout: float) -> None:
        super().__init__(config, 1, dropout)

    def forward(self, enc: Any, batch: dict[str, torch.Tensor]) -> TaskOutput:
        pred = self.classifier(self.dropout(enc.pooler_output)).squeeze(-1)
        labels = batch.get("labels")
        loss = F.mse_loss(pred, labels.view(-1).to(pred.dtype)) if labels is not None else None
        return TaskOutput(loss=loss, logits=pred)

    def predict(self, out: TaskOutput, batch: dict[str, torch.Tensor]) -> list[float]:
        return out.logits.tolist()


def _pack_left(valid_BT: torch.Tensor, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Move the valid positions of each row to the front (stable), as pytorch-crf wants a prefix mask."""
    order = torch.argsort((~valid_BT).to(torch.int8), dim=1, stable=True)
    n = valid_BT.sum(1)
    mask = torch.arange(valid_BT.shape[1], device=valid_BT.device)[None] < n[:, None]
    packed = []
    for t in tensors:
        idx = order if t.dim() == 2 else order[..., None].expand_as(t)
        packed.append(t.gather(1, idx))
    return (mask, *packed)


# A forbidden CRF move's score: exp() of it underflows to 0 in fp32 (and it stays finite in fp16), so the
# move carries no probability mass and Viterbi never takes it, without the inf - inf NaNs of -inf.
_FORBIDDEN = -10000.0


def iob2_allowed_transitions(labels: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(start_L, trans_LL)`` booleans for IOB2 tags: ``I-X`` may only follow ``B-X`` or ``I-X``
    (``trans_LL[from, to]``) and may not start a sentence; every other tag is unconstrained."""
    L = len(labels)
    start_L = torch.ones(L, dtype=torch.bool)
    trans_LL = torch.ones(L, L, dtype=torch.bool)
    for j, tag in enumerate(labels):
        if tag.startswith("I-"):
            start_L[j] = False
            trans_LL[:, j] = torch.tensor([prev in (f"B-{tag[2:]}", tag) for prev in labels])
    return start_L, trans_LL


# The CRF loss's reduction (a task's head option "loss_reduction") -> pytorch-crf's name for it. "token_mean":
# the sequence NLLs summed over the batch, divided by its word count (a per-word loss: the scale of a batch of
# one sentence does not grow with its length). "sentence_mean": divided by the number of sentences, like every
# other head's per-example loss, so its gradient is token_mean's x the batch's mean words per sentence. In joint
# training the tasks share one AdamW and one gradient clip: a per-word loss gives NER a gradient several times
# smaller than the other tasks' (0.30 against 2.3-3.9 on the shared encoder, measured late in a joint run).
CRF_LOSS_REDUCTIONS = {"token_mean": "token_mean", "sentence_mean": "mean"}
# The default, decided by the loss-scale study (experiments/loss_scale.py; full profile, 3 seeds, dense joint and
# SkillNet at 2,400 steps): per sentence gave NER +4.9 / +4.8 F1 over per word and +1.5 / +1.6 on the five-task
# average (paired p 0.02-0.05), no task lower. docs/finetune.md has the table.
DEFAULT_CRF_LOSS_REDUCTION = "sentence_mean"


class TokenCRFHead(nn.Module):
    """Per-token emissions + CRF (T5 NER). Word positions are given by `word_mask` (or labels != -100);
    [CLS], [SEP], padding and sub-word continuations are left out of the CRF chain.

    With the head spec's `labels` (the tag of each label id), the CRF is constrained to valid IOB2, in
    decoding *and* training: forbidden moves get a fixed -1e4 on top of the learnt transition score. Gold
    sequences are valid (the task loader rejects invalid BIO), so training over valid paths only makes
    the loss the likelihood of the very distribution Viterbi decodes from, with no probability mass on
    outputs it can never produce. Without `labels` (old specs) the CRF is unconstrained."""

    def __init__(self, config: SkillNetBertConfig, num_labels: int, dropout: float,
                 labels: list[str] | None = None, loss_reduction: str = DEFAULT_CRF_LOSS_REDUCTION) -> None:
        super().__init__()
        if loss_reduction not in CRF_LOSS_REDUCTIONS:
            raise ValueError(f"token_crf head: loss_reduction {loss_reduction!r}; valid: {', '.join(CRF_LOSS_REDUCTIONS)}")
        self.loss_reduction = loss_reduction
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(config.hidden_size, num_labels)
        self.crf = CRF(num_labels, batch_first=True)
        if labels is not None and len(labels) != num_labels:
            raise ValueError(f"token_crf head: {len(labels)} labels {labels} for num_labels={num_labels}")
        # The IOB2 penalties derive from the label list, so they are not part of the checkpoint. Not buffers
        # either, built on first use: transformers 5's from_pretrained builds the model on the meta device
        # and refills non-persistent buffers with empty memory.
        self._labels = list(labels) if labels is not None else None
        self._num_labels = num_labels
        self._penalties: tuple[torch.Tensor, torch.Tensor] | None = None

    def _valid(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        if batch.get("word_mask") is not None:
            return batch["word_mask"].bool()
        if batch.get("labels") is not None:
            return batch["labels"] != -100
        raise ValueError("token_crf head needs `word_mask` (or `labels`) to know which tokens are words")

    def _transitions(self) -> dict[str, torch.Tensor]:
        if self._penalties is None:
            with torch.device("cpu"):
                L = self._num_labels
                start_L, trans_LL = (iob2_allowed_transitions(self._labels) if self._labels is not None
                                     else (torch.ones(L, dtype=torch.bool), torch.ones(L, L, dtype=torch.bool)))
            self._penalties = ((~start_L).float() * _FORBIDDEN, (~trans_LL).float() * _FORBIDDEN)
        start_p, trans_p = (p.to(self.crf.transitions) for p in self._penalties)
        return {"start_transitions": self.crf.start_transitions + start_p,
                "transitions": self.crf.transitions + trans_p,
                "end_transitions": self.crf.end_transitions}

    def forward(self, enc: Any, batch: dict[str, torch.Tensor]) -> TaskOutput:
        em_BTL = self.classifier(self.dropout(enc.last_hidden_state))
        labels = batch.get("labels")
        if labels is None:
            return TaskOutput(logits=em_BTL)
        valid = self._valid(batch)
        keep = valid.any(1)  # a row with no word has nothing to tag
        if not keep.any():
            return TaskOutput(loss=em_BTL.sum() * 0.0, logits=em_BTL)
        mask, em, lab = _pack_left(valid[keep], em_BTL[keep], labels[keep].clamp(min=0))
        # pytorch-crf's log-likelihood (in O(log T) steps), with the constrained transition scores.
        llh = crf_log_likelihood(em, lab, mask, **self._transitions(),
                                 reduction=CRF_LOSS_REDUCTIONS[self.loss_reduction])
        return TaskOutput(loss=-llh, logits=em_BTL)

    @torch.no_grad()
    def viterbi(self, em_BTL: torch.Tensor, mask_BT: torch.Tensor) -> list[list[int]]:
        """Best constrained tag sequence of each row; `mask_BT` is a prefix mask (first position on)."""
        tr = {k: v.float() for k, v in self._transitions().items()}
        em_BTL = em_BTL.float()
        T = em_BTL.shape[1]
        score_BL = tr["start_transitions"] + em_BTL[:, 0]
        back = []
        for t in range(1, T):
            # [B, from, to]: the best predecessor of each tag; rows past their length keep their score.
            best_BL, arg_BL = (score_BL[:, :, None] + tr["transitions"] + em_BTL[:, t, None, :]).max(1)
            score_BL = torch.where(mask_BT[:, t, None], best_BL, score_BL)
            back.append(arg_BL)
        last_B = (score_BL + tr["end_transitions"]).max(1).indices.tolist()
        back_TBL = torch.stack(back).tolist() if back else []
        out = []
        for b, n in enumerate(mask_BT.sum(1).tolist()):
            tags = [last_B[b]]
            for t in range(n - 1, 0, -1):
                tags.append(back_TBL[t - 1][b][tags[-1]])
            out.append(tags[::-1])
        return out

    def predict(self, out: TaskOutput, batch: dict[str, torch.Tensor]) -> list[list[int]]:
        valid = self._valid(batch)
        result: list[list[int]] = [[] for _ in range(valid.shape[0])]
        keep = valid.any(1)
        if keep.any():
            mask, em = _pack_left(valid[keep], out.logits[keep])
            for row, tags in zip(keep.nonzero().view(-1).tolist(), self.viterbi(em, mask)):
                result[row] = tags
        return result


class SpanHead(nn.Module):
    """Start/end vectors dotted with each token, softmax over the passage (T6, §3.2)."""

    def __init__(
        self, config: SkillNetBertConfig, num_labels: int, dropout: float, max_answer_len: int = MAX_ANSWER_LEN
    ) -> None:
        super().__init__()
        self.qa_outputs = nn.Linear(config.hidden_size, 2)  # rows = v_start, v_end
        self.max_answer_len = max_answer_len

    def forward(self, enc: Any, batch: dict[str, torch.Tensor]) -> TaskOutput:
        logits_BT2 = self.qa_outputs(enc.last_hidden_state)
        ctx = batch.get("context_mask")
        if ctx is not None:
            logits_BT2 = logits_BT2.masked_fill(~ctx.bool()[..., None], torch.finfo(logits_BT2.dtype).min)
        loss = None
        if batch.get("start_positions") is not None:
            s, e = logits_BT2.unbind(-1)
            loss = (
                F.cross_entropy(s, batch["start_positions"].view(-1))
                + F.cross_entropy(e, batch["end_positions"].view(-1))
            ) / 2
        return TaskOutput(loss=loss, logits=logits_BT2)

    def predict(self, out: TaskOutput, batch: dict[str, torch.Tensor]) -> list[tuple[int, int]]:
        s, e = out.logits.float().log_softmax(1).unbind(-1)
        score_BTT = s[:, :, None] + e[:, None, :]
        T = score_BTT.shape[1]
        i = torch.arange(T, device=score_BTT.device)
        ok = (i[None, :] >= i[:, None]) & (i[None, :] - i[:, None] < self.max_answer_len)
        best = score_BTT.masked_fill(~ok, float("-inf")).flatten(1).argmax(1)
        return [(int(b) // T, int(b) % T) for b in best]


class MatchingHead(nn.Module):
    """Answer selection (cMedQA-style): [CLS] of each (question, candidate) pair -> a score; softmax over
    the candidates of a group. Inputs are [G, C, T]; `labels` [G] is the correct candidate's index and
    `candidate_mask` [G, C] marks real candidates when groups are padded."""

    def __init__(self, config: SkillNetBertConfig, num_labels: int, dropout: float) -> None:
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.scorer = nn.Linear(config.hidden_size, 1)

    def forward(self, enc: Any, batch: dict[str, torch.Tensor]) -> TaskOutput:
        G, C = batch["group_shape"]
        scores = self.scorer(self.dropout(enc.pooler_output)).view(G, C)
        cm = batch.get("candidate_mask")
        if cm is not None:
            scores = scores.masked_fill(~cm.bool(), torch.finfo(scores.dtype).min)
        labels = batch.get("labels")
        loss = F.cross_entropy(scores, labels.view(-1)) if labels is not None else None
        return TaskOutput(loss=loss, logits=scores)

    def predict(self, out: TaskOutput, batch: dict[str, torch.Tensor]) -> list[int]:
        return out.logits.argmax(-1).tolist()


HEADS: dict[str, type[nn.Module]] = {
    "classification": ClassificationHead,
    "regression": RegressionHead,
    "token_crf": TokenCRFHead,
    "span": SpanHead,
    "matching": MatchingHead,
}
assert set(HEADS) == set(HEAD_TYPES)


def build_head(config: SkillNetBertConfig, spec: dict[str, Any]) -> nn.Module:
    kind = spec["type"]
    dropout = spec.get("dropout", config.classifier_dropout or config.hidden_dropout_prob)
    num_labels = int(spec.get("num_labels", 1))
    if kind in ("classification", "token_crf") and num_labels < 2:
        raise ValueError(f"a {kind} head needs num_labels >= 2, got {num_labels}")
    extra = (
        {"max_answer_len": int(spec["max_answer_len"])} if kind == "span" and "max_answer_len" in spec else {}
    )
    if kind == "token_crf" and spec.get("labels") is not None:
        extra = {"labels": [str(t) for t in spec["labels"]]}  # which id is which tag: the IOB2 constraints
    if kind == "token_crf" and "loss_reduction" in spec:
        extra["loss_reduction"] = str(spec["loss_reduction"])
    return HEADS[kind](config, num_labels, dropout, **extra)


class TaskHeads(TaskExtras, nn.ModuleDict):
    """``heads.{task}``: one head per task, the first kind of task extra."""

    def task_modules(self) -> dict[str, nn.Module]:
        return dict(self.items())

    def add_task(self, task: str, *args: Any) -> nn.Module:
        config, spec = args
        self[task] = build_head(config, spec)
        return self[task]


class SkillNetBertForMultiTask(SkillNetBertPreTrainedModel):
    """One encoder, one head per task (``config.task_heads``); each forward runs one task's skills."""

    def __init__(self, config: SkillNetBertConfig) -> None:
        super().__init__(config)
        self.bert = SkillNetBertModel(config)
        self.heads = TaskHeads({t: build_head(config, spec) for t, spec in config.task_heads.items()})
        self.post_init()

    def add_task(self, task: str, skills: list[str], head: dict[str, Any]) -> None:
        """Register a new task: its skills (in the config), a freshly initialised head and whatever else the
        backbone's task extras give each task."""
        self.config.set_task(task, skills, head)
        new = [self.heads.add_task(task, self.config, head)]
        new += [extras.add_task(task) for extras in self.bert.task_extras() if task not in extras.task_modules()]
        for module in new:  # as the rest of the model: its device, dtype and mode (eval: no dropout)
            module.to(device=self.device, dtype=self.dtype).apply(self._init_weights).train(self.training)

    def _head(self, task: str) -> nn.Module:
        if task not in self.heads:
            raise KeyError(
                f"no head for task {task!r}; tasks with heads: {', '.join(self.heads) or '(none)'}"
            )
        return self.heads[task]

    def forward(
        self,
        *,
        task: str,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        **batch: Any,
    ) -> TaskOutput:
        head = self._head(task)
        if input_ids.dim() == 3:  # matching groups [G, C, T] -> rows
            batch["group_shape"] = input_ids.shape[:2]
            input_ids = input_ids.flatten(0, 1)
            attention_mask = attention_mask.flatten(0, 1) if attention_mask is not None else None
            token_type_ids = token_type_ids.flatten(0, 1) if token_type_ids is not None else None
        elif isinstance(head, MatchingHead):
            raise ValueError(f"task {task!r} is a matching task: input_ids must be [groups, candidates, T]")
        layout = PackedLayout.take(batch)
        enc = self.bert(input_ids, attention_mask, token_type_ids, task=task, packed=layout)
        batch, hidden = sample_rows(batch, layout, enc.last_hidden_state)
        if hidden is not enc.last_hidden_state:
            enc.last_hidden_state = hidden
        out = head(enc, batch)
        return _with_aux(out, enc)

    @torch.no_grad()
    def predict(self, task: str, **batch: Any) -> list[Any]:
        """Decoded predictions: class ids, floats, CRF tag ids per word, (start, end) token spans, or the
        index of the best candidate."""
        out = self.forward(task=task, **batch)
        if batch["input_ids"].dim() == 3:
            batch["group_shape"] = batch["input_ids"].shape[:2]
        view = dict(batch)
        return self._head(task).predict(out, sample_rows(view, PackedLayout.take(view))[0])
