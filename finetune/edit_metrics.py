"""Character-level edits of a correction, ChERRANT-style (MuCGEC ``scorers/ChERRANT``), and the scores built
on them: ``correction_prf`` (edits matched as (start, end, correction)) and ``detection_prf`` (their spans only:
span-level detection, not SIGHAN's). ``gen_metrics`` (the trainer's entry point) and ``csc_metrics``
(SIGHAN-2015's sentence-level scores) both build on this module, which imports neither."""

from __future__ import annotations

import functools
import itertools
import unicodedata
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Sequence
from typing import Any

References = Sequence[str] | Sequence[Sequence[str]]


def _multi_refs(references: References, n: int) -> list[list[str]]:
    """One list of references per hypothesis; a plain list of strings means one reference each."""
    if len(references) != n:
        raise ValueError(f"hypotheses and references differ in length: {n} vs {len(references)}")
    out: list[list[str]] = []
    for i, r in enumerate(references):
        refs = [r] if isinstance(r, str) else list(r)
        if not refs or not all(isinstance(x, str) for x in refs):
            raise ValueError(f"references[{i}] must be a string or a non-empty list of strings")
        out.append(refs)
    return out


# --------------------------------------------------------------------------- correction F0.5 (ChERRANT)
#
# ChERRANT (char level) aligns source and corrected sentence with a Damerau-style edit distance (insert and
# delete cost 1, a transposition of k+1 characters costs k, a substitution costs < 2), keeps every cheapest
# alignment, merges each alignment's operations into span edits, and scores (start, end, correction) triples.
# Its substitution cost uses the Cilin thesaurus and pinyin, which only break ties between alignments; here
# every pair of different characters costs what ChERRANT charges a pair it knows nothing about, by
# punctuation class. Costs are integers (1 = 1/12000 of an insertion) so that ties are exact.

_UNIT = 12000
_SUB_COST = {2: 14000, 1: 19988, 0: 17000}  # by number of punctuation chars in the pair: 4/6 + 1/2 + {0, .499, .25}
_MAX_ALIGNMENTS = 256  # ChERRANT enumerates all cheapest alignments; a degenerate output can have millions
Edit = tuple[int, int, str]  # (start, end) in source characters, correction text ("" = delete)
_Op = tuple[str, int, int, int, int]  # (operation, src start, src end, tgt start, tgt end)


def _is_punct(text: str) -> bool:
    return bool(text) and all(unicodedata.category(c)[0] in "PS" for c in text)


def _levenshtein(a: Sequence[Hashable], b: Sequence[Hashable]) -> int:
    """Edit distance by the bit-vector algorithm of Myers/Hyyroe: one column of the DP table is a pair of
    bit masks of the vertical +1/-1 steps, so each token of `a` costs a few big-int operations instead of
    len(b) Python steps (char_accuracy runs at every dev evaluation, over thousands of long outputs)."""
    if len(a) < len(b):
        a, b = b, a
    m = len(b)
    if m == 0:
        return len(a)
    peq: dict[Hashable, int] = {}
    for i, c in enumerate(b):
        peq[c] = peq.get(c, 0) | (1 << i)
    mask, top = (1 << m) - 1, 1 << (m - 1)
    pv, mv, dist = mask, 0, m
    for c in a:
        eq = peq.get(c, 0)
        xv = eq | mv
        xh = ((((eq & pv) + pv) & mask) ^ pv) | eq
        ph = (mv | ~(xh | pv)) & mask
        mh = pv & xh
        if ph & top:
            dist += 1
        elif mh & top:
            dist -= 1
        ph = ((ph << 1) | 1) & mask  # row 0 of the table is 0, 1, 2, ...: every step along it is +1
        mh = (mh << 1) & mask
        pv = (mh | ~(xv | ph)) & mask
        mv = ph & xv
    return dist


def _op_table(src: str, tgt: str) -> list[list[tuple[str, ...]]]:
    """For every cell (i, j), the operations that reach it at minimum cost (ties kept, in ChERRANT's order
    transposition, substitution, insertion, deletion; a match excludes the others)."""
    n, m = len(src), len(tgt)
    # a pair's substitution cost depends only on whether each side is punctuation: looked up per character
    # once, not per cell (the per-cell Unicode lookups were a third of the table's time)
    src_p, tgt_p = [_is_punct(c) for c in src], [_is_punct(c) for c in tgt]
    cost = [[0] * (m + 1) for _ in range(n + 1)]
    ops: list[list[tuple[str, ...]]] = [[()] * (m + 1) for _ in range(n + 1)]
    for i in range(1, n + 1):
        cost[i][0], ops[i][0] = i * _UNIT, ("D",)
    for j in range(1, m + 1):
        cost[0][j], ops[0][j] = j * _UNIT, ("I",)
    for i in range(n):
        for j in range(m):
            if src[i] == tgt[j]:
                cost[i + 1][j + 1], ops[i + 1][j + 1] = cost[i][j], ("M",)
                continue
            # A transposition: the last k+1 characters of both sides are the same multiset; the search
            # walks back along the diagonal while it keeps costing something. The two windows' character
            # counts are kept as one difference, updated per step (comparing sorted windows at every step cost
            # O(k log k) each: most of an evaluation's time on long unlike outputs).
            trans, k = float("inf"), 1
            diff, unequal = {src[i]: 1, tgt[j]: -1}, 2  # src[i] != tgt[j] here
            while i - k >= 0 and j - k >= 0 and cost[i - k + 1][j - k + 1] != cost[i - k][j - k]:
                for ch, d in ((src[i - k], 1), (tgt[j - k], -1)):
                    before = diff.get(ch, 0)
                    diff[ch] = before + d
                    unequal += (before + d != 0) - (before != 0)
                if not unequal:
                    trans = cost[i - k][j - k] + k * _UNIT
                    break
                k += 1
            cands = ((f"T{k + 1}", trans), ("S", cost[i][j] + _SUB_COST[src_p[i] + tgt_p[j]]),
                     ("I", cost[i + 1][j] + _UNIT), ("D", cost[i][j + 1] + _UNIT))
            best = min(c for _, c in cands)
            cost[i + 1][j + 1] = int(best)
            ops[i + 1][j + 1] = tuple(name for name, c in cands if c == best)
    return ops


def _alignments(src: str, tgt: str) -> list[list[_Op]]:
    """Cheapest alignments, each a list of operations from the start. Like ChERRANT, only the first
    operation of each cell is followed when the lengths differ by more than 10."""
    ops = _op_table(src, tgt)
    first_only = abs(len(src) - len(tgt)) > 10
    out: list[list[_Op]] = []
    stack: list[tuple[int, int, Any]] = [(len(src), len(tgt), None)]  # chain = (op, rest) toward the end
    while stack and len(out) < _MAX_ALIGNMENTS:
        i, j, chain = stack.pop()
        if i == 0 and j == 0:
            seq = []
            while chain is not None:
                seq.append(chain[0])
                chain = chain[1]
            out.append(seq)
            continue
        cell = ops[i][j][:1] if first_only else ops[i][j]
        for op in reversed(cell):  # pushed in reverse so the first operation is expanded first
            di, dj = {"M": (1, 1), "S": (1, 1), "D": (1, 0), "I": (0, 1)}.get(op, (0, 0))
            if op[0] == "T":
                di = dj = int(op[1:])
            stack.append((i - di, j - dj, ((op, i - di, i, j - dj, j), chain)))
    return out


def _span(tag: str, seq: Sequence[_Op]) -> _Op:
    return (tag, seq[0][1], seq[-1][2], seq[0][3], seq[-1][4])


def _merge_run(seq: list[_Op]) -> list[_Op]:
    """ChERRANT's char-level merging of a run of operations between matches/transpositions."""
    kinds = {op[0] for op in seq}
    if len(seq) <= 1 or kinds == {"D", "I"}:  # interleaved deletions and insertions stay separate
        return seq
    if len(kinds) == 1:  # all D, all I, all S (one span at char level), or all M
        return [_span(seq[0][0], seq)]
    return [_span("S", seq)]


def _is_move(e1: _Op, e3: _Op, src: str, tgt: str) -> bool:
    """Whether edits e1 . e3 around one match/transposition are one word-order edit (ChERRANT rules)."""
    k1, k3 = e1[0][0], e3[0][0]
    if k1 == "S" and k3 == "S":
        w1, w2 = src[e1[1]:e1[2]], tgt[e1[3]:e1[4]]
        w3, w4 = src[e3[1]:e3[2]], tgt[e3[3]:e3[4]]
        if min(len(w1), len(w2), len(w3), len(w4)) == 1:
            return w1 == w4 and w2 == w3
        return _levenshtein(w1, w4) <= 1 and _levenshtein(w2, w3) <= 1
    # deleted here, inserted there (or the reverse)
    dele, ins = (e1, e3) if k1 == "D" else (e3, e1)
    a, b = src[dele[1]:dele[2]], tgt[ins[3]:ins[4]]
    if len(a) < len(b):
        a, b = b, a
    if _is_punct(a) or _is_punct(b) or len(a) - len(b) > 1:
        return False
    if len(b) == 1:
        return a == b
    return _levenshtein(a, b) <= 1 or (len(a) == len(b) and b in a + a)


def _trim(e: _Op, src: str, tgt: str) -> _Op:
    """Drop a common prefix/suffix of a substitution's two sides (ChERRANT's second filter)."""
    tag, s0, s1, t0, t1 = e
    a, b = src[s0:s1], tgt[t0:t1]
    p = 0
    while p < len(a) and p < len(b) and a[p] == b[p]:
        p += 1
    s = 0  # suffix of a[p:] that ends b (all of b, as ChERRANT checks), if b still has room for it
    while s < len(a) - p and b.endswith(a[len(a) - s - 1:]):
        s += 1
    if s > t1 - (t0 + p):
        s = 0
    if not p and not s:
        return e
    s0, t0, s1, t1 = s0 + p, t0 + p, s1 - s, t1 - s
    return ("I" if s0 == s1 else "D" if t0 == t1 else "S", s0, s1, t0, t1)


def _merge(align: list[_Op], src: str, tgt: str) -> list[_Op]:
    """One alignment -> span edits, after ChERRANT's Merger at char level."""
    edits: list[_Op] = []
    for kind, grp in itertools.groupby(align, key=lambda op: op[0][0] if op[0][0] in "MT" else "X"):
        run = list(grp)
        edits.extend(run if kind == "T" else _merge_run(run))
    kept: list[_Op] = []
    i = 0
    while i < len(edits):
        e1 = edits[i]
        if i + 2 < len(edits):
            e2, e3 = edits[i + 1], edits[i + 2]
            pattern = ((e1[0][0] == "S" and e2[0][0] == "M" and e3[0][0] == "S")
                       or ({e1[0][0], e3[0][0]} == {"D", "I"} and e2[0][0] in "MT"))
            if pattern and _is_move(e1, e3, src, tgt):
                kept.append(_span(f"T{e3[2] - e1[1]}", [e1, e3]))
                i += 3
                continue
        if e1[0] != "M":
            kept.append(e1)
        i += 1
    out = []
    for e in kept:
        if src[e[1]:e[2]] == tgt[e[3]:e[4]]:
            continue
        out.append(_trim(e, src, tgt) if e[0] == "S" else e)
    return out


def char_edits(source: str, target: str) -> Counter[Edit]:
    """Character-level edits that turn `source` into `target`, as ChERRANT extracts them: the union (with
    multiplicity, as ChERRANT's M2 file lists them) over the distinct edit lists of all cheapest alignments.
    Whitespace is removed first. An unchanged sentence has no edits."""
    src, tgt = "".join(source.split()), "".join(target.split())
    if src == tgt:
        return Counter()
    return Counter(dict(_char_edits(src, tgt)))


# The reference edits of a split are the same at every evaluation of every run in a process (and so are
# outputs that repeat, as a model's often do): their alignment tables, pure Python, were most of a generation
# run's evaluation time. Cached as an immutable tuple; `char_edits` hands out a fresh Counter.
@functools.lru_cache(maxsize=1 << 14)
def _char_edits(src: str, tgt: str) -> tuple[tuple[Edit, int], ...]:
    out: Counter[Edit] = Counter()
    seen: list[list[_Op]] = []
    for align in _alignments(src, tgt):
        edits = _merge(align, src, tgt)
        if edits in seen:
            continue
        seen.append(edits)
        out.update((s0, s1, tgt[t0:t1]) for _, s0, s1, t0, t1 in edits)
    return tuple(out.items())


def _prf(tp: int, fp: int, fn: int, beta: float, empty: float = 1.0) -> tuple[float, float, float]:
    """P, R, F_beta; `empty` is P when nothing was predicted and R when there was nothing to find. ChERRANT's
    convention is 1 (a system that changes nothing has P = 1), the SIGHAN tool's (FASpell's script) 0."""
    p = tp / (tp + fp) if tp + fp else empty
    r = tp / (tp + fn) if tp + fn else empty
    f = (1 + beta**2) * p * r / (beta**2 * p + r) if p + r else 0.0
    return p, r, f


Counts = tuple[int, int, int]  # (tp, fp, fn)


def _match(hyp: Counter[Any], ref: Counter[Any]) -> Counts:
    tp = sum(ref[e] for e in hyp if e in ref)
    fp = sum(c for e, c in hyp.items() if e not in ref)
    fn = sum(c for e, c in ref.items() if e not in hyp)
    return tp, fp, fn


def _clipped_match(hyp: Counter[Any], ref: Counter[Any]) -> Counts:
    """Each item is a TP at most as often as the hypothesis has it. The span view needs it: a reference with
    several cheapest alignments puts its different edits of one span (ab->aaa: b->a and b->aa) on one span with
    a count >= 2, which `_match` would let one hypothesis edit there earn in full."""
    tp = sum((hyp & ref).values())
    return tp, sum(hyp.values()) - tp, sum(ref.values()) - tp


def _corpus_counts(per_sentence: Iterable[Iterable[Counts]], beta: float, empty: float = 1.0) -> Counts:
    """Corpus (tp, fp, fn) from each sentence's counts against each of its references: a sentence adds those of
    the reference that maximises the corpus F so far (ChERRANT / M2 scorer): the F rounded to 4 places as
    ChERRANT compares it, then more TP, fewer FP, fewer FN. `empty` is `_prf`'s: the caller's reporting rule,
    so that the reference chosen is the best by the F that is reported."""
    tot = (0, 0, 0)
    for candidates in per_sentence:
        best: tuple[tuple[float, int, int, int], Counts] | None = None
        for tp, fp, fn in candidates:
            f = round(_prf(tot[0] + tp, tot[1] + fp, tot[2] + fn, beta, empty)[2], 4)
            key = (f, tp, -fp, -fn)
            if best is None or key > best[0]:
                best = (key, (tp, fp, fn))
        if best is None:
            raise ValueError("a sentence without references")
        tot = (tot[0] + best[1][0], tot[1] + best[1][1], tot[2] + best[1][2])
    return tot


def _spans(edits: Counter[Edit]) -> Counter[tuple[int, int]]:
    """The source spans an edit list touches, whatever it writes there (with multiplicity)."""
    out: Counter[tuple[int, int]] = Counter()
    for (start, end, _), c in edits.items():
        out[start, end] += c
    return out


def _edit_prf(sources: Sequence[str], hypotheses: Sequence[str], references: References, beta: float,
              view: Callable[[Counter[Edit]], Counter[Any]],
              match: Callable[[Counter[Any], Counter[Any]], Counts] = _match) -> dict[str, float]:
    if len(sources) != len(hypotheses):
        raise ValueError(f"sources and hypotheses differ in length: {len(sources)} vs {len(hypotheses)}")
    refs = _multi_refs(references, len(hypotheses))

    def candidates(src: str, hyp: str, rs: list[str]) -> list[Counts]:
        h = view(char_edits(src, hyp))
        return [match(h, view(char_edits(src, r))) for r in rs]

    tot = _corpus_counts((candidates(*x) for x in zip(sources, hypotheses, refs)), beta)
    p, r, f = _prf(*tot, beta)
    return {"precision": 100.0 * p, "recall": 100.0 * r, "f": 100.0 * f,
            "tp": float(tot[0]), "fp": float(tot[1]), "fn": float(tot[2])}


def correction_prf(sources: Sequence[str], hypotheses: Sequence[str], references: References,
                   beta: float = 0.5) -> dict[str, float]:
    """Corpus-level edit P/R/F_beta in percent (+ integer tp/fp/fn). With several references per
    sentence, each sentence uses the one that maximises the corpus F so far (ChERRANT / M2 scorer)."""
    return _edit_prf(sources, hypotheses, references, beta, lambda e: e)


def detection_prf(sources: Sequence[str], hypotheses: Sequence[str], references: References,
                  beta: float = 0.5) -> dict[str, float]:
    """Span-level detection (ChERRANT-style span matching; not SIGHAN's, whose units are sentences:
    csc_metrics): `correction_prf` on the edits' (start, end) spans only. A hypothesis edit is a true positive
    when a reference edits the same source span, whatever either writes there. A model can find the wrong
    characters before it learns which character to write; this says whether it does. A span counts as often
    as both the hypothesis and the reference have it (never more TPs than the hypothesis has edits)."""
    return _edit_prf(sources, hypotheses, references, beta, _spans, _clipped_match)
