"""The TF-IDF baseline of a classification task ranks, not only labels (issue 55, item 7): a binary task's
lexical predictions carry the positive class's probability, so its ROC-AUC is a real one, and a pair task's
features hold the pair's TF-IDF cosine. Cross-checked against scikit-learn built by hand."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from skillnet.finetune.lexical import tfidf_classifier, tfidf_classify
from skillnet.finetune.task_types.classification import ClassificationCodec

_WORDS = list("保险理赔车险寿险重疾医疗意外年金退保保费合同受益人投保免赔额等待期犹豫期")
_FILL = list("的了是我这个吗呢怎么什么可以")


def _pairs(n: int, seed: int) -> list[dict[str, Any]]:
    """Question/answer pairs: a right answer ("1") repeats some of its question's content characters, a wrong
    one ("0") is another question's answer; both carry the same filler, so only the overlap tells them apart."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        q = rng.choice(_WORDS, 4, replace=False).tolist()
        other = rng.choice([w for w in _WORDS if w not in q], 4, replace=False).tolist()
        fill = rng.choice(_FILL, 4).tolist()
        label = str(i % 2)
        ans = (q[:3] if label == "1" else other[:3]) + fill
        out.append({"text": "".join(q + rng.choice(_FILL, 2).tolist()),
                    "text_pair": "".join(rng.permutation(ans)), "label": label})
    return out


def _sklearn_pair_model(train: list[dict[str, Any]], test: list[dict[str, Any]]) -> np.ndarray:
    """The baseline built by hand: the bag of both texts (joined by U+2028), the cosine of the two texts'
    TF-IDF vectors (one vocabulary fit on both sides), a logistic regression; P(class "1") per test pair."""
    import scipy.sparse as sp
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics.pairwise import cosine_similarity

    def vec() -> TfidfVectorizer:
        return TfidfVectorizer(analyzer="char", ngram_range=(1, 2), sublinear_tf=True)

    bag = vec().fit([r["text"] + "\u2028" + r["text_pair"] for r in train])
    sim = vec().fit([r["text"] for r in train] + [r["text_pair"] for r in train])

    def x(rs: list[dict[str, Any]]) -> Any:
        cos = [cosine_similarity(sim.transform([r["text"]]), sim.transform([r["text_pair"]]))[0, 0] for r in rs]
        return sp.hstack([bag.transform([r["text"] + "\u2028" + r["text_pair"] for r in rs]),
                          sp.csr_matrix(np.array(cos)[:, None])], format="csr")

    clf = LogisticRegression(max_iter=2000, C=4.0).fit(x(train), [r["label"] for r in train])
    return clf.predict_proba(x(test))[:, list(clf.classes_).index("1")]


def test_pair_probabilities_equal_sklearn_built_by_hand() -> None:
    train, test = _pairs(120, 0), _pairs(40, 1)
    labels, probs = tfidf_classify([r["text"] for r in train], [r["label"] for r in train], [r["text"] for r in test],
                                   [r["text_pair"] for r in train], [r["text_pair"] for r in test])
    want = _sklearn_pair_model(train, test)
    np.testing.assert_allclose([p["1"] for p in probs], want, rtol=0, atol=1e-9)
    assert labels == ["1" if w > 0.5 else "0" for w in want]
    assert all(abs(sum(p.values()) - 1.0) < 1e-9 for p in probs)
    with pytest.raises(ValueError, match="both"):
        tfidf_classify(["a"], ["x"], ["b"], ["c"], None)


def test_single_text_probabilities_are_sklearns_pipeline() -> None:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    texts = [r["text"] + r["text_pair"] for r in _pairs(100, 2)]
    labels = ["a" if "理" in t else "b" if "险" in t else "c" for t in texts]
    ref = make_pipeline(TfidfVectorizer(analyzer="char", ngram_range=(1, 2), sublinear_tf=True),
                        LogisticRegression(max_iter=2000, C=4.0)).fit(texts[:70], labels[:70])
    got_labels, probs = tfidf_classify(texts[:70], labels[:70], texts[70:])
    want = ref.predict_proba(texts[70:])
    np.testing.assert_allclose([[p[c] for c in ref.classes_] for p in probs], want, rtol=0, atol=1e-9)
    assert got_labels == list(ref.predict(texts[70:])) == tfidf_classifier(texts[:70], labels[:70], texts[70:])
    assert tfidf_classify(["a", "b"], ["x", "x"], ["c"]) == (["x"], [{"x": 1.0}])  # one label: certain


def _td(train: list[dict[str, Any]], kind: str = "pair") -> SimpleNamespace:
    return SimpleNamespace(records={"train": train}, kind=kind, positive_label="1",
                           cfg=SimpleNamespace(metric="auc"))


def test_a_binary_tasks_lexical_baseline_has_a_real_auc() -> None:
    """On main the TF-IDF baseline gave labels only, and every example ranked alike: ROC-AUC 50 on any data.
    Now its AUC is scikit-learn's roc_auc_score of its positive-class probabilities, and on pairs that differ
    only in their overlap it ranks them well."""
    from sklearn.metrics import roc_auc_score

    train, test = _pairs(200, 3), _pairs(80, 4)
    codec, td = ClassificationCodec(), _td(train)
    preds = codec.lexical(td, test)  # type: ignore[arg-type]
    got = codec.score(td, test, preds)  # type: ignore[arg-type]
    scores = [p.score for p in preds]
    gold = [r["label"] == "1" for r in test]
    assert got["auc"] == pytest.approx(100 * roc_auc_score(gold, scores))
    assert got["auc"] > 90.0
    assert got["accuracy"] == pytest.approx(100 * np.mean([p == r["label"] for p, r in zip(preds, test)]))
    np.testing.assert_allclose(scores, _sklearn_pair_model(train, test), rtol=0, atol=1e-9)


def test_a_multi_class_tasks_lexical_baseline_stays_plain_labels() -> None:
    train = [{"text": t, "label": y} for t, y in (("好棒", "pos"), ("很差", "neg"), ("一般", "mid"))] * 5
    td = SimpleNamespace(records={"train": train}, kind="single", positive_label=None, cfg=SimpleNamespace())
    preds = ClassificationCodec().lexical(td, [{"text": "好棒棒", "label": "pos"}])  # type: ignore[arg-type]
    assert preds == ["pos"] and not hasattr(preds[0], "score")
