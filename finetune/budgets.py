"""Equal budgets across the rows of a comparison (``finetune.compare``): what fixes a row's updates per task
(its plan, read from its config before anything runs), what each run realised (its results.json), and
where rows differ after the runs.

A row's updates on a task are the optimizer steps that train it, each of ``batch_size`` examples: a joint
row's micro-batches of the task divided by the accumulation, a task-specific model's own steps. Under the
default stratified draws (finetune/samplers.py) a joint run realises exactly ``unit_counts()`` per task,
and a task-specific model under ``task_specific_budget: "share"`` trains exactly those counts (the same
function), so equal plans give equal realised updates, per task and per seed.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

from skillnet.finetune.config import FinetuneConfig
from skillnet.finetune.methods import METHODS

# Realised counts are whole updates (or micro-batches over the accumulation): equal means equal, up to the
# float of a division.
_SAME = 1e-6


def _sampler_text(cfg: FinetuneConfig) -> str:
    s = cfg.sampler
    knobs = {"proportional": f"alpha {s.alpha:g}", "temperature": f"T {s.temperature:g}, K {s.size_cap}",
             "annealed": f"{s.num_epochs or 'derived'} epochs", "round_robin": ""}[s.kind]
    return s.kind + (f" ({knobs})" if knobs else "")


def examples_per_update(cfg: FinetuneConfig) -> str:
    """The examples one update trains on, as the config fixes them (rows of one comparison share the launch,
    so what the config leaves to it is the same for every row)."""
    tc = cfg.train
    if tc.batch_size:
        return f"{tc.batch_size} examples"
    micro = tc.micro_batch_size or "default"
    return f"micro-batch {micro} x accumulation {tc.grad_accum or 'default'} per rank"


def budget_plan(cfg: FinetuneConfig) -> str:
    """What fixes a row's updates per task, from its config alone (no data): two rows with the same plan give
    every task the same updates. A joint row's updates on a task follow from its steps, the examples per
    update and its sampler; a task-specific model under "share" trains exactly the joint row's count, under
    "full" every task gets all the steps. With i.i.d. draws a joint row's counts are random around the share
    a task-specific model trains, so the two plans differ."""
    steps, batch = cfg.train.max_steps, examples_per_update(cfg)
    if len(cfg.tasks) == 1:
        return f"{steps} updates of {batch} on its one task"
    per_task = METHODS[cfg.method].per_task
    if per_task and cfg.train.task_specific_budget == "full":
        return f"{steps} updates of {batch} on each task (task_specific_budget full)"
    plan = f"{steps} updates of {batch} shared by {_sampler_text(cfg)} sampling"
    if cfg.sampler.draw == "iid":
        return plan + (", each task's expected share" if per_task else ", i.i.d. draws")
    return plan + ", stratified"


def check_budgets(plans: dict[str, str]) -> str | None:
    """None when every row has the same budget plan, else the one-line reason to refuse the comparison."""
    groups: dict[str, list[str]] = {}
    for label, plan in plans.items():
        groups.setdefault(plan, []).append(label)
    if len(groups) < 2:
        return None
    return ("rows get different updates per task: " + "; ".join(f"{', '.join(labs)}: {plan}"
                                                               for plan, labs in groups.items())
            + ". Give every row the same budget (the same steps, batch and sampler; task-specific models: "
              "task_specific_budget share; sampler.draw stratified), or pass --allow-unequal-budgets to compare "
              "them anyway (the table flags them)")


def run_updates(r: dict[str, Any]) -> tuple[dict[str, float], dict[str, float]] | None:
    """(expected, realised) updates on each task of one run's results.json: a joint run's steps times the
    task's target share, and its logged micro-batches of the task over the accumulation (older results:
    steps times the realised share); a per-task method's own steps, both. None for a run that recorded
    neither (older results)."""
    tasks = r.get("tasks", {})
    method = METHODS.get(r.get("method", ""))
    if method is not None and method.per_task:
        if not all("steps" in t for t in tasks.values()):
            return None
        own = {t: float(v["steps"]) for t, v in tasks.items()}
        return own, own
    mix = r.get("task_mix")
    if not mix:
        return None
    steps = float(r["steps"])
    realised = {t: float(mix[t]["updates"]) if "updates" in mix[t] else steps * mix[t]["realised"] for t in tasks}
    return {t: steps * mix[t]["target"] for t in tasks}, realised


def row_updates(runs: list[dict[str, Any]], tasks: list[str]) -> dict[str, Any]:
    """A row's updates over its seeds' runs: expected and realised (mean over seeds), and the realised counts
    of each seed (what the rows must agree on); None where a run recorded none."""
    ups = [run_updates(r) for r in runs]
    if any(u is None for u in ups):
        return {"updates": None, "updates_realised": None, "updates_per_seed": None}
    return {"updates": {t: statistics.fmean(u[0][t] for u in ups) for t in tasks},  # type: ignore[index]
            "updates_realised": {t: statistics.fmean(u[1][t] for u in ups) for t in tasks},  # type: ignore[index]
            "updates_per_seed": [{t: u[1][t] for t in tasks} for u in ups]}  # type: ignore[index]


def realised(row: dict[str, Any]) -> dict[str, float] | None:
    """A table row's realised updates per task (mean over seeds; an older aggregate's expected ones)."""
    return row.get("updates_realised") or row.get("updates")


def budget_gaps(agg: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Tasks on which the rows' realised updates differ for some seed, each with every row's count (mean over
    seeds); empty when every row trained every task equally often on every seed."""
    gaps: dict[str, dict[str, float]] = {}
    rows = {m: row for m, row in agg["methods"].items() if realised(row)}
    seeds = [row.get("updates_per_seed") or [realised(row)] for row in rows.values()]
    for t in agg["tasks"]:
        counts = [[s[i][t] for s in seeds] for i in range(min(map(len, seeds), default=0))]
        if any(len(c) > 1 and max(c) - min(c) > _SAME * max(1.0, max(c)) for c in counts):
            gaps[t] = {m: realised(row)[t] for m, row in rows.items()}  # type: ignore[index]
    return gaps


def updates_cell(updates: dict[str, float] | None) -> str:
    """A row's updates per task in one cell: the count, or the least and the most over its tasks."""
    if not updates:
        return "-"
    lo, hi = round(min(updates.values())), round(max(updates.values()))
    return f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"


COMPARISON = ("comparison.json", "comparison.md")
FAILED = ("comparison.failed.json", "comparison.failed.md")


def write_comparison(out: Path, result: dict[str, Any], markdown: str, passed: bool) -> Path:
    """The comparison's JSON and Markdown: as comparison.json/.md only when it passed its budget checks (a
    rerun's done-check reads comparison.json), else as comparison.failed.json/.md, with whatever the other
    outcome left there before removed. Returns the Markdown's path."""
    keep, drop = (COMPARISON, FAILED) if passed else (FAILED, COMPARISON)
    for name in drop:
        (out / name).unlink(missing_ok=True)
    (out / keep[0]).write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    (out / keep[1]).write_text(markdown, encoding="utf-8")
    return out / keep[1]
