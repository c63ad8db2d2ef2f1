"""Deciding claims: per-example statistics, a hierarchical paired bootstrap and Holm's correction.

A run's test score is one draw twice over: of the seed (initial weights, data order) and of the test set. The
paired t-test over 3 seeds sees only the first; a steady 0.5-point gap on one fixed test set passes it. Here:

* **Per-example statistics** (`example_stats`): each task type turns (records, predictions) into one row of
  numbers per example from which its main metric is recomputed exactly on any resample of the examples
  (`REDUCERS`): sufficient statistics where the metric decomposes (accuracy, F1 counts, BLEU's n-gram counts),
  raw (score, label) rows where it does not (ROC-AUC, Spearman). Runs write them to ``example_stats.json``.
* **The hierarchical paired bootstrap** (`Bootstrap`; Koehn 2004, Dror et al. 2018) has two levels. The test
  level resamples the test examples with replacement; both rows of a difference, and every seed, see the same
  example indices, and the seeds' mean difference is recomputed on each resample. The seed level adds the
  sampling error of a mean over n seeds: (s / sqrt(n)) T with s the seeds' standard deviation of the difference
  and T ~ Student's t with n - 1 degrees of freedom, one draw per replicate. Resampling 3 seeds with replacement
  instead (the textbook hierarchical bootstrap) shrinks their variance by (n - 1) / n and its 95% interval to
  the three seeds' [min, max]: with seed noise dominant, a true null difference then fell outside the
  interval in ~21% of repetitions (tests/test_stats_bootstrap.py). The replicates' 2.5 and 97.5 percentiles
  are the 95% CI of the difference, and ``p = 2 min(P*(d <= 0), P*(d >= 0))`` its two-sided p-value.
* **Holm's step-down correction** (`holm`) over the family of a report's claims.
"""

from __future__ import annotations

import hashlib
import json
import math
import statistics
import zlib
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["ALPHA", "Bootstrap", "N_BOOT", "REDUCERS", "bootstrap_for", "decision_rule_text", "difference_entry",
           "example_stats", "examples_key", "holm", "load_example_stats", "paired_test", "recompute"]

ALPHA = 0.05
N_BOOT = 10_000
STATS_FILE = "example_stats.json"
# Replicates drawn at once: a [chunk, examples] count matrix stays a few MB for test sets of thousands.
_CHUNK = 1000

Reducer = Callable[[np.ndarray, np.ndarray], np.ndarray]
Finish = Callable[[np.ndarray], np.ndarray]


# ---------------------------------------------------------------------------------------- reducers
# A reducer takes the rows X [n, k] and example counts C [B, n] (how often each example is in each resample) and
# returns the metric of every resample [B], in the task's percent scale; C = ones([1, n]) is the test set itself.
# Most metrics need only the column sums S = C @ X [B, k] (`FINISH`: S -> metric), which the bootstrap computes
# for every run of a task in one product; the rest read the ranks (`RANKED`).
def _div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, 0 where den is 0 (the metrics' convention for an empty denominator)."""
    return np.divide(num, den, out=np.zeros_like(num, dtype=np.float64), where=den != 0)


def _ratio(S: np.ndarray) -> np.ndarray:
    """Rows [value, weight]: sum(value) / sum(weight); a mean (accuracy, span F1, ROUGE-L) or a mean over the
    examples that count (matching's groups with a positive)."""
    return _div(S[:, 0], S[:, 1])


def _f1(S: np.ndarray) -> np.ndarray:
    """Rows [tp, fp, fn]: F1 = 2tp / (2tp + fp + fn), 0 without any true positive (entity F1, binary F1)."""
    tp, fp, fn = S.T
    return 100.0 * _div(2 * tp, 2 * tp + fp + fn)


def _precision(S: np.ndarray) -> np.ndarray:
    tp, fp, _ = S.T
    return 100.0 * _div(tp, tp + fp)


def _recall(S: np.ndarray) -> np.ndarray:
    tp, _, fn = S.T
    return 100.0 * _div(tp, tp + fn)


def _edit_f05(S: np.ndarray) -> np.ndarray:
    """Rows [tp, fp, fn] of character edits: ChERRANT's F0.5, whose P is 1 with no edit made and R is 1 with
    none to make (edit_metrics._prf)."""
    tp, fp, fn = S.T
    p = np.where(tp + fp > 0, _div(tp, tp + fp), 1.0)
    r = np.where(tp + fn > 0, _div(tp, tp + fn), 1.0)
    return 100.0 * _div(1.25 * p * r, 0.25 * p + r)


def _macro_f1(S: np.ndarray) -> np.ndarray:
    """Rows [tp, fp, fn] per class (one-hot confusion): the mean F1 over the classes seen in gold or predictions
    of the resample (scikit-learn's default), as metrics.macro_f1."""
    S = S.reshape(S.shape[0], -1, 3)
    tp, fp, fn = S[..., 0], S[..., 1], S[..., 2]
    seen = (tp + fp + fn) > 0
    f1 = _div(2 * tp, 2 * tp + fp + fn)
    return 100.0 * _div((f1 * seen).sum(1), seen.sum(1).astype(np.float64))


def _bleu(S: np.ndarray) -> np.ndarray:
    """Rows [hyp_len, ref_len, matches_1..N, totals_1..N] (sacrebleu's segment statistics): corpus BLEU from
    the summed counts with sacrebleu's exp smoothing (BLEU.compute_bleu)."""
    N = (S.shape[1] - 2) // 2
    sys_len, ref_len, correct, total = S[:, 0], S[:, 1], S[:, 2:2 + N], S[:, 2 + N:]
    bp = np.where(sys_len >= ref_len, 1.0, np.exp(1 - _div(ref_len, sys_len)))
    bp = np.where(sys_len > 0, bp, 0.0)
    zero = correct == 0
    smooth = 2.0 ** np.cumsum(zero, axis=1)  # each order without a match halves the next such order's precision
    prec = np.where(zero, _div(np.ones_like(total), smooth * total), _div(correct, total))
    with np.errstate(divide="ignore"):
        score = bp * np.exp(np.log(prec).mean(1))
    return np.where((total > 0).all(1) & (~zero).any(1), 100.0 * score, 0.0)


def _levels(v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The order that sorts `v`, where each run of equal values starts in that order, and each item's run."""
    order = np.argsort(v, kind="mergesort")
    sv = v[order]
    starts = np.flatnonzero(np.r_[True, sv[1:] != sv[:-1]])
    inv = np.empty(len(v), dtype=np.int64)
    inv[order] = np.cumsum(np.r_[True, sv[1:] != sv[:-1]]) - 1
    return order, starts, inv


def _auc(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Rows [score, is_positive]: ROC-AUC (Mann-Whitney U, ties half) with each example counted as often as the
    resample holds it; NaN where a resample holds one class only (as metrics.roc_auc)."""
    pos = X[:, 1] > 0.5
    neg_scores = X[~pos, 0]
    order, starts, _ = _levels(neg_scores)
    levels = neg_scores[order][starts]
    cneg = np.add.reduceat(C[:, np.flatnonzero(~pos)[order]], starts, axis=1) if len(starts) else C[:, :0]
    # per positive: the negatives strictly below its score (a prefix of the levels) and those tied with it
    cum = np.concatenate([np.zeros((len(C), 1), C.dtype), np.cumsum(cneg, axis=1)], axis=1)
    below = np.searchsorted(levels, X[pos, 0], side="left")
    upto = np.searchsorted(levels, X[pos, 0], side="right")
    cpos = C[:, pos]
    u = (cpos * (cum[:, below] + cum[:, upto])).sum(1) / 2
    n_pos, n_neg = cpos.sum(1), cum[:, -1]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where((n_pos > 0) & (n_neg > 0), 100.0 * u / (n_pos * n_neg), np.nan)


def _weighted_pearson(x: np.ndarray, y: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Pearson (percent) of x, y ([B, n] or [n]) with weights C [B, n]; 0 where either is constant."""
    n = C.sum(1, keepdims=True)
    dx = x - (C * x).sum(1, keepdims=True) / n
    dy = y - (C * y).sum(1, keepdims=True) / n
    vx, vy, cov = (C * dx * dx).sum(1), (C * dy * dy).sum(1), (C * dx * dy).sum(1)
    # a constant column leaves float dust in its variance, not 0
    tiny = 1e-20 * np.maximum((C * x * x).sum(1), 1e-300), 1e-20 * np.maximum((C * y * y).sum(1), 1e-300)
    flat = (vx <= tiny[0]) | (vy <= tiny[1])
    return np.where(flat, 0.0, 100.0 * cov / np.sqrt(np.where(flat, 1.0, vx * vy)))


def _pearson(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Rows [gold, prediction]."""
    return _weighted_pearson(X[None, :, 0], X[None, :, 1], C)


def _weighted_ranks(v: np.ndarray, C: np.ndarray) -> np.ndarray:
    """The 1-based rank of each example in each resample, ties (and copies) sharing their mean rank."""
    order, starts, inv = _levels(v)
    cnt = np.add.reduceat(C[:, order], starts, axis=1)
    rank = np.cumsum(cnt, axis=1) - cnt + (cnt + 1) / 2
    return rank[:, inv]


def _spearman(X: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Rows [gold, prediction]: Pearson of the resample's ranks."""
    return _weighted_pearson(_weighted_ranks(X[:, 0], C), _weighted_ranks(X[:, 1], C), C)


# A task type's rows name one of these (example_stats' "reduce"); a new metric is one entry.
FINISH: dict[str, Finish] = {"ratio": _ratio, "f1": _f1, "precision": _precision, "recall": _recall,
                             "edit_f0.5": _edit_f05, "macro_f1": _macro_f1, "bleu": _bleu}
RANKED: dict[str, Reducer] = {"auc": _auc, "pearson": _pearson, "spearman": _spearman}


def _summed(finish: Finish) -> Reducer:
    return lambda X, C: finish(C @ X)


REDUCERS: dict[str, Reducer] = {**{k: _summed(f) for k, f in FINISH.items()}, **RANKED}


def example_stats(metric: str, reduce: str, rows: Sequence[Sequence[float]]) -> dict[str, Any]:
    """What a task type's ``example_stats`` returns: the metric's name, its reducer and one row per example."""
    if reduce not in REDUCERS:
        raise ValueError(f"unknown reducer {reduce!r}; valid: {', '.join(REDUCERS)}")
    return {"metric": metric, "reduce": reduce, "rows": [[float(v) for v in r] for r in rows]}


def examples_key(recs: Sequence[dict[str, Any]]) -> str:
    """A fingerprint of the scored examples in their order (their ids, else their position and content): runs
    are resampled as pairs example by example, so two runs scored on different sets of one size must not be."""
    h = hashlib.sha256()
    for i, r in enumerate(recs):
        h.update((str(r["id"]) if "id" in r else f"{i}:{json.dumps(r, sort_keys=True, ensure_ascii=False)}").encode())
        h.update(b"\x00")
    return h.hexdigest()[:16]


def _matrix(stats: dict[str, Any]) -> np.ndarray:
    rows = stats["rows"]
    return np.asarray(rows, dtype=np.float64).reshape(len(rows), len(rows[0]) if rows else 0)


def recompute(stats: dict[str, Any], counts: np.ndarray | None = None) -> np.ndarray | float:
    """The metric of `stats` on the whole test set (a float), or on each resample of `counts` [B, n]."""
    X = _matrix(stats)
    if counts is None:
        return float(REDUCERS[stats["reduce"]](X, np.ones((1, len(X))))[0])
    return REDUCERS[stats["reduce"]](X, np.asarray(counts, dtype=np.float64))


def load_example_stats(run: Path, split: str = "test") -> dict[str, dict[str, Any]] | None:
    """{task: stats} of `split` written by the run in `run` (a task-specific run keeps each task's in its own
    sub-folder); None where it wrote none."""
    files = [run / STATS_FILE, *sorted(run.glob(f"*/{STATS_FILE}"))]
    out: dict[str, dict[str, Any]] = {}
    for f in files:
        if f.is_file():
            for task, per in json.loads(f.read_text(encoding="utf-8")).items():
                if isinstance(per, dict) and split in per:
                    out.setdefault(task, per[split])
    return out or None


# ---------------------------------------------------------------------------------------- the bootstrap
def _counts(rng: np.random.Generator, B: int, n: int) -> np.ndarray:
    """[B, n]: how often each of n examples is drawn in each of B resamples of n with replacement."""
    idx = rng.integers(0, n, size=(B, n)) + (np.arange(B) * n)[:, None]
    return np.bincount(idx.ravel(), minlength=B * n).reshape(B, n).astype(np.float32)


def _key(text: str) -> int:
    return zlib.crc32(text.encode("utf-8"))


class Bootstrap:
    """The hierarchical paired bootstrap over one comparison: `runs` maps each row to its per-seed {task:
    example stats} (None: a run without them). Every row, seed and task sees the same resamples (one draw of
    each task's test examples per replicate, shared by all seeds, since every run is scored on the same test set
    and its sampling error is common to them; one Student-t draw per replicate for the seed level, see the
    module docstring). Deterministic given `seed`."""

    def __init__(self, runs: dict[str, Sequence[dict[str, dict[str, Any]] | None]], tasks: Sequence[str],
                 n_boot: int = N_BOOT, seed: int = 0) -> None:
        self.runs, self.tasks, self.n_boot, self.seed = runs, list(tasks), n_boot, seed
        n_seeds = {len(v) for v in runs.values()}
        if len(n_seeds) > 1:
            raise ValueError(f"rows differ in their number of seeds: {sorted(n_seeds)}")
        self.n_seeds = n_seeds.pop() if n_seeds else 0
        # the seed level's standard Student-t draws (df = seeds - 1); none to draw with one seed
        rng = np.random.default_rng([seed, _key("seeds")])
        self.seed_t = rng.standard_t(self.n_seeds - 1, n_boot) if self.n_seeds > 1 else np.zeros(n_boot)
        self._draws: dict[str, dict[str, np.ndarray] | None] = {}

    def missing(self, row: str, task: str) -> str | None:
        """Why `row` has no bootstrap on `task` (None: it has one)."""
        per = self.runs.get(row)
        if per is None:
            return f"no row {row!r}"
        if any(s is None or task not in s for s in per):
            return "a run wrote no per-example statistics"
        found = [s[task] for r in self.runs.values() for s in r if s and task in s]
        sizes = {len(st["rows"]) for st in found}
        if len(sizes) > 1:
            return f"the runs scored different test sets ({', '.join(map(str, sorted(sizes)))} examples)"
        if len({st.get("examples") for st in found}) > 1:  # a run of an older version keeps no key: None
            return "the runs scored different test sets (of one size: their examples differ)"
        metrics = {st["metric"] for st in found}
        if len(metrics) > 1:
            return f"the runs kept statistics of different metrics ({', '.join(sorted(metrics))})"
        return None

    def _task_draws(self, task: str) -> dict[str, np.ndarray] | None:
        """{row: [seeds, B]}: the metric of each row's run of each seed on each resample of `task`'s examples,
        for the rows that have statistics."""
        if task not in self._draws:
            rows = [r for r in self.runs if self.missing(r, task) is None]
            if not rows:
                self._draws[task] = None
                return None
            runs = [(r, k, self.runs[r][k][task]) for r in rows for k in range(self.n_seeds)]  # type: ignore[index]
            n = len(runs[0][2]["rows"])
            # runs whose metric needs only column sums share one product per chunk (float32: counts and the
            # sums of a few thousand rows are exact enough for percentiles, and half the memory traffic)
            summed = [x for x in runs if x[2]["reduce"] in FINISH]
            X = (np.concatenate([_matrix(st) for _, _, st in summed], axis=1).astype(np.float32) if summed
                 else np.zeros((n, 0), np.float32))
            cols = np.cumsum([0] + [len(st["rows"][0]) if st["rows"] else 0 for _, _, st in summed])
            ranked = [(r, k, _matrix(st), RANKED[st["reduce"]]) for r, k, st in runs if st["reduce"] in RANKED]
            out = {r: np.empty((self.n_seeds, self.n_boot)) for r in rows}
            for c, b0 in enumerate(range(0, self.n_boot, _CHUNK)):
                b1 = min(self.n_boot, b0 + _CHUNK)
                C = _counts(np.random.default_rng([self.seed, _key(task), c]), b1 - b0, n)
                S = (C @ X).astype(np.float64)
                for j, (r, k, st) in enumerate(summed):
                    out[r][k, b0:b1] = FINISH[st["reduce"]](S[:, cols[j]:cols[j + 1]])
                for r, k, Xr, reduce in ranked:
                    out[r][k, b0:b1] = reduce(Xr, C)  # scores keep float64: float32 could tie distinct ones
            self._draws[task] = out
        return self._draws[task]

    def difference(self, a: str, b: str, key: str) -> dict[str, Any] | None:
        """`a` minus `b` on task `key` (or on "average", the mean over the tasks): the observed difference
        (mean over seeds, on the whole test set), its 95% percentile CI and bootstrap p-value; None where a
        run lacks per-example statistics (`missing` says why)."""
        tasks = self.tasks if key == "average" else [key]
        if any(self.missing(r, t) for r in (a, b) for t in tasks) or not self.n_seeds:
            return None
        d = np.zeros((self.n_seeds, self.n_boot))
        per_seed = np.zeros(self.n_seeds)  # each seed's difference on the whole test set
        for t in tasks:
            draws = self._task_draws(t)
            assert draws is not None
            d += (draws[a] - draws[b]) / len(tasks)
            per_seed += _observed_diffs(self.runs[a], self.runs[b], t) / len(tasks)
        sd = float(np.std(per_seed, ddof=1)) if self.n_seeds > 1 else 0.0
        boot = d.mean(0) + sd / math.sqrt(self.n_seeds) * self.seed_t
        boot = boot[~np.isnan(boot)]
        lo, hi = np.percentile(boot, [100 * ALPHA / 2, 100 * (1 - ALPHA / 2)]) if len(boot) else (math.nan, math.nan)
        return {"diff": float(per_seed.mean()), "ci": [float(lo), float(hi)],
                "p": bootstrap_p(boot, float(per_seed.mean())),
                "n_boot": self.n_boot, "test": "bootstrap", "seed_sd": sd,
                # one seed has no spread to measure: its interval holds the test set's noise only
                "seed_level": "student-t" if self.n_seeds > 1 else "none (one seed)"}


def _observed_diffs(a: Sequence[dict[str, dict[str, Any]] | None], b: Sequence[dict[str, dict[str, Any]] | None],
                    task: str) -> np.ndarray:
    """Per seed, a's metric minus b's, each recomputed from its whole test set's rows."""
    return np.array([recompute(x[task]) - recompute(y[task]) for x, y in zip(a, b)], dtype=np.float64)  # type: ignore[index]


def bootstrap_p(boot: np.ndarray, observed: float | None = None) -> float:
    """Two-sided p-value of a bootstrap distribution of a difference: twice the share of replicates on the far
    side of 0 from the `observed` difference (a replicate at 0 counts), with the +1 that keeps it above 0;
    without `observed`, the smaller side. Tied to the observed sign, a small p always backs the direction the
    claim reads off the observed difference (a biased metric whose replicates sit mostly across 0 gets p ~ 1)."""
    if not len(boot):
        return math.nan
    n = len(boot)
    below, above = int((boot <= 0).sum()), int((boot >= 0).sum())
    tail = min(below, above) if observed is None else (below if observed > 0 else above if observed < 0 else n)
    return min(1.0, 2 * (tail + 1) / (n + 1))


# ---------------------------------------------------------------------------------------- the seeds' test
def paired_test(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided paired t-test p-value over seeds; None with fewer than 2 pairs or when every seed gives the
    same difference (no spread: the test is undefined, and two identical differences, e.g. two tied
    predictions of a majority class, are no evidence either way). Equal values: p = 1."""
    if len(a) != len(b) or len(a) < 2:
        return None
    d = [x - y for x, y in zip(a, b)]
    # Differences equal up to float rounding (0.3 against 1.3 - 1.0) are the same gap: scipy would see a
    # spread of 1e-17 and call any such gap certain.
    tol = 1e-9 * max(1.0, *map(abs, [*a, *b]))
    if statistics.stdev(d) <= tol:
        return 1.0 if abs(statistics.fmean(d)) <= tol else None
    from scipy import stats

    return float(stats.ttest_rel(a, b).pvalue)


def difference_entry(a_values: Sequence[float], b_values: Sequence[float], boot: Bootstrap | None, a: str, b: str,
                     key: str) -> dict[str, Any]:
    """Row `a` minus row `b` on `key` (a task or "average"; `*_values`: their scores per seed): the bootstrap's
    difference, 95% CI and p where every run kept per-example statistics, else the seeds' paired t-test
    (``ci`` None, ``why`` says what was missing); ``p_t`` is the t-test's p either way, ``beyond_noise`` whether
    the interval (or, without one, the t-test) excludes 0 at 5%, uncorrected."""
    p_t = paired_test(a_values, b_values)
    out = boot.difference(a, b, key) if boot is not None else None
    if out is None:
        tasks = boot.tasks if boot is not None and key == "average" else [key]
        why = next((w for r in (a, b) for t in tasks if (w := boot.missing(r, t))), None) if boot else None
        out = {"diff": statistics.fmean(a_values) - statistics.fmean(b_values), "ci": None, "p": p_t,
               "test": "t-test", "why": why or "no per-example statistics"}
    ci = out["ci"]
    out["p_t"] = p_t
    out["beyond_noise"] = bool(ci[0] > 0 or ci[1] < 0) if ci is not None else p_t is not None and p_t < ALPHA
    return out


def bootstrap_for(dirs: dict[str, Sequence[Path]], tasks: Sequence[str], split: str = "test",
                  n_boot: int = N_BOOT, seed: int = 0) -> Bootstrap:
    """The bootstrap of a comparison whose row `r` ran its seeds in ``dirs[r]`` (from their example_stats.json)."""
    return Bootstrap({r: [load_example_stats(d, split) for d in ds] for r, ds in dirs.items()}, tasks, n_boot, seed)


# ---------------------------------------------------------------------------------------- Holm
def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input's order: the i-th smallest p times (m - i + 1), made
    non-decreasing, capped at 1. A claim holds at family-wise level alpha when its adjusted p < alpha."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    out = [0.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * float(pvalues[i])))
        out[i] = running
    return out


def decision_rule_text(n_claims: int, n_boot: int = N_BOOT) -> str:
    """The decision rule, as the report's Protocol section states it."""
    return (f"A claim holds when the difference it names (claimed-better row minus the other, test split) is "
            f"positive and its hierarchical paired bootstrap p-value, after Holm's step-down correction over the "
            f"report's {n_claims} claim{'s' if n_claims != 1 else ''}, is below {ALPHA:g} (the interval it "
            f"implies excludes 0). Each of {n_boot:,} bootstrap replicates resamples the test examples with "
            "replacement (the same examples for both rows and every seed; Koehn 2004, Dror et al. 2018) and "
            "recomputes each task's metric from per-example statistics, then adds the seed level: the standard "
            "error of the mean over the seeds times a Student-t draw with seeds - 1 degrees of freedom (a "
            "bootstrap over 3 seeds would understate their spread); the 95% interval is the replicates' 2.5 and "
            "97.5 percentiles. Table cells give that interval uncorrected; "
            "the seeds' paired t-test is shown beside it. Where a run kept no per-example statistics, the "
            "t-test's p stands in (said where it happens).")
