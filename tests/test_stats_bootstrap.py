"""finetune/stats.py: per-example statistics that recompute every task type's metric on any resample, the
hierarchical paired bootstrap against scipy and a hand-computed case, Holm against statsmodels, and the
claims decided by them."""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from skillnet.finetune import stats as S
from skillnet.finetune.task_types import codec_for
from skillnet.finetune.task_types.classification import ScoredLabel


def _td(metric: str, positive: str | None = None, lang: str = "zh") -> Any:
    return SimpleNamespace(cfg=SimpleNamespace(metric=metric, lang=lang), positive_label=positive, name="t")


def _tags(rng: random.Random, n: int) -> list[str]:
    return [rng.choice(["O", "O", "B-PER", "I-PER", "B-LOC", "I-LOC", "I-ORG"]) for _ in range(n)]


def _cases(rng: random.Random) -> list[tuple[str, Any, list[dict[str, Any]], list[Any]]]:
    """(type, td, records, predictions) with every metric of every built-in task type."""
    n = 60
    out: list[tuple[str, Any, list[dict[str, Any]], list[Any]]] = []
    gold = [rng.choice("abc") for _ in range(n)]
    pred = [g if rng.random() < 0.6 else rng.choice("abcd") for g in gold]
    for m in ("accuracy", "macro_f1"):
        out.append(("classification", _td(m), [{"label": g} for g in gold], pred))
    bgold = [rng.choice("01") for _ in range(n)]
    bpred = [ScoredLabel(str(int(s > 0.5)), s) for s in (round(rng.random(), 1) for _ in range(n))]
    for m in ("accuracy", "macro_f1", "f1", "auc"):
        out.append(("classification", _td(m, "1"), [{"label": g} for g in bgold], bpred))
    recs = [{"labels": _tags(rng, rng.randint(1, 9))} for _ in range(n)]
    preds = [_tags(rng, len(r["labels"])) for r in recs]
    for m in codec_for("ner").metrics:
        out.append(("ner", _td(m), recs, preds))
    reg = [{"label": rng.randint(0, 5)} for _ in range(n)]
    for m in ("pearson", "spearman"):
        out.append(("regression", _td(m), reg, [r["label"] + rng.choice([0, 0, 1, -2]) + 0.5 * rng.random() for r in reg]))
    ctx = "北京大学在海淀区, the campus of Peking University"
    span = [{"answers": [{"text": ctx[i:i + rng.randint(1, 6)]} for i in rng.sample(range(20), 2)]} for _ in range(n)]
    spreds = [ctx[(i := rng.randrange(25)):i + rng.randint(0, 6)] for _ in range(n)]
    for m in codec_for("span").metrics:
        out.append(("span", _td(m), span, spreds))
    groups = []
    for _ in range(n):
        k = rng.randint(2, 5)
        groups.append(({"positives": rng.sample(range(k), rng.randint(0, 2)), "candidates": [f"c{i}" for i in range(k)]},
                       {"candidates": list(range(k)), "scores": [float(rng.randint(0, 2)) for _ in range(k)]}))
    out.append(("matching", _td("top1_accuracy"), [g for g, _ in groups], [p for _, p in groups]))
    chars = "我们今天天气很好的了吗在再"
    src = ["".join(rng.choice(chars) for _ in range(rng.randint(3, 10))) for _ in range(n)]
    tgt = ["".join(c if rng.random() < 0.8 else rng.choice(chars) for c in s) for s in src]
    hyp = ["".join(c if rng.random() < 0.85 else rng.choice(chars) for c in t) for t in tgt]
    gen = [{"source": s, "target": t} for s, t in zip(src, tgt)]
    for m in ("rouge_l", "bleu_2", "bleu_4", "f0.5"):
        out.append(("generation", _td(m), gen, hyp))
    return out


def test_every_task_types_metric_is_recomputed_exactly_on_the_test_set_and_on_resamples():
    rng = random.Random(0)
    seen = set()
    for kind, td, recs, preds in _cases(rng):
        codec = codec_for(kind)
        st = codec.example_stats(td, recs, preds)
        assert st is not None, (kind, td.cfg.metric)
        assert len(st["rows"]) == len(recs)
        want = codec.score(td, recs, preds)[td.cfg.metric]
        assert S.recompute(st) == pytest.approx(want, abs=1e-9), (kind, td.cfg.metric)
        # a resample: the same examples drawn with replacement, scored by the task's own score()
        idx = np.random.default_rng(len(seen)).integers(0, len(recs), size=(3, len(recs)))
        counts = np.stack([np.bincount(i, minlength=len(recs)) for i in idx])
        got = S.recompute(st, counts)
        for b, i in enumerate(idx):
            ref = codec.score(td, [recs[j] for j in i], [preds[j] for j in i])[td.cfg.metric]
            assert got[b] == pytest.approx(ref, abs=1e-9), (kind, td.cfg.metric, b)
        seen.add((kind, td.cfg.metric))
    for kind in ("classification", "ner", "regression", "span", "matching", "generation"):
        assert {m for k, m in seen if k == kind} >= set(codec_for(kind).metrics)


def test_bleu_from_summed_segment_counts_is_sacrebleus_corpus_bleu():
    from sacrebleu.metrics import BLEU

    hyps = ["the cat sat on the mat", "a dog", "hello there world", "x"]
    refs = ["the cat is on the mat", "a dog barks", "hello world", "y z"]
    from skillnet.finetune.gen_metrics import bleu_sentence_stats

    st = S.example_stats("bleu_4", "bleu", bleu_sentence_stats(hyps, refs, 4, lang="en"))
    want = BLEU(tokenize="13a", smooth_method="exp").corpus_score(hyps, [refs]).score
    assert S.recompute(st) == pytest.approx(want, abs=1e-9)
    twice = BLEU(tokenize="13a", smooth_method="exp").corpus_score(hyps[:2] * 2, [refs[:2] * 2]).score
    assert S.recompute(st, np.array([[2, 2, 0, 0]]))[0] == pytest.approx(twice, abs=1e-9)


def _one_row_runs(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    ratio = lambda v: {"t": S.example_stats("accuracy", "ratio", [[x, 1.0] for x in v])}  # noqa: E731
    return {"A": [ratio(a)], "B": [ratio(b)]}


def test_one_seed_mean_metric_ci_matches_scipys_percentile_bootstrap():
    from scipy import stats

    rng = np.random.default_rng(1)
    a = rng.normal(70, 20, 300)
    b = a - 3 + rng.normal(0, 15, 300)
    res = S.Bootstrap(_one_row_runs(a, b), ["t"], n_boot=10_000, seed=3).difference("A", "B", "t")
    ref = stats.bootstrap((a - b,), np.mean, method="percentile", n_resamples=10_000, random_state=0,
                          confidence_level=0.95).confidence_interval
    se = np.std(a - b) / np.sqrt(len(a))  # Monte Carlo error of a 2.5% percentile at 10,000 draws: ~0.05 se
    assert res["diff"] == pytest.approx(np.mean(a - b))
    assert res["ci"][0] == pytest.approx(ref.low, abs=0.15 * se)
    assert res["ci"][1] == pytest.approx(ref.high, abs=0.15 * se)
    assert 0 < res["p"] < 0.05 and res["test"] == "bootstrap"


def test_hand_computed_case_and_determinism():
    """Two examples, one seed: A is right on the first only, B on neither. Each resample of two draws holds the
    first example 0, 1 or 2 times (1/4, 1/2, 1/4): the difference is 0, 50 or 100 points."""
    runs = _one_row_runs(np.array([100.0, 0.0]), np.array([0.0, 0.0]))
    boot = S.Bootstrap(runs, ["t"], n_boot=20_000, seed=0)
    draws = boot._task_draws("t")
    values, freq = np.unique(draws["A"] - draws["B"], return_counts=True)
    assert values.tolist() == [0.0, 50.0, 100.0]
    assert (freq / freq.sum()) == pytest.approx([0.25, 0.5, 0.25], abs=0.01)
    res = boot.difference("A", "B", "t")
    assert res["diff"] == 50.0 and res["ci"] == [0.0, 100.0]
    assert res["p"] == pytest.approx(2 * 0.25, abs=0.02)  # P*(d <= 0) = 1/4
    assert S.Bootstrap(runs, ["t"], n_boot=20_000, seed=0).difference("A", "B", "t") == res


def test_the_seed_level_is_the_t_distribution_of_the_seeds_mean():
    """Examples that never disagree leave only the seeds' spread: with seed gains of +2, +2 and -4 points the
    interval is the t-interval of their mean, 0 +- t(0.975, 2) * s / sqrt(3) (scipy), not the bootstrap over 3
    seeds' [min, max] = [-4, 2]."""
    from scipy import stats

    base = np.full(50, 60.0)
    runs = {"A": [], "B": []}
    for gain in (2.0, 2.0, -4.0):
        runs["A"].append({"t": S.example_stats("accuracy", "ratio", [[x + gain, 1.0] for x in base])})
        runs["B"].append({"t": S.example_stats("accuracy", "ratio", [[x, 1.0] for x in base])})
    res = S.Bootstrap(runs, ["t", ], n_boot=40_000, seed=1).difference("A", "B", "t")
    half = stats.t.ppf(0.975, 2) * np.std([2.0, 2.0, -4.0], ddof=1) / np.sqrt(3)
    assert res["diff"] == pytest.approx(0.0) and res["seed_sd"] == pytest.approx(np.sqrt(12.0))
    assert res["ci"][0] == pytest.approx(-half, rel=0.05) and res["ci"][1] == pytest.approx(half, rel=0.05)
    assert res["seed_level"] == "student-t"


def test_a_null_difference_with_seed_noise_dominant_is_covered_about_95_percent_of_the_time():
    """Three seeds whose runs differ by seed noise alone (2 points per run, the same examples right and wrong in
    both rows, so the test set adds nothing): the 95% interval covers the true 0 in about 95% of repetitions. A
    bootstrap that resamples the 3 seeds covered it in ~79% (its interval is the seeds' [min, max])."""
    rng = np.random.default_rng(11)
    base = rng.integers(0, 2, 60) * 100.0
    reps, covered = 300, 0
    for i in range(reps):
        runs: dict[str, list] = {"A": [], "B": []}
        for _ in range(3):
            for row in runs:
                shift = rng.normal(0.0, 2.0)
                runs[row].append({"t": S.example_stats("accuracy", "ratio", [[x + shift, 1.0] for x in base])})
        lo, hi = S.Bootstrap(runs, ["t"], n_boot=2000, seed=i).difference("A", "B", "t")["ci"]
        covered += lo <= 0 <= hi
    assert 0.91 <= covered / reps <= 0.99


def test_null_case_covers_zero_about_95_percent_of_the_time():
    """Two rows drawn from the same distribution: the 95% interval covers 0 in about 95% of repetitions."""
    rng = np.random.default_rng(7)
    reps, covered = 200, 0
    for i in range(reps):
        a, b = rng.integers(0, 2, 200) * 100.0, rng.integers(0, 2, 200) * 100.0
        lo, hi = S.Bootstrap(_one_row_runs(a, b), ["t"], n_boot=1000, seed=i).difference("A", "B", "t")["ci"]
        covered += lo <= 0 <= hi
    assert 0.90 <= covered / reps <= 0.99


def test_holm_is_statsmodels_multipletests():
    from statsmodels.stats.multitest import multipletests  # a dev dependency: the cross-check must run
    rng = np.random.default_rng(0)
    for m in (1, 2, 5, 12):
        p = rng.uniform(0, 0.06, m).tolist()
        reject, adj, _, _ = multipletests(p, alpha=0.05, method="holm")
        assert S.holm(p) == pytest.approx(adj.tolist())
        assert [a < 0.05 for a in S.holm(p)] == reject.tolist()
    assert S.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])  # by hand: 3x, then max(2x, running)


def test_vectorised_speed_twelve_claims():
    """~12 claims x 10,000 resamples over 1,000 examples x 3 seeds: seconds, not minutes."""
    import time

    rng = np.random.default_rng(0)
    runs: dict[str, list[dict[str, Any]]] = {}
    for row in ("A", "B", "C", "D"):
        runs[row] = [{f"t{k}": S.example_stats("f1", "f1", rng.integers(0, 3, (1000, 3)).tolist()) for k in range(3)}
                     for _ in range(3)]
    t0 = time.perf_counter()
    boot = S.Bootstrap(runs, ["t0", "t1", "t2"], n_boot=10_000)
    for a, b in (("A", "B"), ("A", "C"), ("A", "D"), ("B", "C")):
        for key in ("t0", "t1", "t2"):
            assert boot.difference(a, b, key) is not None
    assert time.perf_counter() - t0 < 60


def test_missing_statistics_are_said():
    runs = _one_row_runs(np.array([100.0, 0.0]), np.array([0.0, 0.0]))
    runs["C"] = [None]
    boot = S.Bootstrap(runs, ["t"], n_boot=100)
    assert boot.difference("A", "C", "t") is None
    assert "no per-example statistics" in boot.missing("C", "t")


def test_decision_rule_text_states_rule_and_count():
    text = S.decision_rule_text(12, 10_000)
    assert "12 claims" in text and "Holm" in text and "10,000" in text and "bootstrap" in text


# ---------------------------------------------------------------------------------------- claims and comparisons
def _bootstrap_d(p: float, diff: float = 1.0) -> dict[str, Any]:
    return {"diff": diff, "ci": [0.1, 2.0], "p": p, "p_t": 0.2, "test": "bootstrap"}


def test_claims_are_decided_after_holm_over_the_whole_family():
    """p = 0.01, 0.03, 0.04, 0.2: each of the first three passes alone (the old rule held all three); Holm over
    the four keeps the first only (adjusted 0.04, 0.09, 0.09, 0.2)."""
    from skillnet.finetune.document import claim, decide_claims

    items: list[Any] = ["a finding that is not a claim"]
    for i, p in enumerate((0.01, 0.03, 0.04, 0.2)):
        claim(items, f"claim {i}", _bootstrap_d(p), 3, "A minus B")
    claim(items, "unmeasured", None, 3)
    out = decide_claims(items)
    assert out[0] == "a finding that is not a claim" and out[-1] == "unmeasured: not measured in this run."
    assert "**holds**" in out[1] and "Holm-adjusted p = 0.040 over 4 claims" in out[1]
    for text in out[2:5]:
        assert "**within the noise**" in text and "**holds**" not in text
    assert "95% CI [+0.1, +2.0], bootstrap p = 0.030" in out[2] and "seeds' paired t-test p = 0.200" in out[2]


def _write_runs(root: Path, rows: dict[str, list[list[float]]]) -> None:
    """Run folders row/seed{k}/example_stats.json: one accuracy task `t` whose per-example correctness is given."""
    import json

    for row, seeds in rows.items():
        for k, correct in enumerate(seeds):
            d = root / row / f"seed{k}"
            d.mkdir(parents=True)
            st = S.example_stats("accuracy", "ratio", [[100.0 * c, 1.0] for c in correct])
            (d / S.STATS_FILE).write_text(json.dumps({"t": {"test": st}}), encoding="utf-8")


def _agg(rows: dict[str, list[list[float]]]) -> dict[str, Any]:
    methods = {}
    for row, seeds in rows.items():
        vals = [100.0 * float(np.mean(c)) for c in seeds]
        ms = {"values": vals, "mean": float(np.mean(vals)), "std": float(np.std(vals, ddof=1))}
        methods[row] = {"tasks": {"t": {**ms, "metric": "accuracy"}}, "average": ms, "steps": 10,
                        "params": {"total": 1, "trainable": 1, "activated": {"t": 1}}, "seconds": {"mean": 1.0}}
    return {"split": "test", "seeds": [0, 1, 2], "tasks": ["t"], "methods": methods}


def test_compare_and_report_differences_carry_the_bootstrap_ci_and_fall_back_saying_so(tmp_path: Path):
    import json

    from skillnet.experiments import tables
    from skillnet.finetune import compare
    from skillnet.finetune.document import Document

    rng = np.random.default_rng(0)
    rows = {"skillnet": [(rng.random(400) < 0.75).astype(float).tolist() for _ in range(3)],
            "dense": [(rng.random(400) < 0.60).astype(float).tolist() for _ in range(3)]}
    _write_runs(tmp_path, rows)
    agg = _agg(rows)
    boot = S.bootstrap_for({m: [compare.run_dir(tmp_path, m, s) for s in agg["seeds"]] for m in rows}, ["t"])
    d = compare.differences(agg, "dense", boot)["skillnet"]["average"]
    assert d["test"] == "bootstrap" and d["ci"][0] > 0 and d["beyond_noise"] and d["p"] < 0.01
    assert d["diff"] == pytest.approx(agg["methods"]["skillnet"]["average"]["mean"]
                                      - agg["methods"]["dense"]["average"]["mean"])
    assert d["p_t"] == pytest.approx(S.paired_test(agg["methods"]["skillnet"]["average"]["values"],
                                                   agg["methods"]["dense"]["average"]["values"]))
    d = compare.differences(agg, "dense", boot)["skillnet"]["t"]
    # the report reads the comparison from its folder: the same interval in its cells
    (tmp_path / "comparison.json").write_text(json.dumps(agg), encoding="utf-8")
    doc = Document()
    out = tables.differences(doc, tables.load_comparison(tmp_path / "comparison.json"), "skillnet", [])
    e = out["dense"]["t"]
    assert e["ci"] == pytest.approx(d["ci"]) and e["diff"] == pytest.approx(d["diff"])  # ref minus row there
    assert f"**{e['diff']:+.1f} [{e['ci'][0]:+.1f}, {e['ci'][1]:+.1f}]**" in doc.markdown()
    # a run without per-example statistics: the seeds' t-test, and the reason, instead
    (tmp_path / "dense" / "seed1" / S.STATS_FILE).unlink()
    boot = S.bootstrap_for({m: [compare.run_dir(tmp_path, m, s) for s in agg["seeds"]] for m in rows}, ["t"])
    d = compare.differences(agg, "dense", boot)["skillnet"]["t"]
    assert d["test"] == "t-test" and d["ci"] is None and d["p"] == d["p_t"]
    assert "no per-example statistics" in d["why"]
    doc = compare.document({**agg, "budget_gaps": {}}, compare.differences(agg, "dense", boot), "dense", "T", {}, "cmd")
    assert "the seeds' t-test instead (a run wrote no per-example statistics)" in doc.markdown()


def test_final_scores_write_each_tasks_example_statistics(tmp_path: Path) -> None:
    """The run writes example_stats.json beside results.json: per task and split, rows whose recomputed metric is
    the score it reports."""
    import json

    import torch
    from skillnet.finetune import evaluation
    from skillnet.finetune.config import TrainConfig

    codec = codec_for("classification")
    recs = {"dev": [{"label": x} for x in "aabb"], "test": [{"label": x} for x in "abbbab"]}

    class Task:
        cfg = SimpleNamespace(type="classification", metric="macro_f1")
        records = recs
        positive_label = None
        num_train, max_len, truncated = 1, 8, {"dev": 0, "test": 0}

        def __init__(self) -> None:
            self.codec = codec

        def predict_split(self, model, split, bs, progress=False):  # noqa: ANN001, ANN201
            return ["a"] * len(recs[split])

        def score(self, split, preds):  # noqa: ANN001, ANN201
            return codec.score(self, recs[split], preds)

        def trivial_baseline(self, split):  # noqa: ANN001, ANN201
            return {"macro_f1": 0.0}

    cfg = SimpleNamespace(train=TrainConfig(lexical_baselines=False))
    source = SimpleNamespace(target_mix=dict, realised_mix=dict)
    ev = evaluation.DevEvaluator(cfg, {"t": Task()}, source, out=tmp_path, vocab=None, is_main=True)  # type: ignore[arg-type]
    model = torch.nn.Linear(1, 1)
    model.config = SimpleNamespace(task_skill_names=lambda name: ["s7"])  # type: ignore[assignment]
    res = evaluation.final_scores(model, cfg, {"t": Task()}, tmp_path, ev, progress=False)  # type: ignore[arg-type]
    written = json.loads((tmp_path / S.STATS_FILE).read_text(encoding="utf-8"))
    assert set(written["t"]) == {"dev", "test"}
    for split in ("dev", "test"):
        assert S.recompute(written["t"][split]) == pytest.approx(res["t"][split]["macro_f1"])
    assert S.load_example_stats(tmp_path)["t"] == written["t"]["test"]


def test_the_p_value_backs_the_observed_direction_only():
    """A p-value is twice the share of replicates across 0 from the observed difference: replicates mostly below 0
    under a positive observed difference (a biased metric) give p ~ 1, not a small p that a claim would read as
    support for the observed (positive) direction."""
    boot = np.array([-1.0] * 990 + [1.0] * 10)
    assert S.bootstrap_p(boot, 0.5) == 1.0
    assert S.bootstrap_p(boot, -0.5) == pytest.approx(2 * 11 / 1001)
    assert S.bootstrap_p(boot) == pytest.approx(2 * 11 / 1001)


def test_runs_scored_on_different_examples_of_one_size_are_not_paired():
    """Rows are resampled as pairs example by example: a run scored on another test set of the same size (a task
    stage rerun with another cap) is refused by its examples' fingerprint, not paired by position."""
    first = [{"id": f"t-{i}"} for i in range(4)]
    other = [{"id": f"t-{i}"} for i in range(1, 5)]
    assert S.examples_key(first) == S.examples_key([dict(r) for r in first]) != S.examples_key(other)
    rows = [[100.0, 1.0], [0.0, 1.0], [100.0, 1.0], [0.0, 1.0]]
    a = {**S.example_stats("accuracy", "ratio", rows), "examples": S.examples_key(first)}
    b = {**S.example_stats("accuracy", "ratio", rows), "examples": S.examples_key(other)}
    boot = S.Bootstrap({"A": [{"t": a}], "B": [{"t": b}]}, ["t"], n_boot=100)
    assert "examples differ" in boot.missing("A", "t") and boot.difference("A", "B", "t") is None
    assert S.Bootstrap({"A": [{"t": a}], "B": [{"t": dict(a)}]}, ["t"], n_boot=100).difference("A", "B", "t")
