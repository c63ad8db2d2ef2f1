"""SIGHAN-2015's sentence-level scores of a spelling corrector, in percent (Tseng et al., 2015, "Introduction
to SIGHAN 2015 Bake-off for Chinese Spelling Check"): the figures the bake-off reports beside each other.

* ``sentence_prf``: detection and correction P/R/F1. A sentence is a detection TP when the positions its
  output changes are exactly the gold ones (at least one), a correction TP when the characters written there
  are the gold ones too. P = TP / sentences the system changed, R = TP / sentences with gold errors; an empty
  denominator gives 0 (FASpell's script, which pycorrector ships as compute_corrector_prf_faspell).
* ``sentence_rates``: the false-positive rate (of the sentences without an error, the share the output
  changes: FP / (FP + TN)) and detection and correction accuracy (the share of all sentences whose changed
  positions, resp. changes, are exactly the gold ones; an error-free sentence left alone is right at both).

These are SIGHAN's units, whole sentences; ``edit_metrics.detection_prf`` is another measure, ChERRANT-style
span matching per edit, which SIGHAN does not use. On a test half where 156 of 334 sentences have no error
(csc), precision and F alone hide what a corrector does to right sentences: the false-positive rate says it.
"""

from __future__ import annotations

from collections.abc import Sequence

from .edit_metrics import Counts, Edit, References, _corpus_counts, _multi_refs, _prf, char_edits


def _changes(source: str, output: str) -> frozenset[Edit]:
    """What an output changes, in the tool's units: (i, i + 1, character) per position that differs when the
    output keeps the source's length (SIGHAN pairs do); an output of another length has no positions of its
    own, so its ChERRANT edits stand in (a deletion of a wrong character still names its position)."""
    src, out = "".join(source.split()), "".join(output.split())
    if len(src) == len(out):
        return frozenset((i, i + 1, b) for i, (a, b) in enumerate(zip(src, out)) if a != b)
    return frozenset(char_edits(src, out))


def _sentence_counts(hyp: frozenset[Edit], ref: frozenset[Edit], detection: bool) -> Counts:
    same = {e[:2] for e in hyp} == {e[:2] for e in ref} if detection else hyp == ref
    tp = int(bool(hyp) and same)
    return tp, int(bool(hyp)) - tp, int(bool(ref)) - tp


def _all_changes(sources: Sequence[str], hypotheses: Sequence[str], references: References
                 ) -> list[tuple[frozenset[Edit], list[frozenset[Edit]]]]:
    """Each sentence's output changes and each of its references' changes, in the tool's units."""
    if len(sources) != len(hypotheses):
        raise ValueError(f"sources and hypotheses differ in length: {len(sources)} vs {len(hypotheses)}")
    refs = _multi_refs(references, len(hypotheses))
    return [(_changes(src, hyp), [_changes(src, r) for r in rs]) for src, hyp, rs in zip(sources, hypotheses, refs)]


def sentence_prf(sources: Sequence[str], hypotheses: Sequence[str], references: References) -> dict[str, float]:
    """SIGHAN-2015 sentence-level detection and correction P/R/F1 in percent (see the module docstring); with
    several references, each sentence is scored against the one that maximises the corpus F1 so far."""
    changes = _all_changes(sources, hypotheses, references)
    out: dict[str, float] = {}
    empty = 0.0  # the tool's rule for an empty denominator, in the reference choice as in the report
    for level, detection in (("det", True), ("cor", False)):
        tot = _corpus_counts(([_sentence_counts(h, r, detection) for r in rs] for h, rs in changes), 1.0, empty)
        for name, v in zip(("p", "r", "f1"), _prf(*tot, 1.0, empty)):
            out[f"{level}_{name}"] = 100.0 * v
    return out


def sentence_rates(sources: Sequence[str], hypotheses: Sequence[str], references: References) -> dict[str, float]:
    """SIGHAN-2015's false-positive rate and sentence-level detection and correction accuracy in percent (see
    the module docstring). With several references a sentence is right when it is right against one of them,
    and it is error-free (in the false-positive rate's denominator) when every reference leaves it as it is;
    no error-free sentence gives a rate of 0."""
    changes = _all_changes(sources, hypotheses, references)
    clean = [bool(h) for h, rs in changes if not any(rs)]
    det = sum(any({e[:2] for e in h} == {e[:2] for e in r} for r in rs) for h, rs in changes)
    cor = sum(any(h == r for r in rs) for h, rs in changes)
    n = max(1, len(changes))
    return {"fpr": 100.0 * sum(clean) / len(clean) if clean else 0.0,
            "det_acc": 100.0 * det / n, "cor_acc": 100.0 * cor / n}
