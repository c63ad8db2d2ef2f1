"""Span answers as SkillNet's ``predict`` gives them, from a stock ``BertForQuestionAnswering``, its ONNX graph or
a SkillNet HF export: the context read in windows, the best span of each window, the best window's answer.

``export --plain`` and ``export`` copy this file into the model's folder (``qa/span_qa.py``: a subfolder, so
the stock folder still holds no code at its top) with the task's settings (``qa/span_qa.json``: ``max_seq_len``,
``max_question_len``, ``doc_stride``, ``max_answer_len``), so a served folder answers as the project does on contexts of any length. It needs numpy and a transformers fast tokenizer
(ids and character offsets), nothing of SkillNet; fine-tuning's span codec (finetune/task_types/span.py) reads
its windows and picks its spans with the same functions, so the two cannot drift apart.

    import sys; sys.path.insert(0, f"{folder}/qa")
    from span_qa import SpanQA
    qa = SpanQA(folder, model)        # model: BertForQuestionAnswering, an onnxruntime session, or the HF export
    qa("中国的首都是哪里？", "北京是中国的首都。")    # -> "北京"
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

SUBDIR, SETTINGS_FILE = "qa", "span_qa.json"
# Longest answer in tokens when a task sets none (finetune.md, "Span settings": CMRC 2018's answers are far shorter).
MAX_ANSWER_LEN = 64


def question_budget(max_seq_len: int, max_question_len: int | None) -> int:
    """Question pieces kept: `max_question_len`, else a third of the row (the context keeps two thirds)."""
    return max_question_len if max_question_len else max(1, max_seq_len // 3)


def windows(n_question: int, n_context: int, max_seq_len: int, doc_stride: int | None
            ) -> list[tuple[int, int]]:
    """(first, end) context pieces of each window of ``[CLS] question [SEP] window [SEP]`` in `max_seq_len`; the
    stride is `doc_stride` (at most the window, so no piece is skipped), else half a window. The last window
    reaches the context's end; a context that fits is one window."""
    win = max(1, max_seq_len - n_question - 3)
    stride = min(doc_stride, win) if doc_stride else max(1, win // 2)
    starts = list(range(0, max(1, n_context - win + stride), stride)) or [0]
    return [(w0, min(n_context, w0 + win)) for w0 in starts]


def best_span(start: np.ndarray, end: np.ndarray, max_answer_len: int) -> tuple[float, int, int]:
    """(score, first, last) of the best span over one window's context logits: log-softmax of each over the
    context, ``first <= last < first + max_answer_len``, ties to the earliest (start, end) as torch's argmax."""
    def log_softmax(x: np.ndarray) -> np.ndarray:
        x = x.astype(np.float32)
        m = x.max()
        return x - m - np.log(np.exp(x - m).sum(dtype=np.float32))

    s, e = log_softmax(start), log_softmax(end)
    n = len(s)
    i = np.arange(n)
    ok = (i[None, :] >= i[:, None]) & (i[None, :] - i[:, None] < max_answer_len)
    score = np.where(ok, s[:, None] + e[None, :], -np.inf)
    k = int(score.argmax())
    return float(score.flat[k]), k // n, k % n


def window_counts(questions: Sequence[int], contexts: Sequence[list[tuple[int, int]]],
                  answers: Sequence[tuple[int, int] | None], max_seq_len: int, max_question_len: int | None = None,
                  doc_stride: int | None = None) -> dict[str, int]:
    """Per example (its question's piece count, its context's piece offsets, its first answer's characters
    (start, end) or None): how many are read in several windows, and how many have an answer that lies whole
    in no window (training skips those: it learns from the window that holds the answer)."""
    several = outside = 0
    budget = question_budget(max_seq_len, max_question_len)
    for nq, off, ans in zip(questions, contexts, answers):
        ws = windows(min(nq, budget), len(off), max_seq_len, doc_stride)
        several += len(ws) > 1
        if ans is not None:
            toks = [k for k, (s, e) in enumerate(off) if e > ans[0] and s < ans[1]]
            outside += not toks or not any(w0 <= toks[0] and toks[-1] < w1 for w0, w1 in ws)
    return {"examples": len(questions), "several_windows": several, "answer_in_no_window": outside}


def _logits(model: Any, feed: dict[str, np.ndarray], task: str | None) -> tuple[np.ndarray, np.ndarray]:
    """Start and end logits of one batch from an onnxruntime session or a torch QA model (a SkillNet export's
    gets `task`)."""
    if hasattr(model, "get_inputs") and hasattr(model, "run"):  # onnxruntime.InferenceSession
        names = [i.name for i in model.get_inputs()]
        s, e = model.run(None, {k: feed[k] for k in names})[:2]
        return np.asarray(s), np.asarray(e)
    import torch

    with torch.no_grad():
        out = model(**{k: torch.from_numpy(v) for k, v in feed.items()}, **({"task": task} if task else {}))
    return out.start_logits.float().numpy(), out.end_logits.float().numpy()


class SpanQA:
    """Answers questions over contexts of any length with `model` as ``predict`` does (module docstring). `task`:
    which span task of ``span_qa.json`` (a SkillNet export may hold several; a plain folder holds one)."""

    def __init__(self, folder: str | Path, model: Any, tokenizer: Any = None, task: str | None = None,
                 batch_size: int = 16) -> None:
        folder = Path(folder)
        tasks = json.loads((folder / SUBDIR / SETTINGS_FILE).read_text(encoding="utf-8"))["tasks"]
        if task is None and len(tasks) != 1:
            raise ValueError(f"{folder}: span tasks {sorted(tasks)}: say which (task=...)")
        if task is not None and task not in tasks:
            raise ValueError(f"{folder}: no span task {task!r}; its span tasks: {sorted(tasks)}")
        self.task = task if len(tasks) > 1 else None  # the model call names it only where it must choose
        s = tasks[task] if task is not None else next(iter(tasks.values()))
        self.max_seq_len, self.max_question_len = int(s["max_seq_len"]), s.get("max_question_len")
        self.doc_stride, self.max_answer_len = s.get("doc_stride"), int(s.get("max_answer_len") or MAX_ANSWER_LEN)
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(folder))
        self.tok, self.model, self.batch_size = tokenizer, model, batch_size

    def _pieces(self, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        # no cut and no length warning: the windows, not the tokenizer, bound what the model reads
        enc = self.tok(list(texts), add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        return [(list(i), [tuple(o) for o in off]) for i, off in zip(enc["input_ids"], enc["offset_mapping"])]

    def __call__(self, question: str | Sequence[str], context: str | Sequence[str]) -> str | list[str]:
        """The answer (the context's characters; "" when no span lies in it) to each (question, context)."""
        one = isinstance(question, str)
        qs, cs = ([question], [context]) if one else (list(question), list(context))
        answers = self.answer(qs, cs)  # type: ignore[arg-type]
        return answers[0] if one else answers

    def answer(self, questions: list[str], contexts: list[str]) -> list[str]:
        cls, sep, pad = self.tok.cls_token_id, self.tok.sep_token_id, self.tok.pad_token_id or 0
        rows: list[tuple[int, list[int], int, list[tuple[int, int]]]] = []  # (example, ids, base, offsets)
        budget = question_budget(self.max_seq_len, self.max_question_len)
        for ex, ((q, _), (c, off)) in enumerate(zip(self._pieces(questions), self._pieces(contexts))):
            q = q[:budget]
            for w0, w1 in windows(len(q), len(c), self.max_seq_len, self.doc_stride):
                rows.append((ex, [cls, *q, sep, *c[w0:w1], sep], len(q) + 2, off[w0:w1]))
        best: dict[int, tuple[float, str]] = {}
        for b in range(0, len(rows), self.batch_size):
            chunk = rows[b:b + self.batch_size]
            T = max(len(r[1]) for r in chunk)
            ids = np.array([r[1] + [pad] * (T - len(r[1])) for r in chunk], dtype=np.int64)
            am = np.array([[1] * len(r[1]) + [0] * (T - len(r[1])) for r in chunk], dtype=np.int64)
            tt = np.array([[0] * r[2] + [1] * (len(r[1]) - r[2]) + [0] * (T - len(r[1])) for r in chunk],
                          dtype=np.int64)
            start, end = _logits(self.model, {"input_ids": ids, "attention_mask": am, "token_type_ids": tt}, self.task)
            for (ex, _, base, off), s, e in zip(chunk, start, end):
                if not off:  # an empty context: no span to give
                    continue
                score, a, z = best_span(s[base:base + len(off)], e[base:base + len(off)], self.max_answer_len)
                if ex not in best or score > best[ex][0]:  # the first window wins a tie, as in predict
                    best[ex] = (score, contexts[ex][off[a][0]:off[z][1]])
        return [best.get(i, (0.0, ""))[1] for i in range(len(questions))]


def settings_from_meta(meta: dict[str, Any], head: dict[str, Any]) -> dict[str, Any]:
    """A span task's settings from its ``finetune_tasks.json`` entry and model head; an export from before the
    entry held ``span`` gets the defaults that were then in effect."""
    L = int(meta.get("max_seq_len") or 512)
    return {"max_seq_len": L, "max_question_len": question_budget(L, None), "doc_stride": None,
            "max_answer_len": int(head.get("max_answer_len", MAX_ANSWER_LEN)), **(meta.get("span") or {})}


def write_settings(folder: Path, tasks: dict[str, dict[str, Any]]) -> None:
    """Copy this module into `folder`'s ``qa/`` with each span task's settings beside it (``span_qa.json``)."""
    import shutil

    keys = ("max_seq_len", "max_question_len", "doc_stride", "max_answer_len")
    folder = folder / SUBDIR
    folder.mkdir(parents=True, exist_ok=True)
    (folder / SETTINGS_FILE).write_text(
        json.dumps({"tasks": {t: {k: s.get(k) for k in keys} for t, s in tasks.items()}}, indent=2) + "\n",
        encoding="utf-8")
    shutil.copyfile(Path(__file__), folder / "span_qa.py")
