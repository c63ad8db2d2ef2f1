"""What the reproduction report's halves share: the papers' row names, score and difference tables, the
sizes of the sampling studies, their line plots."""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

from skillnet.experiments.profiles import BUDGET_RULE
from skillnet.export.card import read_json as load  # a JSON file, None where there is none
from skillnet.finetune.budgets import realised, updates_cell
from skillnet.finetune.compare import run_dir
from skillnet.finetune.document import Document, pyplot, save_figure, verdict
from skillnet.finetune.stats import Bootstrap, bootstrap_for, difference_entry

# The packaged task each of the papers' datasets is replaced by (same task type and skills).
NLU_STAND_INS = {"sentiment": "ChnSentiCorp", "ner": "OntoNotes", "domain": "TNEWS", "qa_match": "AFQMC",
                 "span": "CMRC 2018", "answer_select": "NLPCC-DBQA (the new task, §4.3)"}

# Row labels of the compare runs -> the names the papers' tables use.
NLU_ROWS = [("task_specific", "Task-specific fine-tuning"), ("dense_joint", "Joint fine-tuning (Dense)"),
            ("moe", "Joint fine-tuning (MoE, top-2)"), ("pals", "BERT and PALs (joint)"),
            ("learnable", "Learnable skill combination (straight-through)"),
            ("learnable_eq6", "Learnable skill combination (Eq. 6 as written)"),
            ("skillnet_dense", "SkillNet-NLU w/o sparse pre-training"), ("skillnet", "SkillNet-NLU")]
NLG_ROWS = [("task_specific", "Task-specific fine-tuning"), ("dense_joint", "Joint fine-tuning (Dense)"),
            ("moe", "Joint fine-tuning (MoE, top-2)"), ("skillnet", "SkillNet-NLG")]


def baseline_scores(cmp_dir: Path, cmp: dict[str, Any], key: str, metric: str | None = None) -> dict[str, Any]:
    """Each task's ``key`` entry (``trivial_test``, ``lexical_test``, ``lexical_name``, ``test_examples``)
    of its metric (or of ``metric``), from the first run of the comparison that recorded it (every run
    scores the same split with the same baseline)."""
    out: dict[str, Any] = {}
    for f in sorted(cmp_dir.glob("*/seed*/results.json")) + sorted(cmp_dir.glob("*/seed*/*/results.json")):
        for t, r in (load(f) or {}).get("tasks", {}).items():
            v = r.get(key)
            if t not in cmp["tasks"] or t in out or v is None:
                continue
            if isinstance(v, dict):
                v = v.get(metric or r["metric"])
                if v is None:
                    continue  # an older run without that metric: a later one may have it
            out[t] = v
    return {t: v for t, v in out.items() if v is not None}


def cut_shares(cmp_dir: Path, cmp: dict[str, Any]) -> dict[str, float]:
    """Each task's share of test examples longer than its max_seq_len (percent), which every model reads cut."""
    size = baseline_scores(cmp_dir, cmp, "test_examples")
    return {t: 100.0 * n / size[t] for t, n in baseline_scores(cmp_dir, cmp, "test_truncated").items() if size.get(t)}


def exported_positions(cmp_dir: Path) -> int | None:
    """The fewest positions (``max_position_embeddings``) among a comparison's exported models: the longest
    input any of its rows can read. None when no run has exported a model."""
    found = [load(f) or {} for f in sorted(cmp_dir.glob("*/seed*/export/config.json"))
             + sorted(cmp_dir.glob("*/seed*/*/export/config.json"))]
    n = [c["max_position_embeddings"] for c in found if isinstance(c.get("max_position_embeddings"), int)]
    return min(n) if n else None


def at_positions(cut: dict[str, float], seq: dict[str, Any], positions: int | None) -> set[str]:
    """The tasks of ``cut`` whose max_seq_len is the model's positions: none of them can be read longer."""
    return {t for t in cut if positions is not None and isinstance(seq.get(t), int) and seq[t] >= positions}


def scored(x: Any) -> bool:
    """A number that was measured (an unscored mean is None or NaN)."""
    return isinstance(x, (int, float)) and not math.isnan(x)


def at_or_below(cmp: dict[str, Any], floor: dict[str, float]) -> list[tuple[str, str]]:
    """(row, task) pairs of a comparison whose mean test score is at or below ``floor[task]`` (a trivial
    baseline) or was not scored; tasks without a floor are skipped."""
    return [(m, t) for m, r in cmp["methods"].items() for t in cmp["tasks"] if t in floor
            and not (scored(v := r["tasks"][t]["mean"]) and v > floor[t])]


def ms(d: dict[str, Any]) -> str:
    m, s = d.get("mean"), d.get("std")
    if not scored(m):
        return "-"
    return f"{m:.1f} ± {s:.1f}" if s is not None and len(d.get("values", [])) > 1 else f"{m:.1f}"


def score_table(doc: Document, cmp: dict[str, Any], order: list[tuple[str, str]], params: bool = True,
                sizes: dict[str, Any] | None = None) -> None:
    """The rows' test scores per task; `sizes`: each task's test examples, shown in its column's head (how
    much a score can decide depends on it)."""
    tasks = cmp["tasks"]
    rows_data = cmp["methods"]
    metric = {t: next(iter(rows_data.values()))["tasks"][t]["metric"] for t in tasks}
    head = ["model", *[f"{t} ({metric[t]}" + (f", {sizes[t]:,} test" if t in (sizes or {}) else "") + ")"
                       for t in tasks], "Avg", "updates / task"]
    labels = [(k, name) for k, name in order if k in rows_data] + [(k, k) for k in rows_data
                                                                    if k not in dict(order)]
    doc.table(head, [[name, *[ms(rows_data[key]["tasks"][t]) for t in tasks], ms(rows_data[key]["average"]),
                      updates_cell(realised(rows_data[key]))] for key, name in labels])
    if params and any(realised(rows_data[key]) for key, _ in labels):
        # the column gives the least and the most; a reader checking equal budgets needs every task's count
        doc.table(["model", *[f"updates: {t}" for t in tasks]],
                  [[name, *[f"{u[t]:,.0f}" if (u := realised(rows_data[key])) else "-" for t in tasks]]
                   for key, name in labels])
    if params:
        prow = []
        for key, name in labels:
            p = rows_data[key]["params"]
            prow.append([name, f"{p['total'] / 1e6:.2f} M", f"{p['trainable'] / 1e6:.2f} M",
                         *[f"{p['activated'][t] / 1e6:.2f} M" for t in tasks]])
        doc.table(["model", "total params", "trainable", *[f"activated: {t}" for t in tasks]], prow)


def budget_caption(doc: Document, cmp: dict[str, Any], by_design: str | None = None) -> None:
    """The budget rule under which a table's rows ran, and, loudly, where its rows broke it (`by_design`: why
    a study's rows differ on purpose)."""
    gaps = cmp.get("budget_gaps") or {}
    text = (f"Budget: {BUDGET_RULE}. *updates / task* gives each row's count as its runs realised it (the least "
            "and the most over the tasks, mean over seeds; the *updates* table, each task's).")
    if gaps:
        text += (f" Here the rows' updates differ, {by_design}: " if by_design else
                 " **Here the rows did not get equal updates, so their differences mix methods and budgets**: ")
        text += "; ".join(f"{t}: " + ", ".join(f"{m} {n:,.0f}" for m, n in c.items()) for t, c in gaps.items()) + "."
    doc.p(text)


def load_comparison(path: Path) -> dict[str, Any] | None:
    """A comparison.json with ``dir``, the folder of its runs, whose per-example statistics `differences`
    resamples (in memory only)."""
    cmp = load(path)
    if cmp is not None:
        cmp["dir"] = str(path.parent)
    return cmp


@functools.lru_cache(maxsize=16)
def _bootstrap(folder: str, rows: tuple[str, ...], seeds: tuple[int, ...], tasks: tuple[str, ...],
               split: str) -> Bootstrap:
    return bootstrap_for({r: [run_dir(Path(folder), r, s) for s in seeds] for r in rows}, tasks, split)


def bootstrap(cmp: dict[str, Any]) -> Bootstrap | None:
    """The hierarchical bootstrap of a comparison read by `load_comparison` (one per comparison: every
    difference of a report shares its resamples); None for one without its folder."""
    if not cmp.get("dir"):
        return None
    return _bootstrap(cmp["dir"], tuple(cmp["methods"]), tuple(cmp["seeds"]), tuple(cmp["tasks"]),
                      cmp.get("split", "test"))


def differences(doc: Document, cmp: dict[str, Any], ref: str, order: list[tuple[str, str]]) -> dict[str, Any]:
    """Paired differences (ref - row) per task and on the average, each with its 95% bootstrap interval
    over seeds and test examples (the seeds' t-test where a run kept no per-example statistics); a table in
    `doc`, and returned for the findings."""
    rows_data, tasks = cmp["methods"], cmp["tasks"]
    if ref not in rows_data:
        return {}
    names = dict(order)
    out, table = {}, []
    n = len(cmp["seeds"])
    boot = bootstrap(cmp)
    for key in rows_data:
        if key == ref:
            continue
        cells, entry = [], {}
        for t in [*tasks, "average"]:
            a = rows_data[ref]["average"]["values"] if t == "average" else rows_data[ref]["tasks"][t]["values"]
            b = rows_data[key]["average"]["values"] if t == "average" else rows_data[key]["tasks"][t]["values"]
            e = entry[t] = difference_entry(a, b, boot, ref, key, t)
            cells.append(verdict(e["diff"], e["p"], n, e["ci"]))
        out[key] = entry
        table.append([names.get(key, key), *cells])
    doc.table([f"{names.get(ref, ref)} minus", *tasks, "Avg"], table)
    missing = sorted({e["why"] for en in out.values() for e in en.values() if e["ci"] is None})
    doc.p("Cells: the difference and its 95% interval (hierarchical paired bootstrap over seeds and test examples), "
          "**bold** where it excludes 0, uncorrected; only the findings' claims are corrected for their number."
          + (f" Where there is no interval the seeds' t-test stands in ({'; '.join(missing)})." if missing else ""))
    return out


def n_seeds(c: dict[str, Any]) -> str:
    n = len(c["seeds"])
    return f"{n} seed{'s' if n > 1 else ''}"


def task_skills(config: Path) -> dict[str, list[str]]:
    d = load(config)
    return {t["name"]: list(t["skills"]) for t in d["tasks"]} if d else {}


def same_task_sets(config: Path, skills: list[str]) -> list[list[str]]:
    """Groups of skills that exactly the same tasks use (their ablations give the same model)."""
    users: dict[tuple[str, ...], list[str]] = {}
    for sk in skills:
        key = tuple(sorted(t for t, ss in task_skills(config).items() if sk in ss))
        users.setdefault(key, []).append(sk)
    return [g for g in users.values() if len(g) > 1]


def study_sizes(doc: Document, config: Path, var: str, source: str) -> None:
    """The training-set sizes of a sampling study, read from the config it ran."""
    d = load(config)
    if not d:
        return
    sizes = ", ".join(f"{t['name']} {t.get('max_train_examples', 'all')}" for t in d["tasks"])
    doc.p(f"Sampling only matters when tasks differ in size, so this study cuts each training set to the relative "
          f"size of the dataset it stands in for ({source}): {sizes} examples. With the equal sizes of the main "
          f"table every {var} gives the same task mix.")


def line_plot(c: dict[str, Any], var: str, path: Path, title: str, logx: bool = False) -> None:
    plt = pyplot()
    pts = sorted((float(k.split("_", 1)[1]), r["average"]) for k, r in c["methods"].items())
    fig, ax = plt.subplots(figsize=(5, 3.2))
    ax.errorbar([x for x, _ in pts], [a["mean"] for _, a in pts], yerr=[a["std"] for _, a in pts], marker="o",
                capsize=3)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(var)
    ax.set_ylabel("average test score")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    save_figure(fig, path)


def beyond_noise(d: dict[str, Any] | None) -> bool:
    """A paired difference (of `differences`) that the report calls beyond the noise: its 95% interval
    excludes 0 (without one, the seeds' t-test gives p < 0.05)."""
    if d is not None and "beyond_noise" in d:
        return bool(d["beyond_noise"])
    return d is not None and d.get("p") is not None and d["p"] < 0.05


def spread_text(c: dict[str, Any]) -> str:
    """A study's seeds and the spread over them of its rows' averages (the smallest and largest std)."""
    stds = [r["average"]["std"] for r in c["methods"].values()
            if len(r["average"].get("values", [])) > 1 and scored(r["average"].get("std"))]
    if not stds:
        return f"{n_seeds(c)}: no spread over seeds to judge a difference by"
    return f"{n_seeds(c)}; a row's average varies over the seeds by ±{min(stds):.1f} to ±{max(stds):.1f} (std)"


def _gap(d: dict[str, Any]) -> str:
    """A difference as the finding quotes it: with its 95% interval where there is one, else the t-test's p."""
    if d.get("ci") is not None:
        return f"{d['diff']:+.1f} [{d['ci'][0]:+.1f}, {d['ci'][1]:+.1f}]"
    return f"{d['diff']:+.1f}" + (f", p = {d['p']:.3f}" if d.get("p") is not None else "")


def ablation_finding(doc: Document, c: dict[str, Any], order: list[tuple[str, str]], steps: int | None) -> str:
    """The ablation judged against its own yardstick, the unablated row of the same study (same steps, same
    seeds): the paired differences (a table in `doc`) and which removals lower the average beyond the noise."""
    doc.p("Differences from the unablated row of this study (same steps and seeds), paired over seeds (positive "
          "= removing the skill lowers the score):")
    d = {k: v["average"] for k, v in differences(doc, c, "skillnet", order).items()}
    head = (f"Ablation ({spread_text(c)}" + (f"; {steps:,} steps" if steps else "")
            + "; the yardstick is the unablated row of the same study)")
    if len(c["seeds"]) < 2:
        return (head + ": one seed, so no removal can be told from noise; largest change "
                f"{max((abs(v['diff']) for v in d.values()), default=0.0):.1f} points. The paper finds every removal "
                "hurts, s7 most.")
    hurt = [k for k, v in d.items() if beyond_noise(v) and v["diff"] > 0]
    helped = [k for k, v in d.items() if beyond_noise(v) and v["diff"] < 0]
    within = [k for k in d if k not in hurt and k not in helped]
    parts = ["removing " + ", ".join(f"{k.removeprefix('no_')} ({_gap(d[k])})" for k in keys) + what
             for keys, what in ((hurt, " lowers the average beyond the noise"),
                                (helped, " raises it beyond the noise"), (within, " changes it within the noise"))
             if keys]
    return head + ": " + "; ".join(parts) + ". The paper finds every removal hurts, s7 most."


def study_best(doc: Document, c: dict[str, Any], order: list[tuple[str, str]], what: str, paper: str) -> str:
    """A sampling study's finding: its highest average against every other row, paired over seeds (a table in
    `doc`). A value is called the best only when it is beyond the noise of every other one."""
    rows, names = c["methods"], dict(order)
    best = max(rows, key=lambda k: rows[k]["average"]["mean"])
    doc.p(f"Differences from the highest average ({names.get(best, best)}), paired over seeds (positive = it is "
          "higher):")
    d = {k: v["average"] for k, v in differences(doc, c, best, order).items()}
    head = f"{what} ({spread_text(c)})"
    if len(c["seeds"]) < 2:
        return (f"{head}: the highest average is at {names.get(best, best)}, on one seed, so no value can be "
                f"called the best (the paper: {paper}).")
    within = [k for k, v in d.items() if not beyond_noise(v)]
    if not within:
        return (f"{head}: the best average is at {names.get(best, best)}, beyond the noise of every other value ("
                + "; ".join(f"{names.get(k, k)}: {_gap(v)}" for k, v in d.items()) + f") (the paper: {paper}).")
    return (f"{head}: the highest average is at {names.get(best, best)}, within the noise of "
            + "; ".join(f"{names.get(k, k)} ({_gap(d[k])})" for k in within)
            + ", so these runs do not single out a best value"
            + "".join(f"; beyond the noise of {names.get(k, k)} ({_gap(v)})" for k, v in d.items() if k not in within)
            + f" (the paper: {paper}).")
