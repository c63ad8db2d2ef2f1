"""The peak learning rate of every row of the main tables, chosen on dev with the same search for every method
(issue 55: the full profile's lr had been chosen on one SkillNet run's test score).

Stage nlu_tune (nlg_tune) runs every row of Table 3 (NLG Table 3) at every lr of the profile's grid, at one seed
(the first) and a reduced budget (``Profile.nlu_tune_steps`` / ``nlg_tune_steps``), as one `finetune.compare` in
``compare/<part>_tune/``. Each row takes the lr whose run has the best mean dev score (the average over tasks at the
run's dev-selected checkpoint, what checkpoint selection reads); the grid, every dev score, the choice and the
runs' cost go to ``tune/<part>.json``, and stage nlu_main (nlg_main) passes each row its lr (``--args-for
LABEL=--lr X``). Batch size and steps are not searched: they are budget choices fixed a priori (profiles.py). An
empty grid searches nothing: every row trains at the profile's lr (the scale profile: the papers').
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skillnet.experiments.profiles import Profile
from skillnet.experiments.runner import Runner, compare, paths

# How a row's lr is picked: said once, here, for the JSON and the report.
RULE = ("each row takes the lr of its grid whose run has the highest mean dev score (the average over tasks at the "
        "run's dev-selected checkpoint); ties go to the smaller lr")


@dataclass(frozen=True)
class Search:
    """One part's search: the rows of its main table, the grid, the budget of each run, the lr without a search."""

    part: str  # "nlu" | "nlg"
    rows: list[str]
    grid: list[float]
    steps: int
    default_lr: float


def search(p: Profile, part: str) -> Search:
    """The profile's search for `part`; NLU runs at the side studies' budget unless nlu_tune_steps names one."""
    if part == "nlu":
        return Search("nlu", list(p.nlu_methods), sorted(p.nlu_lr_grid), p.nlu_tune_steps or p.nlu_side_steps
                      or p.nlu_steps, p.nlu_lr)
    return Search("nlg", list(p.nlg_methods), sorted(p.nlg_lr_grid), p.nlg_tune_steps or p.nlg_steps, p.nlg_lr)


# The dev-selected weights of a fine-tuning run: finetune/evaluation.py saves a full export there at each new best
# mean dev score (export/ holds the last step's). Adaptation continues the model that the main table scored.
DEV_SELECTED = "best"


def dev_selected(cmp_dir: Path, row: str) -> Path:
    """Each seed's dev-selected export of a comparison's row, '{seed}' for compare to fill."""
    return cmp_dir / row / "seed{seed}" / DEV_SELECTED


def result_path(out: Path, part: str) -> Path:
    return out / "tune" / f"{part}.json"


def label_of(row: str) -> str:
    """A compare row's label (``LABEL=METHOD`` or ``METHOD``)."""
    return row.split("=")[0]


def grid_label(row: str, lr: float) -> str:
    return f"{label_of(row)}_lr{lr:g}"


def grid_rows(s: Search, inits: dict[str, str]) -> tuple[list[str], list[str]]:
    """compare's rows and options for the search: every row at every lr under its own label, each from the
    weights its main-table row starts from (`inits`, by label; '{seed}' allowed)."""
    rows: list[str] = []
    extra: list[str] = []
    for row in s.rows:
        method = row.split("=")[-1]
        for lr in s.grid:
            lab = grid_label(row, lr)
            rows.append(f"{lab}={method}")
            extra += ["--args-for", f"{lab}=--lr {lr:g}"]
            if label_of(row) in inits:
                extra += ["--init-for", f"{lab}={inits[label_of(row)]}"]
    return rows, extra


def pick(dev: dict[str, dict[str, float | None]], grid: list[float]) -> dict[str, float]:
    """Per row, the lr of the best dev score (RULE); a run without a dev score (None or nan) never wins."""
    def key(row: str, lr: float) -> tuple[float, float]:
        v = dev[row].get(f"{lr:g}")
        return (-math.inf if v is None or v != v else v, -lr)

    return {row: max(grid, key=lambda lr, row=row: key(row, lr)) for row in dev}


def run_search(r: Runner, part: str, config: Path, init: Path, inits: dict[str, str]) -> dict[str, Any]:
    """The stage: run the grid (resumable, skipped once done), then choose and record; {} in a dry run."""
    from skillnet.common.files import atomic_write_json
    from skillnet.finetune.compare import aggregate

    s = search(r.p, part)
    if not s.grid:
        return {"searched": False, "lr": s.default_lr}
    out = paths(r.out)["cmp"] / f"{part}_tune"
    rows, extra = grid_rows(s, inits)
    seed = r.p.seeds[0]
    compare(r, config, out, rows, [seed], init, extra)
    if r.dry_run:
        return {}
    labels = [label_of(x) for x in rows]
    agg = aggregate(out, labels, [seed], split="dev")
    dev = {label_of(row): {f"{lr:g}": _finite(agg["methods"][grid_label(row, lr)]["average"]["mean"])
                           for lr in s.grid} for row in s.rows}
    dev_tasks = {lab: {t: _finite(v["mean"]) for t, v in agg["methods"][lab]["tasks"].items()} for lab in labels}
    chosen = pick(dev, s.grid)
    seconds = {lab: agg["methods"][lab]["seconds"]["mean"] for lab in labels}
    rec = {"part": part, "split": "dev", "seed": seed, "steps": s.steps, "grid": s.grid, "rule": RULE,
           "rows": [label_of(x) for x in s.rows], "dev": dev, "dev_tasks": dev_tasks, "chosen": chosen,
           "run_seconds": seconds, "runs": len(labels), "total_run_seconds": round(sum(seconds.values()), 1),
           "comparison": str(out)}
    result_path(r.out, part).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(result_path(r.out, part), rec)
    return {"chosen": chosen, "runs": len(labels), "total_run_seconds": rec["total_run_seconds"]}


def _finite(v: Any) -> float | None:
    return None if v is None or (isinstance(v, float) and math.isnan(v)) else float(v)


def chosen_lrs(r: Runner, part: str) -> dict[str, float]:
    """Each row's lr from the part's search (by label); {} where the profile searches nothing or in a dry run
    before the search has run. A real run without the search's result stops with one line."""
    s = search(r.p, part)
    if not s.grid:
        return {}
    f = result_path(r.out, part)
    if not f.is_file():
        if r.dry_run:
            return {}
        raise RuntimeError(f"stage {r.stage}: no lr search result at {f}: run stage {part}_tune first "
                           "(every row's lr is chosen on dev there)")
    rec = json.loads(f.read_text(encoding="utf-8"))
    missing = [label_of(x) for x in s.rows if label_of(x) not in rec.get("chosen", {})]
    if missing or sorted(rec.get("grid", [])) != s.grid:
        raise RuntimeError(f"stage {r.stage}: {f} was searched for other rows or another grid (missing "
                           f"{missing or 'none'}; grid {rec.get('grid')} against {s.grid}): delete it and "
                           f"compare/{part}_tune, then rerun stage {part}_tune")
    return {k: float(v) for k, v in rec["chosen"].items()}


def study_lrs(r: Runner, part: str, rows: dict[str, str]) -> dict[str, float]:
    """The lr of each row of a study other than the main table (loss-scale, side studies, adaptation): the lr the
    search chose for the main-table row it continues or resembles (`rows`: study label -> main-table label), so
    that no lr of any table is the profile's own (which was once chosen on a test score); {} where the profile
    searches nothing (every row then trains at the profile's lr, the papers' on the scale profile)."""
    lrs = chosen_lrs(r, part)
    return {lab: lrs[main] for lab, main in rows.items() if main in lrs}


def with_lrs(extra: list[str], lrs: dict[str, float]) -> list[str]:
    """compare options `extra` with ``--lr X`` added to each row's --args-for (a row without one gets its own):
    compare keeps one --args-for per row, so an lr must join the row's other options, not replace them."""
    out, done = [], set()
    it = iter(extra)
    for a in it:
        if a == "--args-for":
            val = next(it)
            lab = val.split("=", 1)[0]
            if lab in lrs:
                val, done = f"{val} --lr {lrs[lab]:g}", done | {lab}
            out += [a, val]
        else:
            out.append(a)
    for lab, lr in lrs.items():
        if lab not in done:
            out += ["--args-for", f"{lab}=--lr {lr:g}"]
    return out


def stale_runs(cmp_dir: Path, lrs: dict[str, float], arm: str | None = None) -> list[str]:
    """Runs of a comparison folder that trained with another lr than their row's chosen one, or (`arm`) another
    NER loss arm (experiments/loss_scale.py): a finished comparison is not rerun, so the table would not be
    what the search or the study decided."""
    from skillnet.experiments.loss_scale import config_arm

    bad = []
    for f in sorted(cmp_dir.glob("*/seed*/finetune_config.json")):
        cfg = json.loads(f.read_text(encoding="utf-8"))
        lab = f.parent.parent.name
        lr = float(cfg.get("train", {}).get("lr", math.nan))
        if lab in lrs and not math.isclose(lr, lrs[lab], rel_tol=1e-9):
            bad.append(f"{lab}/{f.parent.name}: lr {lr:g}, chosen {lrs[lab]:g}")
        if arm is not None and any(t.get("type") == "ner" for t in cfg.get("tasks", [])) and config_arm(cfg) != arm:
            bad.append(f"{lab}/{f.parent.name}: NER loss {config_arm(cfg)}, the study's winner {arm}")
    return bad


def refuse_stale(r: Runner, cmp_dir: Path, lrs: dict[str, float], arm: str | None = None) -> None:
    bad = stale_runs(cmp_dir, lrs, arm)
    if bad:
        raise RuntimeError(f"stage {r.stage}: {len(bad)} run(s) in {cmp_dir} trained with settings that are no "
                           f"longer the chosen ones ({'; '.join(bad[:3])}{'; ...' if len(bad) > 3 else ''}): "
                           f"delete {cmp_dir} to rerun the table with them")
