"""``span``: an answer span of a context (span head), scored with CMRC 2018's EM/F1.

``[CLS] question [SEP] context-window [SEP]``; the context is cut into windows of ``max_seq_len`` with a
stride of half a window. Training uses the window that holds the answer (examples whose answer fits no
window are skipped and counted in ``td.skipped_windows``); evaluation scores the best span over all
windows and maps it back to characters of the context."""

from __future__ import annotations

import logging
from typing import Any

import torch

from .. import metrics as M
from .base import (
    MAX_ANSWER_LEN,
    Encoded,
    TaskCodec,
    TaskView,
    bert_inputs,
    iter_chunks,
    pad,
    pair,
    pieces,
    to_device,
)

log = logging.getLogger("finetune")


class SpanCodec(TaskCodec):
    name = "span"
    head = "span"
    kinds = ("span",)
    metrics = ("f1", "em", "char_bag_f1", "char_bag_em")
    metric = "f1"
    head_options = {"max_answer_len": MAX_ANSWER_LEN}
    packs = "tokens"  # start/end logits over each window's own tokens, moved back to its row after the encoder

    def encode(self, td: TaskView, recs: list[dict[str, Any]], split: str) -> tuple[list[Encoded], int]:
        """Window rows, and the number of examples whose question was cut."""
        train = split == "train"
        qs = pieces(td.tok, [r["question"] for r in recs])
        cs = pieces(td.tok, [r["context"] for r in recs])
        feats: list[Encoded] = []
        q_budget = max(1, td.max_len // 3)
        cut_questions = sum(len(q_ids) > q_budget for q_ids, _ in qs)
        for ex_i, (r, (q_ids, _), (c_ids, c_off)) in enumerate(zip(recs, qs, cs)):
            q_ids = q_ids[:q_budget]
            win = td.max_len - len(q_ids) - 3
            stride = max(1, win // 2)
            starts = list(range(0, max(1, len(c_ids) - win + stride), stride)) or [0]
            ans_tok: tuple[int, int] | None = None
            if train and r["answers"]:
                a = r["answers"][0]
                cs_, ce_ = a["start"], a["start"] + len(a["text"])
                toks = [k for k, (s, e) in enumerate(c_off) if e > cs_ and s < ce_]
                if toks:
                    ans_tok = (toks[0], toks[-1])
            for w0 in starts:
                w1 = min(len(c_ids), w0 + win)
                base = len(q_ids) + 2
                e = pair(td.tok, q_ids, c_ids[w0:w1], td.max_len)
                cmask = [0] * base + [1] * (w1 - w0) + [0]
                extra = {"context_mask": cmask, "example": ex_i, "offsets": c_off[w0:w1], "base": base}
                if train:
                    if ans_tok is None or not (w0 <= ans_tok[0] and ans_tok[1] < w1):
                        continue
                    extra["start"] = ans_tok[0] - w0 + base
                    extra["end"] = ans_tok[1] - w0 + base
                e.extra.update(extra)
                feats.append(e)
                if train:
                    break  # one window per training example
            else:
                if train:
                    td.skipped_windows += 1
        if train and td.skipped_windows:
            log.warning("%s: %d training examples skipped: answer not inside any %d-token window",
                        td.name, td.skipped_windows, td.max_len)
        return feats, cut_questions

    def collate(self, td: TaskView, feats: list[Encoded], with_labels: bool) -> dict[str, torch.Tensor]:
        batch = bert_inputs(td.tok, feats)
        batch["context_mask"] = pad([f.extra["context_mask"] for f in feats], 0)
        if with_labels:
            batch["start_positions"] = torch.tensor([f.extra["start"] for f in feats], dtype=torch.long)
            batch["end_positions"] = torch.tensor([f.extra["end"] for f in feats], dtype=torch.long)
        return batch

    def predict(self, td: TaskView, model: Any, recs: list[dict[str, Any]], split: str | None, bs: int,
                progress: bool) -> list[Any]:
        """The best-scoring span over all windows of each record (empty if none maps back to the context)."""
        device = next(model.parameters()).device
        feats = td.features(split) if split is not None else td.encode_records(recs)
        best: dict[int, tuple[float, str]] = {}
        for chunk in iter_chunks(len(feats), bs, progress, td.name):
            fs = [feats[i] for i in chunk]
            batch = to_device(self.eval_batch(td, fs), device)
            for f, (score, chars) in zip(fs, self.decode(td, model, fs, batch)):
                if chars is None:
                    continue
                ex = f.extra["example"]
                text = recs[ex]["context"][chars[0]:chars[1]]
                if ex not in best or score > best[ex][0]:
                    best[ex] = (score, text)
        return [best.get(i, (0.0, ""))[1] for i in range(len(recs))]

    def decode(self, td: TaskView, model: Any, feats: list[Encoded], batch: dict[str, torch.Tensor]) -> list[Any]:
        """Per window: (score, (first, end) character offsets of its best span in the context), or
        (score, None) where the span is not inside the context."""
        out = model(task=td.name, **batch)
        preds: list[Any] = []
        for f, (score, (ts, te)) in zip(feats, self._best_spans(td, model, out.logits)):
            off = f.extra["offsets"]
            a, b = ts - f.extra["base"], te - f.extra["base"]
            if not (0 <= a < len(off) and 0 <= b < len(off)):
                preds.append((score, None))
            else:
                preds.append((score, (off[a][0], off[b][1])))
        return preds

    def _best_spans(self, td: TaskView, model: Any, logits_BT2: torch.Tensor) -> list[tuple[float, tuple[int, int]]]:
        max_len = int(getattr(model.heads[td.name], "max_answer_len", 64))
        s, e = logits_BT2.float().log_softmax(1).unbind(-1)
        score = s[:, :, None] + e[:, None, :]
        T = score.shape[1]
        i = torch.arange(T)
        ok = (i[None, :] >= i[:, None]) & (i[None, :] - i[:, None] < max_len)
        flat = score.masked_fill(~ok, float("-inf")).flatten(1)
        val, arg = flat.max(1)
        return [(float(v), (int(a) // T, int(a) % T)) for v, a in zip(val, arg)]

    def score(self, td: TaskView, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, float]:
        golds = [[a["text"] for a in r["answers"]] for r in recs]
        bag = M.span_char_bag_em_f1(golds, preds)
        return {**M.cmrc2018_em_f1(golds, preds), "char_bag_em": bag["em"], "char_bag_f1": bag["f1"]}

    def trivial(self, td: TaskView, recs: list[dict[str, Any]]) -> list[Any]:
        """The context's first character."""
        return [r["context"][:1] for r in recs]
