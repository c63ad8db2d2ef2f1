"""Converters from public formats (CLUE JSON lines, CMRC 2018, CoNLL NER) on hand-written fixtures, and the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from skillnet.data_prep.tasks import (
    TaskDataError,
    TaskSpec,
    convert_clue,
    convert_conll,
    convert_squad,
    load_task,
    load_task_file,
    to_bio,
    write_task_dir,
)
from skillnet.data_prep.tasks.__main__ import main

FIX = Path(__file__).parent / "fixtures" / "tasks"


def _read(p: Path) -> list[dict]:
    return [json.loads(x) for x in p.read_text(encoding="utf-8").splitlines()]


def test_chnsenticorp_hash_split_is_deterministic_and_complete(tmp_path: Path) -> None:
    a = convert_clue(FIX / "chnsenticorp.jsonl", "chnsenticorp", ratios=(0.5, 0.25, 0.25))
    b = convert_clue(FIX / "chnsenticorp.jsonl", "chnsenticorp", ratios=(0.5, 0.25, 0.25))
    assert a.splits == b.splits
    ids = sorted(r["id"] for recs in a.splits.values() for r in recs)
    assert ids == sorted(f"all-{i}" for i in range(10))  # every record in exactly one split
    assert a.spec.label_list == ["0", "1"] and a.spec.kind == "single"
    r0 = next(r for recs in a.splits.values() for r in recs if r["id"] == "all-0")
    assert r0 == {"id": "all-0", "text": "房间很干净，服务员态度也好，下次还住这里。", "label": "1"}
    c = convert_clue(FIX / "chnsenticorp.jsonl", "chnsenticorp", ratios=(0.5, 0.25, 0.25), seed=1)
    assert c.splits != a.splits  # the seed matters


def test_tnews_uses_label_desc_and_keeps_unlabelled_test(tmp_path: Path) -> None:
    conv = convert_clue({"train": FIX / "tnews_train.json", "test": FIX / "tnews_test.json"}, "tnews",
                        keep_unlabelled=True)
    assert conv.spec.label_list == ["news_entertainment", "news_finance", "news_sports"]
    assert len(conv.splits["train"]) == 6 and conv.splits["test"] == []
    assert [r["text"] for r in conv.splits["unlabelled"]] == ["世界杯预选赛今晚打响", "基金经理如何看待明年的市场"]
    assert conv.stats["unlabelled"] == 2
    spec = write_task_dir(conv, tmp_path)
    assert spec.files == {"train": "train.jsonl", "unlabelled": "unlabelled.jsonl"}
    ds, _ = load_task(tmp_path, "unlabelled", require_labels=False)
    assert list(ds["label_id"]) == [-1, -1]
    dropped = convert_clue({"train": FIX / "tnews_train.json", "test": FIX / "tnews_test.json"}, "tnews")
    assert "unlabelled" not in dropped.splits and dropped.stats["unlabelled"] == 2


def test_afqmc_pairs(tmp_path: Path) -> None:
    conv = convert_clue({"train": FIX / "afqmc_train.json"}, "afqmc")
    recs = conv.splits["train"]
    # AFQMC has no id field: the id is split + line number
    assert recs[0] == {"id": "train-1", "text": "花呗如何还款", "text_pair": "花呗怎么还钱", "label": "1"}
    assert conv.spec.kind == "pair" and conv.spec.label_list == ["0", "1"] and len(recs) == 6


def test_ocnli_drops_and_counts_dash_labels(tmp_path: Path) -> None:
    conv = convert_clue({"dev": FIX / "ocnli_dev.json"}, "ocnli")
    assert conv.stats == {"dropped label '-'": 2}
    assert [r["id"] for r in conv.splits["dev"]] == ["dev-0", "dev-1", "dev-2", "dev-4"]
    assert conv.spec.label_list == ["contradiction", "entailment", "neutral"]
    spec = write_task_dir(conv, tmp_path)
    assert spec.report == {"dropped label '-'": 2}
    ds, _ = load_task(tmp_path, "dev")
    assert ds[0]["label"] == "entailment" and ds[0]["label_id"] == 1


def test_clue_missing_field_names_file_and_line(tmp_path: Path) -> None:
    p = tmp_path / "afqmc.json"
    p.write_text('{"sentence1": "a", "sentence2": "b", "label": "1"}\n{"sentence1": "c", "label": "0"}\n',
                 encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"afqmc\.json:2: missing field 'sentence2'"):
        convert_clue(p, "afqmc")
    conv = convert_clue(p, "afqmc", skip_bad=True, ratios=(1, 0, 0))
    assert conv.stats == {"missing field": 1} and len(conv.splits["train"]) == 1


def test_cmrc2018_squad_json(tmp_path: Path) -> None:
    with pytest.raises(TaskDataError, match=r"cmrc2018_dev\.json:\d+: .*DEV_1_QUERY_2.*no answer"):
        convert_squad({"dev": FIX / "cmrc2018_dev.json"})
    conv = convert_squad({"dev": FIX / "cmrc2018_dev.json"}, skip_bad=True)
    assert conv.stats == {"answer not in context": 2, "answer re-anchored": 1, "question without answer": 1}
    recs = {r["id"]: r for r in conv.splits["dev"]}
    assert len(recs) == 5 and "DEV_0_QUERY_0" in recs  # the dataset's ids, not "dev-DEV_0_QUERY_0"
    assert recs["DEV_0_QUERY_0"]["answers"] == [{"text": "山海关", "start": 17}]  # duplicate answer kept once
    fixed = recs["DEV_0_QUERY_1"]
    a = fixed["answers"][0]
    assert fixed["context"][a["start"]:a["start"] + len(a["text"])] == "两万多千米"
    assert recs["DEV_0_QUERY_2"]["answers"] == [{"text": "嘉峪关", "start": 23}]  # ids kept as given
    write_task_dir(conv, tmp_path)
    ds, _ = load_task_file(tmp_path / "dev.jsonl", "span")
    assert ds[4]["answers"] == [{"text": "2011年", "start": 29}]


def test_conll_bio_and_bmes(tmp_path: Path) -> None:
    conv = convert_conll({"train": FIX / "ner_bio.conll", "dev": FIX / "ner_bmes.tsv"})
    tr = conv.splits["train"]
    assert [("".join(r["tokens"]), r["labels"][:2]) for r in tr] == [
        ("李明在北京大学工作。", ["B-PER", "I-PER"]), ("上海很大", ["B-LOC", "I-LOC"]), ("张三去了联合国。", ["B-PER", "I-PER"])]
    assert tr[2]["labels"][4:7] == ["B-ORG", "I-ORG", "I-ORG"]  # -DOCSTART- skipped
    dev = conv.splits["dev"]
    assert dev[0]["labels"] == ["B-PER", "I-PER", "I-PER", "O", "O", "B-LOC", "O"]  # BMES/S- -> BIO
    assert dev[1]["labels"] == ["O", "B-LOC", "I-LOC"]  # IOB1 I- after O -> B-
    assert conv.spec.label_list == ["O", "B-LOC", "I-LOC", "B-ORG", "I-ORG", "B-PER", "I-PER"]


def test_to_bio_and_conll_errors(tmp_path: Path) -> None:
    assert to_bio(["S-PER", "B-LOC", "E-LOC", "I-ORG", "I-PER"]) == ["B-PER", "B-LOC", "I-LOC", "B-ORG", "B-PER"]
    p = tmp_path / "bad.conll"
    p.write_text("李 B-PER\n明 I-PER\n\n北\n京 I-LOC\n\n上 X-LOC\n", encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"bad\.conll:4: expected 'token tag'"):
        convert_conll(p)
    conv = convert_conll(p, skip_bad=True, ratios=(1, 0, 0))
    assert conv.stats == {"wrong type": 1, "invalid BIO tag": 1} and len(conv.splits["train"]) == 1


def test_max_examples_slice_is_stable_and_nested() -> None:
    small = convert_clue(FIX / "chnsenticorp.jsonl", "chnsenticorp", ratios=(1, 0, 0), max_examples=3)
    big = convert_clue(FIX / "chnsenticorp.jsonl", "chnsenticorp", ratios=(1, 0, 0), max_examples=6)
    s_ids = [r["id"] for r in small.splits["train"]]
    b_ids = [r["id"] for r in big.splits["train"]]
    assert len(s_ids) == 3 and len(b_ids) == 6 and set(s_ids) <= set(b_ids)
    assert s_ids == sorted(s_ids, key=lambda x: int(x.split("-")[1]))  # input order kept
    assert small.spec.label_list == ["0", "1"]  # label list from the full data, not the slice


def test_cli_convert_and_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "ocnli"
    assert main(["convert", "ocnli", "--input", f"dev={FIX / 'ocnli_dev.json'}", "--out", str(out)]) == 0
    assert "dropped label '-': 2" in capsys.readouterr().out
    spec = TaskSpec.load(out / "task.json")
    assert spec.counts == {"dev": 4} and spec.kind == "pair"
    first = (out / "dev.jsonl").read_bytes()
    assert main(["convert", "ocnli", "--input", f"dev={FIX / 'ocnli_dev.json'}", "--out", str(out)]) == 0
    assert (out / "dev.jsonl").read_bytes() == first  # re-run: identical bytes
    assert main(["check", str(out / "dev.jsonl"), "--spec", str(out)]) == 0
    assert "4 pair records kept of 4" in capsys.readouterr().out
    # a label outside the spec's label set: exit 1, message with file and line, no traceback
    bad = tmp_path / "bad.jsonl"
    bad.write_text(out.joinpath("dev.jsonl").read_text(encoding="utf-8") +
                   '{"text": "a", "text_pair": "b", "label": "maybe"}\n', encoding="utf-8")
    assert main(["check", str(bad), "--spec", str(out)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"error: {bad}:5: label 'maybe' is not in the label set") and "Traceback" not in err
    assert main(["check", str(bad), "--spec", str(out), "--skip-bad"]) == 0
    assert "skipped 1 (label not in label set: 1)" in capsys.readouterr().out


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["convert", "afqmc", "--out", str(tmp_path)]) == 1
    assert "needs --input" in capsys.readouterr().err
    assert main(["convert", "cmrc2018", "--input", str(tmp_path / "missing.json"), "--out", str(tmp_path)]) == 1
    assert "missing.json:0: file not found" in capsys.readouterr().err
    empty = tmp_path / "e.jsonl"
    empty.write_text("", encoding="utf-8")
    assert main(["check", str(empty), "--kind", "single"]) == 1
    assert "e.jsonl:1: file is empty" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["convert", "nope", "--out", str(tmp_path)])
