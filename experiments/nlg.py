"""The SkillNet-NLG half: BART denoising pre-training, the generation task data, and the comparisons of
NLG Tables 3 and 4 and §3.4 (sampling temperature)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from skillnet.experiments.profiles import Profile
from skillnet.experiments.runner import (
    PY,
    Runner,
    check_floor,
    compare,
    paper_ratio_caps,
    paths,
    pt_args,
    task_counts,
    write_config,
)
from skillnet.experiments.tune import (
    chosen_lrs,
    dev_selected,
    refuse_stale,
    run_search,
    search,
    study_lrs,
    with_lrs,
)


def stage_bart_pt(r: Runner) -> dict[str, Any]:
    """A small Chinese BART pre-trained by denoising (text infilling): no Chinese BART weights exist offline,
    and SkillNet-NLG copies every skill from a pre-trained dense BART (Appendix C.1)."""
    P = paths(r.out)
    cfg = write_config(r, "bart", r.p.bart) if r.p.bart else None
    model = ["--model-config", str(cfg)] if cfg else ["--preset", "base"]
    args = ["--arch", "bart", "--shards", str(P["shards"]), *model, *pt_args(r, r.p.bart_pt_steps, r.p.bart_pt_lr),
            "--output-dir", str(P["bart"])]
    r.run(r.deepspeed("pretrain/run.py", args, r.p.bart_pt_batch or r.p.pt_batch))
    r.run([PY, "-m", "skillnet.pretrain.export", "--checkpoint", str(P["bart"]), "--out", str(P["bart_hf"])])
    return check_floor(r, P["bart"])


NLG_FORMATS = {"csc": "csc", "insuranceqa_answer": "insuranceqa-answer", "insuranceqa_question": "insuranceqa-question",
               "poetry_title": "poetry-title", "poetry_next_line": "poetry-next-line"}
NLG_LENGTHS = {"csc": (64, 64), "insuranceqa_answer": (64, 96), "insuranceqa_question": (96, 48),
               "poetry_title": (32, 64), "poetry_next_line": (32, 32)}


def gen_tasks() -> dict[str, Any]:
    from skillnet.data_prep.tasks.generation import GEN_TASKS

    return GEN_TASKS


NLG_PAPER_SIZES = {"csc": 1_200_000, "insuranceqa_answer": 740_000, "insuranceqa_question": 2_160_000,
                   "poetry_title": 114_000}


def nlg_test_cap(p: Profile, name: str) -> int | None:
    """Test examples of an NLG task: its per-task cap (None: the whole split), else the profile's nlg_test, else
    nlg_eval. The converter caps dev at the same number; fine-tuning cuts dev to nlg_eval (nlg_config)."""
    return p.nlg_eval_per_task.get(name, p.nlg_test or p.nlg_eval)


def eval_cap_args(r: Runner, name: str) -> list[str]:
    cap = nlg_test_cap(r.p, name)
    return [] if cap is None else ["--max-eval-examples", str(cap)]


def stage_nlg_tasks(r: Runner) -> dict[str, Any]:
    P = paths(r.out)
    r.run_many([([PY, "-m", "skillnet.data_prep.tasks", "convert", fmt, "--out", str(P["tasks"] / name),
                  "--max-examples", str(r.p.nlg_train), *eval_cap_args(r, name)],
                 P["tasks"] / name / "task.json") for name, fmt in NLG_FORMATS.items()], r.p.jobs)
    return {"counts": task_counts(P["tasks"], list(NLG_FORMATS))}


def nlg_config(r: Runner, names: list[str], steps: int, name: str, caps: dict[str, int] | None = None,
                **sampler: Any) -> Path:
    P = paths(r.out)
    p = r.p
    info = gen_tasks()
    tasks = []
    for n in names:
        src, tgt = NLG_LENGTHS[n]
        tasks.append({"name": n, "type": "generation", "spec": str(P["tasks"] / n / "task.json"),
                      "skills": list(info[n].skills), "metric": info[n].metric, "max_seq_len": src,
                      "max_target_len": tgt, "num_beams": p.nlg_beams,
                      **({"max_train_examples": caps[n]} if caps else {}),
                      # a task tested on more than nlg_eval examples is still selected on nlg_eval dev examples
                      **({"max_dev_examples": p.nlg_eval} if nlg_test_cap(p, n) != p.nlg_eval else {})})
    d = {
        "model": {"preset": "tiny" if p.bart else "base", "overrides": dict(p.bart)},
        "tasks": tasks,
        # NLG Eq. 4 with the paper's T = 4 and K = 2^21
        "sampler": {"kind": "temperature", "temperature": 4.0, "size_cap": 2**21, **sampler},
        "train": {"max_steps": steps, "batch_size": p.nlg_batch, "eval_batch_size": 32, "lr": p.nlg_lr,
                  "warmup_ratio": 0.1, "eval_every": p.nlg_eval_every, "log_every": max(1, p.nlg_eval_every // 2),
                  "label_smoothing": 0.1, "task_specific_budget": "share", "seed": 0},  # the budget rule
        "output_dir": str(r.out / "unused"),
    }
    return write_config(r, name, d)


def nlg_train_tasks() -> list[str]:
    return [n for n, i in gen_tasks().items() if not i.held_out and n in NLG_FORMATS]


def stage_nlg_tune(r: Runner) -> dict[str, Any]:
    """Every row of NLG Table 3 at every lr of the profile's grid, one seed, a reduced budget; each row's lr is
    the one of the best mean dev score (experiments/tune.py)."""
    P = paths(r.out)
    cfg = nlg_config(r, nlg_train_tasks(), search(r.p, "nlg").steps, "nlg_tune")
    return run_search(r, "nlg", cfg, P["bart_hf"], {})


def stage_nlg_main(r: Runner) -> dict[str, Any]:
    P = paths(r.out)
    cfg = nlg_config(r, nlg_train_tasks(), r.p.nlg_steps, "nlg_main")
    lrs = chosen_lrs(r, "nlg")  # each row's lr, chosen on dev by stage nlg_tune
    refuse_stale(r, P["cmp"] / "nlg_main", lrs)  # a finished table of other settings is not rerun by compare
    compare(r, cfg, P["cmp"] / "nlg_main", r.p.nlg_methods, r.p.seeds, P["bart_hf"], with_lrs([], lrs))
    return {"lr": lrs}


def stage_nlg_temp(r: Runner) -> dict[str, Any]:
    P = paths(r.out)
    cfg = nlg_config(r, nlg_train_tasks(), r.p.nlg_steps, "nlg_temp",
                      caps=paper_ratio_caps(NLG_PAPER_SIZES, r.p.nlg_train))
    rows = [f"T_{t:g}=skillnet" for t in r.p.temperatures]
    extra = with_lrs([x for t in r.p.temperatures
                      for x in ("--args-for", f"T_{t:g}=--sampler temperature --temperature {t}")],
                     study_lrs(r, "nlg", {x.split("=")[0]: "skillnet" for x in rows}))  # SkillNet-NLG's lr
    extra.append("--allow-unequal-budgets")  # the task mix, and so each task's updates, is what this study varies
    compare(r, cfg, P["cmp"] / "nlg_temp", rows, r.p.side_seeds, P["bart_hf"], extra)
    return {}


def stage_nlg_adapt(r: Runner) -> dict[str, Any]:
    """NLG Table 4: the held-back task from each seed's multi-task SkillNet-NLG at its dev-selected checkpoint
    (the model NLG Table 3 scored), with its Table-2-style skills (existing) and with a new skill; task-specific
    fine-tuning starts from the pre-trained BART, as a model trained for the new task alone would (NLG Table 4's
    "task-specific fine-tuning"; the NLU half's Table 5 row does the same from the dense BERT)."""
    P = paths(r.out)
    new = [n for n, i in gen_tasks().items() if i.held_out][0]
    cfg = nlg_config(r, [new], r.p.nlg_adapt_steps or r.p.adapt_steps, "nlg_adapt")
    init = dev_selected(P["cmp"] / "nlg_main", "skillnet")
    rows = ["a_existing=skillnet", "c_new_skill=skillnet", "task_specific"]
    extra = ["--args-for", "c_new_skill=--new-skill new_task", "--reference", "a_existing",
             "--init-for", f"task_specific={P['bart_hf']}"]
    extra = with_lrs(extra, study_lrs(r, "nlg", {x.split("=")[0]: x.split("=")[-1] for x in rows}))
    compare(r, cfg, P["cmp"] / "nlg_adapt", rows, r.p.seeds, init, extra)
    return {}
