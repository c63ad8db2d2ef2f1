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
    vec, clf = _fitted_classifier(tuple(train_texts), tuple(train_labels))
    if clf is None:  # one label: nothing to learn, every prediction is it
        return [train_labels[0]] * len(texts)
    return list(clf.predict(vec.transform(texts)))


@lru_cache(maxsize=8)
def _fitted_classifier(train_texts: tuple[str, ...], train_labels: tuple[Any, ...]) -> tuple[Any, Any]:
    # Cached: a comparison runs many methods and seeds in one process on the same train split.
    from sklearn.linear_model import LogisticRegression

    vec = _vectorizer()
    x = vec.fit_transform(train_texts)
    if len(set(train_labels)) < 2:
        return vec, None
    return vec, LogisticRegression(max_iter=2000, C=4.0).fit(x, list(train_labels))


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
