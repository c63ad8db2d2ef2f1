"""Feature encoding: char/word-piece alignment for NER, answer spans through windows, matching groups."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from skillnet.data_prep.tasks.schema import TaskDataError
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
    assert d.score("dev", preds) == {"em": 100.0, "f1": 100.0, "char_bag_em": 100.0, "char_bag_f1": 100.0}


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


# ---------------------------------------------------------------------------
PAIRS = [{"text": "花呗如何还款", "text_pair": "花呗怎么还钱", "label": "1"},
         {"text": "今天天气好", "text_pair": "借呗利息多少", "label": "0"}]


def test_pair_kind_is_inferred_from_the_records(tmp_path, tok):
    d = _data(tmp_path, tok, "classification", PAIRS)
    assert d.kind == "pair"
    f = d.features("train")[0]
    text_b = [tok.vocab[i] for i, tt in zip(f.input_ids, f.token_type_ids) if tt == 1]
    assert "".join(text_b) == "花呗怎么还钱[SEP]"
    reg = _data(tmp_path, tok, "regression", [{**r, "label": float(r["label"])} for r in PAIRS])
    assert reg.kind == "pair"
    single = _data(tmp_path, tok, "classification", [{"text": r["text"], "label": r["label"]} for r in PAIRS])
    assert single.kind == "single"


def test_pair_record_without_text_pair_is_an_error_naming_its_line(tmp_path, tok):
    rows = [*PAIRS, {"text": "只有一句", "label": "1"}]
    with pytest.raises(TaskDataError, match=r"classification\.jsonl:3: missing field 'text_pair'.*pair"):
        _data(tmp_path, tok, "classification", rows)


def test_text_pair_is_never_dropped_silently(tmp_path, tok):
    with pytest.raises(TaskDataError, match=r"classification\.jsonl:1: .*'text_pair'.*single"):
        _data(tmp_path, tok, "classification", PAIRS, kind="single")


def test_classification_scores_macro_f1_as_sklearn_and_positive_class_f1(tmp_path, tok):
    from sklearn.metrics import f1_score

    rows = [{"text": f"第{i}条", "label": lab} for i, lab in enumerate("abcabcab")]
    d = _data(tmp_path, tok, "classification", rows)
    assert d.label_list == ["a", "b", "c"]
    recs = [r for r in d.records["dev"] if r["label"] != "c"]  # a dev set where class c never occurs
    preds = ["a", "b", "b", "b", "a", "a"]
    gold = [r["label"] for r in recs]
    scores = d.score_records(recs, preds)
    assert scores["macro_f1"] == pytest.approx(100 * f1_score(gold, preds, average="macro"))
    assert "f1" not in scores  # three classes: no positive class

    binary = _data(tmp_path, tok, "classification", PAIRS * 3)
    gold = [r["label"] for r in binary.records["dev"]]
    preds = ["1"] * len(gold)
    s = binary.score_records(binary.records["dev"], preds)
    assert s["f1"] == pytest.approx(100 * f1_score(gold, preds, pos_label="1"))
    neg = _data(tmp_path, tok, "classification", PAIRS * 3, positive_label="0", metric="f1")
    assert neg.score_records(neg.records["dev"], preds)["f1"] == 0.0


def test_f1_metric_on_a_multiclass_task_is_an_error(tmp_path, tok):
    rows = [{"text": f"第{i}条", "label": lab} for i, lab in enumerate("abcabc")]
    with pytest.raises(TaskDataError, match=r"metric 'f1'.*binary.*3 labels"):
        _data(tmp_path, tok, "classification", rows, metric="f1")


def test_span_scores_are_cmrc2018s(tmp_path, tok):
    ctx = "北京大学和大学北京是两回事。"
    rows = [{"context": ctx, "question": "是什么？", "answers": [{"text": "北京大学", "start": 0}]}]
    d = _data(tmp_path, tok, "span", rows)
    s = d.score_records(d.records["dev"], ["大学北京"])
    assert s["f1"] == pytest.approx(50.0) and s["char_bag_f1"] == pytest.approx(100.0)


def test_truncated_examples_are_counted_per_split(tmp_path, tok):
    long = "很" * 100
    cls = _data(tmp_path, tok, "classification",
                [{"text": long, "label": "a"}, {"text": "短", "label": "b"}, {"text": long, "label": "b"}],
                max_seq_len=16)
    assert cls.truncated == {"train": 2, "dev": 2}
    pair = _data(tmp_path, tok, "classification",
                 [{"text": "短", "text_pair": long, "label": "1"}, {"text": "短", "text_pair": "短", "label": "0"}],
                 max_seq_len=16)
    assert pair.truncated == {"train": 1, "dev": 1}
    ner = _data(tmp_path, tok, "ner", [{"tokens": list(long), "labels": ["O"] * 100},
                                       {"tokens": list("李明"), "labels": ["B-PER", "I-PER"]}], max_seq_len=16)
    assert ner.truncated == {"train": 1, "dev": 1}
    # a long context is read through windows (not truncation); a long question is cut (truncation)
    ctx = "前面是无关文字。" * 20 + "答案是上海。"
    span_rows = [{"context": ctx, "question": "答案是什么？", "answers": [{"text": "上海", "start": ctx.index("上海")}]},
                 {"context": ctx, "question": "问" * 40, "answers": [{"text": "上海", "start": ctx.index("上海")}]}]
    span = _data(tmp_path, tok, "span", span_rows, max_seq_len=32)
    assert span.truncated == {"train": 1, "dev": 1}
    match = _data(tmp_path, tok, "matching", [
        {"question": "车险怎么买", "candidates": ["寿险价格", long], "positives": [0]},
        {"question": "寿险多少钱", "candidates": ["寿险价格", "车险网站买"], "positives": [0]}], max_seq_len=16)
    assert match.truncated == {"train": 1, "dev": 1}
    none = _data(tmp_path, tok, "classification", [{"text": "短", "label": "a"}, {"text": "长", "label": "b"}])
    assert none.truncated == {"train": 0, "dev": 0}


def test_plan_prints_truncation_counts(tmp_path, tok, capsys):
    from skillnet.finetune.run import _print_plan
    from skillnet.finetune.samplers import SamplerConfig, build_sampler

    d = _data(tmp_path, tok, "classification",
              [{"text": "很" * 100, "label": "a"}, {"text": "短", "label": "b"}], max_seq_len=16)
    params = {"total": 1, "trainable": 1,
              "tasks": {d.name: {"skills": ["s7"], "activated": 1, "trainable_activated": 1}}}
    sampler = build_sampler(SamplerConfig(), {d.name: 2}, seed=0, steps_per_epoch=1, max_steps=1)
    _print_plan(FinetuneConfig(tasks=[d.cfg]), {d.name: d}, sampler, params, [], 1)
    err = capsys.readouterr().err
    assert "truncated at max_seq_len=16: train 1 of 2, dev 1 of 2" in err


def test_dev_cap_shrinks_dev_and_leaves_test_at_the_eval_cap(tmp_path, tok):
    rows = [{"text": f"第{i}条", "label": "neg" if i < 100 else "pos"} for i in range(200)]
    d = _data(tmp_path, tok, "classification", rows, test=str(tmp_path / "classification.jsonl"),
              max_eval_examples=80, max_dev_examples=30)
    assert len(d.records["dev"]) == 30 and len(d.records["test"]) == 80
    same = _data(tmp_path, tok, "classification", rows, max_eval_examples=30)
    assert d.records["dev"] == same.records["dev"]  # the same seeded sample as a cap of 30 on both
    with pytest.raises(ValueError, match="max_dev_examples"):
        _data(tmp_path, tok, "classification", rows, max_dev_examples=0)
