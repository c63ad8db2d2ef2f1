"""Feature encoding: char/word-piece alignment for NER, answer spans through windows, matching groups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from skillnet.data_prep.tokenizer import load_tokenizer
from skillnet.finetune.config import FinetuneConfig
from skillnet.finetune.tasks import TaskData


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(None)


def _data(tmp_path: Path, tok, typ: str, rows: list[dict], **task) -> TaskData:
    f = tmp_path / f"{typ}.jsonl"
    f.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in rows) + "\n", encoding="utf-8")
    t = {"name": typ, "type": typ, "skills": ["s7"], "train": str(f), "dev": str(f), **task}
    cfg = FinetuneConfig.from_dict({"tasks": [t]})
    return TaskData(cfg.tasks[0], cfg, tok)


def test_tagging_alignment_with_word_pieces(tmp_path, tok):
    rows = [{"tokens": ["我", "用", "iPhone", "在", "北", "京"], "labels": ["O", "O", "B-PRD", "O", "B-LOC", "I-LOC"]}]
    d = _data(tmp_path, tok, "ner", rows)
    f = d.features("train")[0]
    pieces = [tok.vocab[i] for i in f.input_ids]
    assert pieces[0] == "[CLS]" and pieces[-1] == "[SEP]"
    # one first piece per word carries its tag; continuation pieces are outside the CRF chain
    assert sum(f.extra["word_mask"]) == 6
    first = [p for p, m in zip(pieces, f.extra["word_mask"]) if m]
    assert first[:2] == ["我", "用"] and first[3:] == ["在", "北", "京"]
    tags = [d.label_list[lab] for lab, m in zip(f.extra["labels"], f.extra["word_mask"]) if m]
    assert tags == rows[0]["labels"]
    assert all(lab == -100 for lab, m in zip(f.extra["labels"], f.extra["word_mask"]) if not m)


def test_tagging_truncation_predicts_o_for_cut_words(tmp_path, tok):
    rows = [{"tokens": list("张三在北京工作了很多年"), "labels": ["B-PER", "I-PER", "O", "B-LOC", "I-LOC"] + ["O"] * 6}]
    d = _data(tmp_path, tok, "ner", rows, max_seq_len=8)
    f = d.features("train")[0]
    assert len(f.input_ids) == 8 and f.extra["n_words"] == 6 and f.extra["n_total"] == 11


def test_span_answer_in_a_later_window_and_back_to_characters(tmp_path, tok):
    ctx = "前面是一段很长的无关文字，用来把答案推到后面的窗口里。" * 2 + "答案是上海市。"
    ans = "上海市"
    rows = [{"context": ctx, "question": "答案是什么？", "answers": [{"text": ans, "start": ctx.index(ans)}]}]
    d = _data(tmp_path, tok, "span", rows, max_seq_len=32)
    train = d.features("train")
    assert len(train) == 1  # the one window that holds the answer
    f = train[0]
    s, e = f.extra["start"], f.extra["end"]
    off = f.extra["offsets"]
    assert ctx[off[s - f.extra["base"]][0]:off[e - f.extra["base"]][1]] == ans
    assert f.extra["context_mask"][s] == 1 and f.extra["context_mask"][0] == 0
    assert len(d.features("dev")) > 2  # evaluation covers the whole context with overlapping windows

    class Oracle(torch.nn.Module):
        """Puts all start/end mass on the gold tokens of the window that holds the answer."""

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))
            self.heads = {"span": torch.nn.Module()}

        def forward(self, task, input_ids, context_mask, **kw):
            B, T = input_ids.shape
            logits = torch.full((B, T, 2), -1e4)
            for b in range(B):
                ids = input_ids[b].tolist()
                for i in range(T - 2):
                    if [tok.vocab[x] for x in ids[i:i + 3]] == ["上", "海", "市"]:
                        logits[b, i, 0] = logits[b, i + 2, 1] = 10.0
            return type("O", (), {"logits": logits})()

    preds = d.predict_split(Oracle(), "dev", 4)
    assert preds == [ans]
    assert d.score("dev", preds) == {"em": 100.0, "f1": 100.0}


def test_matching_batch_label_points_at_the_positive(tmp_path, tok):
    rows = [{"question": "车险怎么买", "candidates": ["寿险价格", "车险网站买", "年金领取", "医保报销"], "positives": [1]},
            {"question": "寿险多少钱", "candidates": ["寿险价格", "车险网站买", "年金领取"], "positives": [0]}]
    d = _data(tmp_path, tok, "matching", rows, num_negatives=2)
    for draw in range(5):
        b = d.train_batch([0, 1], seed=0, draw=draw)
        assert b["input_ids"].shape[:2] == (2, 3)
        for g, r in enumerate(rows):
            row = b["input_ids"][g, b["labels"][g]].tolist()
            text = "".join(tok.vocab[i] for i in row if tok.vocab[i] not in ("[CLS]", "[SEP]", "[PAD]"))
            assert text == r["question"] + r["candidates"][r["positives"][0]]
    ragged = d.train_batch([0, 1], seed=0, draw=0)
    assert "candidate_mask" not in ragged  # both groups have 3 candidates here
    d.cfg.num_negatives = 3
    ragged = d.train_batch([0, 1], seed=0, draw=0)
    assert ragged["candidate_mask"].tolist() == [[1, 1, 1, 1], [1, 1, 1, 0]]


def test_train_order_is_a_permutation_per_pass(tmp_path, tok):
    rows = [{"text": f"第{i}条", "label": "a" if i % 2 else "b"} for i in range(10)]
    d = _data(tmp_path, tok, "classification", rows)
    first_pass = [i for k in range(5) for i in d.train_indices(seed=1, draw=k, batch_size=2)]
    assert sorted(first_pass) == list(range(10))
    second_pass = [i for k in range(5, 10) for i in d.train_indices(seed=1, draw=k, batch_size=2)]
    assert sorted(second_pass) == list(range(10)) and second_pass != first_pass
    assert d.train_indices(seed=1, draw=3, batch_size=2) == d.train_indices(seed=1, draw=3, batch_size=2)


def test_eval_cap_is_a_sample_not_the_head_of_a_sorted_file(tmp_path, tok):
    # Converted dev files can be sorted by label; the first N of one would be a one-class dev set.
    rows = [{"text": f"第{i}条", "label": "neg" if i < 100 else "pos"} for i in range(200)]
    d = _data(tmp_path, tok, "classification", rows, max_eval_examples=40, max_train_examples=50)
    for split, n in (("dev", 40), ("train", 50)):
        labels = [r["label"] for r in d.records[split]]
        assert len(labels) == n and 0.25 < labels.count("pos") / n < 0.75, (split, labels.count("pos"))
        ids = [int(r["text"][1:-1]) for r in d.records[split]]
        assert ids == sorted(ids)  # file order kept
    again = _data(tmp_path / "..", tok, "classification", rows, max_eval_examples=40)
    assert again.records["dev"] == d.records["dev"]  # deterministic
