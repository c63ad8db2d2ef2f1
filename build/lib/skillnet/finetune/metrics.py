"""Evaluation metrics for the fine-tuning task types (pure Python/numpy, no torch).

* classification: ``accuracy``, ``macro_f1``
* regression: ``pearson``, ``spearman`` (average ranks for ties)
* NER: ``bio_entities`` + ``entity_prf`` (entity-level P/R/F1; an entity counts only with exact type
  and boundaries, conlleval conventions for ill-formed BIO)
* span MRC: ``span_em_f1`` (CMRC-2018-style mixed segmentation: each CJK character is a token, runs of
  Latin letters/digits are one token, punctuation and spaces dropped; max over gold answers)
* matching / answer selection: ``group_top1_accuracy`` (top-1 accuracy over candidate groups, as cMedQA)

All return percentages in [0, 100] except correlations, which are in [-100, 100], so that the
score tables read like the papers'.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Hashable, Iterable, Sequence
from typing import Any

import numpy as np

# --------------------------------------------------------------------------- classification


def accuracy(gold: Sequence[Hashable], pred: Sequence[Hashable]) -> float:
    _same_length(gold, pred)
    if not gold:
        return 0.0
    return 100.0 * sum(g == p for g, p in zip(gold, pred)) / len(gold)


def macro_f1(gold: Sequence[Hashable], pred: Sequence[Hashable], labels: Iterable[Hashable] | None = None) -> float:
    """Unweighted mean of per-class F1 over ``labels`` (default: every label seen in gold or pred).

    A class with no gold and no predicted item has F1 = 0 if it is in an explicit ``labels`` list
    (as scikit-learn's zero_division=0) — pass only the labels you care about.
    """
    _same_length(gold, pred)
    classes = list(labels) if labels is not None else sorted(set(gold) | set(pred), key=str)
    if not classes:
        return 0.0
    f1s = []
    for c in classes:
        tp = sum(1 for g, p in zip(gold, pred) if g == c and p == c)
        fp = sum(1 for g, p in zip(gold, pred) if g != c and p == c)
        fn = sum(1 for g, p in zip(gold, pred) if g == c and p != c)
        f1s.append(_f1(tp, fp, fn))
    return 100.0 * sum(f1s) / len(f1s)


# --------------------------------------------------------------------------- regression


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    _same_length(x, y)
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    if a.size < 2:
        return 0.0
    a = a - a.mean()
    b = b - b.mean()
    denom = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    # A constant prediction has no defined correlation; 0 is the honest "no signal" score.
    return 0.0 if denom == 0 else 100.0 * float((a * b).sum()) / denom


def rankdata(x: Sequence[float]) -> np.ndarray:
    """1-based ranks; ties share the mean of the ranks they span."""
    a = np.asarray(x, dtype=np.float64)
    order = np.argsort(a, kind="mergesort")
    ranks = np.empty(len(a), dtype=np.float64)
    i = 0
    while i < len(a):
        j = i
        while j + 1 < len(a) and a[order[j + 1]] == a[order[i]]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    _same_length(x, y)
    return pearson(rankdata(x).tolist(), rankdata(y).tolist())


# --------------------------------------------------------------------------- NER (BIO)


def bio_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """Entities ``(type, start, end_exclusive)`` of a BIO sequence.

    Conventions (those of conlleval, so scores compare with published ones): an ``I-X`` that does
    not continue an entity of type X (after ``O``, at the start, or after an entity of another type)
    starts a new entity; ``B-X`` always starts one, so ``B-PER B-PER`` is two adjacent entities.
    ``E-``/``S-`` (BIOES) are accepted too.
    """
    out: list[tuple[str, int, int]] = []
    cur_type: str | None = None
    cur_start = 0
    for i, tag in enumerate(list(tags) + ["O"]):
        if tag == "O" or tag == "" or len(tag) < 2 or tag[1] != "-":
            prefix, typ = "O", None
        else:
            prefix, typ = tag[0].upper(), tag[2:]
        continues = cur_type is not None and typ == cur_type and prefix in ("I", "E")
        if cur_type is not None and not continues:
            out.append((cur_type, cur_start, i))
            cur_type = None
        if prefix in ("B", "S") or (prefix in ("I", "E") and not continues):
            cur_type, cur_start = typ, i
        if cur_type is not None and prefix in ("E", "S"):
            out.append((cur_type, cur_start, i + 1))
            cur_type = None
    return out


def entity_prf(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
    """Micro entity-level precision / recall / F1 (percent) over sentences of BIO tags."""
    _same_length(gold, pred)
    tp = n_gold = n_pred = 0
    for i, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted tags")
        ge = Counter(bio_entities(g))
        pe = Counter(bio_entities(p))
        tp += sum((ge & pe).values())
        n_gold += sum(ge.values())
        n_pred += sum(pe.values())
    prec = tp / n_pred if n_pred else 0.0
    rec = tp / n_gold if n_gold else 0.0
    f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
    return {"precision": 100.0 * prec, "recall": 100.0 * rec, "f1": 100.0 * f1}


# --------------------------------------------------------------------------- span extraction

_TOKEN_RE = re.compile(r"[A-Za-z0-9]+|\S")


def _is_punct(ch: str) -> bool:
    return unicodedata.category(ch).startswith(("P", "S"))


def mixed_tokens(text: str) -> list[str]:
    """CMRC-2018-style segmentation: CJK (and any other non-Latin) chars one by one, Latin/digit runs
    as one token, lower-cased, punctuation and whitespace dropped."""
    text = unicodedata.normalize("NFKC", text).lower()
    return [t for t in _TOKEN_RE.findall(text) if not (len(t) == 1 and _is_punct(t))]


def span_em_f1(gold_answers: Sequence[Sequence[str] | str], pred: Sequence[str]) -> dict[str, float]:
    """Exact match and token-overlap F1 (percent), each the max over a question's gold answers."""
    _same_length(gold_answers, pred)
    if not pred:
        return {"em": 0.0, "f1": 0.0}
    em_sum = f1_sum = 0.0
    for golds, p in zip(gold_answers, pred):
        if isinstance(golds, str):
            golds = [golds]
        pt = mixed_tokens(p)
        best_em = best_f1 = 0.0
        for g in golds:
            gt = mixed_tokens(g)
            best_em = max(best_em, float(gt == pt))
            common = sum((Counter(gt) & Counter(pt)).values())
            if common:
                prec, rec = common / len(pt), common / len(gt)
                best_f1 = max(best_f1, 2 * prec * rec / (prec + rec))
            elif not gt and not pt:
                best_f1 = max(best_f1, 1.0)
        em_sum += best_em
        f1_sum += best_f1
    return {"em": 100.0 * em_sum / len(pred), "f1": 100.0 * f1_sum / len(pred)}


# --------------------------------------------------------------------------- matching


def group_top1_accuracy(group_ids: Sequence[Hashable], scores: Sequence[float],
                        labels: Sequence[int | bool]) -> dict[str, float]:
    """Top-1 accuracy over candidate groups: a group is right if its best-scored candidate is positive.

    Groups without any positive candidate cannot be scored and are left out (``skipped_groups``).
    Ties at the top score count fractionally (the expected accuracy of breaking the tie at random),
    so a constant scorer gets the random baseline, not the luck of the input order.
    """
    _same_length(group_ids, scores)
    _same_length(group_ids, labels)
    cands: dict[Hashable, list[tuple[float, bool]]] = {}
    for g, s, y in zip(group_ids, scores, labels):
        cands.setdefault(g, []).append((float(s), bool(y)))
    correct = 0.0
    n_scored = 0
    for items in cands.values():
        if not any(y for _, y in items):
            continue
        n_scored += 1
        top = max(s for s, _ in items)
        tied = [y for s, y in items if s == top]
        correct += sum(tied) / len(tied)
    acc = 100.0 * correct / n_scored if n_scored else 0.0
    return {"top1_accuracy": acc, "groups": float(n_scored), "skipped_groups": float(len(cands) - n_scored)}


# --------------------------------------------------------------------------- helpers


def _f1(tp: int, fp: int, fn: int) -> float:
    prec = tp / (tp + fp) if tp + fp else 0.0
    rec = tp / (tp + fn) if tp + fn else 0.0
    return 2 * prec * rec / (prec + rec) if prec + rec else 0.0


def _same_length(a: Sequence[Any], b: Sequence[Any]) -> None:
    if len(a) != len(b):
        raise ValueError(f"gold and predictions differ in length: {len(a)} vs {len(b)}")
