"""Run several multi-task methods on the same tasks, data, budget and seeds, and put them side by side.

    python -m skillnet.finetune.compare --config tasks.json --methods all --seeds 0 1 2 --init runs/pt/hf
    # 2 CPU ranks per run (or GPUs): every run goes through `deepspeed --num_gpus 2 ... --ds-config`
    python -m skillnet.finetune.compare --config tasks.json --methods skillnet dense_joint --nproc 2
    # any launcher (a cluster): the command prefix is yours
    python -m skillnet.finetune.compare --config tasks.json --launcher "deepspeed --hostfile hosts" --ds-config ds.json

Each (method, seed) run is an ordinary ``finetune.run`` in ``<output-dir>/<method>/seed<k>/`` (its log in
``run.log`` there). A run whose ``results.json`` exists is not run again, and an interrupted one resumes
from its last checkpoint, so the command can be stopped and rerun at any point. The table is written
whenever every run has finished: ``comparison.md`` / ``comparison.json`` (per-task test scores as mean ±
std over seeds, the average, parameters total / trainable / activated per task, wall time), and the
pictures ``curves.png`` (dev metric against step, per task and method) and ``skill_map.png`` (the
learned task-skill map of the first row that learned one).

Budgets (finetune/budgets.py): rows are compared at equal realised updates per task, per seed. A row's
updates on a task are the optimizer steps that train it: a joint row's micro-batches of the task over the
accumulation (stratified draws give each task exactly its rounded share), a task-specific model's own steps
(``train.task_specific_budget: "share"``: exactly that count). Rows whose configs give them different
updates per task (a ``--max-steps``, batch or sampler of one row, task-specific models under ``"full"``,
i.i.d. draws beside a task-specific row) are refused before anything runs. A finished comparison whose
realised updates differ (early stopping) writes its table as ``comparison.failed.md`` / ``.json`` (no
comparison.json, so a rerun does not take it as done) and exits 1; ``--allow-unequal-budgets`` accepts both
(for a study whose variable *is* the mix, such as the sampling alpha or temperature), the table still flags
them. The table's ``updates / task`` column gives each row's realised counts (the least and the most over
tasks), and a second table each task's.

Differences: every method sees the same seeds, and a seed fixes the initial weights, the task sequence
and the data order, so methods are compared seed by seed (paired), on the same test examples: each
difference gets a 95% interval from a hierarchical paired bootstrap over seeds and test examples
(finetune/stats.py, from each run's example_stats.json), called beyond the spread when it excludes 0; the
seeds' paired t-test stands beside it, and in for it where a run kept no per-example statistics.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skillnet.common.cli import Parser
from skillnet.finetune.budgets import (
    budget_gaps,
    budget_plan,
    check_budgets,
    realised,
    row_updates,
    updates_cell,
    write_comparison,
)
from skillnet.finetune.config import ConfigError, FinetuneConfig
from skillnet.finetune.document import Document, copied_to, pyplot, save_figure, verdict
from skillnet.finetune.methods import METHODS
from skillnet.finetune.stats import Bootstrap, bootstrap_for, difference_entry
from skillnet.finetune.workers import REPO, Job, run_all


def build_parser() -> argparse.ArgumentParser:
    p = Parser("skillnet.finetune.compare", description="Run multi-task methods with the same tasks, data, budget and seeds; write one comparison "
                    "table (Markdown + JSON) and pictures. Resumable: finished runs are kept.")
    p.add_argument("--config", required=True, help="fine-tuning config (JSON) shared by every run")
    p.add_argument("--methods", nargs="+", default=["all"], metavar="[LABEL=]METHOD",
                   help=f"rows of the table: methods, or 'all' ({', '.join(METHODS)}); LABEL=METHOD adds a "
                        "variant under its own label (e.g. skillnet_dense=skillnet with --init-for)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds; every method runs each")
    p.add_argument("--init", help="initial weights for every method (SkillNet export or dense HF checkpoint "
                                  "folder); '{seed}' in the path is replaced by each run's seed")
    p.add_argument("--init-for", dest="init_for", action="append", default=[], metavar="LABEL=DIR",
                   help="initial weights of one row instead of --init (repeatable), e.g. the 'w/o sparse "
                        "pre-training' row from the dense BERT")
    p.add_argument("--args-for", dest="args_for", action="append", default=[],
                   metavar="LABEL=ARGS", help="extra finetune.run options of one row (repeatable), e.g. "
                   "'s8_frozen=--new-skill s8 --freeze-old-skills' for the adaptation rows of Table 5")
    p.add_argument("--output-dir", dest="output_dir", default="runs/compare",
                   help="where runs, tables and pictures go: new or empty, or an earlier comparison of the same "
                        "config (continued); anything else is refused")
    p.add_argument("--max-steps", dest="max_steps", type=int,
                   help="override train.max_steps of the config")
    p.add_argument("--allow-unequal-budgets", dest="allow_unequal_budgets", action="store_true",
                   help="compare rows that get different updates per task (a row's own --max-steps or sampler, "
                        "task-specific models under task_specific_budget full, early stopping); without it such "
                        "a comparison is refused before it runs. For studies whose variable is the task mix "
                        "(sampling alpha or temperature); the table flags the rows either way")
    p.add_argument("--reference", default=None,
                   help="method the others are compared with (default: skillnet if run, else the first)")
    p.add_argument("--nproc", type=int, default=1,
                   help="ranks per run: 1 = plain PyTorch; N > 1 = `deepspeed --num_gpus N` with --ds-config")
    p.add_argument("--ds-config", dest="ds_config", default=None,
                   help="DeepSpeed JSON for multi-rank runs (default with --nproc > 1: ds_configs/cpu_fp32.json "
                        "without a GPU, ds_configs/zero2.json with one)")
    p.add_argument("--launcher", default=None,
                   help="command prefix that starts one run on many ranks, e.g. 'deepspeed --hostfile h' "
                        "(overrides --nproc)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads per run (default: torch's, or cores / --jobs with --jobs > 1)")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at once, each in its own worker process with cores / jobs threads: tiny models "
                        "use one thread better than two, so on a 2-core CPU --jobs 2 finishes a comparison "
                        "sooner (bench/compare_jobs.py measures it). Keep 1 on a GPU")
    p.add_argument("--report", default=None, metavar="MD",
                   help="also write the comparison as this Markdown file, its pictures beside it in img/ (an "
                        "existing file is replaced only if a comparison wrote it, or with --overwrite)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --report file that a comparison did not write")
    p.add_argument("--title", default="Multi-task methods compared", help="title of the report")
    p.add_argument("--no-plots", action="store_true", help="skip the pictures (no matplotlib needed)")
    p.add_argument("--dry-run", action="store_true", help="print the runs and their commands, run nothing")
    p.add_argument("--in-process", action="store_true",
                   help="run the one-process runs inside this process instead of a fresh interpreter each (saves "
                        "the start-up of Python and the libraries per run, which dominates tiny runs)")
    return p


@dataclass(frozen=True)
class Row:
    """One row of the table: a method under a label, with its own initial weights and options if given."""

    label: str
    method: str
    init: str | None = None
    args: tuple[str, ...] = ()


def resolve_rows(names: Sequence[str], init: str | None = None, init_for: Sequence[str] = (),
                 args_for: Sequence[str] = ()) -> list[Row]:
    if list(names) == ["all"]:
        names = list(METHODS)
    pairs = [n.split("=", 1) if "=" in n else [n, n] for n in names]
    bad = [m for _, m in pairs if m not in METHODS]
    if bad:
        raise ConfigError(f"--methods: unknown method(s) {bad}; valid: {', '.join(METHODS)} or all")
    labels = [lab for lab, _ in pairs]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"--methods: duplicate row labels {labels}; give variants their own LABEL=METHOD")

    def per_label(items: Sequence[str], flag: str) -> dict[str, str]:
        out = {}
        for it in items:
            if "=" not in it:
                raise ConfigError(f"{flag} {it!r}: expected LABEL=VALUE")
            lab, val = it.split("=", 1)
            if lab not in labels:
                raise ConfigError(f"{flag} {it!r}: no row labelled {lab!r}; rows: {', '.join(labels)}")
            out[lab] = val
        return out

    inits, extra = per_label(init_for, "--init-for"), per_label(args_for, "--args-for")
    for lab, path in inits.items():
        # "{seed}" in a path: each seed starts from its own folder (e.g. that seed's multi-task model)
        if "{seed}" not in path and not Path(path).exists():
            raise ConfigError(f"--init-for {lab}={path}: {path} does not exist")
    return [Row(lab, m, inits.get(lab, init), tuple(shlex.split(extra.get(lab, "")))) for lab, m in pairs]


def _check_row(base: FinetuneConfig, row: Row, seed: int) -> None:
    d = base.to_dict()
    d["method"] = row.method
    if row.init:
        init = Path(row.init.replace("{seed}", str(seed)))
        if not init.exists():
            raise ConfigError(f"row {row.label}, seed {seed}: initial weights {init} do not exist")
        d["model"]["init"] = str(init.resolve())
    cfg = FinetuneConfig.from_dict(d, where=f"config (row {row.label})", base_dir=base.base_dir)
    cfg.check_model(f"row {row.label}")


def row_config(config: Path, row: Row, max_steps: int | None = None) -> FinetuneConfig:
    """The config a row's runs train with: the shared config under the row's method and options (as
    ``finetune.run`` applies them)."""
    import contextlib
    import io

    from skillnet.finetune.cli import apply_overrides
    from skillnet.finetune.cli import build_parser as run_parser

    argv = ["--config", str(config), "--method", row.method, *row.args]
    if max_steps is not None:
        argv += ["--max-steps", str(max_steps)]
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            a = run_parser().parse_args(argv)
    except SystemExit:
        last = (err.getvalue().strip().splitlines() or ["bad options"])[-1]
        raise ConfigError(f"--args-for {row.label}: {last.split('error: ', 1)[-1]}") from None
    return apply_overrides(FinetuneConfig.load(config), a)


def run_dir(out: Path, label: str, seed: int) -> Path:
    return out / label / f"seed{seed}"


def run_command(a: argparse.Namespace, config: Path, row: Row, seed: int, rdir: Path) -> list[str]:
    args = ["--config", str(config), "--method", row.method, "--seed", str(seed), "--output-dir", str(rdir),
            "--resume", "auto", "--no-progress", *row.args]
    if row.init:  # checked to exist by _check_row
        args += ["--init", str(Path(row.init.replace("{seed}", str(seed))).resolve())]
    if a.max_steps is not None:
        args += ["--max-steps", str(a.max_steps)]
    if a.threads:
        args += ["--threads", str(a.threads)]
    if a.launcher or a.nproc > 1:
        import torch

        ds = a.ds_config or str(REPO / "ds_configs" / ("zero2.json" if torch.cuda.is_available() else "cpu_fp32.json"))
        prefix = shlex.split(a.launcher) if a.launcher else ["deepspeed", "--num_gpus", str(a.nproc)]
        return [*prefix, str(REPO / "finetune" / "run.py"), *args, "--ds-config", ds]
    return [sys.executable, "-m", "skillnet.finetune.run", *args]


# ---------------------------------------------------------------------------------------- aggregation
def _mean_std(xs: Sequence[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return math.nan, math.nan
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _score(r: dict[str, Any], split: str) -> float | None:
    v = r.get(split)
    return None if not isinstance(v, dict) else v.get(r["metric"])


def aggregate(out: Path, methods: list[str], seeds: list[int], split: str = "test") -> dict[str, Any]:
    rows: dict[str, Any] = {}
    tasks: list[str] = []
    for m in methods:
        runs = [json.loads((run_dir(out, m, s) / "results.json").read_text(encoding="utf-8")) for s in seeds]
        if not tasks:
            tasks = list(runs[0]["tasks"])
        per_task = {}
        for t in tasks:
            vals = [_score(r["tasks"][t], split) for r in runs]
            mean, std = _mean_std(vals)
            per_task[t] = {"mean": mean, "std": std, "values": vals, "metric": runs[0]["tasks"][t]["metric"]}
        avg_per_seed = [statistics.fmean(per_task[t]["values"][i] for t in tasks) for i in range(len(seeds))]
        a_mean, a_std = _mean_std(avg_per_seed)
        p = runs[0]["params"]
        rows[m] = {
            "tasks": per_task, "average": {"mean": a_mean, "std": a_std, "values": avg_per_seed},
            "params": {"total": p["total"], "trainable": p["trainable"],
                       "activated": {t: p["tasks"][t]["activated"] for t in tasks}},
            "seconds": {"mean": statistics.fmean(r["seconds"] for r in runs), "values": [r["seconds"] for r in runs]},
            "steps": runs[0]["steps"],
            # updates on each task (budgets.py): expected and realised, mean over seeds, and each seed's realised
            **row_updates(runs, tasks),
            "curves": {t: [r["tasks"][t].get("dev_curve", []) for r in runs] for t in tasks},
        }
    agg = {"split": split, "seeds": seeds, "tasks": tasks, "methods": rows}
    agg["budget_gaps"] = budget_gaps(agg)
    return agg


def differences(agg: dict[str, Any], reference: str, boot: Bootstrap | None = None) -> dict[str, Any]:
    """Each row minus `reference`, per task and on the average (finetune.stats.difference_entry)."""
    ref = agg["methods"][reference]
    res: dict[str, Any] = {}
    for m, row in agg["methods"].items():
        if m == reference:
            continue
        entry = {}
        for key in [*agg["tasks"], "average"]:
            a = row["average"]["values"] if key == "average" else row["tasks"][key]["values"]
            b = ref["average"]["values"] if key == "average" else ref["tasks"][key]["values"]
            entry[key] = difference_entry(a, b, boot, m, reference, key)
        res[m] = entry
    return res


def _fmt(ms: dict[str, Any]) -> str:
    if math.isnan(ms["mean"]):
        return "-"
    return f"{ms['mean']:.1f} ± {ms['std']:.1f}"


def document(agg: dict[str, Any], diffs: dict[str, Any], reference: str, title: str, pictures: dict[str, Path],
             command: str) -> Document:
    """The comparison as a document: scores, parameters, differences from the reference, variant rows,
    learned maps and the pictures (caption -> file)."""
    tasks, rows = agg["tasks"], agg["methods"]
    n = len(agg["seeds"])
    metric = {t: next(iter(rows.values()))["tasks"][t]["metric"] for t in tasks}
    doc = Document()
    doc.h(1, title)
    doc.p(f"Written by `{command}`. Scores are on the **{agg['split']}** split, one checkpoint per run "
          f"(selected by the mean dev score over tasks), as mean ± standard deviation over {n} seeds "
          f"({', '.join(map(str, agg['seeds']))}). *updates / task*: the optimizer steps that trained each task, "
          "as the runs logged them (a joint row's micro-batches of the task over the accumulation; a task-specific "
          "model's own steps), the least and the most over the tasks; rows are compared at equal updates per task.")
    gaps = agg.get("budget_gaps") or {}
    if gaps:
        doc.p("**Unequal budgets: these rows did not get the same updates per task**, so their differences "
              "mix the methods with the budgets: " + "; ".join(
                  f"{t}: " + ", ".join(f"{m} {n:,.0f}" for m, n in c.items()) for t, c in gaps.items()) + ".")
    doc.table(["method", *(f"{t} ({metric[t]})" for t in tasks), "average", "steps", "updates / task",
               "wall time / run"],
              [[m, *(_fmt(row["tasks"][t]) for t in tasks), _fmt(row["average"]), str(row["steps"]),
                updates_cell(realised(row)) + (" (unequal)" if gaps and realised(row) else ""),
                f"{row['seconds']['mean']:.0f} s"] for m, row in rows.items()])
    if any(realised(row) for row in rows.values()):
        doc.p("Updates per task, as realised (mean over seeds):")
        doc.table(["method", *tasks], [[m, *(f"{realised(row)[t]:,.0f}" if realised(row) else "-"
                                             for t in tasks)] for m, row in rows.items()])
    doc.p("Parameters (Tables 4 and 6: *activated* = what one task's forward pass uses):")
    doc.table(["method", "total", "trainable", *(f"activated: {t}" for t in tasks)],
              [[m, f"{row['params']['total']:,}", f"{row['params']['trainable']:,}",
                *(f"{row['params']['activated'][t]:,}" for t in tasks)] for m, row in rows.items()])
    if diffs:
        doc.p(f"Differences from **{reference}** (method − {reference}; paired over seeds and test examples) with "
              "their 95% bootstrap interval; **bold** = the interval excludes 0 (uncorrected)" + "".join(
                  sorted({f"; {m}: the seeds' t-test instead ({e['why']})" for m, en in diffs.items()
                          for e in en.values() if e["ci"] is None})) + ":")
        table = [[m, *(verdict(entry[k]["diff"], entry[k]["p"], n, entry[k]["ci"]) for k in [*tasks, "average"])]
                 for m, entry in diffs.items()]
        doc.table(["method", *tasks, "average"], table)
        beyond = [(m, k) for m, e in diffs.items() for k, v in e.items() if v["beyond_noise"]]
        doc.p(("Beyond the spread: " + ", ".join(f"{m} on {k}" for m, k in beyond) + ".") if beyond
              else "No difference from the reference lies beyond the spread over seeds.")
    variants = {lab: r for lab, r in agg.get("rows", {}).items() if lab != r["method"] or r["init"] or r["args"]}
    if variants:
        doc.p("Rows that are variants (method, initial weights, extra options):")
        doc.bullets([f"**{lab}**: method `{r['method']}`, init `{r['init'] or 'the preset, random'}`"
                     + (f", options `{' '.join(r['args'])}`" if r["args"] else "") for lab, r in variants.items()])
    maps = agg.get("learned_maps") or {}
    if maps:
        doc.p("Learned task-skill maps: task x skill cells whose selection changed during training (per seed):")
        doc.table(["row", "estimator", "sharpness", "changed cells"],
                  [[lab, str(m["estimator"]), f"{m['sharpness']:g}",
                    ", ".join("-" if c is None else str(c) for c in m["changed_cells"]) + f" of {m['cells']}"]
                   for lab, m in maps.items()])
    for caption, path in pictures.items():
        doc.img(path, caption)
    return doc


# ---------------------------------------------------------------------------------------- pictures
def plot_curves(agg: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    tasks, rows = agg["tasks"], agg["methods"]
    cols = min(3, len(tasks))
    nrows = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), squeeze=False)
    for i, t in enumerate(tasks):
        ax = axes[i // cols][i % cols]
        for m, row in rows.items():
            curves = [c for c in row["curves"][t] if c]
            if not curves:
                continue
            steps = sorted({s for c in curves for s, _ in c})
            by_step = [[v for c in curves for s2, v in c if s2 == s] for s in steps]
            mean = [statistics.fmean(v) for v in by_step]
            ax.plot(steps, mean, marker="o", ms=3, label=m)
            ax.fill_between(steps, [min(v) for v in by_step], [max(v) for v in by_step], alpha=0.15)
        metric = next(iter(rows.values()))["tasks"][t]["metric"]
        ax.set_title(t)
        ax.set_xlabel("optimizer step (task_specific: steps of its own run)")
        ax.set_ylabel(f"dev {metric}")
        ax.grid(alpha=0.3)
    for j in range(len(tasks), nrows * cols):
        axes[j // cols][j % cols].axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), frameon=False)
    fig.suptitle(f"Dev score during training (mean over seeds {agg['seeds']}; band = min..max)")
    save_figure(fig, path, rect=(0, 0.06, 1, 0.95))


def learned_maps(out: Path, rows: list[Row], seeds: list[int]) -> dict[str, Any]:
    """Per learned-map row: its estimator and how many task-skill cells the training changed, per seed
    (the map each run exported as skill_map.json)."""
    res: dict[str, Any] = {}
    for r in rows:
        docs = [run_dir(out, r.label, s) / "skill_map.json" for s in seeds]
        docs = [json.loads(d.read_text(encoding="utf-8")) for d in docs if d.is_file()]
        if docs:
            res[r.label] = {"estimator": docs[0].get("estimator"), "sharpness": docs[0].get("sharpness"),
                            "cells": len(docs[0]["tasks"]) * len(docs[0]["skills"]),
                            "changed_cells": [d.get("changed_cells") for d in docs]}
    return res


def learned_map_picture(out: Path, rows: list[Row], seeds: list[int], dest: Path) -> str | None:
    """The learned task-skill map of the first row whose run drew one (skill_map.png, written by every run
    with a learned map, whatever its method), copied to `dest`; returns that row's label."""
    for r in rows:
        for s in seeds:
            src = run_dir(out, r.label, s) / "skill_map.png"
            if src.is_file():
                shutil.copyfile(src, dest)
                return r.label
    return None


# ---------------------------------------------------------------------------------------- main
def claim_compare_dir(a: argparse.Namespace, config: Path, out: Path) -> None:
    """--output-dir and --report (common/outputs.py), before any run starts. A comparison of the same config
    continues in its folder (new rows or seeds included: each run's folder is claimed by its own finetune.run),
    anything else there is refused; with no way to tell another tool's files from its own, compare has no
    --overwrite for the folder."""
    from skillnet.common.outputs import claim_file, claim_output, starts_with

    claim_output(out, option="--output-dir", command="finetune.compare", identity={"config": str(config)},
                 overwrite=None, adopt=lambda d: any(d.glob("*/seed*/run.log")))
    if a.report:
        claim_file(a.report, option="--report", overwrite=a.overwrite,
                   own=starts_with("Written by `python -m skillnet.finetune.compare"))


def main(argv: Sequence[str] | None = None) -> int:
    from skillnet.common.outputs import OutputError, at_least, check_options, non_negative

    parser = build_parser()
    a = parser.parse_args(argv)
    check_options(parser, a, {"max_steps": at_least(1), "nproc": at_least(1), "threads": at_least(1),
                              "jobs": at_least(1), "seeds": non_negative()})
    if a.ds_config and not Path(a.ds_config).is_file():  # else every run fails on it, one after the other
        parser.error(f"--ds-config {a.ds_config}: no such file")
    try:
        rows = resolve_rows(a.methods, a.init, a.init_for, a.args_for)
        methods = [r.label for r in rows]
        config = Path(a.config).resolve()
        base = FinetuneConfig.load(config)  # fail on a bad config before the first run
        if len(set(a.seeds)) != len(a.seeds):
            raise ConfigError(f"--seeds has duplicates: {a.seeds}")
        for row in rows:  # every row against its model, before the first run starts
            for seed in a.seeds:
                _check_row(base, row, seed)
        plans = {row.label: budget_plan(row_config(config, row, a.max_steps)) for row in rows}
        refused = check_budgets(plans)
        if refused and not a.allow_unequal_budgets:
            raise ConfigError(refused)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not a.no_plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("error: the pictures need matplotlib: pip install 'skillnet[plots]' (or pass --no-plots)",
                  file=sys.stderr)
            return 2
    if a.jobs > 1 and not a.threads:
        a.threads = max(1, (os.cpu_count() or 1) // a.jobs)
    out = Path(a.output_dir).resolve()
    try:
        claim_compare_dir(a, config, out)
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plan = [(r, s) for s in a.seeds for r in rows]
    failed: list[tuple[str, int]] = []
    t_all = time.time()
    todo: list[Job] = []
    row_seed: dict[Path, tuple[str, int]] = {}  # a failed run is named by its row and seed, not its folder
    for i, (row, s) in enumerate(plan, 1):
        rdir = run_dir(out, row.label, s)
        row_seed[rdir] = (row.label, s)
        cmd = run_command(a, config, row, s, rdir)
        head = f"[compare] ({i}/{len(plan)}) {row.label} seed {s}"
        if (rdir / "results.json").is_file():
            print(f"{head}: done before, kept ({rdir / 'results.json'})", file=sys.stderr, flush=True)
        elif a.dry_run:
            print(f"{head}: {shlex.join(cmd)}", file=sys.stderr)
        else:
            todo.append((head, cmd, rdir, a.in_process and cmd[:3] == [sys.executable, "-m", "skillnet.finetune.run"]))

    def finished(job: Job, rc: int, secs: float) -> None:
        head, _, rdir, _ = job
        if rc != 0 or not (rdir / "results.json").is_file():
            tail = (rdir / "run.log").read_text(encoding="utf-8", errors="replace").splitlines()[-5:]
            print(f"{head}: FAILED (exit {rc}) after {secs:.0f} s; last lines of its log:\n  " + "\n  ".join(tail),
                  file=sys.stderr, flush=True)
            failed.append(row_seed[rdir])
            return
        res = json.loads((rdir / "results.json").read_text(encoding="utf-8"))
        dev = [_score(r, "dev") for r in res["tasks"].values()]
        dev = [x for x in dev if x is not None]
        msg = f"mean dev {statistics.fmean(dev):.1f}" if dev else "no dev set"
        print(f"{head}: finished in {secs:.0f} s, {msg}", file=sys.stderr, flush=True)

    run_all(todo, a.jobs, finished)
    if a.dry_run:
        return 0
    if failed:
        print(f"error: {len(failed)} run(s) failed: {failed}; fix and rerun the same command "
              "(finished runs are kept)", file=sys.stderr)
        return 1
    agg = aggregate(out, methods, a.seeds)
    agg["budgets"] = {"plans": plans, "equal": not agg["budget_gaps"], "allowed": a.allow_unequal_budgets}
    agg["learned_maps"] = learned_maps(out, rows, a.seeds)
    agg["rows"] = {r.label: {"method": r.method, "init": r.init, "args": list(r.args)} for r in rows}
    reference = a.reference or ("skillnet" if "skillnet" in methods else methods[0])
    boot = bootstrap_for({m: [run_dir(out, m, s) for s in a.seeds] for m in methods}, agg["tasks"])
    diffs = differences(agg, reference, boot) if len(methods) > 1 else {}
    pictures: dict[str, Path] = {}
    if not a.no_plots:
        plot_curves(agg, out / "curves.png")
        pictures["Dev score against training step, per task and method"] = out / "curves.png"
        label = learned_map_picture(out, rows, a.seeds, out / "skill_map.png")
        if label:
            pictures[f"Learned task-skill map ({label}, first seed): alpha per task and skill, selected cells "
                     "marked"] = out / "skill_map.png"
    command = "python -m skillnet.finetune.compare " + shlex.join(list(argv) if argv is not None else sys.argv[1:])
    doc = document(agg, diffs, reference, a.title, pictures, command)
    md = doc.markdown()
    passed = not agg["budget_gaps"] or a.allow_unequal_budgets
    table = write_comparison(out, {"reference": reference, **agg, "differences": diffs}, md, passed)
    if a.report and passed:
        rep = Path(a.report)
        stem = rep.stem
        rep.write_text(doc.markdown(copied_to(rep.parent / "img", lambda p: f"{stem}_{p.name}")), encoding="utf-8")
    print(md, file=sys.stderr)
    print(f"[compare] {len(plan)} runs, {time.time() - t_all:.0f} s; table: {table}", file=sys.stderr)
    if not passed:
        print(f"error: the rows got different updates per task ({', '.join(agg['budget_gaps'])}; early stopping?): "
              f"table in {table}, no comparison.json; pass --allow-unequal-budgets to accept it", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
