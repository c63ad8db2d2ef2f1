"""`data_prep vocab`: a compact vocab that tokenises its inputs exactly as the base vocab, with coverage."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from skillnet.data_prep.tokenizer import TokenizerConfig, WordPieceTokenizer, load_tokenizer
from skillnet.data_prep.vocab import build_compact_vocab

CORPUS = ["今天天气很好，我们去公园散步。", "保险公司的理赔流程是什么？", "Hello world, SkillNet 2026!"]
TASK = [{"source": "银行卡丢了怎么办", "target": "请尽快挂失", "label": "ok"}]


def _inputs(tmp_path: Path) -> tuple[Path, Path, Path]:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("\n".join(CORPUS) + "\n", encoding="utf-8")
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in TASK), encoding="utf-8")
    test = tmp_path / "test.jsonl"
    test.write_text(json.dumps({"source": "今天麒麟", "target": "好"}, ensure_ascii=False) + "\n", encoding="utf-8")
    return corpus, train, test


def test_the_compact_vocab_tokenises_its_inputs_like_the_base(tmp_path: Path) -> None:
    corpus, train, test = _inputs(tmp_path)
    rep = build_compact_vocab([corpus, train], tmp_path / "v", check=[test])
    base = load_tokenizer()
    small = WordPieceTokenizer(TokenizerConfig(vocab_file=str(tmp_path / "v" / "vocab.txt")))
    assert small.vocab_size == rep.size < 250
    # The special block keeps its ids.
    for name in ("pad_id", "unk_id", "cls_id", "sep_id", "mask_id"):
        assert getattr(small, name) == getattr(base, name)
    texts = CORPUS + [TASK[0]["source"], TASK[0]["target"], TASK[0]["label"]]
    for a, b in zip(base.encode_batch(texts), small.encode_batch(texts)):
        assert [base.vocab[i] for i in a] == [small.vocab[i] for i in b]
    assert all(c.unk_chars == 0 for c in rep.built_from)
    # 麒 and 麟 are in bert-base-chinese but in no input: in the test split it becomes [UNK], and is counted.
    assert all(c in base.vocab and c not in small.vocab for c in "麒麟")
    (checked,) = rep.checked
    assert (checked.chars, checked.unk_chars) == (5, 2)


@pytest.mark.slow  # 6-12 s (subprocesses): among the slowest, kept out of make test-fast (3 min)
def test_min_count_drops_rare_entries_and_the_cli_reports_coverage(tmp_path: Path) -> None:
    corpus, train, test = _inputs(tmp_path)
    r = subprocess.run([sys.executable, "-m", "skillnet.data_prep", "vocab", str(corpus), str(train), "--check",
                        str(test), "--out", str(tmp_path / "v2"), "--min-count", "2"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "v2" / "vocab_report.json").read_text(encoding="utf-8"))
    assert report["min_count"] == 2 and report["built_from"][0]["unk_chars"] > 0  # once-used characters dropped
    assert "[UNK] chars" in r.stdout and "build ... --vocab" in r.stdout
    bad = subprocess.run([sys.executable, "-m", "skillnet.data_prep", "vocab", str(tmp_path / "nope.txt"), "--out",
                          str(tmp_path / "v3")], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("error: no such file") and "Traceback" not in bad.stderr


def test_finetuning_reads_the_init_folders_own_vocab(tmp_path: Path) -> None:
    from skillnet.finetune.config import FinetuneConfig

    init = tmp_path / "export"
    init.mkdir()
    spec = {"model": {"init": str(init)}, "tasks": [{"name": "t", "type": "classification", "skills": ["s1"],
                                                     "train": "train.jsonl"}], "output_dir": "out"}
    assert FinetuneConfig.from_dict(spec, base_dir=str(tmp_path)).vocab_path() is None  # the default vocab
    (init / "vocab.txt").write_text("[PAD]\n", encoding="utf-8")
    assert FinetuneConfig.from_dict(spec, base_dir=str(tmp_path)).vocab_path() == str(init / "vocab.txt")
    spec["model"]["vocab"] = "my_vocab.txt"  # an explicit vocab wins
    assert FinetuneConfig.from_dict(spec, base_dir=str(tmp_path)).vocab_path() == str(tmp_path / "my_vocab.txt")
