"""``span``: an answer span of a context (span head), scored with CMRC 2018's EM/F1.

``[CLS] question [SEP] context-window [SEP]``; the question keeps ``max_question_len`` pieces (default a third of
``max_seq_len``) and the context is read in windows of the rest with a stride of ``doc_stride`` (default half a
window). The windows and the span choice are model/span_qa.py's, the module an export carries beside the model,
so a served folder answers as ``predict`` does. Training uses the window that holds the answer (examples whose answer fits no
window are skipped and counted in ``td.skipped_windows``); evaluation scores the best span over all
windows and maps it back to characters of the context."""

from __future__ import annotations

import logging
from typing import Any

import torch
from skillnet.model.span_qa import MAX_ANSWER_LEN as DEFAULT_ANSWER_LEN
from skillnet.model.span_qa import best_span, question_budget, window_counts, windows

from .. import metrics as M
from ..stats import example_stats
from .base import (
    MAX_ANSWER_LEN,
    Encoded,
    TaskCodec,
    TaskSettings,
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
        q_budget = question_budget(td.max_len, td.cfg.max_question_len)
        cut_questions = sum(len(q_ids) > q_budget for q_ids, _ in qs)
        for ex_i, (r, (q_ids, _), (c_ids, c_off)) in enumerate(zip(recs, qs, cs)):
            q_ids = q_ids[:q_budget]
            ans_tok: tuple[int, int] | None = None
            if train and r["answers"]:
                a = r["answers"][0]
                cs_, ce_ = a["start"], a["start"] + len(a["text"])
                toks = [k for k, (s, e) in enumerate(c_off) if e > cs_ and s < ce_]
                if toks:
                    ans_tok = (toks[0], toks[-1])
            for w0, w1 in windows(len(q_ids), len(c_ids), td.max_len, td.cfg.doc_stride):
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
        (score, None) where the window holds no context."""
        logits = model(task=td.name, **batch).logits.float().cpu().numpy()
        cap = int(getattr(model.heads[td.name], "max_answer_len", DEFAULT_ANSWER_LEN))
        preds: list[Any] = []
        for f, row in zip(feats, logits):
            off, base = f.extra["offsets"], f.extra["base"]
            if not off:
                preds.append((float("-inf"), None))
                continue
            score, a, b = best_span(row[base:base + len(off), 0], row[base:base + len(off), 1], cap)
            preds.append((score, (off[a][0], off[b][1])))
        return preds

    def plan_lines(self, td: TaskView) -> list[str]:
        """The start-up plan's line: how the training examples are read in windows, and how many are lost."""
        recs = td.records.get("train") or []
        if not recs:
            return []
        qs = pieces(td.tok, [r["question"] for r in recs])
        cs = pieces(td.tok, [r["context"] for r in recs])
        ans = [(r["answers"][0]["start"], r["answers"][0]["start"] + len(r["answers"][0]["text"]))
               if r.get("answers") else None for r in recs]
        c = window_counts([len(q) for q, _ in qs], [off for _, off in cs], ans, td.max_len,
                          td.cfg.max_question_len, td.cfg.doc_stride)
        sp = self.settings(td)
        return [f"  {td.name}/train: contexts read in windows of {td.max_len} tokens (question <= "
                f"{sp['max_question_len']}, stride {sp['doc_stride'] or 'half a window'}): {c['several_windows']:,} "
                f"of {c['examples']:,} examples span several windows; {c['answer_in_no_window']:,} answers lie whole "
                "in no window (skipped in training)"]

    def check_config(self, cfg: TaskSettings) -> None:
        super().check_config(cfg)
        if cfg.max_question_len is not None and cfg.max_question_len > cfg.max_seq_len - 4:
            raise ValueError(f"task {cfg.name!r}: max_question_len={cfg.max_question_len} leaves no context in "
                             f"max_seq_len={cfg.max_seq_len} (at most {cfg.max_seq_len - 4})")

    def settings(self, td: TaskView) -> dict[str, Any]:
        """The span settings in effect: what model/span_qa.py needs to read windows as training did."""
        return {"max_seq_len": td.max_len, "max_question_len": question_budget(td.max_len, td.cfg.max_question_len),
                "doc_stride": td.cfg.doc_stride,
                "max_answer_len": int(td.cfg.head.get("max_answer_len", DEFAULT_ANSWER_LEN))}

    def meta(self, td: TaskView) -> dict[str, Any]:
        return {"span": self.settings(td)}

    def config_from_meta(self, meta: dict[str, Any]) -> dict[str, Any]:
        span = meta.get("span") or {}
        return {"doc_stride": span.get("doc_stride"), "max_question_len": span.get("max_question_len")}

    def head_spec(self, td: TaskView) -> dict[str, Any]:
        # the cap in effect is written down, not left to the head's own default
        return {**super().head_spec(td), "max_answer_len": self.settings(td)["max_answer_len"]}

    def score(self, td: TaskView, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, float]:
        golds = [[a["text"] for a in r["answers"]] for r in recs]
        bag = M.span_char_bag_em_f1(golds, preds)
        return {**M.cmrc2018_em_f1(golds, preds), "char_bag_em": bag["em"], "char_bag_f1": bag["f1"]}

    def example_stats(self, td: TaskView, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, Any] | None:
        """[the question's EM or F1 (percent), 1]: both are means over questions."""
        bag, _, measure = td.cfg.metric.rpartition("_")
        per = M.span_char_bag_em_f1 if bag else M.cmrc2018_em_f1
        rows = [[per([[a["text"] for a in r["answers"]]], [p])[measure], 1.0] for r, p in zip(recs, preds)]
        return example_stats(td.cfg.metric, "ratio", rows)

    def trivial(self, td: TaskView, recs: list[dict[str, Any]]) -> list[Any]:
        """The context's first character."""
        return [r["context"][:1] for r in recs]
