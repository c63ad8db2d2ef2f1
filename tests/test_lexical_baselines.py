"""Non-neural baselines fit on train (TF-IDF + logistic regression; TF-IDF similarity), checked against
scikit-learn's own pipeline and against hand-made cases."""

from __future__ import annotations

import numpy as np
from skillnet.finetune.lexical import tfidf_classifier, tfidf_similarities


def test_the_classifier_is_sklearns_char_tfidf_plus_logistic_regression() -> None:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline

    rng = np.random.default_rng(0)
    good, bad = "好棒赞喜欢满意", "差烂坏讨厌失望"
    texts, labels = [], []
    for _ in range(200):
        y = int(rng.integers(2))
        chars = rng.choice(list(good if y else bad), 3).tolist() + rng.choice(list("的了是我这个东西"), 4).tolist()
        texts.append("".join(rng.permutation(chars)))
        labels.append(str(y))
    preds = tfidf_classifier(texts[:150], labels[:150], texts[150:])
    ref = make_pipeline(TfidfVectorizer(analyzer="char", ngram_range=(1, 2), sublinear_tf=True),
                        LogisticRegression(max_iter=2000, C=4.0)).fit(texts[:150], labels[:150]).predict(texts[150:])
    assert preds == list(ref)
    assert np.mean([p == y for p, y in zip(preds, labels[150:])]) > 0.95
    assert tfidf_classifier(["a", "b"], ["x", "x"], ["c"]) == ["x"]  # one label: nothing to fit


def test_similarity_prefers_the_candidate_sharing_characters() -> None:
    fit = ["保险怎么理赔", "理赔需要什么材料", "车险多少钱", "今天天气很好"]
    scores = tfidf_similarities(fit, ["怎么理赔"], [["车险多少钱", "理赔需要什么材料", "今天天气很好"]])[0]
    assert int(np.argmax(scores)) == 1 and all(0.0 <= s <= 1.0 + 1e-9 for s in scores)


def test_batched_similarities_equal_sklearn_cosine_per_query() -> None:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.metrics.pairwise import cosine_similarity

    fit = ["保险怎么理赔", "理赔需要什么材料", "车险多少钱", "今天天气很好", "寿险和重疾险有什么区别"]
    queries = ["怎么理赔", "车险", "重疾险区别"]
    cands = [["车险多少钱", "理赔需要什么材料"], [], ["寿险", "今天天气很好", "重疾险和寿险"]]
    ref_vec = TfidfVectorizer(analyzer="char", ngram_range=(1, 2), sublinear_tf=True).fit(fit)
    got = tfidf_similarities(fit, queries, cands)
    assert [len(g) for g in got] == [2, 0, 3]
    for q, cs, g in zip(queries, cands, got):
        if cs:
            ref = cosine_similarity(ref_vec.transform(cs), ref_vec.transform([q])).ravel()
            np.testing.assert_allclose(g, ref, rtol=0, atol=1e-12)
            assert g == tfidf_similarities(fit, [q], [cs])[0]  # batched = one query at a time
    assert tfidf_similarities(fit, ["a"], [[]]) == [[]]
