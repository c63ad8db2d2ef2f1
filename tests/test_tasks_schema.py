"""Task schema loader: valid records of every kind, and every bad-input kind named by file and line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from skillnet.data_prep.tasks import (
    KINDS,
    TaskDataError,
    TaskSpec,
    check_record,
    load_task,
    load_task_file,
    write_jsonl,
)


def _write(tmp_path: Path, lines: list[object] | list[str], name: str = "t.jsonl") -> Path:
    p = tmp_path / name
    p.write_text("".join((x if isinstance(x, str) else json.dumps(x, ensure_ascii=False)) + "\n" for x in lines),
                 encoding="utf-8")
    return p


GOOD = {
    "single": {"text": "很好", "label": "pos"},
    "pair": {"text": "花呗如何还款", "text_pair": "花呗怎么还钱", "label": 1},
    "tagging": {"tokens": list("李明在北京"), "labels": ["B-PER", "I-PER", "O", "B-LOC", "I-LOC"]},
    "span": {"context": "长城东起山海关。", "question": "长城东起哪里？", "answers": [{"text": "山海关", "start": 4}]},
    "choice": {"question": "法律要求残疾保险吗？", "candidates": ["不要求", "天气很好", "是的"], "positives": [0]},
    "generation": {"source": "今天天气", "target": "很好"},
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kind_loads_as_hf_dataset(tmp_path: Path, kind: str) -> None:
    p = _write(tmp_path, [GOOD[kind], {**GOOD[kind], "id": "x2"}])
    ds, report = load_task_file(p, kind)
    assert len(ds) == 2 and report.kept == 2 and report.skipped == {}
    assert ds[1]["id"] == "x2" and ds[0]["id"] == "t.jsonl:1"
    assert set(GOOD[kind]) <= set(ds.column_names)


def test_label_ids_and_inferred_label_lists(tmp_path: Path) -> None:
    p = _write(tmp_path, [{"text": "a", "label": 10}, {"text": "b", "label": "2"}, {"text": "c", "label": 2}])
    recs, rep = load_task_file(p, "single", as_dataset=False)
    assert rep.label_list == ["2", "10"]  # integer-looking labels sorted numerically, ints and strings unified
    assert [r["label_id"] for r in recs] == [1, 0, 0]
    p2 = _write(tmp_path, [GOOD["tagging"]], "n.jsonl")
    recs, rep = load_task_file(p2, "tagging", as_dataset=False)
    assert rep.label_list == ["O", "B-LOC", "I-LOC", "B-PER", "I-PER"]
    assert recs[0]["label_ids"] == [3, 4, 0, 1, 2]
    # a list of entity types expands to BIO tags
    _, rep = load_task_file(p2, "tagging", ["PER", "LOC", "ORG"], as_dataset=False)
    assert rep.label_list == ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]


def test_regression_labels_are_floats(tmp_path: Path) -> None:
    p = _write(tmp_path, [{"text": "a", "text_pair": "b", "label": 3}, {"text": "a", "text_pair": "c", "label": 0.5}])
    recs, rep = load_task_file(p, "pair", regression=True, as_dataset=False)
    assert [r["label"] for r in recs] == [3.0, 0.5] and isinstance(recs[0]["label"], float)
    assert rep.label_list is None and "label_id" not in recs[0]
    bad = _write(tmp_path, [{"text": "a", "text_pair": "b", "label": "3.0"}], "b.jsonl")
    with pytest.raises(TaskDataError, match=r"b\.jsonl:1: regression label must be a number"):
        load_task_file(bad, "pair", regression=True)


# (kind, lines (the last one is the only bad one), label_list, its line, message fragment, skip-bad reason)
BAD_CASES = [
    ("single", [GOOD["single"], {"text": "差", "label": "neutral"}], ["neg", "pos"], 2,
     "label 'neutral' is not in the label set", "label not in label set"),
    ("pair", [GOOD["pair"], {"text": "只有一句", "label": "1"}], None, 2, "missing field 'text_pair'", "missing field"),
    ("span", [GOOD["span"], {**GOOD["span"], "answers": [{"text": "山海关", "start": 2}]}], None, 2,
     "'山海关' is not at character offset 2 of the context (it occurs at 4)", "span not in context"),
    ("span", [{**GOOD["span"], "answers": [{"text": "嘉峪关", "start": 0}]}], None, 1,
     "it does not occur in the context", "span not in context"),
    ("single", [GOOD["single"], '{"text": "坏", "label": "neg"'], None, 2, "invalid JSON", "invalid JSON"),
    ("single", [{"text": ["不是", "字符串"], "label": "pos"}], None, 1, "field 'text' must be a string, got array",
     "wrong type"),
    ("single", [{"text": "好", "label": 1.0}], None, 1, "class label must be a string or integer", "wrong type"),
    ("single", [GOOD["single"], ["text", "label"]], None, 2, "expected a JSON object, got array", "wrong type"),
    ("single", [{"text": "   ", "label": "pos"}], None, 1, "field 'text' is empty", "empty text"),
    ("tagging", [{"tokens": ["李", "明"], "labels": ["B-PER"]}], None, 1, "2 tokens but 1 labels", "length mismatch"),
    ("tagging", [{"tokens": ["李", "明"], "labels": ["O", "I-PER"]}], None, 1, "'I-PER' at position 1 follows 'O'",
     "invalid BIO sequence"),
    ("tagging", [{"tokens": ["李", "明"], "labels": ["PER", "O"]}], None, 1, "is not a BIO tag", "invalid BIO tag"),
    ("tagging", [GOOD["tagging"]], ["PER"], 1, "'B-LOC' is not in the label set", "label not in label set"),
    ("choice", [{**GOOD["choice"], "positives": [3]}], None, 1, "positives[0] = 3 is not a candidate index",
     "label not in label set"),
    ("choice", [{**GOOD["choice"], "candidates": ["唯一"]}], None, 1, "need at least 2 candidates", "too few candidates"),
    ("generation", [{"source": "有输入"}], None, 1, "missing field 'target'", "missing field"),
]


@pytest.mark.parametrize("case", BAD_CASES, ids=[f"{c[0]}-{c[5]}-{i}" for i, c in enumerate(BAD_CASES)])
def test_bad_input_names_file_and_line(tmp_path: Path, case: tuple) -> None:
    kind, lines, labels, line, fragment, _ = case
    p = _write(tmp_path, lines, "bad.jsonl")
    with pytest.raises(TaskDataError) as ei:
        load_task_file(p, kind, labels)
    msg = str(ei.value)
    assert msg.startswith(f"{p}:{line}: "), msg
    assert fragment in msg, msg
    assert ei.value.line == line and ei.value.path == str(p)


@pytest.mark.parametrize("case", BAD_CASES, ids=[f"{c[0]}-{c[5]}-{i}" for i, c in enumerate(BAD_CASES)])
def test_skip_bad_counts_reason(tmp_path: Path, case: tuple) -> None:
    kind, lines, labels, _, _, reason = case
    good = GOOD[kind] if labels is None or kind != "tagging" else {"tokens": ["李"], "labels": ["B-PER"]}
    p = _write(tmp_path, [*lines, good], "bad.jsonl")
    recs, rep = load_task_file(p, kind, labels, skip_bad=True, as_dataset=False)
    # every case has exactly one bad line, the last of `lines`
    assert rep.skipped == {reason: 1}
    assert rep.kept == len(recs) == len(lines)
    assert f"{p}:" in rep.first_error[reason]


def test_skip_bad_counts_several_reasons(tmp_path: Path) -> None:
    lines = [GOOD["single"], {"text": "x", "label": "other"}, "not json", {"text": "y"}, {"text": "z", "label": "other"},
             GOOD["single"]]
    _, rep = load_task_file(_write(tmp_path, lines), "single", ["neg", "pos"], skip_bad=True)
    assert rep.skipped == {"label not in label set": 2, "invalid JSON": 1, "missing field": 1}
    assert rep.kept == 2 and rep.records_read == 6
    assert "skipped 4" in rep.summary()


def test_empty_file_and_only_blank_lines(tmp_path: Path) -> None:
    for content in ("", "\n\n  \n"):
        p = tmp_path / "empty.jsonl"
        p.write_text(content, encoding="utf-8")
        with pytest.raises(TaskDataError, match=r"empty\.jsonl:1: file is empty"):
            load_task_file(p, "single", skip_bad=True)


def test_all_records_bad_is_an_error_even_with_skip_bad(tmp_path: Path) -> None:
    p = _write(tmp_path, [{"text": "x"}, {"text": "y"}])
    with pytest.raises(TaskDataError, match=r"t\.jsonl:1: no valid single record .*missing field: 2"):
        load_task_file(p, "single", skip_bad=True)


def test_missing_file_invalid_utf8_and_json_array_hint(tmp_path: Path) -> None:
    with pytest.raises(TaskDataError, match=r"nope\.jsonl:0: file not found"):
        load_task_file(tmp_path / "nope.jsonl", "single")
    p = tmp_path / "latin1.jsonl"
    p.write_bytes(json.dumps(GOOD["single"]).encode() + b"\n" + '{"text": "caf\xe9", "label": "pos"}'.encode("latin-1"))
    with pytest.raises(TaskDataError, match=r"latin1\.jsonl:2: invalid UTF-8"):
        load_task_file(p, "single")
    # a whole JSON document is read as one when the file is named .json, and named as the mistake in .jsonl
    arr = tmp_path / "array.jsonl"
    arr.write_text(json.dumps([GOOD["single"], GOOD["single"]]), encoding="utf-8")
    with pytest.raises(TaskDataError, match=r"array\.jsonl:1: expected a JSON object, got a JSON array.*name a JSON "
                                            r"document \.json"):
        load_task_file(arr, "single")
    arr.write_text(json.dumps([GOOD["single"]], indent=1), encoding="utf-8")  # pretty-printed array
    with pytest.raises(TaskDataError, match=r"array\.jsonl:1: invalid JSON.*one JSON object per line"):
        load_task_file(arr, "single")
    doc = tmp_path / "array.json"
    doc.write_text(json.dumps([GOOD["single"], {**GOOD["single"], "text": "好"}], indent=1), encoding="utf-8")
    recs, _ = load_task_file(doc, "single", as_dataset=False)
    assert [r["text"] for r in recs] == ["很好", "好"]


def test_unknown_kind_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="valid kinds: single, pair, tagging"):
        load_task_file(_write(tmp_path, [GOOD["single"]]), "classification")


def test_require_labels_false_for_prediction_files(tmp_path: Path) -> None:
    p = _write(tmp_path, [{"text": "a"}, {"text": "b", "label": "pos"}])
    recs, _ = load_task_file(p, "single", ["neg", "pos"], require_labels=False, as_dataset=False)
    assert [r["label_id"] for r in recs] == [-1, 1]
    p2 = _write(tmp_path, [{"tokens": ["李"]}], "t2.jsonl")
    recs, _ = load_task_file(p2, "tagging", ["PER"], require_labels=False, as_dataset=False)
    assert recs[0]["labels"] is None


def test_max_examples_and_bom(tmp_path: Path) -> None:
    p = tmp_path / "bom.jsonl"
    p.write_bytes(b"\xef\xbb\xbf" + "".join(json.dumps({"text": f"t{i}", "label": "a"}) + "\n"
                                             for i in range(10)).encode())
    ds, rep = load_task_file(p, "single", max_examples=3)
    assert len(ds) == 3 and ds[0]["text"] == "t0"


def test_task_spec_round_trip_and_load_task(tmp_path: Path) -> None:
    spec = TaskSpec(name="s", kind="single", label_list=["neg", "pos"], files={"train": "train.jsonl"})
    assert TaskSpec.from_json(spec.to_json()) == spec
    write_jsonl(tmp_path / "train.jsonl", [GOOD["single"], {"text": "差", "label": "neg"}])
    spec.save(tmp_path / "task.json")
    ds, rep = load_task(tmp_path, "train")
    assert list(ds["label_id"]) == [1, 0] and rep.label_list == ["neg", "pos"]
    with pytest.raises(KeyError, match="has no split 'dev'"):
        load_task(tmp_path, "dev")
    with pytest.raises(ValueError, match="unknown task kind"):
        TaskSpec(name="x", kind="nope")


def test_check_record_public_validation() -> None:
    assert check_record(GOOD["span"], "span")["answers"] == [{"text": "山海关", "start": 4}]
    with pytest.raises(ValueError, match="missing field 'label'"):
        check_record({"text": "x"}, "single")


# ---------------------------------------------------------------------------
def test_truncated_json_line_reports_the_real_column(tmp_path: Path) -> None:
    # The line's own newline must not move the error to "column 1" of a second line.
    truncated = '{"text": "abc", "label": "1"'  # the ',' or '}' expected at column 29
    p = _write(tmp_path, [GOOD["single"], truncated, GOOD["single"]])
    with pytest.raises(TaskDataError, match=r"t\.jsonl:2: invalid JSON: Expecting ',' delimiter at column 29"):
        load_task_file(p, "single")
    cut_string = '{"text": "今天天气很好", "label": "1'
    p = _write(tmp_path, [cut_string])
    with pytest.raises(TaskDataError, match=r"t\.jsonl:1: invalid JSON: Unterminated string .* at column 29"):
        load_task_file(p, "single")
    crlf = tmp_path / "crlf.jsonl"
    crlf.write_bytes(b'{"text": "a", "label": "1"}\r\n{"text": "b", "label": "1"\r\n')
    with pytest.raises(TaskDataError, match=r"crlf\.jsonl:2: invalid JSON: Expecting ',' delimiter at column 27"):
        load_task_file(crlf, "single")


def test_single_record_with_text_pair_is_an_error(tmp_path: Path) -> None:
    p = _write(tmp_path, [GOOD["single"], GOOD["pair"]])
    with pytest.raises(TaskDataError, match=r"t\.jsonl:2: field 'text_pair' in a single-sentence record"):
        load_task_file(p, "single")


def test_infer_pair_kind_from_records(tmp_path: Path) -> None:
    from skillnet.data_prep.tasks.schema import infer_pair_kind

    p = _write(tmp_path, [GOOD["single"], GOOD["pair"]])
    assert infer_pair_kind(p) == ("pair", f"{p}:2")
    assert infer_pair_kind(_write(tmp_path, [GOOD["single"], "not json", GOOD["single"]])) == ("single", None)
