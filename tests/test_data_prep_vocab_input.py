"""``data_prep build --vocab``: what a user has of a Hub checkpoint is a model folder, and a file that is no
vocab must be named as such.

* ``--vocab DIR`` reads the folder's vocab.txt, else the WordPiece vocab inside its tokenizer.json (all that
  transformers 5's ``save_pretrained`` writes), and builds the same shards (same fingerprint, same vocab.txt
  copy) as ``--vocab DIR/vocab.txt``.
* A binary or otherwise unreadable ``--vocab`` fails with one line that names the file and the option, not
  with a bare ``'utf-8' codec can't decode byte``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from skillnet.data_prep.__main__ import main
from skillnet.data_prep.tokenizer import load_tokenizer, train_wordpiece

TEXT = ["我们今天去北京参观博物馆。", "The weather is nice today.", "保险公司会根据合同支付赔偿金。"] * 20


@pytest.fixture(scope="module")
def vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_wordpiece(iter(TEXT), tmp_path_factory.mktemp("vocab"), vocab_size=200, min_frequency=1)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "c.txt"
    path.write_text("\n\n".join(TEXT) + "\n", encoding="utf-8")
    return path


def _build(corpus: Path, vocab: Path, out: Path) -> dict:
    assert main(["build", str(corpus), "--out", str(out), "--vocab", str(vocab), "--no-progress"]) == 0
    return json.loads((out / "manifest.json").read_text(encoding="utf-8"))


def _hf_folder(vocab: Path, folder: Path, keep_vocab_txt: bool) -> Path:
    """What transformers 5's save_pretrained writes (tokenizer.json, no vocab.txt), or a Hub checkpoint's
    folder with its vocab.txt beside."""
    import shutil

    from transformers import BertTokenizer

    BertTokenizer(vocab=str(vocab)).save_pretrained(str(folder))
    assert (folder / "tokenizer.json").is_file() and not (folder / "vocab.txt").exists()
    if keep_vocab_txt:
        shutil.copyfile(vocab, folder / "vocab.txt")
    return folder


@pytest.mark.parametrize("keep_vocab_txt", [True, False], ids=["vocab_txt", "tokenizer_json_only"])
def test_vocab_option_takes_a_hugging_face_model_folder(vocab: Path, corpus: Path, tmp_path: Path,
                                                        keep_vocab_txt: bool) -> None:
    ref = _build(corpus, vocab, tmp_path / "ref")
    folder = _hf_folder(vocab, tmp_path / "hf", keep_vocab_txt)
    got = _build(corpus, folder, tmp_path / "got")
    assert got["tokenizer"]["fingerprint"] == ref["tokenizer"]["fingerprint"] == load_tokenizer(vocab).fingerprint
    assert (tmp_path / "got" / "vocab.txt").read_bytes() == vocab.read_bytes()
    assert (tmp_path / "got" / "shard-000000.bin").read_bytes() == (tmp_path / "ref" / "shard-000000.bin").read_bytes()


def test_a_binary_vocab_names_the_file_and_the_option(corpus: Path, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    binary = tmp_path / "model.bin"
    binary.write_bytes(b"\x00\xb1\xff\xfe" * 64)
    assert main(["build", str(corpus), "--out", str(tmp_path / "o"), "--vocab", str(binary), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--vocab" in err and str(binary) in err, err
    assert not (tmp_path / "o" / "manifest.json").exists()


def test_a_folder_without_a_vocab_names_what_it_looked_for(corpus: Path, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert main(["build", str(corpus), "--out", str(tmp_path / "o"), "--vocab", str(tmp_path / "empty"),
                 "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "--vocab" in err and "vocab.txt" in err and "tokenizer.json" in err, err
