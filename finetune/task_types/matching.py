"""``matching``: pick the right candidates of a question (matching head), scored by top-1 accuracy.

Each group is ``[question, candidate]`` pairs ``[G, C, T]``, encoded per batch (no cached rows). Training
draws the positive and ``num_negatives`` negatives per group; evaluation scores every candidate (capped by
``head.max_candidates``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from .. import metrics as M
from ..stats import example_stats
from .base import (
    DROPOUT,
    MAX_CANDIDATES,
    Encoded,
    TaskCodec,
    TaskView,
    cut_texts,
    iter_chunks,
    pair,
    piece_ids,
    pieces,
    stable_hash,
    to_device,
)


class MatchingCodec(TaskCodec):
    name = "matching"
    head = "matching"
    kinds = ("choice",)
    metrics = ("top1_accuracy",)
    metric = "top1_accuracy"
    head_options = {"dropout": DROPOUT, "max_candidates": MAX_CANDIDATES}

    def eval_candidates(self, td: TaskView, r: dict[str, Any]) -> list[int]:
        """Candidate indices scored at evaluation: all, or the positives plus the first negatives up to
        `head.max_candidates` (a fixed subset so the random baseline is 1/k)."""
        cap = int(td.cfg.head.get("max_candidates", 0) or 0)
        n = len(r["candidates"])
        if not cap or n <= cap:
            return list(range(n))
        pos = list(r["positives"])
        negs = [i for i in range(n) if i not in set(pos)][: max(0, cap - len(pos))]
        return sorted(pos + negs)

    def encode(self, td: TaskView, recs: list[dict[str, Any]], split: str) -> tuple[list[Encoded], int]:
        """No rows (groups are encoded per batch); the count of questions with a cut candidate pair."""
        cands = [r["candidates"] if split == "train" else [r["candidates"][i] for i in self.eval_candidates(td, r)]
                 for r in recs]
        q_len = [len(ids) for ids in piece_ids(td.tok, [r["question"] for r in recs])]
        c_len = [len(ids) for ids in piece_ids(td.tok, [c for cs in cands for c in cs])]
        n, k = 0, 0
        for q, cs in zip(q_len, cands):
            n += any(q + c_len[k + j] > td.max_len - 3 for j in range(len(cs)))
            k += len(cs)
        return [], n

    def num_train_rows(self, td: TaskView) -> int:
        return len(td.records["train"])

    def group_tensors(self, td: TaskView, groups: list[list[tuple[str, str]]]) -> dict[str, torch.Tensor]:
        flat = [p for g in groups for p in g]
        qa = pieces(td.tok, [q for q, _ in flat])
        ca = pieces(td.tok, [c for _, c in flat])
        encs = [pair(td.tok, q, c, td.max_len) for (q, _), (c, _) in zip(qa, ca)]
        G, C = len(groups), max(len(g) for g in groups)
        T = max(len(e.input_ids) for e in encs)
        ids = torch.full((G, C, T), td.tok.pad_id, dtype=torch.long)
        tt = torch.zeros((G, C, T), dtype=torch.long)
        am = torch.zeros((G, C, T), dtype=torch.long)
        cm = torch.zeros((G, C), dtype=torch.long)
        k = 0
        for gi, g in enumerate(groups):
            for ci in range(len(g)):
                e = encs[k]
                k += 1
                n = len(e.input_ids)
                ids[gi, ci, :n] = torch.tensor(e.input_ids)
                tt[gi, ci, :n] = torch.tensor(e.token_type_ids)
                am[gi, ci, :n] = 1
                cm[gi, ci] = 1
        # An all-padding candidate row would attend to nothing; give it its [CLS] so softmax stays finite.
        am[..., 0] = 1
        out = {"input_ids": ids, "token_type_ids": tt, "attention_mask": am}
        if int(cm.sum()) != G * C:
            out["candidate_mask"] = cm
        return out

    def train_batch(self, td: TaskView, indices: Sequence[int], seed: int, draw: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng([seed, stable_hash(td.name), 1_000_003, draw])
        groups, labels = [], []
        k_neg = td.cfg.num_negatives
        for r in (td.records["train"][i] for i in indices):
            cands, pos = r["candidates"], r["positives"]
            p = int(pos[rng.integers(len(pos))])
            negs = [i for i in range(len(cands)) if i not in set(pos)]
            chosen = [int(x) for x in rng.choice(len(negs), size=min(k_neg, len(negs)), replace=False)] if negs else []
            items = [p] + [negs[j] for j in chosen]
            order = rng.permutation(len(items))
            items = [items[j] for j in order]
            labels.append(int(np.where(order == 0)[0][0]))
            groups.append([(r["question"], cands[i]) for i in items])
        batch = self.group_tensors(td, groups)
        batch["labels"] = torch.tensor(labels, dtype=torch.long)
        return batch

    def predict(self, td: TaskView, model: Any, recs: list[dict[str, Any]], split: str | None, bs: int,
                progress: bool) -> list[Any]:
        """Pairs of all records in one flat list, scored bs at a time as one pseudo-group [1, n, T] (the
        head scores each row independently; the softmax only matters for the loss)."""
        device = next(model.parameters()).device
        cands = [self.eval_candidates(td, r) for r in recs]
        flat = [(ri, c) for ri, cs in enumerate(cands) for c in cs]
        flat_scores: list[float] = []
        for chunk in iter_chunks(len(flat), bs, progress, td.name):
            pairs = [[(recs[flat[j][0]]["question"], recs[flat[j][0]]["candidates"][flat[j][1]]) for j in chunk]]
            flat_scores += self.decode(td, model, [], to_device(self.group_tensors(td, pairs), device))
        per: list[list[float]] = [[] for _ in recs]
        for (ri, _), sc in zip(flat, flat_scores):
            per[ri].append(sc)
        return [{"candidates": c, "scores": s} for c, s in zip(cands, per)]

    def decode(self, td: TaskView, model: Any, feats: list[Encoded], batch: dict[str, torch.Tensor]) -> list[Any]:
        """The score of each candidate pair of the batch."""
        return model(task=td.name, **batch).logits.view(-1).float().tolist()

    def score(self, td: TaskView, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, float]:
        gids, scores, labels = [], [], []
        for gi, (r, p) in enumerate(zip(recs, preds)):
            pos = set(r["positives"])
            for c, s in zip(p["candidates"], p["scores"]):
                gids.append(gi)
                scores.append(s)
                labels.append(int(c in pos))
        res = M.group_top1_accuracy(gids, scores, labels)
        return {"top1_accuracy": res["top1_accuracy"]}

    def example_stats(self, td: TaskView, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, Any] | None:
        """[100 x the group's top-1 accuracy, 1], or [0, 0] for a group without a positive (left out, as
        ``group_top1_accuracy`` leaves it out)."""
        rows = []
        for r, p in zip(recs, preds):
            pos = set(r["positives"])
            res = M.group_top1_accuracy([0] * len(p["scores"]), p["scores"], [int(c in pos) for c in p["candidates"]])
            rows.append([res["top1_accuracy"] * res["groups"], res["groups"]])
        return example_stats(td.cfg.metric, "ratio", rows)

    lexical_name = "TF-IDF cosine similarity"

    def lexical(self, td: TaskView, recs: list[dict[str, Any]], train: list[dict[str, Any]] | None = None
                ) -> list[Any] | None:
        """Each candidate scored by the cosine similarity of its character 1-2-gram TF-IDF vector to the
        question's (the vocabulary and idf fit on train's questions and candidates)."""
        from ..lexical import tfidf_similarities

        train = td.records["train"] if train is None else train
        fit = [r["question"] for r in train] + [c for r in train for c in r["candidates"]]
        cands = [self.eval_candidates(td, r) for r in recs]
        scores = tfidf_similarities(fit, [r["question"] for r in recs],
                                    [[r["candidates"][i] for i in cs] for r, cs in zip(recs, cands)])
        return [{"candidates": cs, "scores": sc} for cs, sc in zip(cands, scores)]

    def cut_for_model(self, td: TaskView, recs: list[dict[str, Any]]) -> list[dict[str, Any]] | None:
        """Each (question, candidate) pair cut as ``group_tensors`` cuts it; the question, cut only in a pair
        where it is the longer side, is read once by the baseline: its shortest cut."""
        out = []
        for r in recs:
            cut = [cut_texts(td.tok, r["question"], c, td.max_len) for c in r["candidates"]]
            q = min((a for a, _ in cut), key=len, default=r["question"])
            out.append({**r, "question": q, "candidates": [b for _, b in cut]})
        return out

    def trivial(self, td: TaskView, recs: list[dict[str, Any]]) -> list[Any]:
        """Constant scores: the tie rule of group_top1_accuracy gives the random-choice expectation."""
        return [{"candidates": self.eval_candidates(td, r), "scores": [0.0] * len(self.eval_candidates(td, r))}
                for r in recs]

    def present(self, rec: dict[str, Any], pred: Any) -> Any:
        scores = pred["scores"]
        return {"best": pred["candidates"][max(range(len(scores)), key=scores.__getitem__)], "scores": scores}
