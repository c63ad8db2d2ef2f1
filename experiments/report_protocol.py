"""The report's "Protocol" section (issue 55): what a skeptical reader checks before any table. What was tuned on
what (checkpoints, each row's lr, the NER loss, adaptation's starting point), what decontamination dropped, the
budgets each row realised, the pre-training runs, and the rule that decides claims with their number. Every
statement is read from the run's files; what a run lacks is said, not guessed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skillnet.experiments.loss_scale import DECISION_RULE, config_arm
from skillnet.experiments.tables import load
from skillnet.experiments.tune import DEV_SELECTED, RULE, result_path, search
from skillnet.finetune.document import Document
from skillnet.finetune.stats import decision_rule_text

PROTOCOL = "Protocol"
# The comparisons whose realised budgets the section lists, per report part.
BUDGET_TABLES = {"nlu": ("nlu_main", "nlu_ablate", "nlu_adapt"), "nlg": ("nlg_main", "nlg_adapt")}
# The verdicts of finetune.document.claim: a finding carrying one is a claim the report decides.
CLAIM_VERDICTS = ("**holds**", "**within the noise**", "**does not hold**", "no difference (")
# What protocol 2 (experiments/parts.py PROTOCOL_VERSION; issue 55) changed over protocol 1, the run committed
# before it: the list the "What changed since the last committed run" section (report_changes.py) states, each rule
# as this section then shows it for the run at hand. Protocol 1's side is what its committed report and code said.
PROTOCOL_CHANGES = (
    "**Data**: the pre-training corpus is built after every task and decontaminated (a document sharing text with "
    "any task's dev or test split is dropped), and dev and test examples that copy a train example are removed "
    "within each task, so the two runs' test sets are not the same examples; protocol 1 did neither "
    "(*Decontamination* above gives the rule and the counts).",
    "**Selection**: every choice is made on dev: each main-table row's peak lr by one search for all rows "
    "(protocol 1: one lr, chosen on a SkillNet run's test score), the NER loss by the loss-scale study, adaptation "
    "from each seed's dev-selected checkpoint with the task-specific row from the pre-trained dense BERT (protocol "
    "1: from a dense copy of the multi-task model).",
    "**Budgets**: every row gets the same realised updates per task on every seed, checked after the runs "
    "(protocol 1: each task-specific model trained half a joint row's steps on its one task, more updates on it "
    "than a joint row gave it); the step counts below.",
    "**Pre-training**: one sparse BERT per seed and a dense control with the same steps, objectives and data, "
    "fine-tuning seed k from pre-training seed k (protocol 1: one pre-training run per model, the baselines from "
    "the dense BERT, 500 steps and NSP behind the sparse one).",
    "**Test sets and seeds**: NLG tasks are tested on 500 examples (csc on its whole test split), the side studies "
    "run 2 seeds (protocol 1: 50 examples, 1 seed).",
    "**Metrics**: csc is decoded without an edit forced at characters outside the vocab and scored with "
    "SIGHAN-2015's sentence-level rates beside F0.5; the binary tasks' TF-IDF anchor ranks (ROC-AUC).",
    "**Decision rule**: a claim holds when its hierarchical paired bootstrap p-value, Holm-corrected over the "
    "report's claims, is below 0.05 (*Decision rule* above); protocol 1 called a difference beyond the noise when "
    "the seeds' paired t-test gave p < 0.05, uncorrected.",
)


def count_claims(findings: list[Any]) -> int:
    """The claims the report decided (a claim "not measured in this run" is not one): findings.Claim objects
    with a difference, or their words once `decide_claims` has rendered them."""
    return sum(1 for f in findings
               if (getattr(f, "d", None) is not None) or (isinstance(f, str) and any(v in f for v in CLAIM_VERDICTS)))


def protocol_section(doc: Document, out: Path, profile: Any, parts: tuple[str, ...], cmps: dict[str, Any],
                     n_claims: int) -> None:
    doc.h(2, PROTOCOL)
    doc.p("How every choice of this run was made, and on which split: a choice made on a test score would make the "
          "tables below an optimistic estimate for the rows it favoured.")
    doc.bullets(tuned_on_what(out, profile, parts, cmps))
    decontamination(doc, out)
    realised_budgets(doc, cmps, parts)
    pretraining_runs(doc, out)
    doc.p("**Decision rule.** " + decision_rule_text(n_claims))


def tuned_on_what(out: Path, profile: Any, parts: tuple[str, ...], cmps: dict[str, Any]) -> list[str]:
    items = ["Checkpoints: every run keeps the checkpoint of its best mean dev score over tasks (`best/`; each "
             "task-specific model its own); test is scored once, on that checkpoint, and never chooses anything."]
    for part in parts:
        items.append(lr_choice(out, profile, part))
    if profile.nlu_lr_grid or profile.nlg_lr_grid:
        items.append("The other studies train at lrs the search chose on dev, so that no lr is the profile's own: "
                     "the loss-scale study (run after the search, which used the model's default NER loss) each row "
                     "at its Table 3 row's lr; the side studies and the new task's SkillNet rows at SkillNet's, its "
                     "task-specific row at task-specific's.")
    else:
        side = [f"NLU {profile.nlu_lr:g}" for part in parts if part == "nlu"] + \
            [f"NLG {profile.nlg_lr:g}" for part in parts if part == "nlg"]
        items.append(f"Every table trains at the profile's lr ({', '.join(side)}), fixed before any run (the "
                     "papers' on the scale profile), the same for every row.")
    items.append(f"Batch size and steps: budget choices fixed before any run, by compute and the papers' epochs per "
                 f"task, not tuned (NLU batch {profile.nlu_batch} x {profile.nlu_steps:,} steps, NLG batch "
                 f"{profile.nlg_batch} x {profile.nlg_steps:,}; `experiments/profiles.py` gives the rationale).")
    if "nlu" in parts:
        items.append(ner_loss(out))
    items += adaptation_inits(cmps, parts)
    return items


def lr_choice(out: Path, profile: Any, part: str) -> str:
    s = search(profile, part)
    name = "NLU" if part == "nlu" else "NLG"
    if not s.grid:
        return (f"{name} learning rate: not searched; every row trains at peak lr {s.default_lr:g}, the profile's "
                "(for the base models: the papers' own).")
    rec = load(result_path(out, part))
    if not rec:
        return (f"{name} learning rate: to be chosen on dev from {', '.join(f'{x:g}' for x in s.grid)} (stage "
                f"{part}_tune, which has not written {result_path(out, part).name} yet).")
    runs = rec.get("runs") or len(rec.get("dev", {})) * len(rec.get("grid", []))
    cost = rec.get("total_run_seconds")
    chosen = "; ".join(
        f"`{row}` {lr:g} (dev " + ", ".join(f"{k}: {'-' if v is None else f'{v:.1f}'}"
                                            for k, v in rec.get("dev", {}).get(row, {}).items()) + ")"
        for row, lr in rec.get("chosen", {}).items())
    return (f"{name} learning rate, chosen on dev with the same search for every row: grid "
            f"{', '.join(f'{x:g}' for x in rec.get('grid', []))}, seed {rec.get('seed')}, {rec.get('steps'):,} steps "
            f"per run ({runs} runs" + (f", {cost / 60:.1f} min of run time" if cost else "") + f"); {RULE}. "
            f"Chosen: {chosen}.")


def ner_loss(out: Path) -> str:
    study = load(out / "loss_scale" / "loss_scale.json")
    used = load(out / "configs" / "nlu_main.json")
    used_arm = config_arm(used) if used else None
    if not study:
        return ("NER loss: no loss-scale study in this run" + (f"; Table 3 trained with `{used_arm}`" if used_arm
                                                               else "") + ".")
    dec = study.get("decision")
    if not dec:
        return ("NER loss: this run's loss-scale study predates the decision on dev (issue 55); its tables do not "
                "say which arm dev prefers.")
    scores = ", ".join(f"`{a}` {'-' if v is None else f'{v:.2f}'}" for a, v in dec["by_arm"].items())
    agree = ("" if used_arm is None else f" Table 3 trained with `{used_arm}`" +
             (", the winner." if used_arm == dec["winner"] else f", **not the winner** `{dec['winner']}`."))
    return (f"NER loss: chosen on dev by the loss-scale study ({', '.join(study.get('scores', {}))}, seeds "
            f"{study.get('seeds')}): {DECISION_RULE}. Mean dev score per arm: {scores}; winner `{dec['winner']}`."
            + agree)


def adaptation_inits(cmps: dict[str, Any], parts: tuple[str, ...]) -> list[str]:
    out = []
    for key, name in (("nlu_adapt", "NLU"), ("nlg_adapt", "NLG")):
        if key[:3] not in parts or not cmps.get(key):
            continue
        rows = cmps[key].get("rows") or {}
        inits = {lab: str(r.get("init") or "") for lab, r in rows.items()}
        from_best = [lab for lab, p in inits.items() if Path(p).name == DEV_SELECTED]
        other = {lab: p for lab, p in inits.items() if lab not in from_best}
        out.append(f"{name} adaptation: " + (f"{', '.join(f'`{x}`' for x in from_best)} start from each seed's "
                                             "dev-selected multi-task checkpoint (`best/`)" if from_best else
                                             "no row starts from a dev-selected checkpoint")
                   # the pre-trained model's folder: the last parts of its path that name it (pt_x[/seed{seed}]/hf)
                   + "".join(f"; `{lab}` from `{'/'.join(Path(p).parts[-3 if '{seed}' in p else -2:])}`"
                             for lab, p in other.items())
                   + ".")
    return out


def decontamination(doc: Document, out: Path) -> None:
    rec = load(out / "corpus" / "decontamination.json")
    if not rec:
        doc.p("**Decontamination.** This run wrote no `corpus/decontamination.json`: its pre-training corpus was "
              "not checked against the tasks' dev and test text.")
        return
    corpus = rec.get("corpus") or {}
    held = rec.get("heldout") or {}
    text = str(rec.get("rule", "-")).rstrip(".")
    rule = f"Rule: {text}" + (f" ({rec['ngram']}-character n-grams)." if rec.get("ngram") and str(rec["ngram"])
                              not in text else ".")
    docs = (f" Pre-training corpus: {_n(corpus.get('docs_in'))} documents in, {_n(corpus.get('docs_dropped'))} "
            f"dropped for sharing text with a dev or test example, {_n(corpus.get('docs_out'))} kept." if corpus else "")
    doc.p(f"**Decontamination.** {rule}{docs}")
    if isinstance(held.get("docs_dropped"), int):
        doc.p(f"Held-out text (the MLM floor's): {held['docs_dropped']:,} of {_n(held.get('docs_in'))} documents "
              "dropped.")
    by_task = rec.get("by_task") or {}
    dedup = rec.get("dedup") or {}
    rows = []
    for task in sorted(set(by_task) | set(dedup)):
        for split in sorted(set(by_task.get(task, {})) | set(dedup.get(task, {}))):
            m = by_task.get(task, {}).get(split, {})
            d = dedup.get(task, {}).get(split, {})
            rows.append([task, split, _n(m.get("examples")), _n(m.get("examples_matched")),
                         _n(d.get("examples_in")), _n(d.get("removed"))])
    if rows:
        doc.table(["task", "split", "examples", "sharing text with the corpus (its documents dropped)",
                   "examples before de-duplication", "removed as duplicates of train"], rows)


def _n(v: Any) -> str:
    return f"{v:,}" if isinstance(v, int) else "-"


def realised_budgets(doc: Document, cmps: dict[str, Any], parts: tuple[str, ...]) -> None:
    """Per comparison, each row's realised updates on each task (mean over seeds) and whether every row got the
    same count on every task and seed (compare's budget_gaps)."""
    shown = [(key, cmps[key]) for part in parts for key in BUDGET_TABLES.get(part, ()) if cmps.get(key)]
    if not shown:
        doc.p("**Realised budgets.** No comparison has recorded its updates yet.")
        return
    doc.p("**Realised budgets.** Optimizer updates each row realised on each task (mean over its seeds), and "
          "whether every row of the table got the same count on every task and seed:")
    for key, agg in shown:
        tasks = list(agg.get("tasks") or [])
        gaps = agg.get("budget_gaps") or {}
        rows = []
        for label, row in agg.get("methods", {}).items():
            ups = row.get("updates_realised") or row.get("updates") or {}
            seeds = row.get("updates_per_seed") or []
            rows.append([label, *(f"{ups[t]:,.0f}" if t in ups else "-" for t in tasks),
                         str(len(seeds)) if seeds else "-"])
        doc.p(f"`{key}`: " + ("equal in every row, task and seed." if not gaps else
                              f"**unequal** on {', '.join(gaps)}."))
        doc.table(["row", *tasks, "seeds recorded"], rows)


def pretraining_runs(doc: Document, out: Path) -> None:
    """The pre-training runs found in the run folder: one folder per run, or one per seed (seed*/)."""
    found = []
    for d in sorted(p for p in out.glob("pt_*") if p.is_dir()):
        seeds = sorted(int(s.name[4:]) for s in d.glob("seed*") if s.name[4:].isdigit())
        if seeds:
            found.append(f"`{d.name}` seeds {', '.join(map(str, seeds))} (fine-tuning seed k starts from seed k)")
        elif (d / "hf").is_dir() or (d / "log.jsonl").is_file():
            found.append(f"`{d.name}` one run")
    doc.p("**Pre-training runs.** " + ("; ".join(found) + "." if found else "none found in this run folder."))

