"""Metrics against hand-computed cases."""

from __future__ import annotations

import math

import pytest
from skillnet.finetune.metrics import (
    accuracy,
    bio_entities,
    char_bag_tokens,
    entity_prf,
    group_top1_accuracy,
    macro_f1,
    pearson,
    rankdata,
    span_char_bag_em_f1,
    spearman,
)


def test_accuracy_and_macro_f1_by_hand():
    gold = ["a", "b", "a", "c"]
    pred = ["a", "a", "a", "c"]
    assert accuracy(gold, pred) == pytest.approx(75.0)
    # a: P=2/3 R=1 F1=0.8; b: F1=0; c: F1=1  -> mean 0.6
    assert macro_f1(gold, pred) == pytest.approx(60.0)
    # an explicit label list restricts the average
    assert macro_f1(gold, pred, labels=["a", "c"]) == pytest.approx(90.0)
    with pytest.raises(ValueError, match="length"):
        accuracy(["a"], ["a", "b"])


def test_pearson_by_hand():
    # dx=[-1.5,-.5,.5,1.5] dy=[-3,-1,0,4]: sum dxdy=11, sum dx^2=5, sum dy^2=26
    assert pearson([1, 2, 3, 4], [2, 4, 5, 9]) == pytest.approx(100 * 11 / math.sqrt(130))
    assert pearson([1, 2, 3], [3, 2, 1]) == pytest.approx(-100.0)
    assert pearson([1, 1, 1], [1, 2, 3]) == 0.0  # constant prediction: no signal


def test_spearman_with_ties_by_hand():
    assert rankdata([1, 2, 2, 3]).tolist() == [1.0, 2.5, 2.5, 4.0]
    # ranks x=[1,2.5,2.5,4], y=[1,3,2,4]: 4.5 / sqrt(4.5*5)
    assert spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(100 * 4.5 / math.sqrt(22.5))
    # monotone but non-linear: Spearman 100, Pearson below
    assert spearman([1, 2, 3, 4], [1, 10, 100, 1000]) == pytest.approx(100.0)
    assert pearson([1, 2, 3, 4], [1, 10, 100, 1000]) < 90


def test_bio_entities_adjacent_and_ill_formed():
    tags = ["B-PER", "I-PER", "B-PER", "O", "B-ORG", "I-ORG", "I-ORG", "O", "I-LOC", "I-LOC"]
    assert bio_entities(tags) == [("PER", 0, 2), ("PER", 2, 3), ("ORG", 4, 7), ("LOC", 8, 10)]
    # I- of another type starts a new entity (conlleval)
    assert bio_entities(["B-LOC", "I-LOC", "I-ORG", "I-ORG"]) == [("LOC", 0, 2), ("ORG", 2, 4)]
    # BIOES
    assert bio_entities(["S-PER", "B-LOC", "E-LOC", "O"]) == [("PER", 0, 1), ("LOC", 1, 3)]
    assert bio_entities(["O", "O"]) == []


def test_entity_f1_with_adjacent_and_nested_boundaries():
    gold = [
        ["B-PER", "I-PER", "B-PER", "O", "B-ORG", "I-ORG", "I-ORG", "O", "I-LOC", "I-LOC"],
        # 北京大学: one ORG; the prediction finds the LOC 北京 nested inside it and splits the rest off
        ["B-ORG", "I-ORG", "I-ORG", "I-ORG", "O"],
    ]
    pred = [
        # merges the two adjacent PERs; cuts ORG one short and labels its last char LOC; LOC right
        ["B-PER", "I-PER", "I-PER", "O", "B-ORG", "I-ORG", "B-LOC", "O", "B-LOC", "I-LOC"],
        ["B-LOC", "I-LOC", "I-ORG", "I-ORG", "O"],
    ]
    # gold: PER(0,2) PER(2,3) ORG(4,7) LOC(8,10) | ORG(0,4)                 -> 5
    # pred: PER(0,3) ORG(4,6) LOC(6,7) LOC(8,10) | LOC(0,2) ORG(2,4)        -> 6, 1 correct
    r = entity_prf(gold, pred)
    assert r["precision"] == pytest.approx(100 / 6)
    assert r["recall"] == pytest.approx(100 / 5)
    assert r["f1"] == pytest.approx(100 * 2 / 11)
    # strict IOB2: gold's "O I-LOC I-LOC" and pred's "I-ORG I-ORG" after a LOC are no entities;
    # gold PER PER ORG | ORG (4) against pred PER ORG LOC LOC | LOC (5): none right
    assert (r["precision_strict"], r["recall_strict"], r["f1_strict"]) == (0.0, 0.0, 0.0)
    perfect = entity_prf(gold, gold)
    assert perfect == {k + s: 100.0 for k in ("precision", "recall", "f1") for s in ("", "_strict")}
    with pytest.raises(ValueError, match="sentence 0"):
        entity_prf([["O", "O"]], [["O"]])


def test_span_char_bag_em_f1_chinese_characters():
    assert char_bag_tokens("iPhone 12手机，很好") == ["iphone", "12", "手", "机", "很", "好"]
    gold = [["北京大学"], ["1998年", "一九九八年"], ["张三"]]
    pred = ["北京大学医学部", "1998年。", "李四"]
    r = span_char_bag_em_f1(gold, pred)
    # 1: 4 common chars, P=4/7 R=1 -> F1 8/11, EM 0; 2: EM 1 (punctuation dropped); 3: 0
    assert r["em"] == pytest.approx(100 / 3)
    assert r["f1"] == pytest.approx(100 * (8 / 11 + 1 + 0) / 3)
    # partial overlap inside a word: 上海市 vs 上海 -> P=1, R=2/3 -> 0.8
    assert span_char_bag_em_f1(["上海市"], ["上海"])["f1"] == pytest.approx(80.0)


def test_group_top1_accuracy_by_hand():
    groups = ["q1", "q1", "q1", "q2", "q2", "q3", "q3", "q4", "q4"]
    scores = [0.1, 0.9, 0.3, 0.8, 0.2, 0.5, 0.5, 0.7, 0.1]
    labels = [0, 1, 0, 0, 1, 1, 0, 0, 0]
    r = group_top1_accuracy(groups, scores, labels)
    # q1 right, q2 wrong, q3 a tie between a positive and a negative counts 1/2, q4 has no positive
    assert r["top1_accuracy"] == pytest.approx(50.0)
    assert r["groups"] == 3 and r["skipped_groups"] == 1
    # a constant scorer earns the random baseline (1/group size), not the input order's luck
    const = group_top1_accuracy(["a", "a", "a", "a"], [0.0] * 4, [1, 0, 0, 0])
    assert const["top1_accuracy"] == pytest.approx(25.0)


# ---------------------------------------------------------------------------
# Metrics the paper compares with, cross-checked against the official script's logic (CMRC 2018) and
# well-kept libraries (seqeval, scikit-learn, scipy). Accessed through the module so that a missing
# function fails its own test only.
import json  # noqa: E402
import random  # noqa: E402
import re  # noqa: E402

from skillnet.finetune import metrics as M  # noqa: E402

# CMRC 2018 evaluate script (v5), re-implemented from its description for the cross-check: lower-case
# and strip, drop the characters of a fixed list (a two-character "……" entry never matches one
# character), each character of U+4E00..U+9FA5 is a token, every other run goes through nltk's word
# tokenizer; F1 from the longest common *contiguous* token run; EM compares the punctuation-stripped
# strings. The script calls nltk.word_tokenize, which first splits sentences with punkt; punkt needs a
# data download, so the run is tokenised as one sentence (preserve_line=True).
_OFFICIAL_SP = ['-', ':', '_', '*', '^', '/', '\\', '~', '`', '+', '=', '，', '。', '：', '？', '！', '“', '”',
                '；', '’', '《', '》', '……', '·', '、', '「', '」', '（', '）', '－', '～', '『', '』']


def _official_segments(s: str) -> list[str]:
    from nltk.tokenize import word_tokenize

    out: list[str] = []
    pending = ""
    for ch in str(s).lower().strip():
        if ch in _OFFICIAL_SP:  # rm_punc=True, as calc_f1_score calls it
            continue
        if re.search(r"[\u4e00-\u9fa5]", ch):
            out += word_tokenize(pending, preserve_line=True) if pending else []
            pending = ""
            out.append(ch)
        else:
            pending += ch
    out += word_tokenize(pending, preserve_line=True) if pending else []
    return out


def _official_lcs(a: list[str], b: list[str]) -> int:
    best = 0
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i in range(len(a)):
        for j in range(len(b)):
            if a[i] == b[j]:
                table[i + 1][j + 1] = table[i][j] + 1
                best = max(best, table[i + 1][j + 1])
    return best


def _official_scores(answers: list[str], pred: str) -> tuple[float, float]:
    f1s = []
    for ans in answers:
        a, p = _official_segments(ans), _official_segments(pred)
        n = _official_lcs(a, p)
        f1s.append(0.0 if n == 0 else 2 * (n / len(p)) * (n / len(a)) / (n / len(p) + n / len(a)))

    def strip(s: str) -> str:
        return "".join(c for c in str(s).lower().strip() if c not in _OFFICIAL_SP)

    em = float(any(strip(a) == strip(pred) for a in answers))
    return max(f1s), em


@pytest.mark.parametrize("gold,pred,f1,em", [
    ("北京大学", "大学北京", 50.0, 0.0),  # longest common contiguous run 北京 / 大学: 2 of 4 tokens
    ("5%", "5", 100 * 2 / 3, 0.0),  # '%' is not in the official list: EM 0, one extra token
    ("3.5亿", "3.5亿", 100.0, 100.0),
    ("3.5", "35", 0.0, 0.0),  # 3.5 is one token
    ("。", "。", 0.0, 100.0),  # empty gold after punctuation removal: F1 0 (EM compares strings)
    ("ＡＢＣ公司", "abc公司", 100 * 2 * (2 / 3) * (2 / 3) / (4 / 3), 0.0),  # no NFKC: ａｂｃ != abc
    ("iPhone 12", "iphone12", 0.0, 0.0),  # two words vs one; EM keeps the space
    ("a-b公司", "ab公司", 100.0, 100.0),  # '-' is removed before segmentation: "ab" stays one word
    ("约1998年", "1998年。", 100 * 2 * (2 / 2) * (2 / 3) / (1 + 2 / 3), 0.0),
])
def test_cmrc2018_matches_the_official_logic(gold, pred, f1, em):
    r = M.cmrc2018_em_f1([[gold]], [pred])
    assert r["f1"] == pytest.approx(f1) and r["em"] == pytest.approx(em)
    assert (r["f1"] / 100, r["em"] / 100) == pytest.approx(_official_scores([gold], pred))


def test_cmrc2018_tokens_words_and_characters():
    assert M.cmrc2018_tokens("iPhone 12手机，价格3.5万") == ["iphone", "12", "手", "机", "价", "格", "3.5", "万"]
    assert M.cmrc2018_tokens("5%") == ["5", "%"]


def test_cmrc2018_random_cases_agree_with_the_official_logic():
    rng = random.Random(0)
    alphabet = list("北京大学上海市长城年月日") + list("ab Z19.,%'\"()…") + ["〇", "ａ", "-", "，", "。", "“", "”", "《", "》"]

    def text(lo: int, hi: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randint(lo, hi)))

    golds = [[text(1, 8) for _ in range(rng.randint(1, 3))] for _ in range(400)]
    preds = [text(0, 10) for _ in range(400)]
    r = M.cmrc2018_em_f1(golds, preds)
    ref = [_official_scores(g, p) for g, p in zip(golds, preds)]
    assert r["f1"] == pytest.approx(100 * sum(f for f, _ in ref) / 400)
    assert r["em"] == pytest.approx(100 * sum(e for _, e in ref) / 400)
    # and per question, not only on average
    for g, p, (f, e) in zip(golds[:100], preds[:100], ref[:100]):
        one = M.cmrc2018_em_f1([g], [p])
        assert (one["f1"] / 100, one["em"] / 100) == pytest.approx((f, e)), (g, p)


def test_char_bag_span_metric_keeps_its_old_behaviour_under_an_honest_name():
    # the bag-of-characters F1 ignores order: the official script gives 50 here
    assert M.span_char_bag_em_f1([["北京大学"]], ["大学北京"])["f1"] == pytest.approx(100.0)
    assert M.span_char_bag_em_f1([["5%"]], ["5"])["em"] == pytest.approx(100.0)


def _random_bio(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(["O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC"]) for _ in range(n)]


def test_entity_f1_agrees_with_seqeval_default_and_strict():
    import warnings

    from seqeval.metrics import f1_score, precision_score, recall_score
    from seqeval.scheme import IOB2

    rng = random.Random(1)
    for _ in range(30):
        lens = [rng.randint(1, 12) for _ in range(rng.randint(1, 6))]
        gold = [_random_bio(rng, n) for n in lens]
        pred = [_random_bio(rng, n) for n in lens]
        r = M.entity_prf(gold, pred)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # seqeval warns on 0/0 and scores it 0, as entity_prf does
            assert r["f1"] == pytest.approx(100 * f1_score(gold, pred))
            assert r["precision"] == pytest.approx(100 * precision_score(gold, pred))
            assert r["recall"] == pytest.approx(100 * recall_score(gold, pred))
            assert r["f1_strict"] == pytest.approx(100 * f1_score(gold, pred, mode="strict", scheme=IOB2))
            assert r["precision_strict"] == pytest.approx(
                100 * precision_score(gold, pred, mode="strict", scheme=IOB2))
            assert r["recall_strict"] == pytest.approx(100 * recall_score(gold, pred, mode="strict", scheme=IOB2))


def test_strict_entities_ignore_ill_formed_i_tags():
    assert M.iob2_strict_entities(["I-ORG", "I-ORG", "O", "B-ORG", "I-PER", "B-PER", "I-PER"]) == [
        ("ORG", 3, 4), ("PER", 5, 7)]


def test_macro_f1_and_binary_f1_agree_with_sklearn():
    from sklearn.metrics import f1_score

    rng = random.Random(2)
    for _ in range(30):
        n = rng.randint(1, 25)
        labels = rng.sample(["a", "b", "c", "d"], rng.randint(2, 4))
        gold = [rng.choice(labels) for _ in range(n)]
        pred = [rng.choice(labels) for _ in range(n)]
        assert M.macro_f1(gold, pred) == pytest.approx(100 * f1_score(gold, pred, average="macro", zero_division=0))
        bg = [rng.choice(["0", "1"]) for _ in range(n)]
        bp = [rng.choice(["0", "1"]) for _ in range(n)]
        assert M.binary_f1(bg, bp, positive="1") == pytest.approx(
            100 * f1_score(bg, bp, pos_label="1", average="binary", zero_division=0))


def test_correlations_propagate_nan():
    from scipy.stats import pearsonr, spearmanr

    gold, pred = [0.1, 0.5, 0.9, 0.3], [0.2, float("nan"), 0.8, 0.1]
    assert math.isnan(spearmanr(gold, pred).statistic)  # what the reference library does
    assert math.isnan(M.spearman(gold, pred))
    assert math.isnan(M.pearson(gold, pred))
    assert math.isnan(M.pearson(pred, gold))
    ok = [0.2, 0.4, 0.8, 0.1]
    assert M.spearman(gold, ok) == pytest.approx(100 * spearmanr(gold, ok).statistic)
    assert M.pearson(gold, ok) == pytest.approx(100 * pearsonr(gold, ok).statistic)


def test_roc_auc_agrees_with_scikit_learn_and_gives_trivial_scorers_50():
    """answer_select's metric (issue 49): ROC-AUC x100, ties counted half; always-yes (a constant score) and a
    random scorer sit at 50 whatever the balance, where positive-class F1 gives always-yes 2p/(1+p)."""
    from sklearn.metrics import roc_auc_score

    rng = random.Random(3)
    for n, share in ((40, 0.5), (57, 0.2), (200, 0.7)):
        gold = [rng.random() < share for _ in range(n)]
        gold[0], gold[1] = True, False  # both classes
        scores = [round(rng.random(), 1) for _ in range(n)]  # rounded: many ties
        assert M.roc_auc(gold, scores) == pytest.approx(100 * roc_auc_score(gold, scores))
    gold = [True, False] * 50
    assert M.roc_auc(gold, [0.9] * 100) == 50.0  # always yes
    assert M.binary_f1(["1" if g else "0" for g in gold], ["1"] * 100, "1") == pytest.approx(200 / 3)
    assert M.roc_auc([1, 1, 0, 0], [0.8, 0.7, 0.3, 0.7]) == pytest.approx(87.5)
    assert math.isnan(M.roc_auc([1, 1], [0.2, 0.4]))  # one class: undefined
    with pytest.raises(ValueError, match="differ in length"):
        M.roc_auc([1, 0], [0.1])


def test_a_binary_classification_task_scores_auc_from_the_positive_probability():
    from types import SimpleNamespace

    from skillnet.finetune.task_types.classification import ClassificationCodec, ScoredLabel

    td = SimpleNamespace(positive_label="1")
    recs = [{"label": g} for g in ("1", "0", "1", "0")]
    preds = [ScoredLabel("1", 0.9), ScoredLabel("1", 0.6), ScoredLabel("0", 0.4), ScoredLabel("0", 0.1)]
    out = ClassificationCodec().score(td, recs, preds)
    assert out["auc"] == pytest.approx(75.0) and out["accuracy"] == 50.0
    assert preds[0] == "1" and json.dumps(preds) == '["1", "1", "0", "0"]'  # a label to everything else
    # a predictor without scores (the trivial baseline's labels) is a constant scorer: 50
    assert ClassificationCodec().score(td, recs, ["1"] * 4)["auc"] == 50.0
