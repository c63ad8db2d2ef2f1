"""The SkillNet-NLG half of the reproduction report: NLG Table 3, adaptation (NLG Table 4) and the sampling
temperature (§3.4), with sample outputs, each read from its compare run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skillnet.experiments.tables import (
    NLG_ROWS,
    baseline_scores,
    budget_caption,
    differences,
    line_plot,
    load,
    score_table,
    study_best,
    study_sizes,
)
from skillnet.finetune.document import Document, claim

# The rows of the NLG tables after Table 3 (NLG_ROWS) as the report names them; report_changes.py matches the
# committed run's rows by these names.
ADAPT_ROWS = [("a_existing", "SkillNet-NLG, existing skills"), ("c_new_skill", "SkillNet-NLG + new skill"),
              ("task_specific", "task-specific")]


def temperature_rows(c: dict[str, Any]) -> list[tuple[str, str]]:
    return [(k, f"T = {k[2:]}") for k in c["methods"]]


def nlg_part(doc: Document, cmps: dict[str, Any], cmp_dir: Path, out: Path, findings: list[str]) -> None:
    nlg = cmps["nlg_main"]
    doc.h(2, "SkillNet-NLG: multi-task generation (NLG Table 3 layout)")
    if nlg:
        doc.p("Tasks: " + ", ".join(
            f"{t} ({nlg['methods'][next(iter(nlg['methods']))]['tasks'][t]['metric']})" for t in nlg["tasks"])
              + ". Every row starts from the same denoising-pre-trained BART; SkillNet-NLG copies its FFNs into "
              "the skills.")
        from skillnet.data_prep.tasks.generation import GEN_TASKS

        doc.p("Each task borrows the skill set of a task of the paper (Table 2 of SkillNet-NLG; `general` is the "
              "generic skill):")
        doc.table(["task", "stands in for", "skills", "metric"],
                  [[t, i.analogue + (" (the new task)" if i.held_out else ""), " ".join(i.skills), i.metric]
                   for t, i in GEN_TASKS.items()])
        budget_caption(doc, nlg)
        score_table(doc, nlg, NLG_ROWS, sizes=baseline_scores(cmp_dir / "nlg_main", nlg, "test_examples"))
        triv = trivial(cmp_dir / "nlg_main", nlg)
        if triv:
            doc.p("The trivial baseline outputs the source unchanged (test split, same metric):")
            doc.table(["baseline", *nlg["tasks"]], [["copy the source", *[f"{triv[t]:.1f}" for t in nlg["tasks"]]]])
            best = {t: max(r["tasks"][t]["mean"] for r in nlg["methods"].values()) for t in nlg["tasks"]}
            above = [t for t in nlg["tasks"] if best[t] > triv[t]]
            findings.append(f"Generation at this size: the best row beats copying the source on {len(above)} of "
                            f"{len(best)} tasks" + (f" ({', '.join(above)})" if above else "")
                            + (". See the sample outputs: a model this small, pre-trained this briefly, mostly has "
                               "not learnt to copy or to write fluent text, so the NLG comparison says little about "
                               "the method." if 2 * len(above) < len(best) else "."))
        doc.p("Differences from SkillNet-NLG, paired over seeds and test examples, with 95% intervals (positive = "
              "SkillNet-NLG is better):")
        d = differences(doc, nlg, "skillnet", NLG_ROWS)
        n = len(nlg["seeds"])
        for key, text in (("task_specific", "SkillNet-NLG beats task-specific fine-tuning on average (NLG Table 3)"),
                          ("dense_joint", "SkillNet-NLG beats the dense joint model on average (NLG Table 3)"),
                          ("moe", "SkillNet-NLG beats the MoE on average (NLG Table 3)")):
            claim(findings, text, d.get(key, {}).get("average"), n, f"SkillNet-NLG minus {dict(NLG_ROWS)[key]}")
        doc.img(cmp_dir / "nlg_main" / "curves.png", "Dev score against step, per task and method (NLG)")
        degenerate_outputs(doc, nlg, cmp_dir / "nlg_main", findings)
        detection_table(doc, nlg, cmp_dir / "nlg_main", findings)
        by_row = samples(doc, cmp_dir / "nlg_main")
        correction_samples(doc, nlg, by_row)
        const, pairs = constant_outputs(by_row)
        if pairs:
            findings.append(f"Generation outputs: in {const} of {pairs} (row, task) pairs the first seed's model gives "
                            "one and the same text for every kept test input (a degenerate model; see the samples).")
    else:
        doc.p("Not run yet (stage nlg_main).")
    doc.h(2, "Adaptation to a new generation task (NLG Table 4 layout)")
    if cmps["nlg_adapt"]:
        c = cmps["nlg_adapt"]
        order = ADAPT_ROWS
        budget_caption(doc, c)
        score_table(doc, c, order, sizes=baseline_scores(cmp_dir / "nlg_adapt", c, "test_examples"))
        doc.p("Differences from the existing-skills row, paired over seeds and test examples, with 95% intervals "
              "(positive = existing skills are better):")
        d = differences(doc, c, "a_existing", order)
        claim(findings, "On the new generation task, SkillNet-NLG beats task-specific fine-tuning (NLG Table 4)",
              d.get("task_specific", {}).get("average"), len(c["seeds"]), "existing skills minus task-specific")
        const, pairs = constant_outputs(samples(doc, cmp_dir / "nlg_adapt"))
        if pairs:
            findings.append(f"New generation task: in {const} of {pairs} rows the first seed's model gives one and the "
                            "same text for every kept test input.")
    doc.h(2, "Sampling temperature T (NLG §3.4)")
    if cmps["nlg_temp"]:
        c = cmps["nlg_temp"]
        study_sizes(doc, out / "configs" / "nlg_temp.json", "T", "SkillNet-NLG Table 5")
        budget_caption(doc, c, "by design: T sets each task's sampling share")
        order = temperature_rows(c)
        score_table(doc, c, order, params=False, sizes=baseline_scores(cmp_dir / "nlg_temp", c, "test_examples"))
        findings.append(study_best(doc, c, order, "Temperature", "T = 4"))
        line_plot(c, "T", cmp_dir / "nlg_temp" / "sampling.png", "Average test score against the temperature T",
                   logx=True)
        doc.img(cmp_dir / "nlg_temp" / "sampling.png", "Average test score against T (SkillNet-NLG)")


def trivial(cmp_dir: Path, cmp: dict[str, Any]) -> dict[str, float]:
    """Each task's trivial test score (copy the source), when every task recorded one."""
    out = baseline_scores(cmp_dir, cmp, "trivial_test")
    return out if len(out) == len(cmp["tasks"]) else {}


def run_files(run_dir: Path, method: str, task: str, name: str) -> list[Path]:
    """File `name` of every seed's run of one row that trained `task`, in seed order: a joint run's own, or
    a task-specific row's run of that task (its seed folder keeps one run per task)."""
    return sorted((run_dir / method).glob(f"seed*/{name}")) + sorted((run_dir / method).glob(f"seed*/{task}/{name}"))


def task_results(run_dir: Path, method: str, task: str) -> list[dict[str, Any]]:
    """The task's entry of every seed's results.json of one row, in seed order."""
    files = run_files(run_dir, method, task, "results.json")
    return [r for r in ((load(f) or {}).get("tasks", {}).get(task) for f in files) if r]


def diagnostics(run_dir: Path, method: str, task: str, key: str) -> list[float]:
    """``key`` of the task's test scores in every seed's run of one row, in seed order."""
    return [float(v) for v in ((r.get("test") or {}).get(key) for r in task_results(run_dir, method, task))
            if v is not None]


DISTINCT_FLOOR = 90.0  # percent of test inputs with their own output; below it a row is called degenerate


def distinct_means(cmp: dict[str, Any], run_dir: Path) -> dict[tuple[str, str], float]:
    """Mean share of distinct test outputs over the seeds, per (row, task) that recorded it."""
    out = {}
    for m in cmp["methods"]:
        for t in cmp["tasks"]:
            d = diagnostics(run_dir, m, t, "distinct")
            if d:
                out[(m, t)] = sum(d) / len(d)
    return out


def low_distinct(means: dict[tuple[str, str], float]) -> list[tuple[str, str, float]]:
    """(row, task, share) of every pair below DISTINCT_FLOOR."""
    return [(m, t, d) for (m, t), d in means.items() if d < DISTINCT_FLOOR]


def degenerate_outputs(doc: Document, nlg: dict[str, Any], run_dir: Path, findings: list[str]) -> None:
    """Share of distinct outputs and repetition rate per row and task (all test inputs, mean over seeds);
    a finding names every (row, task) below DISTINCT_FLOOR."""
    means = distinct_means(nlg, run_dir)
    low = [f"`{m}` on {t} ({d:.0f}%)" for m, t, d in low_distinct(means)]
    rows = []
    for m in nlg["methods"]:
        cells = []
        for t in nlg["tasks"]:
            if (m, t) not in means:
                cells.append("-")
                continue
            rep = diagnostics(run_dir, m, t, "repetition")
            cells.append(f"{means[m, t]:.0f}% / {sum(rep) / len(rep):.0f}%" if rep else f"{means[m, t]:.0f}%")
        rows.append([m, *cells])
    if all(c == "-" for r in rows for c in r[1:]):
        return
    doc.p(f"Distinct outputs among the test inputs / repetition rate (token 4-grams repeating an earlier one in "
          f"the same output), mean over seeds. A row below {DISTINCT_FLOOR:.0f}% distinct gives the same text to "
          "many inputs: it has not learnt to condition on the source.")
    doc.table(["row", *nlg["tasks"]], rows)
    findings.append("Degenerate generation (below " f"{DISTINCT_FLOOR:.0f}% distinct test outputs): "
                    + (", ".join(low) if low else "none: every row's output depends on its input") + ".")


def samples(doc: Document, cmp_dir: Path, n: int = 3) -> dict[str, dict[str, Any]]:
    """A few test inputs with the reference and each row's output (first seed), read from the runs (a
    task-specific row keeps one samples.json per task model)."""
    by_row: dict[str, dict[str, Any]] = {}
    for row_dir in sorted(p for p in cmp_dir.iterdir() if p.is_dir()) if cmp_dir.is_dir() else []:
        seeds = sorted(row_dir.glob("seed*"))
        if not seeds:
            continue
        files = [seeds[0] / "samples.json"] if (seeds[0] / "samples.json").is_file() else sorted(
            seeds[0].glob("*/samples.json"))
        merged: dict[str, Any] = {}
        for f in files:
            merged.update(load(f) or {})
        if merged:
            by_row[row_dir.name] = merged
    if not by_row:
        return {}
    tasks = list(dict.fromkeys(t for samp in by_row.values() for t in samp))
    doc.h(3, f"Sample outputs (test split, first seed): {cmp_dir.name}")
    for task in tasks:
        first = next(samp[task] for samp in by_row.values() if task in samp)
        rows = []
        for i, it in enumerate(first[:n]):
            rows.append(["source", it["source"]])
            rows.append(["reference", it["reference"]])
            for row, samp in by_row.items():
                items = samp.get(task, [])
                out = items[i].get("output", "-") if i < len(items) else "-"
                rows.append([row, out if out.strip() else "(empty output)"])
        doc.p(f"**{task}**")
        doc.table(["", "text"], rows)
    return by_row


def correction_tasks(cmp: dict[str, Any]) -> list[str]:
    """The comparison's tasks scored by edit F0.5 (csc)."""
    from skillnet.finetune.gen_metrics import CORRECTION_METRICS

    first = next(iter(cmp["methods"].values()), {"tasks": {}})
    return [t for t in cmp["tasks"] if first["tasks"].get(t, {}).get("metric") in CORRECTION_METRICS]


def f05_zero_rows(cmp: dict[str, Any], task: str) -> list[str]:
    """The comparison's rows whose test F0.5 on a correction task is 0: the one definition the detection finding
    and the samples of zero rows share. Scores are non-negative, so a mean of 0 is every seed at 0; the
    comparison's, not the seed folders', so that a seed folder the comparison does not count changes nothing."""
    return [m for m, r in cmp["methods"].items() if r.get("tasks", {}).get(task, {}).get("mean") == 0]


def _mean(values: list[float]) -> str:
    return f"{sum(values) / len(values):.1f}" if values else "-"


# The detection table's scores: span-level detection (edit_metrics.detection_prf), then SIGHAN-2015's sentence
# level (finetune/csc_metrics.py)
_DETECTION_CELLS = ("det_f0.5", "det_p", "det_r", "sent_det_f1", "sent_cor_f1", "sent_fpr", "sent_det_acc",
                    "sent_cor_acc")


def _detection_cells(values: dict[str, list[float]]) -> list[str]:
    """One row of the detection table after its name, from each score's values (the seeds'); "-" where none."""
    c = {k: _mean(values.get(k, [])) for k in ("f0.5", *_DETECTION_CELLS)}
    return [c["f0.5"], c["det_f0.5"], f"{c['det_p']} / {c['det_r']}", c["sent_det_f1"], c["sent_cor_f1"],
            c["sent_fpr"], f"{c['sent_det_acc']} / {c['sent_cor_acc']}"]


def detection_table(doc: Document, cmp: dict[str, Any], run_dir: Path, findings: list[str]) -> None:
    """Beside a correction task's F0.5, per row: the detection scores of its test outputs (mean over seeds), and a
    finding for the rows whose F0.5 is 0: do they find the wrong characters at all?"""
    for t in correction_tasks(cmp):
        rows, zero, zero_rows = [], {}, f05_zero_rows(cmp, t)
        for m in cmp["methods"]:
            det = diagnostics(run_dir, m, t, "det_f0.5")
            if not det:  # a run from before the detection scores
                continue
            seeds = {k: diagnostics(run_dir, m, t, k) for k in ("f0.5", *_DETECTION_CELLS)}
            rows.append([m, *_detection_cells(seeds)])
            if m in zero_rows:
                zero[m] = sum(det) / len(det)
        if not rows:
            continue
        # copying the source: the false-positive rate's floor (0), and the accuracy of changing nothing
        copy = {k: [v] for k in ("f0.5", *_DETECTION_CELLS)
                if (v := baseline_scores(run_dir, cmp, "trivial_test", k).get(t)) is not None}
        shown = rows + ([["copy the source", *_detection_cells(copy)]] if "sent_fpr" in copy else [])
        doc.p(f"**{t}**: edit F0.5 beside detection (test split, mean over seeds). A row can find the wrong "
              "characters before it learns which character to write: span-level detection (ChERRANT-style span "
              "matching, not SIGHAN's measure) counts an edit at a gold edit's span whatever it writes there; "
              "SIGHAN-2015's sentence level counts a sentence whose changed positions are exactly the gold ones "
              "(detection) and whose characters are too (correction), and its false-positive rate is the share "
              "of the sentences without an error that a row changes (copying the source: 0).")
        doc.table(["row", "F0.5", "span detection F0.5", "span detection P / R", "sentence detection F1",
                   "sentence correction F1", "false-positive rate", "sentence detection / correction accuracy"],
                  shown)
        if zero:
            found = [f"`{m}` {d:.1f}" for m, d in zero.items() if d > 0]
            findings.append(f"{t}: F0.5 is 0 in {len(zero)} of {len(rows)} rows; "
                            + (f"of these, detection F0.5 is above 0 in {len(found)} ({', '.join(found)}): they "
                               "find wrong characters but write the wrong ones" if found else
                               "none of them finds a wrong character either (detection F0.5 0)")
                            + " (see the detection table and the samples).")


def _edit_text(source: str, output: str) -> str:
    """The character edits source -> output, 1-based positions ("3 唷→友"; ∅ for nothing)."""
    from skillnet.finetune.edit_metrics import char_edits

    src = "".join(source.split())
    edits = sorted(char_edits(source, output))
    return ", ".join(f"{s + 1} {src[s:e] or '∅'}→{text or '∅'}" for s, e, text in edits) or "no edit"


def correction_samples(doc: Document, cmp: dict[str, Any], by_row: dict[str, dict[str, Any]], n: int = 3) -> None:
    """For a correction task, up to `n` kept test inputs that have an error, with the edits of the reference and of
    each row whose F0.5 is 0 (first seed): where it edits, against where it should (the samples above may all
    be sentences without an error)."""
    for t in correction_tasks(cmp):
        zero = [m for m in f05_zero_rows(cmp, t) if t in by_row.get(m, {})]
        if not zero:
            continue
        items = by_row[zero[0]][t]
        wrong = [i for i, it in enumerate(items) if "".join(it["source"].split()) != "".join(it["reference"].split())]
        rows = []
        for i in wrong[:n]:
            it = items[i]
            rows.append(["source", it["source"]])
            rows.append(["reference", f"{it['reference']} ({_edit_text(it['source'], it['reference'])})"])
            for m in zero:
                out = by_row[m][t][i].get("output", "") if i < len(by_row[m][t]) else ""
                rows.append([m, f"{out or '(empty output)'} ({_edit_text(it['source'], out)})"])
        if rows:
            doc.p(f"**{t}, inputs with an error** (first seed; rows with F0.5 0; in brackets the character edits "
                  "against the source, 1-based positions):")
            doc.table(["", "text (edits)"], rows)


def constant_outputs(by_row: dict[str, dict[str, Any]]) -> tuple[int, int]:
    """(row, task) pairs whose kept test outputs are one and the same text for every input, of all pairs."""
    pairs = [[x.get("output") for x in items] for samp in by_row.values() for items in samp.values() if len(items) > 1]
    return sum(len(set(p)) == 1 for p in pairs), len(pairs)
