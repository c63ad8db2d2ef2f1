"""What the reproduction report's halves share: the papers' row names, score and difference tables, the
sizes of the sampling studies, their line plots."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any

from skillnet.experiments.profiles import BUDGET_RULE
from skillnet.finetune.compare import updates_cell
from skillnet.finetune.document import Document, paired_test, pyplot, save_figure, verdict

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



def load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else None


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


def score_table(doc: Document, cmp: dict[str, Any], order: list[tuple[str, str]], params: bool = True) -> None:
    tasks = cmp["tasks"]
    rows_data = cmp["methods"]
    metric = {t: next(iter(rows_data.values()))["tasks"][t]["metric"] for t in tasks}
    head = ["model", *[f"{t} ({metric[t]})" for t in tasks], "Avg", "updates / task"]
    labels = [(k, name) for k, name in order if k in rows_data] + [(k, k) for k in rows_data
                                                                    if k not in dict(order)]
    doc.table(head, [[name, *[ms(rows_data[key]["tasks"][t]) for t in tasks], ms(rows_data[key]["average"]),
                      updates_cell(rows_data[key].get("updates"))] for key, name in labels])
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
    text = (f"Budget: {BUDGET_RULE}. *updates / task* gives each row's count (the least and the most over the "
            "tasks, as the sampler expects them).")
    if gaps:
        text += (f" Here the rows' updates differ, {by_design}: " if by_design else
                 " **Here the rows did not get equal updates, so their differences mix methods and budgets**: ")
        text += "; ".join(f"{t}: " + ", ".join(f"{m} {n:,.0f}" for m, n in c.items()) for t, c in gaps.items()) + "."
    doc.p(text)


def differences(doc: Document, cmp: dict[str, Any], ref: str, order: list[tuple[str, str]]) -> dict[str, Any]:
    """Paired differences (row - ref) over seeds per task and on the average; returns them for the
    findings."""
    rows_data, tasks = cmp["methods"], cmp["tasks"]
    if ref not in rows_data:
        return {}
    names = dict(order)
    out, table = {}, []
    n = len(cmp["seeds"])
    for key in rows_data:
        if key == ref:
            continue
        cells, entry = [], {}
        for t in [*tasks, "average"]:
            a = rows_data[ref]["average"]["values"] if t == "average" else rows_data[ref]["tasks"][t]["values"]
            b = rows_data[key]["average"]["values"] if t == "average" else rows_data[key]["tasks"][t]["values"]
            diff = statistics.fmean(a) - statistics.fmean(b)
            p = paired_test(a, b)
            entry[t] = {"diff": diff, "p": p}
            cells.append(verdict(diff, p, n))
        out[key] = entry
        table.append([names.get(key, key), *cells])
    doc.table([f"{names.get(ref, ref)} minus", *tasks, "Avg"], table)
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
          f"table every {var} gives the same task mix. One seed.")


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


