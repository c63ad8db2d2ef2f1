"""Evaluation metrics for the fine-tuning task types (pure Python/numpy, no torch).

* classification: ``accuracy``, ``macro_f1`` (scikit-learn's default: the mean over the classes seen in
  gold or predictions), ``binary_f1`` (F1 of the positive class, as the paper reports for NLPCC-DBQA)
* regression: ``pearson``, ``spearman`` (average ranks for ties); a NaN prediction gives NaN, as scipy
* NER: ``bio_entities`` + ``entity_prf`` (entity-level P/R/F1; an entity counts only with exact type
  and boundaries; ``f1`` follows conlleval for ill-formed BIO, ``f1_strict`` is seqeval's strict IOB2
  mode, where an ``I-`` tag that continues no entity belongs to none)
* span MRC: ``cmrc2018_em_f1`` (the CMRC 2018 evaluation script's EM and F1: its punctuation list, its
  mixed segmentation, F1 from the longest common contiguous token run) and ``span_char_bag_em_f1`` (a
  bag-of-characters F1 after NFKC; not CMRC 2018's, kept as a second opinion)
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
    """Unweighted mean of per-class F1 over ``labels`` (default: every label seen in gold or pred, which is
    scikit-learn's ``f1_score(average="macro")``).

    A class listed in an explicit ``labels`` but absent from both gold and pred scores F1 = 0 and pulls
    the mean down (scikit-learn's ``zero_division=0`` with ``labels=``): pass only the labels you mean.
    """
    _same_length(gold, pred)
    classes = list(labels) if labels is not None else sorted(set(gold) | set(pred), key=str)
    if not classes:
        return 0.0
    return 100.0 * sum(_class_f1(gold, pred, c) for c in classes) / len(classes)


def binary_f1(gold: Sequence[Hashable], pred: Sequence[Hashable], positive: Hashable) -> float:
    """F1 of the positive class alone (scikit-learn's ``average="binary"``); 0 when it is never
    predicted or never gold."""
    _same_length(gold, pred)
    return 100.0 * _class_f1(gold, pred, positive)


def _class_f1(gold: Sequence[Hashable], pred: Sequence[Hashable], c: Hashable) -> float:
    tp = sum(1 for g, p in zip(gold, pred) if g == c and p == c)
    fp = sum(1 for g, p in zip(gold, pred) if g != c and p == c)
    fn = sum(1 for g, p in zip(gold, pred) if g == c and p != c)
    return _f1(tp, fp, fn)


# --------------------------------------------------------------------------- regression


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    _same_length(x, y)
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    if np.isnan(a).any() or np.isnan(b).any():
        # A NaN prediction (a diverged model) has no correlation; NaN never wins best-checkpoint selection.
        return math.nan
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
    """Pearson of the ranks; NaN if any value is NaN (ranks of NaN are meaningless), as scipy."""
    _same_length(x, y)
    if np.isnan(np.asarray(x, dtype=np.float64)).any() or np.isnan(np.asarray(y, dtype=np.float64)).any():
        return math.nan
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


def iob2_strict_entities(tags: Sequence[str]) -> list[tuple[str, int, int]]:
    """Entities ``(type, start, end_exclusive)`` as seqeval's strict IOB2 mode sees them: ``B-X`` followed by
    the longest run of ``I-X``; an ``I-`` tag that continues no such entity belongs to no entity."""
    out: list[tuple[str, int, int]] = []
    cur_type: str | None = None
    cur_start = 0
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, typ = (tag[0].upper(), tag[2:]) if len(tag) > 2 and tag[1] == "-" else ("O", None)
        if cur_type is not None and not (prefix == "I" and typ == cur_type):
            out.append((cur_type, cur_start, i))
            cur_type = None
        if prefix == "B":
            cur_type, cur_start = typ, i
    return out


def entity_prf(gold: Sequence[Sequence[str]], pred: Sequence[Sequence[str]]) -> dict[str, float]:
    """Micro entity-level precision / recall / F1 (percent) over sentences of BIO tags: conlleval-style
    (``precision``, ``recall``, ``f1``; seqeval's default mode) and strict IOB2 (``*_strict``; seqeval's
    ``mode="strict", scheme=IOB2``). On well-formed IOB2 the two agree."""
    _same_length(gold, pred)
    for i, (g, p) in enumerate(zip(gold, pred)):
        if len(g) != len(p):
            raise ValueError(f"sentence {i}: {len(g)} gold tags but {len(p)} predicted tags")
    out: dict[str, float] = {}
    for suffix, extract in (("", bio_entities), ("_strict", iob2_strict_entities)):
        tp = n_gold = n_pred = 0
        for g, p in zip(gold, pred):
            ge = Counter(extract(g))
            pe = Counter(extract(p))
            tp += sum((ge & pe).values())
            n_gold += sum(ge.values())
            n_pred += sum(pe.values())
        prec = tp / n_pred if n_pred else 0.0
        rec = tp / n_gold if n_gold else 0.0
        f1 = 2 * prec * rec / (prec + rec) if prec + rec else 0.0
        out.update({f"precision{suffix}": 100.0 * prec, f"recall{suffix}": 100.0 * rec, f"f1{suffix}": 100.0 * f1})
    return out


# --------------------------------------------------------------------------- span extraction

# CMRC 2018's evaluation script removes exactly these characters, nothing else: ASCII , . ! ? % " and
# Unicode punctuation outside the list stay (and count as tokens). The script also lists "……" as one
# two-character entry, which its per-character test never matches, so "…" stays as well.
CMRC2018_PUNCTUATION = frozenset("-:_*^/\\~`+=，。：？！“”；’《》·、「」（）－～『』")
# The script's "Chinese character" test: the basic CJK block only (U+9FA6..U+9FFF and the extensions
# go to the word tokenizer like Latin text).
_CMRC_CJK_RE = re.compile(r"[\u4e00-\u9fa5]")
_word_tokenizer: Any = None


def _latin_words(run: str) -> list[str]:
    """Words of a non-Chinese run as the CMRC 2018 script gets them from ``nltk.word_tokenize``.

    nltk's word tokenizer is the Treebank-style regex tokenizer behind ``word_tokenize``; the sentence
    splitter (punkt) that ``word_tokenize`` runs first needs a data download, so each run is one
    sentence. That differs only for a run punkt would split, where the official script also splits off
    a period inside the run (``"a. b"``: ``a . b`` there, ``a. b`` here)."""
    global _word_tokenizer
    if _word_tokenizer is None:
        from nltk.tokenize.destructive import NLTKWordTokenizer  # lazy: importing nltk takes ~1 s

        _word_tokenizer = NLTKWordTokenizer()
    return _word_tokenizer.tokenize(run)


def cmrc2018_tokens(text: str) -> list[str]:
    """The official script's mixed segmentation (with punctuation removal): lower-cased, the fixed
    punctuation list dropped *before* segmenting (so ``a-b`` is the one word ``ab``), every character of
    U+4E00..U+9FA5 one token, each run of other characters word-tokenized. No Unicode normalisation."""
    tokens: list[str] = []
    run: list[str] = []
    for ch in text.lower().strip():
        if ch in CMRC2018_PUNCTUATION:
            continue
        if _CMRC_CJK_RE.match(ch):
            if run:
                tokens += _latin_words("".join(run))
                run = []
            tokens.append(ch)
        else:
            run.append(ch)
    if run:
        tokens += _latin_words("".join(run))
    return tokens


def _cmrc2018_strip(text: str) -> str:
    return "".join(ch for ch in text.lower().strip() if ch not in CMRC2018_PUNCTUATION)


def longest_common_run(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common contiguous run of tokens (not the longest common subsequence)."""
    best = 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b):
            if x == y:
                cur[j + 1] = prev[j] + 1
                best = max(best, cur[j + 1])
        prev = cur
    return best


def cmrc2018_em_f1(gold_answers: Sequence[Sequence[str] | str], pred: Sequence[str]) -> dict[str, float]:
    """CMRC 2018's EM and F1 (percent), each the max over a question's gold answers.

    F1: precision and recall of the longest common contiguous token run (``cmrc2018_tokens``); a gold
    answer with no token left scores 0. EM: the lower-cased, punctuation-stripped strings are equal
    (spaces count). A question without any gold answer scores 0 (the official script fails on one).
    """
    _same_length(gold_answers, pred)
    if not pred:
        return {"em": 0.0, "f1": 0.0}
    em_sum = f1_sum = 0.0
    for golds, p in zip(gold_answers, pred):
        golds = [golds] if isinstance(golds, str) else list(golds)
        pt, ps = cmrc2018_tokens(p), _cmrc2018_strip(p)
        best_f1 = 0.0
        for g in golds:
            gt = cmrc2018_tokens(g)
            n = longest_common_run(gt, pt)
            if n:
                prec, rec = n / len(pt), n / len(gt)
                best_f1 = max(best_f1, 2 * prec * rec / (prec + rec))
        em_sum += float(any(_cmrc2018_strip(g) == ps for g in golds))
        f1_sum += best_f1
    return {"em": 100.0 * em_sum / len(pred), "f1": 100.0 * f1_sum / len(pred)}


_CHAR_BAG_RE = re.compile(r"[A-Za-z0-9]+|\S")


def _is_punct(ch: str) -> bool:
    return unicodedata.category(ch).startswith(("P", "S"))


def char_bag_tokens(text: str) -> list[str]:
    """NFKC, lower-cased; each CJK (or other non-Latin) character one token, Latin/digit runs one token,
    every Unicode punctuation/symbol character and whitespace dropped."""
    text = unicodedata.normalize("NFKC", text).lower()
    return [t for t in _CHAR_BAG_RE.findall(text) if not (len(t) == 1 and _is_punct(t))]


def span_char_bag_em_f1(gold_answers: Sequence[Sequence[str] | str], pred: Sequence[str]) -> dict[str, float]:
    """Bag-of-characters EM and F1 (percent), max over gold answers. NOT CMRC 2018's metric: order is
    ignored (``北京大学`` vs ``大学北京`` scores 100), all Unicode punctuation is dropped and text is NFKC
    normalised. Use ``cmrc2018_em_f1`` for numbers compared with published CMRC 2018 scores."""
    _same_length(gold_answers, pred)
    if not pred:
        return {"em": 0.0, "f1": 0.0}
    em_sum = f1_sum = 0.0
    for golds, p in zip(gold_answers, pred):
        if isinstance(golds, str):
            golds = [golds]
        pt = char_bag_tokens(p)
        best_em = best_f1 = 0.0
        for g in golds:
            gt = char_bag_tokens(g)
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


def roc_auc(gold: Sequence[bool | int], scores: Sequence[float]) -> float:
    """ROC-AUC in percent: the chance that a positive example scores above a negative one (ties count half),
    from the ranks (Mann-Whitney U). 50 for any constant or random scorer, whatever the class balance, which
    positive-class F1 is not (always-yes scores 2p/(1+p)). NaN when gold holds one class only."""
    _same_length(gold, scores)
    y = np.asarray([bool(g) for g in gold])
    n_pos, n_neg = int(y.sum()), int((~y).sum())
    if not n_pos or not n_neg:
        return math.nan
    ranks = rankdata([float(s) for s in scores])
    u = float(ranks[y].sum()) - n_pos * (n_pos + 1) / 2
    return 100.0 * u / (n_pos * n_neg)


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
