"""``regression``: one number per text or text pair (regression head), scored by correlation."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import metrics as M
from ..stats import example_stats
from .base import DROPOUT, Encoded, TaskView, bert_inputs
from .sentence import SentenceCodec


class RegressionCodec(SentenceCodec):
    name = "regression"
    head = "regression"
    metrics = ("pearson", "spearman")
    metric = "pearson"
    head_options = {"dropout": DROPOUT}
    regression = True

    def head_spec(self, td: TaskView) -> dict[str, Any]:
        return {**super().head_spec(td), "regression": True}

    def label_of(self, rec: dict[str, Any]) -> Any:
        return rec["label"]

    def collate(self, td: TaskView, feats: list[Encoded], with_labels: bool) -> dict[str, torch.Tensor]:
        batch = bert_inputs(td.tok, feats)
        if with_labels:
            batch["labels"] = torch.tensor([float(f.extra["label"]) for f in feats], dtype=torch.float32)
        return batch

    def decode(self, td: TaskView, model: Any, feats: list[Encoded], batch: dict[str, torch.Tensor]) -> list[Any]:
        return [float(x) for x in model.predict(td.name, **batch)]

    def score(self, td: TaskView, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, float]:
        gold = [float(r["label"]) for r in recs]
        return {"pearson": M.pearson(gold, preds), "spearman": M.spearman(gold, preds)}

    def example_stats(self, td: TaskView, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, Any] | None:
        """[gold, prediction]: correlations (of ranks, for spearman) do not decompose per example."""
        return example_stats(td.cfg.metric, td.cfg.metric, [[float(r["label"]), float(p)] for r, p in zip(recs, preds)])

    def trivial(self, td: TaskView, recs: list[dict[str, Any]]) -> list[Any]:
        """The train mean (its correlations are 0)."""
        mean = float(np.mean([r["label"] for r in td.records["train"]]))
        return [mean] * len(recs)
