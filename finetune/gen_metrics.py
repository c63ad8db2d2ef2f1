"""Generation metrics, in percent: ROUGE-L, BLEU-2/4 and character-level F0.5 for correction tasks.

* ``bleu(hyps, refs, n)``: corpus BLEU-n computed by ``sacrebleu`` (exp smoothing, i.e. NIST / nltk
  ``method3``, the smoothing of the public SkillNet-NLG scripts).
* ``rouge_l(hyps, refs)``: mean over sentences of the ROUGE-L F1 computed by ``rouge-score`` (max over
  the references of a sentence).
* ``correction_prf(sources, hyps, refs)`` (from ``edit_metrics``): ChERRANT-style (MuCGEC ``scorers/ChERRANT``) character-level
  edits source->hypothesis and source->reference, matched as (start, end, correction) and counted over
  the corpus; P, R and F0.5. ``detection_prf``: the same on the edits' (start, end) spans only (found the
  wrong characters, whatever it wrote there): span-level detection, ChERRANT-style span matching, which is
  not SIGHAN's. SIGHAN-2015's own scores count whole sentences: ``csc_metrics`` (P/R/F1, false-positive rate,
  accuracy).
* ``score_generation(names, sources, hyps, refs, lang)``: the entry point for the trainer.

Tokenisation (docs/nlg_data.md, "Metrics"): for ``lang="zh"`` every CJK character (and every other
non-space, non-alphanumeric character such as punctuation) is one token and each run of ASCII letters/digits
is one token, so Chinese is scored per character and Latin words inside Chinese text per word; whitespace only
separates. ``lang="en"`` uses each library's standard English tokeniser (sacrebleu ``13a``, rouge-score's
lower-casing alphanumeric tokeniser). Correction F0.5 is always per character, whitespace removed.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence
from typing import Any

from . import csc_metrics
from .edit_metrics import References, _levenshtein, _multi_refs, correction_prf, detection_prf

LANGS = ("zh", "en")
CORRECTION_METRICS = ("f0.5", "edit_p", "edit_r")  # ChERRANT edit P/R/F0.5 (correction_prf)
# Whether a corrector finds the wrong characters, whatever it writes there: span-level detection (det_*:
# ChERRANT-style span matching, detection_prf, not SIGHAN's) and SIGHAN-2015's sentence-level F1
# (csc_metrics.sentence_prf); they need the sources, as the correction metrics do
DETECTION_METRICS = ("det_f0.5", "det_p", "det_r", "sent_det_f1", "sent_cor_f1")
# SIGHAN-2015's other sentence-level figures (csc_metrics.sentence_rates): what a corrector does to the
# sentences without an error (false-positive rate), and the share of sentences it gets right
SENTENCE_METRICS = ("sent_fpr", "sent_det_acc", "sent_cor_acc")
GEN_METRICS = ("rouge_l", "bleu_2", "bleu_4", *CORRECTION_METRICS, *DETECTION_METRICS, *SENTENCE_METRICS,
               "distinct", "repetition", "char_accuracy")
# Each sentence-level name: (the csc_metrics function, its key)
_SENTENCE_SCORES = {"sent_det_f1": ("sentence_prf", "det_f1"), "sent_cor_f1": ("sentence_prf", "cor_f1"),
                    "sent_fpr": ("sentence_rates", "fpr"), "sent_det_acc": ("sentence_rates", "det_acc"),
                    "sent_cor_acc": ("sentence_rates", "cor_acc")}
# A run of ASCII letters/digits is one token; any other non-space character (CJK, punctuation) is one token.
_TOKEN_RE = re.compile(r"[A-Za-z0-9]+|\S")


def gen_tokens(text: str, lowercase: bool = False) -> list[str]:
    """Tokens of `text` for BLEU/ROUGE with lang="zh" (see the module docstring)."""
    return _TOKEN_RE.findall(text.lower() if lowercase else text)


def _check_lang(lang: str) -> None:
    if lang not in LANGS:
        raise ValueError(f"unknown lang {lang!r}; valid: {', '.join(LANGS)}")


# --------------------------------------------------------------------------- BLEU


def bleu(hypotheses: Sequence[str], references: References, n: int = 4, *, lang: str = "zh",
         lowercase: bool = False) -> float:
    """Corpus-level BLEU-n (percent): n-gram counts summed over the corpus, uniform weights 1/n,
    the brevity penalty against the closest reference length, exp smoothing of zero counts."""
    if not hypotheses:
        _check_lang(lang)
        _multi_refs(references, 0)
        return 0.0
    metric, hyps, streams = _bleu_inputs(hypotheses, references, n, lang, lowercase)
    return float(metric.corpus_score(hyps, streams).score)


def bleu_sentence_stats(hypotheses: Sequence[str], references: References, n: int = 4, *, lang: str = "zh",
                        lowercase: bool = False) -> list[list[int]]:
    """Each sentence's sacrebleu statistics [hyp_len, ref_len, matches_1..n, totals_1..n]: `bleu` is the score of
    their sums, so a resample of the sentences (finetune/stats.py's bootstrap) is scored from them exactly."""
    if not hypotheses:
        return []
    metric, hyps, streams = _bleu_inputs(hypotheses, references, n, lang, lowercase)
    return [[int(x) for x in row] for row in metric._extract_corpus_statistics(hyps, streams)]


def _bleu_inputs(hypotheses: Sequence[str], references: References, n: int, lang: str,
                 lowercase: bool) -> tuple[Any, list[str], list[list[str | None]]]:
    """sacrebleu's BLEU as `bleu` configures it, the prepared hypotheses and the reference streams."""
    from sacrebleu.metrics import BLEU  # lazy: only generation tasks need it

    _check_lang(lang)
    refs = _multi_refs(references, len(hypotheses))
    if lang == "zh":
        def prep(s: str) -> str:
            return " ".join(gen_tokens(s, lowercase))
        tokenize = "none"  # already split; sacrebleu splits on whitespace
    else:
        def prep(s: str) -> str:
            return s
        tokenize = "13a"
    # sacrebleu takes reference *streams*; a sentence with fewer references has None in the later ones.
    n_streams = max(len(r) for r in refs)
    streams = [[prep(r[k]) if k < len(r) else None for r in refs] for k in range(n_streams)]
    metric = BLEU(tokenize=tokenize, max_ngram_order=n, smooth_method="exp", lowercase=lowercase and lang == "en")
    return metric, [prep(h) for h in hypotheses], streams


# --------------------------------------------------------------------------- ROUGE-L


class _GenTokenizer:
    """rouge-score's tokenizer interface (its default drops every non-ASCII character, i.e. all Chinese)."""

    def __init__(self, lowercase: bool) -> None:
        self.lowercase = lowercase

    def tokenize(self, text: str) -> list[str]:
        return gen_tokens(text, self.lowercase)


@functools.lru_cache(maxsize=4)
def _rouge_scorer(lang: str, lowercase: bool) -> Any:
    from rouge_score import rouge_scorer  # lazy: imports nltk (~2 s)

    tok = _GenTokenizer(lowercase) if lang == "zh" else None
    return rouge_scorer.RougeScorer(["rougeL"], tokenizer=tok)


def rouge_l(hypotheses: Sequence[str], references: References, *, lang: str = "zh",
            lowercase: bool = False) -> float:
    """Mean over sentences of the ROUGE-L F1 (LCS-based, beta = 1), best reference per sentence."""
    _check_lang(lang)
    refs = _multi_refs(references, len(hypotheses))
    if not hypotheses:
        return 0.0
    scorer = _rouge_scorer(lang, lowercase)
    total = sum(scorer.score_multi(r, h)["rougeL"].fmeasure for h, r in zip(hypotheses, refs))
    return 100.0 * total / len(hypotheses)


# --------------------------------------------------------------------------- entry point


def distinct_share(hypotheses: Sequence[str]) -> float:
    """Percent of outputs that are distinct (100: every input got its own text; a model stuck at the init
    plateau answers every input alike and scores 100/n)."""
    return 100.0 * len(set(hypotheses)) / len(hypotheses) if hypotheses else 0.0


def repetition_rate(hypotheses: Sequence[str], n: int = 4, lang: str = "zh") -> float:
    """Percent of token n-grams that repeat an earlier n-gram of the same output, over all outputs
    ("我们们们们们" repeats; a fluent sentence rarely does)."""
    total = repeated = 0
    for h in hypotheses:
        toks = gen_tokens(h) if lang == "zh" else h.split()
        seen: set[tuple[str, ...]] = set()
        for i in range(len(toks) - n + 1):
            g = tuple(toks[i:i + n])
            total += 1
            repeated += g in seen
            seen.add(g)
    return 100.0 * repeated / total if total else 0.0


def char_accuracy(hypotheses: Sequence[str], references: References, lang: str = "zh") -> float:
    """100 x (1 - character error rate): one minus the summed Levenshtein distances over the summed
    reference lengths, in metric tokens (``lang="zh"``: characters, a Latin/number run as one; ``en``:
    words); with several references, the closest. For spelling correction it says whether a model keeps
    the sentence: copying the source scores the share of characters that were right already, and a model
    that drops or invents characters falls below it even when it fixes none."""
    refs = _multi_refs(references, len(hypotheses))
    dist = total = 0
    for h, rs in zip(hypotheses, refs):
        toks = [gen_tokens(r) if lang == "zh" else r.split() for r in rs]
        ht = gen_tokens(h) if lang == "zh" else h.split()
        d, n = min(((_levenshtein(ht, t), len(t)) for t in toks), key=lambda x: x[0])
        dist += d
        total += n
    return max(0.0, 100.0 * (1.0 - dist / total)) if total else 0.0


def score_generation(metric_names: Sequence[str], sources: Sequence[str] | None, hypotheses: Sequence[str],
                     references: References, lang: str = "zh", lowercase: bool = False) -> dict[str, float]:
    """{name: value in percent} for each requested name of GEN_METRICS.

    `references` is one string per hypothesis or a list of references per hypothesis. `sources` is needed
    only by CORRECTION_METRICS, DETECTION_METRICS and SENTENCE_METRICS. `lowercase`: compare BLEU/ROUGE-L
    case-insensitively (a lower-casing vocab, as bert-base-chinese's, cannot produce upper case).
    """
    unknown = [m for m in metric_names if m not in GEN_METRICS]
    if unknown:
        raise ValueError(f"unknown generation metric(s) {unknown}; valid: {', '.join(GEN_METRICS)}")
    _check_lang(lang)
    if lowercase:  # every metric, the correction edits included (an upper-case letter kept is no edit)
        hypotheses = [h.lower() for h in hypotheses]
        references = [r.lower() if isinstance(r, str) else [x.lower() for x in r] for r in references]
        sources = None if sources is None else [x.lower() for x in sources]
    out: dict[str, float] = {}
    # (F0.5, P, R) names of each edit-level score
    edit_scores = ((*CORRECTION_METRICS, correction_prf), (*DETECTION_METRICS[:3], detection_prf))
    wanted = [x for x in edit_scores if any(m in x[:3] for m in metric_names)]
    sentence = [m for m in metric_names if m in _SENTENCE_SCORES]
    if (wanted or sentence) and sources is None:
        needs = [m for m in metric_names if m in CORRECTION_METRICS or m in DETECTION_METRICS or m in sentence]
        raise ValueError(f"{'/'.join(needs)} need the source sentences (sources=None given)")
    for f_name, p_name, r_name, prf_fn in wanted:
        prf = prf_fn(sources, hypotheses, references, beta=0.5)
        out.update({f_name: prf["f"], p_name: prf["precision"], r_name: prf["recall"]})
    if sentence:
        for fn in dict.fromkeys(_SENTENCE_SCORES[m][0] for m in sentence):
            got = getattr(csc_metrics, fn)(sources, hypotheses, references)
            out.update({m: got[key] for m, (f, key) in _SENTENCE_SCORES.items() if f == fn})
    for m in metric_names:
        if m == "distinct":
            out[m] = distinct_share(hypotheses)
        elif m == "repetition":
            out[m] = repetition_rate(hypotheses, lang=lang)
        elif m == "char_accuracy":
            out[m] = char_accuracy(hypotheses, references, lang=lang)
        elif m == "rouge_l":
            out[m] = rouge_l(hypotheses, references, lang=lang)
        elif m.startswith("bleu_"):
            out[m] = bleu(hypotheses, references, int(m[5:]), lang=lang)
    return {m: out[m] for m in metric_names}
