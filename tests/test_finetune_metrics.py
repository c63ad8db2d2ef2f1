"""Metrics against hand-computed cases."""

from __future__ import annotations

import math

import pytest
from skillnet.finetune.metrics import (
    accuracy,
    bio_entities,
    entity_prf,
    group_top1_accuracy,
    macro_f1,
    mixed_tokens,
    pearson,
    rankdata,
    span_em_f1,
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
    perfect = entity_prf(gold, gold)
    assert perfect == {"precision": 100.0, "recall": 100.0, "f1": 100.0}
    with pytest.raises(ValueError, match="sentence 0"):
        entity_prf([["O", "O"]], [["O"]])


def test_span_em_f1_chinese_characters():
    assert mixed_tokens("iPhone 12手机，很好") == ["iphone", "12", "手", "机", "很", "好"]
    gold = [["北京大学"], ["1998年", "一九九八年"], ["张三"]]
    pred = ["北京大学医学部", "1998年。", "李四"]
    r = span_em_f1(gold, pred)
    # 1: 4 common chars, P=4/7 R=1 -> F1 8/11, EM 0; 2: EM 1 (punctuation dropped); 3: 0
    assert r["em"] == pytest.approx(100 / 3)
    assert r["f1"] == pytest.approx(100 * (8 / 11 + 1 + 0) / 3)
    # partial overlap inside a word: 上海市 vs 上海 -> P=1, R=2/3 -> 0.8
    assert span_em_f1(["上海市"], ["上海"])["f1"] == pytest.approx(80.0)


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
