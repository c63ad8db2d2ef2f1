"""Non-neural baselines learnt from a task's train split (scikit-learn): a neural row of the report is read
against them. Character n-grams, because the tasks are Chinese (no word boundaries) and short."""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache
from typing import Any


def _vectorizer() -> Any:
    from sklearn.feature_extraction.text import TfidfVectorizer

    return TfidfVectorizer(analyzer="char", ngram_range=(1, 2), min_df=1, sublinear_tf=True, lowercase=True)


def tfidf_classifier(train_texts: Sequence[str], train_labels: Sequence[Any], texts: Sequence[str]) -> list[Any]:
    """Labels of ``texts`` from a logistic regression on TF-IDF features of ``train_texts``."""
    return tfidf_classify(train_texts, train_labels, texts)[0]


def tfidf_classify(train_texts: Sequence[str], train_labels: Sequence[Any], texts: Sequence[str],
                   train_pairs: Sequence[str] | None = None, pairs: Sequence[str] | None = None
                   ) -> tuple[list[Any], list[dict[Any, float]]]:
    """Labels of ``texts`` and each one's probability per class, from a logistic regression on TF-IDF features.
    With ``train_pairs``/``pairs`` (the second text of each example: an answer to the question in ``texts``),
    the features are those of both texts side by side and one more: the TF-IDF cosine of the two. A bag of
    both sides' n-grams cannot tell whether the two share anything, and that overlap is most of what a
    lexical reader knows about a pair (on the answer_select dev split of the full profile the cosine alone
    ranks at ROC-AUC 73.7, the bag at 68.8, both together at 77.8)."""
    if (train_pairs is None) != (pairs is None):
        raise ValueError("give both train_pairs and pairs, or neither")
    model = _fitted_classifier(tuple(train_texts), tuple(train_labels),
                               None if train_pairs is None else tuple(train_pairs))
    if model.clf is None:  # one label: nothing to learn, every prediction is it, with certainty
        return [train_labels[0]] * len(texts), [{train_labels[0]: 1.0} for _ in texts]
    prob = model.clf.predict_proba(model.features(texts, pairs))
    classes = list(model.clf.classes_)
    # the label of the largest probability, as LogisticRegression.predict (the first class on a tie)
    return ([classes[int(i)] for i in prob.argmax(axis=1)],
            [dict(zip(classes, (float(v) for v in row))) for row in prob])


_PAIR_SEP = "\u2028"  # joins a pair's two texts for the bag of n-grams: a character neither text holds


class _PairTfidf:
    """The fitted vectorizers of `tfidf_classify` (the pair's cosine reads both sides in one vocabulary and
    idf, as the matching baseline does) and its classifier (None: one label)."""

    def __init__(self, texts: Sequence[str], pairs: Sequence[str] | None) -> None:
        self.bag = _vectorizer().fit(self._joined(texts, pairs))
        self.sim = None if pairs is None else _vectorizer().fit([*texts, *pairs])
        self.clf: Any = None

    @staticmethod
    def _joined(texts: Sequence[str], pairs: Sequence[str] | None) -> list[str]:
        return list(texts) if pairs is None else [a + _PAIR_SEP + b for a, b in zip(texts, pairs)]

    def features(self, texts: Sequence[str], pairs: Sequence[str] | None) -> Any:
        x = self.bag.transform(self._joined(texts, pairs))
        if self.sim is None or pairs is None:
            return x
        import scipy.sparse as sp

        cos = self.sim.transform(list(texts)).multiply(self.sim.transform(list(pairs))).sum(axis=1)  # L2 rows
        return sp.hstack([x, sp.csr_matrix(cos)], format="csr")


@lru_cache(maxsize=8)
def _fitted_classifier(train_texts: tuple[str, ...], train_labels: tuple[Any, ...],
                       train_pairs: tuple[str, ...] | None = None) -> _PairTfidf:
    # Cached: a comparison runs many methods and seeds in one process on the same train split.
    from sklearn.linear_model import LogisticRegression

    model = _PairTfidf(train_texts, train_pairs)
    if len(set(train_labels)) >= 2:
        model.clf = LogisticRegression(max_iter=2000, C=4.0).fit(model.features(train_texts, train_pairs),
                                                                 list(train_labels))
    return model


@lru_cache(maxsize=4)
def _fitted(fit_texts: tuple[str, ...]) -> Any:
    return _vectorizer().fit(fit_texts)


def tfidf_similarities(fit_texts: Sequence[str], queries: Sequence[str],
                       candidates: Sequence[Sequence[str]]) -> list[list[float]]:
    """Cosine similarity of each candidate's TF-IDF vector to its query's (rows are L2-normalised), for many
    queries, each with its own candidates, in two transforms (one per query and candidate call cost more than
    the rest of a CPU evaluation)."""
    import numpy as np

    vec = _fitted(tuple(fit_texts))
    sizes = [len(c) for c in candidates]
    if not sum(sizes):
        return [[] for _ in sizes]
    q = vec.transform(list(queries))
    c = vec.transform([x for cs in candidates for x in cs])
    owner = np.repeat(np.arange(len(sizes)), sizes)
    flat = np.asarray(c.multiply(q[owner]).sum(axis=1)).ravel()
    out, k = [], 0
    for n in sizes:
        out.append([float(v) for v in flat[k:k + n]])
        k += n
    return out
