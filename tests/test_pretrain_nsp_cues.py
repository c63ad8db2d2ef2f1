"""NSP pairs carry no surface cue of their label.

A true next B and a random B must be built the same way: both start at a sentence boundary and both
take their length from the same distribution. Checked as the issue measures it: a simple classifier over
(B starts at a sentence boundary, length of A, length of B, total length), trained on one half of the
samples and scored on the other, must not beat chance by more than 5 points, on a corpus of long
documents (several windows each) and on one of short documents (shorter than a window, some of a single
sentence).

Sentence starts are visible in the ids: every sentence opens with one of a few marker characters that
occur nowhere else, so "B starts at a sentence boundary" is read off the sample itself.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from skillnet.data_prep.build import BuildConfig, build
from skillnet.data_prep.tokenizer import load_tokenizer
from skillnet.pretrain.dataset import PretrainingDataset
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.tree import DecisionTreeClassifier

MARKERS = "甲乙丙丁戊己庚辛"
BODY = "天地人山水风云日月星花草木鱼鸟虫"
SEQ = 64


def _sentence(rng: np.random.Generator) -> str:
    body = "".join(BODY[i] for i in rng.integers(len(BODY), size=int(rng.integers(3, 15))))
    return MARKERS[int(rng.integers(len(MARKERS)))] + body + "。"


def _shards(tmp: Path, n_docs: int, sentences: tuple[int, int], single_frac: float, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n_docs):
        n = 1 if rng.random() < single_frac else int(rng.integers(*sentences))
        docs.append("".join(_sentence(rng) for _ in range(n)))
    (tmp / "c.txt").write_text("\n".join(docs) + "\n", encoding="utf-8")
    build(BuildConfig(inputs=[str(tmp / "c.txt")], out=str(tmp / "out"), progress=False))
    return tmp / "out"


def _features(ds: PretrainingDataset, epochs: int) -> tuple[np.ndarray, np.ndarray]:
    """Rows of (B starts at a sentence boundary, len A, len B, total) and the NSP labels."""
    markers = set(load_tokenizer().token_ids(list(MARKERS)))
    feats, labels = [], []
    for epoch in range(epochs):
        b = ds.batch(range(ds.num_samples), epoch, "nsp")
        for row, n, y in zip(
            b["input_ids"].numpy(), b["attention_mask"].sum(1).tolist(), b["next_sentence_label"]
        ):
            sep = int(np.flatnonzero(row[:n] == ds.sep_id)[0])
            a, bb = row[1:sep], row[sep + 1 : n - 1]
            feats.append([float(int(bb[0]) in markers), len(a), len(bb), n])
            labels.append(int(y))
    return np.asarray(feats), np.asarray(labels)


CORPORA = {
    # documents of 15-40 sentences: several windows each, most B budgets are filled
    "long_documents": dict(n_docs=150, sentences=(15, 41), single_frac=0.0, seed=1, epochs=4),
    # documents of 1-4 sentences, shorter than one window: B often stops at its document's end
    "short_documents": dict(n_docs=1500, sentences=(2, 5), single_frac=0.2, seed=2, epochs=2),
}


@pytest.mark.parametrize("corpus", sorted(CORPORA))
def test_nsp_label_is_not_predictable_from_b_start_and_lengths(corpus: str, tmp_path: Path) -> None:
    spec = dict(CORPORA[corpus])
    epochs = spec.pop("epochs")
    ds = PretrainingDataset(_shards(tmp_path, **spec), max_seq_len=SEQ)
    X, y = _features(ds, epochs)
    assert len(y) >= 2000 and abs(y.mean() - 0.5) < 0.05
    at_boundary = {lab: X[y == lab, 0].mean() for lab in (0, 1)}
    assert min(at_boundary.values()) > 0.95, f"B starts at a sentence boundary: {at_boundary}"
    half = len(y) // 2
    order = np.random.default_rng(0).permutation(len(y))
    train, test = order[:half], order[half:]
    for clf in (
        make_pipeline(StandardScaler(), LogisticRegression()),
        DecisionTreeClassifier(max_depth=6, min_samples_leaf=20, random_state=0),
    ):
        clf.fit(X[train], y[train])
        acc = float((clf.predict(X[test]) == y[test]).mean())
        assert acc <= 0.55, f"{corpus}: {type(clf).__name__} predicts the NSP label with accuracy {acc:.3f}"


def test_short_seq_prob_draws_shorter_targets(tmp_path: Path) -> None:
    """With short_seq_prob (BERT: 0.1) a share of the pairs aims below the full length."""
    shards = _shards(tmp_path, n_docs=150, sentences=(15, 41), single_frac=0.0, seed=3)
    full_len = {}
    for p in (0.0, 0.5):
        X, _ = _features(PretrainingDataset(shards, max_seq_len=SEQ, short_seq_prob=p), 2)
        full_len[p] = float((X[:, 3] == SEQ).mean())
    # Without short targets only pairs that reach a document end are shorter than max_seq_len.
    assert full_len[0.0] > 0.75 and full_len[0.5] < 0.7 * full_len[0.0], full_len
    with pytest.raises(ValueError, match="short_seq_prob"):
        PretrainingDataset(shards, max_seq_len=SEQ, short_seq_prob=1.5)
