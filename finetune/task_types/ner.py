"""``ner``: one IOB2 tag per word (token CRF head), scored by entity-level F1.

Each word (``tokens[i]``) becomes its word pieces; the first piece carries the tag (the CRF sees only first
pieces, via ``word_mask``); a word with no piece becomes ``[UNK]``; words past ``max_seq_len`` are
predicted ``O`` (and still count in the metric)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from skillnet.model.heads import CRF_LOSS_REDUCTIONS

from .. import metrics as M
from ..stats import example_stats
from .base import DROPOUT, Encoded, TaskCodec, TaskView, bert_inputs, pad, piece_ids


class NerCodec(TaskCodec):
    name = "ner"
    head = "token_crf"
    kinds = ("tagging",)
    metrics = ("f1", "precision", "recall", "f1_strict", "precision_strict", "recall_strict")
    metric = "f1"
    # loss_reduction: the CRF loss per sentence (sentence_mean, the default, as the other heads' per-example
    # losses) or per word (token_mean; its gradient is smaller by the mean words per sentence): model/heads.py
    head_options = {"dropout": DROPOUT, "loss_reduction": (
        f"one of {', '.join(CRF_LOSS_REDUCTIONS)}", lambda v: v in CRF_LOSS_REDUCTIONS)}
    labelled = True
    packs = "tokens"  # the CRF reads each example's emissions, moved back to its own row after the encoder

    def encode(self, td: TaskView, recs: list[dict[str, Any]], split: str) -> tuple[list[Encoded], int]:
        feats = [self._encode(td, r) for r in recs]
        return feats, sum(f.extra["n_words"] < f.extra["n_total"] for f in feats)

    def _encode(self, td: TaskView, r: dict[str, Any]) -> Encoded:
        tok = td.tok
        words = r["tokens"]
        ids, tt, wmask, labs = [tok.cls_id], [0], [0], [-100]
        label_ids = r.get("label_ids")
        n_words = 0
        for i, p in enumerate(piece_ids(tok, words)):
            p = p or [tok.unk_id]
            if len(ids) + len(p) > td.max_len - 1:
                break
            ids += p
            tt += [0] * len(p)
            wmask += [1] + [0] * (len(p) - 1)
            lab = label_ids[i] if label_ids is not None else 0
            labs += [lab] + [-100] * (len(p) - 1)
            n_words += 1
        ids.append(tok.sep_id)
        tt.append(0)
        wmask.append(0)
        labs.append(-100)
        return Encoded(ids, tt, {"word_mask": wmask, "labels": labs, "n_words": n_words, "n_total": len(words)})

    def collate(self, td: TaskView, feats: list[Encoded], with_labels: bool) -> dict[str, torch.Tensor]:
        batch = bert_inputs(td.tok, feats)
        batch["word_mask"] = pad([f.extra["word_mask"] for f in feats], 0)
        if with_labels:
            batch["labels"] = pad([f.extra["labels"] for f in feats], -100)
        return batch

    def decode(self, td: TaskView, model: Any, feats: list[Encoded], batch: dict[str, torch.Tensor]) -> list[Any]:
        """Tags per word; words cut by max_seq_len are O."""
        labels = td.label_list or []
        preds = []
        for f, tags in zip(feats, model.predict(td.name, **batch)):
            labs = [labels[int(i)] for i in tags]
            preds.append(labs + ["O"] * (f.extra["n_total"] - len(labs)))
        return preds

    def score(self, td: TaskView, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, float]:
        return M.entity_prf([r["labels"] for r in recs], preds)

    def example_stats(self, td: TaskView, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, Any] | None:
        """Per sentence, [tp, fp, fn] of entities (conlleval's reading of the tags, or strict IOB2 for the
        ``*_strict`` metrics): entity P/R/F1 are micro, from the summed counts."""
        measure, _, strict = td.cfg.metric.partition("_")
        extract = M.iob2_strict_entities if strict else M.bio_entities
        rows = []
        for r, p in zip(recs, preds):
            ge, pe = Counter(extract(r["labels"])), Counter(extract(p))
            tp = sum((ge & pe).values())
            rows.append([tp, sum(pe.values()) - tp, sum(ge.values()) - tp])
        return example_stats(td.cfg.metric, measure, rows)

    def trivial(self, td: TaskView, recs: list[dict[str, Any]]) -> list[Any]:
        """All O."""
        return [["O"] * len(r["tokens"]) for r in recs]

    def present(self, rec: dict[str, Any], pred: Any) -> Any:
        ents = [{"type": t, "start": s, "end": e, "text": "".join(rec["tokens"][s:e])}
                for t, s, e in M.bio_entities(pred)]
        return {"tags": pred, "entities": ents}
