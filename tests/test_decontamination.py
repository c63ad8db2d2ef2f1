"""Issue 55, item 1: no dev or test text in pre-training, and no dev or test example that is a copy of a
training one.

The corpus was every People's Daily paragraph and insuranceqa answer, built before the tasks: 79% of the
dev/test text of 24 characters or more was in it verbatim, and 213 of insuranceqa's 2,000 test questions
were in train with the same domain."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from skillnet.data_prep.__main__ import main as data_prep_main

# Two People's Daily-style sentences of more than 20 characters each, and one unrelated document.
DEV = "国务院总理李鹏今天上午在人民大会堂会见了来访的日本首相桥本龙太郎，双方就两国关系交换了意见。"
TEST = "新华社北京一月五日电全国人大常委会委员长乔石今天在北京会见了德国联邦议院代表团一行"
OTHER = "保险公司会根据您的年龄和健康状况来决定您的人寿保险费率，通常越年轻越便宜。"


def _task(root: Path, name: str, kind: str, splits: dict[str, list[dict[str, Any]]]) -> Path:
    """A converted task folder written the way `convert` writes one."""
    from skillnet.data_prep.tasks import TaskSpec
    from skillnet.data_prep.tasks.splits import Converted, write_task_dir

    labels = ["neg", "pos"] if kind in ("single", "pair") else None
    write_task_dir(Converted(TaskSpec(name=name, kind=kind, label_list=labels), splits), root / name)
    return root / name


def _single(*texts: str) -> list[dict[str, Any]]:
    return [{"text": t, "label": "pos"} for t in texts]


def _evals(tmp_path: Path, n: int | None = None) -> Any:
    from skillnet.data_prep.decontaminate import NGRAM, EvalTexts

    _task(tmp_path / "tasks", "news", "single",
          {"train": _single(OTHER), "dev": _single(DEV), "test": _single(TEST)})
    return EvalTexts.from_task_dirs([tmp_path / "tasks"], n or NGRAM)


def test_documents_that_hold_dev_or_test_text_are_dropped_and_unrelated_ones_kept(tmp_path: Path) -> None:
    from skillnet.data_prep.decontaminate import decontaminate

    corpus = [
        "本报讯 " + DEV + " 会见后，李鹏还设宴招待了客人。",  # the dev sentence inside a longer paragraph
        TEST[:22],  # a long part of the test sentence
        OTHER,  # train text may stay: fine-tuning trains on it anyway
        "今天天气很好，我们去公园散步吧。",
    ]
    kept, held, rep = decontaminate(corpus, [], _evals(tmp_path))
    assert kept == corpus[2:] and held == []
    assert rep["corpus"] == {"docs_in": 4, "docs_dropped": 2, "docs_out": 2,
                             "chars_in": sum(map(len, corpus)), "chars_out": sum(map(len, corpus[2:]))}
    # matched is counted before dropping, per task and split
    assert rep["by_task"]["news"]["dev"] == {"examples": 1, "examples_matched": 1, "examples_unchecked": 0}
    assert rep["by_task"]["news"]["test"]["examples_matched"] == 1
    assert rep["ngram"] == 20 and "20 characters" in rep["rule"]


def test_the_rule_normalises_width_case_punctuation_and_spaces(tmp_path: Path) -> None:
    from skillnet.data_prep.decontaminate import contaminated, normalise

    ev = _evals(tmp_path)
    # full-width digits and Latin, other punctuation, spaces between the characters: the same text
    assert normalise("ＡＢＣ１２３，a b-c！") == "abc123abc"
    variant = " ".join(DEV.replace("，", "、").replace("。", "!"))
    flags, _ = contaminated([variant], ev.grams(), ev.n)
    assert flags == [True]


def test_the_rule_edge_cases_text_shorter_than_n_and_exactly_n(tmp_path: Path) -> None:
    from skillnet.data_prep.decontaminate import EvalTexts, contaminated, ngrams

    assert ngrams("一二三四五", 6) == set() and ngrams("一二三四五六", 6) == {"一二三四五六"}
    assert ngrams("一，二。三 四五六", 6) == {"一二三四五六"}  # counted after normalisation
    n = 20
    short, exact = DEV[:n - 1], TEST[:n]
    ev = EvalTexts(n)
    ev.add("t", "test", "single", _single(short, exact))
    # a test text shorter than n matches nothing, even a document that holds it; it is counted as unchecked
    assert contaminated(["前言" + short + "后记"], ev.grams(), n)[0] == [False]
    assert contaminated(["前言" + exact + "后记"], ev.grams(), n)[0] == [True]
    # n - 1 shared characters are not enough
    assert contaminated([exact[:-1] + "另"], ev.grams(), n)[0] == [False]
    from skillnet.data_prep.decontaminate import decontaminate

    rep = decontaminate([], [], ev)[2]
    assert rep["by_task"]["t"]["test"] == {"examples": 2, "examples_matched": 0, "examples_unchecked": 1}
    # a short sentence's tags are no text of n characters either
    ev.add("ner", "test", "tagging", [{"tokens": list(short), "labels": ["O"] * len(short)}])
    assert decontaminate([], [], ev)[2]["by_task"]["ner"]["test"]["examples_unchecked"] == 1


def test_every_text_of_every_kind_is_checked(tmp_path: Path) -> None:
    """Candidates, span contexts, tagging tokens and generation targets are text pre-training must not see."""
    from skillnet.data_prep.decontaminate import EvalTexts, contaminated

    recs = {
        "choice": {"question": "问题", "candidates": ["短", DEV], "positives": [1]},
        "span": {"context": DEV, "question": "谁?", "answers": [{"text": "李鹏", "start": 6}]},
        "tagging": {"tokens": list(DEV), "labels": ["O"] * len(DEV)},
        "generation": {"source": "短", "target": DEV},
        "pair": {"text": "短", "text_pair": DEV, "label": "pos"},
    }
    for kind, rec in recs.items():
        ev = EvalTexts(20)
        ev.add("t", "dev", kind, [rec])
        assert contaminated([DEV], ev.grams(), ev.n)[0] == [True], kind
        assert contaminated([OTHER], ev.grams(), ev.n)[0] == [False], kind


def test_sample_corpus_drops_contaminated_documents_from_corpus_and_held_out(tmp_path: Path) -> None:
    from skillnet.data_prep.sample_corpus import packaged_chinese_docs

    docs = packaged_chinese_docs()[:300]
    long_docs = [i for i, d in enumerate(docs) if len(d) >= 60]
    in_corpus = next(i for i in long_docs if (i + 1) % 100)
    in_held = next(i for i in long_docs if (i + 1) % 100 == 0)  # documents 100, 200, 300 are held out
    _task(tmp_path / "tasks", "news", "single", {"train": _single(OTHER), "dev": _single(docs[in_corpus][:40]),
                                                 "test": _single(docs[in_held][-30:])})
    corpus, held = tmp_path / "c" / "corpus.txt", tmp_path / "c" / "heldout.txt"
    assert data_prep_main(["sample-corpus", "--out", str(corpus), "--max-docs", "300", "--held-out", str(held),
                           "--decontaminate", str(tmp_path / "tasks")]) == 0
    kept, kept_held = corpus.read_text("utf-8").splitlines(), held.read_text("utf-8").splitlines()
    # every document that shares the text goes (the same paragraph may recur), every other one stays
    hit = {i for i, d in enumerate(docs) if docs[in_corpus][:40] in d or docs[in_held][-30:] in d}
    assert in_corpus in hit and in_held in hit
    assert kept == [d for i, d in enumerate(docs) if (i + 1) % 100 and i not in hit]
    assert kept_held == [d for i, d in enumerate(docs) if (i + 1) % 100 == 0 and i not in hit]
    rep = json.loads((tmp_path / "c" / "decontamination.json").read_text("utf-8"))
    assert rep["corpus"]["docs_in"] == 297 and rep["corpus"]["docs_out"] == len(kept)
    assert rep["heldout"]["docs_in"] == 3 and rep["heldout"]["docs_dropped"] == 3 - len(kept_held) >= 1
    assert rep["by_task"]["news"] == {"dev": {"examples": 1, "examples_matched": 1, "examples_unchecked": 0},
                                      "test": {"examples": 1, "examples_matched": 1, "examples_unchecked": 0}}
    assert rep["dedup"]["news"] == {"dev": {"examples_in": 1, "removed": 0}, "test": {"examples_in": 1, "removed": 0}}
    # its own output is rewritten on a rerun, as before decontamination (its first line may be any document)
    assert data_prep_main(["sample-corpus", "--out", str(corpus), "--max-docs", "300", "--held-out", str(held),
                           "--decontaminate", str(tmp_path / "tasks")]) == 0


def test_duplicates_of_train_are_removed_within_each_task(tmp_path: Path) -> None:
    t = _task(tmp_path, "sent", "single", {
        "train": _single("这个手机很好用", "物流太慢了"),
        "dev": _single("这个手机很好用！", "电池不耐用"),  # a copy of train up to punctuation
        "test": _single("物 流 太 慢 了", "电池不耐用", "屏幕很清晰")})  # a spaced copy of train; a copy of dev
    spec = json.loads((t / "task.json").read_text("utf-8"))
    assert spec["dedup"] == {"dev": {"examples_in": 2, "removed": 1}, "test": {"examples_in": 3, "removed": 2}}
    assert spec["counts"] == {"train": 2, "dev": 1, "test": 1}
    assert [json.loads(x)["text"] for x in (t / "test.jsonl").read_text("utf-8").splitlines()] == ["屏幕很清晰"]
    # a choice example is its question: the same question with other sampled negatives is the same example
    q = {"question": "人寿保险可以借钱吗", "candidates": ["可以", "不行"], "positives": [0]}
    c = _task(tmp_path, "groups", "choice", {"train": [q], "test": [{**q, "candidates": ["不行", "可以"],
                                                                     "positives": [1]}]})
    assert json.loads((c / "task.json").read_text("utf-8"))["dedup"]["test"] == {"examples_in": 1, "removed": 1}
    # a pair is both texts: the same question with another answer is another example
    p = _task(tmp_path, "pairs", "pair", {"train": [{"text": "问题一", "text_pair": "答案一", "label": "pos"}],
                                           "test": [{"text": "问题一", "text_pair": "答案二", "label": "neg"}]})
    assert json.loads((p / "task.json").read_text("utf-8"))["dedup"]["test"]["removed"] == 0


def test_insuranceqa_domain_test_questions_are_not_in_train(tmp_path: Path) -> None:
    """The package's own splits repeat test questions in train (the issue counted 213 of 2,000)."""
    from skillnet.data_prep.tasks.__main__ import main as tasks_main

    out = tmp_path / "domain"
    assert tasks_main(["convert", "insuranceqa-domain", "--out", str(out)]) == 0
    spec = json.loads((out / "task.json").read_text("utf-8"))

    def texts(split: str) -> set[str]:
        return {json.loads(x)["text"] for x in (out / f"{split}.jsonl").read_text("utf-8").splitlines()}

    assert not texts("test") & texts("train") and not texts("test") & texts("dev") and not texts("dev") & texts("train")
    assert spec["dedup"]["test"]["examples_in"] == 2000 and spec["dedup"]["test"]["removed"] >= 213
    assert spec["counts"]["test"] == 2000 - spec["dedup"]["test"]["removed"]


def test_insuranceqa_pairs_drop_every_pair_of_a_question_seen_in_train(tmp_path: Path) -> None:
    """answer_select's pairs draw a question's negatives afresh in each split: under a (question, answer) key a
    test question seen in train would keep its new wrong-answer pairs (and shift the class balance), so the
    converter keys its pairs on the question."""
    from skillnet.data_prep.tasks.__main__ import main as tasks_main

    out = tmp_path / "pairs"
    assert tasks_main(["convert", "insuranceqa-pairs", "--out", str(out), "--max-examples", "4000",
                       "--max-eval-examples", "1000"]) == 0

    def questions(split: str) -> set[str]:
        return {json.loads(x)["text"] for x in (out / f"{split}.jsonl").read_text("utf-8").splitlines()}

    assert not questions("test") & questions("train") and not questions("dev") & questions("train")
    assert not questions("test") & questions("dev")


def test_every_part_converts_both_halves_tasks_before_the_corpus() -> None:
    from skillnet.experiments.stages import PARTS, STAGES

    order = [s.name for s in STAGES]
    for part, (_, _, names) in PARTS.items():
        assert {"nlu_tasks", "nlg_tasks", "corpus"} <= set(names), part
        assert order.index("nlu_tasks") < order.index("corpus") and order.index("nlg_tasks") < order.index("corpus")


def test_the_corpus_stage_decontaminates_and_records_the_counts(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    from skillnet.data_prep.sample_corpus import packaged_chinese_docs
    from skillnet.experiments.profiles import PROFILES
    from skillnet.experiments.runner import Runner, stage_corpus

    r = Runner(tmp_path, PROFILES["quick"])
    r.stage = "corpus"
    with pytest.raises(RuntimeError, match="nlu_tasks, nlg_tasks"):  # the tasks must be there first
        stage_corpus(r)
    for s in ("nlu_tasks", "nlg_tasks"):
        (tmp_path / "stages" / f"{s}.json").write_text("{}")
    doc = next(d for d in packaged_chinese_docs()[:50] if len(d) > 40)
    _task(tmp_path / "tasks", "ner", "single", {"train": _single(OTHER), "dev": _single(DEV), "test": _single(doc)})
    rec = stage_corpus(r)
    assert "--decontaminate" in r.commands[0]
    d = rec["decontamination"]
    assert d["by_task"]["ner"]["test"]["examples_matched"] == 1 and d["corpus"]["docs_dropped"] >= 1
    assert doc not in (tmp_path / "corpus" / "corpus.txt").read_text("utf-8").splitlines()
    log = (tmp_path / "logs" / "corpus.log").read_text("utf-8")
    assert "ner: dev 0 of 1" in log and "test 1 of 1" in log and "ner: dev 0 of 1" in capsys.readouterr().out
