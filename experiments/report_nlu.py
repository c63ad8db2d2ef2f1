"""The SkillNet-NLU half of the reproduction report: Table 3, adaptation (Tables 4-5), ablation (Table 6)
and task sampling (Figure 3), each read from its compare run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skillnet.data_prep.tasks.lengths import WARN_CUT_SHARE
from skillnet.experiments.loss_scale import write_section
from skillnet.experiments.tables import (
    NLU_ROWS,
    NLU_STAND_INS,
    ablation_finding,
    at_or_below,
    at_positions,
    baseline_scores,
    budget_caption,
    cut_shares,
    differences,
    exported_positions,
    line_plot,
    load,
    n_seeds,
    same_task_sets,
    score_table,
    study_best,
    study_sizes,
    task_skills,
)
from skillnet.finetune.document import Document, claim

# The rows of each NLU table after Table 3 (NLU_ROWS) as the report names them; report_changes.py matches the
# committed run's rows by these names.
ADAPT_ROWS = [("a_existing", "(a) existing skills"), ("b_s8_frozen", "(b) + s8, old skills frozen"),
              ("c_s8_all", "(c) + s8, all skills updated"), ("task_specific", "task-specific")]


def ablation_rows(c: dict[str, Any]) -> list[tuple[str, str]]:
    return [("skillnet", "SkillNet-NLU (all skills)")] + [(k, f"without {k[3:]}") for k in c["methods"]
                                                          if k.startswith("no_")]


def alpha_rows(c: dict[str, Any]) -> list[tuple[str, str]]:
    return [(k, f"alpha = {k[6:]}") for k in c["methods"]]


def nlu_part(doc: Document, cmps: dict[str, Any], cmp_dir: Path, out: Path, findings: list[str]) -> None:
    nlu = cmps["nlu_main"]
    doc.h(2, "SkillNet-NLU: multi-task training (Table 3 layout)")
    if nlu:
        doc.p("Tasks (packaged real Chinese data): " + ", ".join(
            f"{t} ({nlu['methods'][next(iter(nlu['methods']))]['tasks'][t]['metric']})" for t in nlu["tasks"])
              + ". Seed k of each row starts from pre-training seed k. SkillNet and the learnable combination start "
              "from the sparsely pre-trained BERT (the dense BERT continued by sparse MLM+NSP steps); the "
              "baselines and `SkillNet-NLU w/o sparse pre-training` (every skill a copy of the FFN, §4.2) from its "
              "dense control, the dense BERT continued by the same steps, objectives, data and lr without skills. "
              "Every row thus has the same pre-training budget and objectives, so `w/o sparse pre-training` "
              "isolates the sparsity of pre-training, and the baselines are not a step and an objective behind "
              "(the paper starts them from its dense BERT).")
        smap = task_skills(out / "configs" / "nlu_main.json")
        if smap:
            doc.p("Each task stands in for a dataset of the paper. Its skills follow the logic of Table 2 of "
                  "SkillNet-NLU (Table 1's skills; insurance counts as the finance domain, s6; a task that reads "
                  "questions gets s5; s7 is the generic skill):")
            doc.table(["task", "stands in for", "skills"],
                      [[t, NLU_STAND_INS.get(t, "-"), " ".join(ss)] for t, ss in smap.items()])
            doc.p("OCNLI (natural language inference) has no packaged stand-in here.")
        budget_caption(doc, nlu)
        score_table(doc, nlu, NLU_ROWS)
        baselines(doc, nlu, cmp_dir / "nlu_main", findings)
        doc.p("Differences from SkillNet-NLU, paired over seeds and test examples, with 95% intervals (positive = "
              "SkillNet is better):")
        d = differences(doc, nlu, "skillnet", NLU_ROWS)
        n = len(nlu["seeds"])
        names = dict(NLU_ROWS)
        for key, text in (("task_specific", "SkillNet-NLU beats task-specific fine-tuning on average (Table 3)"),
                          ("dense_joint", "SkillNet-NLU beats the dense joint model on average (Table 3)"),
                          ("moe", "SkillNet-NLU beats the top-2 MoE on average (Table 3)"),
                          ("skillnet_dense", "Sparse pre-training improves SkillNet-NLU over the same pre-training done "
                                            "densely (Table 3, last rows)"),
                          ("pals", "SkillNet-NLU beats BERT and PALs on average (a comparison the SkillNet papers "
                                   "do not make; PALs are from Stickland and Murray, 2019)")):
            claim(findings, text, d.get(key, {}).get("average"), n, f"SkillNet-NLU minus {names[key]}")
        inv = differences(Document(), nlu, "learnable", NLU_ROWS).get("skillnet", {}).get("average")
        claim(findings, "The learnable skill combination beats SkillNet's fixed map (learnable-skill-combination "
                        "Table 1)", inv, n, "learnable (straight-through) minus SkillNet-NLU")
        maps = nlu.get("learned_maps") or {}
        if maps:
            doc.p("Learned task-skill maps: how many task x skill cells the training switched, per seed. Eq. 6 as "
                  "written (sharpness 1e9) passes no gradient from the task losses to the map in fp32; only the "
                  "orthogonality loss (Eq. 4) moves its skill embeddings, so the cells it switches are not chosen "
                  "by the tasks. The straight-through estimator passes the task losses' gradient:")
            doc.table(["row", "estimator", "sharpness", "changed cells per seed"],
                      [[k, str(m["estimator"]), f"{m['sharpness']:g}",
                        ", ".join("-" if c is None else str(c) for c in m["changed_cells"]) + f" of {m['cells']}"]
                       for k, m in maps.items()])
            moved = {k: any(c for c in m["changed_cells"] if c) for k, m in maps.items()}
            findings.append("Learned map: " + "; ".join(
                f"`{k}` ({maps[k]['estimator']}) {'moved away from' if v else 'stayed at'} its initial map "
                f"({', '.join('-' if c is None else str(c) for c in maps[k]['changed_cells'])} of "
                f"{maps[k]['cells']} cells per seed)" for k, v in moved.items())
                + (". Under Eq. 6 as written only the orthogonality loss moves the map." if "learnable_eq6" in maps
                   else "."))
        doc.img(cmp_dir / "nlu_main" / "curves.png", "Dev score against step, per task and method (NLU)")
        doc.img(cmp_dir / "nlu_main" / "skill_map.png", "The learned task-skill map (learnable, first seed)")
    else:
        doc.p("Not run yet (stage nlu_main).")

    study = load(out / "loss_scale" / "loss_scale.json")
    if study:  # stage nlu_loss_scale: its winner on dev is the NER loss of every table here (nlu.nlu_config)
        write_section(doc, study, 2, "SkillNet-NLU: the NER loss's scale in joint training")

    doc.h(2, "Adaptation to a new task (Tables 4 and 5 layout)")
    if cmps["nlu_adapt"]:
        c = cmps["nlu_adapt"]
        doc.p("The held-back task is trained from each seed's multi-task SkillNet-NLU at its dev-selected checkpoint "
              "(the model Table 3 scored): (a) with its existing skills {s1, s3, s5, s7}; (b) with a new skill s8 "
              "copied from s7, old skills frozen (only s8 and the head learn); (c) with s8 and every skill updated; "
              "and task-specific fine-tuning of the pre-trained dense BERT that Table 3's task-specific row starts "
              "from (the paper's Table 4 setting).")
        order = ADAPT_ROWS
        budget_caption(doc, c)
        score_table(doc, c, order)
        learning_metrics(doc, c, cmp_dir / "nlu_adapt", out / "tasks", order)
        doc.p("Differences from (a), paired over seeds and test examples, with 95% intervals (positive = (a) is "
              "better):")
        d = differences(doc, c, "a_existing", order)
        n = len(c["seeds"])
        claim(findings, "On the new task, SkillNet with its existing skills beats task-specific fine-tuning "
                        "(Table 4)", d.get("task_specific", {}).get("average"), n, "(a) minus task-specific")
        inv = differences(Document(), c, "c_s8_all", []).get("a_existing", {}).get("average")
        claim(findings, "Adding a new skill s8 (all skills updated) improves on the existing skills (Table 5)", inv, n,
              "(c) minus (a)")
    doc.h(2, "Skill ablation (Table 6 layout)")
    if cmps["nlu_ablate"]:
        c = cmps["nlu_ablate"]
        order = ablation_rows(c)
        doc.p("As in §5.1 of SkillNet-NLU, the ablation starts from the dense BERT with every skill a copy of its FFN "
              "(SkillNet-NLU w/o sparse pre-training); removing a skill removes it from every task that uses it. "
              f"{n_seeds(c)}.")
        budget_caption(doc, c)
        score_table(doc, c, order, params=False)
        twins = same_task_sets(out / "configs" / "nlu_main.json", [k[3:] for k in c["methods"] if k.startswith("no_")])
        if twins:
            doc.p("Skills used by exactly the same tasks start as identical copies, so removing one or the other "
                  "gives the same model and the same scores: " + "; ".join(" and ".join(t) for t in twins) + ".")
        if any(k.startswith("no_") for k in c["methods"]):
            steps = (load(out / "configs" / "nlu_ablate.json") or {}).get("train", {}).get("max_steps")
            findings.append(ablation_finding(doc, c, order, steps))
    doc.h(2, "Task sampling (Figure 3 of SkillNet-NLU)")
    if cmps["nlu_alpha"]:
        c = cmps["nlu_alpha"]
        study_sizes(doc, out / "configs" / "nlu_alpha.json", "alpha", "SkillNet-NLU's dataset table")
        budget_caption(doc, c, "by design: alpha sets each task's sampling share")
        score_table(doc, c, alpha_rows(c), params=False)
        findings.append(study_best(doc, c, alpha_rows(c), "Sampling", "alpha = 1.0"))
        line_plot(c, "alpha", cmp_dir / "nlu_alpha" / "sampling.png", "Average test score against the sampling rate alpha")
        doc.img(cmp_dir / "nlu_alpha" / "sampling.png", "Average test score against alpha (SkillNet w/o sparse pre-training)")


def baselines(doc: Document, nlu: dict[str, Any], run_dir: Path, findings: list[str]) -> None:
    """Non-neural anchors on the same test splits: the trivial predictor of each task type, and the
    TF-IDF baseline fit on train where the type has one; then where the neural rows stand."""
    tasks = nlu["tasks"]
    triv, lex, lex_cut, names, size, seq = (baseline_scores(run_dir, nlu, k) for k in (
        "trivial_test", "lexical_test", "lexical_cut_test", "lexical_name", "test_examples", "max_seq_len"))
    cut = cut_shares(run_dir, nlu)
    if not triv:
        return

    def cell(d: dict[str, Any], t: str) -> str:
        return f"{d[t]:.1f}" if t in d else "-"

    doc.p("Non-neural baselines on the same test splits: the trivial predictor (majority class; all-`O` for "
          "NER; the context's first character for spans; random choice for matching) and, where the task type "
          "has one, a baseline fit on the train split (" + "; ".join(sorted({f"{n}" for n in names.values()}))
          + ", character 1-2-grams, scikit-learn). The last rows are each test split's size, the task's "
          "max_seq_len (the length that holds 95% of its training examples, unless the model's positions are "
          "fewer) and the share of test examples longer than it, which every model reads cut. Where a task has "
          "cut examples, `TF-IDF, cut` is the same baseline fit and scored on what the model reads of each "
          "example (its texts cut at max_seq_len as the model's input is): the difference to `TF-IDF` is what "
          "the cut alone costs a reader of the characters.")
    doc.table(["baseline", *tasks], [["trivial", *[cell(triv, t) for t in tasks]],
                                     ["TF-IDF", *[cell(lex, t) for t in tasks]],
                                     *([["TF-IDF, cut", *[cell(lex_cut, t) for t in tasks]]] if lex_cut else []),
                                     ["test examples", *[f"{size[t]:,}" if t in size else "-" for t in tasks]],
                                     ["max_seq_len", *[str(seq[t]) if t in seq else "-" for t in tasks]],
                                     ["test examples cut", *[f"{cut[t]:.1f}%" if t in cut else "-" for t in tasks]]])
    long = {t: v for t, v in cut.items() if v > 100 * WARN_CUT_SHARE}
    if long:
        positions = exported_positions(run_dir)
        capped = at_positions(long, seq, positions)
        why = ""
        if capped:
            why += (f" {' and '.join(sorted(capped))} read{'s' if len(capped) == 1 else ''} {positions} tokens, the "
                    "model's positions: no longer input is possible without pre-training more positions.")
        if set(long) - capped:
            why += (f" {' and '.join(sorted(set(long) - capped))} could read more: a longer max_seq_len fits "
                    + (f"the model's {positions} positions." if positions else "the model's positions."))
        findings.append("Cut by max_seq_len: " + ", ".join(
            f"{t} ({v:.1f}% of its test examples are longer than {seq.get(t, '?')} tokens)" for t, v in long.items())
            + ". Their models read the start of those examples only (TF-IDF reads them whole)." + why
            + "".join(f" {t}: TF-IDF scores {lex[t]:.1f} on the whole examples and {lex_cut[t]:.1f} on what the "
                      "model reads of them, so the cut " + ("costs a reader of the characters little (a gap of "
                      f"{lex[t] - lex_cut[t]:+.1f} points)" if abs(lex[t] - lex_cut[t]) < 2.0 else
                      f"costs {lex[t] - lex_cut[t]:.1f} points") + "."
                      for t in long if t in lex and t in lex_cut))
    below_triv = at_or_below(nlu, triv)
    if below_triv:
        findings.append("At or below the trivial baseline: " + ", ".join(f"`{m}` on {t}" for m, t in below_triv)
                        + " (those rows learnt nothing usable on that task).")
    for t in (t for t in tasks if t in lex):
        best = max(nlu["methods"], key=lambda m: nlu["methods"][m]["tasks"][t]["mean"])
        top = nlu["methods"][best]["tasks"][t]["mean"]
        findings.append(f"{t}: the best neural row (`{best}`, {top:.1f}) is "
                        f"{'above' if top > lex[t] else 'at or below'} the TF-IDF baseline ({lex[t]:.1f}).")


def learning_metrics(doc: Document, c: dict[str, Any], run_dir: Path, tasks_dir: Path,
                     order: list[tuple[str, str]]) -> None:
    """Accuracy and ROC-AUC of each binary task of a comparison, per row, beside always-yes and chance: on a
    balanced split positive-class F1 gives always-yes 66.7, where these give it 50, so a row above 50 has
    learnt something."""
    import statistics

    for t in c["tasks"]:
        spec = tasks_dir / t / "task.json"
        per_row: dict[str, dict[str, list[float]]] = {}
        for key in c["methods"]:
            for f in sorted((run_dir / key).glob("seed*/results.json")):
                r = (load(f) or {}).get("tasks", {}).get(t, {}).get("test") or {}
                for m in ("accuracy", "auc"):
                    if isinstance(r.get(m), (int, float)):
                        per_row.setdefault(key, {}).setdefault(m, []).append(float(r[m]))
        gold = (load(spec) or {}).get("label_counts", {}).get("test")
        if not any("auc" in v for v in per_row.values()) or not gold:
            continue
        n_gold = sum(gold.values())
        yes = 100.0 * gold.get("1", 0) / n_gold

        def cell(v: list[float] | None) -> str:
            if not v:
                return "-"
            return f"{statistics.fmean(v):.1f}" + (f" ± {statistics.stdev(v):.1f}" if len(v) > 1 else "")

        names = dict(order)
        doc.p(f"{t}, scored by what shows learning: test accuracy and ROC-AUC (x100: the chance that a right answer "
              "scores above a wrong one), beside the predictors that learn nothing. Always-yes and chance score "
              f"ROC-AUC 50 on any split, and accuracy {yes:.1f} and 50 on this one ({n_gold:,} pairs, "
              f"{yes:.1f}% right answers):")
        doc.table(["model", "accuracy", "ROC-AUC"],
                  [[names.get(k, k), cell(v.get("accuracy")), cell(v.get("auc"))] for k, v in per_row.items()]
                  + [["always yes", f"{yes:.1f}", "50.0"], ["chance (random answer)", "50.0", "50.0"]])

