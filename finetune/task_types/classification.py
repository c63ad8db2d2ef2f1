"""``classification``: one label of a closed set per text or text pair (classification head)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from skillnet.data_prep.tasks.schema import TaskDataError

from .. import metrics as M
from ..stats import example_stats
from .base import DROPOUT, Encoded, TaskSettings, TaskView, bert_inputs, cut_texts
from .sentence import SentenceCodec


class ScoredLabel(str):
    """A predicted label that carries the model's probability of the positive class (`score`), for ROC-AUC; a
    plain string to everything else (equality, JSON, the prediction files)."""

    score: float

    def __new__(cls, label: str, score: float) -> ScoredLabel:
        out = super().__new__(cls, label)
        out.score = score
        return out


# Metrics of a binary task only: they need a positive class.
BINARY_METRICS = ("f1", "auc")


class ClassificationCodec(SentenceCodec):
    name = "classification"
    head = "classification"
    # auc: ROC-AUC of the positive class's probability (binary tasks; 50 for always-yes or chance, on any split,
    # where positive-class f1 rewards always-yes with 2p/(1+p): 66.7 on a balanced split)
    metrics = ("accuracy", "macro_f1", "f1", "auc")
    metric = "accuracy"
    head_options = {"dropout": DROPOUT}
    labelled = True

    def check_config(self, cfg: TaskSettings) -> None:
        if cfg.positive_label is not None:
            cfg.positive_label = str(cfg.positive_label)
        labels = [str(x) for x in cfg.labels] if cfg.labels is not None else None
        if labels is not None and cfg.positive_label is not None and cfg.positive_label not in labels:
            raise ValueError(f"positive_label {cfg.positive_label!r} is not one of the labels {labels}")
        if labels is not None and cfg.metric in BINARY_METRICS:
            if len(labels) != 2:
                raise ValueError(f"metric {cfg.metric!r} is of the positive class of a binary task; 'labels' has "
                                 f"{len(labels)}: {labels} (use macro_f1)")
            if cfg.positive_label is None and "1" not in labels:
                raise ValueError(f"metric {cfg.metric!r} needs 'positive_label' (one of {labels}); the default '1' "
                                 "is not a label")

    def positive_label(self, td: TaskView) -> str | None:
        """The class whose F1 is the ``f1`` metric of a binary task (None otherwise)."""
        labels = list(td.label_list or [])
        pos = td.cfg.positive_label
        where = td.files.get("train", td.name)
        if pos is not None and pos not in labels:
            raise TaskDataError(where, 0, f"task {td.name!r}: positive_label {pos!r} is not one of the labels "
                                f"{labels}")
        if len(labels) == 2 and pos is None and "1" in labels:
            pos = "1"
        if td.cfg.metric in BINARY_METRICS and (len(labels) != 2 or pos is None):
            raise TaskDataError(where, 0, f"task {td.name!r}: metric {td.cfg.metric!r} is of the positive class of a binary "
                                f"task; it has {len(labels)} labels {labels}" + (
                                    "" if len(labels) != 2 else " and no 'positive_label' (the default '1' is "
                                    "not a label)"))
        return pos if len(labels) == 2 else None

    def label_of(self, rec: dict[str, Any]) -> Any:
        return rec.get("label_id", -1)

    def collate(self, td: TaskView, feats: list[Encoded], with_labels: bool) -> dict[str, torch.Tensor]:
        batch = bert_inputs(td.tok, feats)
        if with_labels:
            batch["labels"] = torch.tensor([int(f.extra["label"]) for f in feats], dtype=torch.long)
        return batch

    def decode(self, td: TaskView, model: Any, feats: list[Encoded], batch: dict[str, torch.Tensor]) -> list[Any]:
        labels = td.label_list or []
        if td.positive_label is None:
            return [labels[int(i)] for i in model.predict(td.name, **batch)]
        # a binary task: the label of the larger logit (as the head's predict), with the positive class's
        # probability for ROC-AUC
        with torch.no_grad():
            logits = model(task=td.name, **batch).logits.float()
        prob = logits.softmax(-1)[:, labels.index(td.positive_label)].tolist()
        return [ScoredLabel(labels[int(i)], p) for i, p in zip(logits.argmax(-1).tolist(), prob)]

    def score(self, td: TaskView, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, float]:
        gold = [r["label"] for r in recs]
        # macro-F1 over the classes present in gold or predictions (scikit-learn's default): a class
        # absent from a small dev set would otherwise count as F1 = 0.
        out = {"accuracy": M.accuracy(gold, preds), "macro_f1": M.macro_f1(gold, preds)}
        if td.positive_label is not None:
            out["f1"] = M.binary_f1(gold, preds, td.positive_label)
            # a predictor without scores (the trivial baseline) ranks every example alike: 50
            scores = [getattr(p, "score", 0.5) for p in preds]
            out["auc"] = M.roc_auc([g == td.positive_label for g in gold], scores)
        return out

    def example_stats(self, td: TaskView, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, Any] | None:
        """accuracy: [100 x correct, 1]; macro_f1: one-hot [tp, fp, fn] per class seen; f1: the positive class's
        [tp, fp, fn]; auc: [score, is positive] (ranks do not decompose)."""
        gold = [r["label"] for r in recs]
        pos = td.positive_label

        def confusion(c: Any) -> list[list[float]]:
            return [[g == c and p == c, g != c and p == c, g == c and p != c] for g, p in zip(gold, preds)]

        classes = sorted(set(gold) | set(preds), key=str)
        rows = {
            "accuracy": lambda: ("ratio", [[100.0 * (g == p), 1.0] for g, p in zip(gold, preds)]),
            "macro_f1": lambda: ("macro_f1", [sum(r, []) for r in zip(*map(confusion, classes))] if classes
                                 else [[] for _ in gold]),
            "f1": lambda: ("f1", confusion(pos)),
            "auc": lambda: ("auc", [[getattr(p, "score", 0.5), g == pos] for g, p in zip(gold, preds)]),
        }
        if td.cfg.metric not in rows or (td.cfg.metric in BINARY_METRICS and pos is None):
            return None
        reduce, out = rows[td.cfg.metric]()
        return example_stats(td.cfg.metric, reduce, out)

    lexical_name = "TF-IDF + logistic regression"

    def lexical(self, td: TaskView, recs: list[dict[str, Any]], train: list[dict[str, Any]] | None = None
                ) -> list[Any] | None:
        """Character 1-2-gram TF-IDF (of text and pair side by side, and the pair's TF-IDF cosine) and a logistic
        regression, fit on train (scikit-learn). A binary task's labels carry the positive class's probability,
        as the model's do: without it every example ranks alike and the ROC-AUC of the baseline is 50 whatever
        it has learnt."""
        from ..lexical import tfidf_classify

        train = td.records["train"] if train is None else train

        def pairs(rs: list[dict[str, Any]]) -> list[str] | None:
            return [r["text_pair"] for r in rs] if td.kind == "pair" else None

        labels, probs = tfidf_classify([r["text"] for r in train], [r["label"] for r in train],
                                       [r["text"] for r in recs], pairs(train), pairs(recs))
        if td.positive_label is None:
            return labels
        return [ScoredLabel(y, p.get(td.positive_label, 0.0)) for y, p in zip(labels, probs)]

    def cut_for_model(self, td: TaskView, recs: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        out = []
        for r in recs:
            a, b = cut_texts(td.tok, r["text"], r["text_pair"] if td.kind == "pair" else None, td.max_len)
            out.append({**r, "text": a, **({"text_pair": b} if b is not None else {})})
        return out

    def trivial(self, td: TaskView, recs: list[dict[str, Any]]) -> list[Any]:
        """The majority class of train."""
        major = Counter(r["label"] for r in td.records["train"]).most_common(1)[0][0]
        return [major] * len(recs)
