"""What classification and regression share: one text or a text pair per row, ``[CLS] a [SEP] (b [SEP])``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from skillnet.data_prep.tasks.schema import infer_pair_kind

from .base import Encoded, TaskCodec, TaskView, pair, piece_ids


class SentenceCodec(TaskCodec):
    packs = "pooled"  # classification and regression: one pooled output per example

    kinds = ("single", "pair")

    def infer_kind(self, td: TaskView, load_splits: Sequence[str]) -> tuple[str, str]:
        """``pair`` if the train records carry a ``text_pair``, so a pair task given as plain files is never
        trained on its first texts alone."""
        if "train" not in td.sources or not load_splits:
            return self.kinds[0], ""
        kind, where = infer_pair_kind(td.sources["train"], columns=td.cfg.columns or None,
                                      name=td.files["train"], split="train")
        note = ""
        if where is not None:
            note = (f" (kind 'pair' inferred from {where}, the first record "
                    "with a 'text_pair'; set 'kind' in the config to choose)")
        return kind, note

    def label_of(self, rec: dict[str, Any]) -> Any:
        raise NotImplementedError

    def encode(self, td: TaskView, recs: list[dict[str, Any]], split: str) -> tuple[list[Encoded], int]:
        a = piece_ids(td.tok, [r["text"] for r in recs])
        b = (piece_ids(td.tok, [r["text_pair"] for r in recs]) if td.kind == "pair" else [None] * len(recs))
        feats = []
        for r, ia, ib in zip(recs, a, b):
            e = pair(td.tok, ia, ib, td.max_len)
            e.extra["label"] = self.label_of(r)
            feats.append(e)
        return feats, sum(f.extra["truncated"] for f in feats)
