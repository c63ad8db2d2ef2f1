"""Pictures and one self-contained HTML page from a run's logs, results and parameter counts.

    python -m skillnet.finetune.report runs/ft             # a fine-tuning run (results.json, log.jsonl)
    python -m skillnet.finetune.report runs/compare        # a `finetune.compare` directory (comparison.json)
    python -m skillnet.finetune.report runs/pt             # a pre-training run (log.jsonl)

Writes ``<dir>/report/*.png`` and ``<dir>/report/report.html`` (pictures embedded, nothing to fetch). Needs
matplotlib (``pip install 'skillnet[plots]'``).

A fine-tuning run gets: the dev curve of each task with the selected checkpoint marked, the target against
the realised task mix, the task x skill map (Table 2, or the learned map), and the activated and trainable
parameters per task. A comparison gets each row's average score with its spread over seeds, its
parameters, and the dev curves; adaptation rows ((a) existing skills, (b) new skill with old ones frozen,
(c) new skill with all updated, task-specific) show up there side by side. A pre-training run gets its
loss and accuracy per objective and the realised objective mix.
"""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skillnet.common.cli import Parser
from skillnet.finetune.document import Document, pyplot, save_figure


def read_log(run: Path) -> list[dict[str, Any]]:
    """The records of a run's log.jsonl, the last one of each (split, step), in step order."""
    path = run / "log.jsonl"
    if not path.is_file():
        return []
    recs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            recs.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a kill: the rest of the log is still worth drawing
    # After a resume the log may repeat steps (issue: log after kill); keep the last record of each step.
    last: dict[tuple[str, int], dict[str, Any]] = {}
    for r in recs:
        if "step" in r:
            last[(r.get("split", "train"), int(r["step"]))] = r
    return sorted(last.values(), key=lambda r: (r.get("split", ""), r["step"]))


# ------------------------------------------------------------------------------------- fine-tuning run
def dev_curves(results: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    tasks = results["tasks"]
    cols = min(3, len(tasks))
    rows = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.3 * rows), squeeze=False)
    for k, (name, r) in enumerate(tasks.items()):
        ax = axes[k // cols][k % cols]
        curve = r.get("dev_curve") or []
        if curve:
            ax.plot([s for s, _ in curve], [v for _, v in curve], marker="o", ms=3, label="dev")
        triv = (r.get("trivial_dev") or {}).get(r["metric"])
        if triv is not None:
            ax.axhline(triv, color="grey", ls=":", label=f"trivial ({triv:.1f})")
        if r.get("best_step"):
            ax.axvline(r["best_step"], color="darkorange", ls="--", label=f"selected (step {r['best_step']})")
        ax.set_title(f"{name}: dev {r['metric']}", fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    for k in range(len(tasks), rows * cols):
        axes[k // cols][k % cols].axis("off")
    sel = results.get("selection", "mean")
    fig.suptitle("Dev score during training; dashed = the checkpoint the results come from "
                 + ("(best mean dev over tasks)" if sel == "mean" else "(each task's own best)"), fontsize=10)
    save_figure(fig, path)


def task_mix(results: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    mix = results.get("task_mix") or {}
    names = list(mix)
    x = range(len(names))
    fig, ax = plt.subplots(figsize=(1.6 + 1.2 * len(names), 3.2))
    ax.bar([i - 0.2 for i in x], [mix[t]["target"] for t in names], width=0.4, label="target q_i")
    ax.bar([i + 0.2 for i in x], [mix[t]["realised"] for t in names], width=0.4, label="realised share")
    ax.set_xticks(list(x), names)
    ax.set_ylabel("share of training steps")
    s = results.get("sampler") or {}
    ax.set_title(f"Task mix: sampler {s.get('kind')}" + (f", alpha {s.get('alpha')}" if s.get("kind") ==
                                                        "proportional" else ""), fontsize=10)
    ax.legend(fontsize=8)
    save_figure(fig, path)


def parameters(params: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    tasks = params["tasks"]
    names = list(tasks)
    act = [tasks[t]["activated"] / 1e6 for t in names]
    tr = [tasks[t]["trainable_activated"] / 1e6 for t in names]
    fig, ax = plt.subplots(figsize=(6.5, 1.9 + 0.5 * len(names)))
    y = range(len(names))
    ax.barh([i + 0.2 for i in y], act, height=0.4, label="activated (a forward pass of the task)")
    ax.barh([i - 0.2 for i in y], tr, height=0.4, label="of which trainable")
    ax.axvline(params["total"] / 1e6, color="grey", ls=":", label=f"model total {params['total'] / 1e6:.2f} M")
    ax.set_yticks(list(y), names)
    ax.set_xlabel("parameters (millions)")
    ax.set_title("Parameters per task (Tables 4-6: activated = what one task's forward pass uses)", fontsize=10)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=3, frameon=False)
    save_figure(fig, path)


def task_skill_map(run: Path, results: dict[str, Any], path: Path) -> bool:
    from skillnet.finetune import skill_map

    learned = run / "skill_map.json"
    if learned.is_file():
        doc = json.loads(learned.read_text(encoding="utf-8"))
        skill_map.draw(doc, path, "Learned task x skill map")
        return True
    cfg_file = run / "export" / "config.json"
    if not cfg_file.is_file():
        return False
    cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    skills = [s["name"] for s in cfg.get("skills", [])]
    if len(skills) < 2:
        return False  # a dense model has no map to show
    tasks = list(results["tasks"])
    generic = cfg.get("generic_skill")
    active = [[s in cfg["tasks"].get(t, []) or s == generic for s in skills] for t in tasks]
    skill_map.draw({"tasks": tasks, "skills": skills, "active": active}, path, "Task x skill map (Table 2)")
    return True


# ------------------------------------------------------------------------------------- comparison
def comparison_bars(cmp: dict[str, Any], path: Path) -> None:
    plt = pyplot()
    rows = cmp["methods"]
    names = list(rows)
    means = [rows[m]["average"]["mean"] for m in names]
    stds = [rows[m]["average"]["std"] for m in names]
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 1.6 + 0.45 * len(names)), gridspec_kw={"width_ratios": [3, 2]})
    y = list(range(len(names)))
    ax.barh(y, means, xerr=stds, capsize=3, color="steelblue")
    for yi, (m, s) in enumerate(zip(means, stds)):
        vals = rows[names[yi]]["average"]["values"]
        ax.plot(vals, [yi] * len(vals), "k.", ms=4)
        ax.text(m + s + 0.3, yi, f"{m:.1f} ± {s:.1f}", va="center", fontsize=8)
    ax.set_yticks(y, names)
    ax.invert_yaxis()
    lo = min(min(rows[m]["average"]["values"]) for m in names)
    ax.set_xlim(max(0.0, lo - 10), max(means) + max(stds) + 8)
    ax.set_xlabel(f"average {cmp['split']} score over tasks (bar: mean; dots: seeds; line: ±1 std)")
    task0 = cmp["tasks"][0]
    act = [rows[m]["params"]["activated"][task0] / 1e6 for m in names]
    tr = [rows[m]["params"]["trainable"] / 1e6 for m in names]
    ax2.barh([i - 0.2 for i in y], act, height=0.4, label=f"activated ({task0})")
    ax2.barh([i + 0.2 for i in y], tr, height=0.4, label="trainable")
    ax2.set_yticks(y, [""] * len(names))
    ax2.invert_yaxis()
    ax2.set_xlabel("parameters (millions)")
    ax2.legend(fontsize=7)
    fig.suptitle(f"Methods compared over seeds {cmp['seeds']}", fontsize=10)
    save_figure(fig, path)


# ------------------------------------------------------------------------------------- pre-training run
def pretrain_curves(log: list[dict[str, Any]], path: Path) -> bool:
    train = [r for r in log if r.get("split", "train") == "train"]
    objectives = sorted({k.split("/")[0] for r in train for k in r if k.endswith("/loss")})
    if not objectives:
        return False
    plt = pyplot()
    # A one-objective run (dense MLM, BART denoising) has no mix to show: two panels, not an empty third.
    has_mix = any(k.startswith("mix/") for r in train for k in r)
    fig, axes = plt.subplots(1, 3 if has_mix else 2, figsize=(13 if has_mix else 9, 3.3))
    for obj in objectives:
        pts = [(r["step"], r[f"{obj}/loss"]) for r in train if f"{obj}/loss" in r]
        axes[0].plot([s for s, _ in pts], [v for _, v in pts], label=obj)
        acc = [(r["step"], r[f"{obj}/acc"]) for r in train if f"{obj}/acc" in r]
        if acc:
            axes[1].plot([s for s, _ in acc], [v for _, v in acc], label=obj)
        mix = [(r["step"], r[f"mix/{obj}"]) for r in train if f"mix/{obj}" in r]
        if mix and has_mix:
            axes[2].plot([s for s, _ in mix], [v for _, v in mix], label=obj)
    for ax, title in zip(axes, ("loss per objective", "accuracy per objective (predicted tokens / NSP pairs)",
                                "realised objective mix (share of steps so far)")):
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        if ax.get_lines():
            ax.legend(fontsize=8)
    save_figure(fig, path)
    return True


# ------------------------------------------------------------------------------------- the page
def _results_rows(results: dict[str, Any]) -> list[list[str]]:
    def f(r: dict[str, Any], key: str) -> str:
        v = (r.get(key) or {}).get(r["metric"])
        return "-" if v is None else f"{v:.1f}"

    return [[name, r["metric"], str(r.get("best_step") or "-"), f(r, "dev"), f(r, "test"), f(r, "trivial_dev"),
             f(r, "trivial_test")] for name, r in results["tasks"].items()]


def _comparison_rows(cmp: dict[str, Any]) -> list[list[str]]:
    tasks = cmp["tasks"]
    return [[m, *(f"{r['tasks'][t]['mean']:.1f} ± {r['tasks'][t]['std']:.1f}" for t in tasks),
             f"{r['average']['mean']:.1f} ± {r['average']['std']:.1f}"] for m, r in cmp["methods"].items()]


def build(run: Path, out: Path | None = None) -> Path:
    run = Path(run)
    out = Path(out) if out else run / "report"
    out.mkdir(parents=True, exist_ok=True)
    doc = Document()
    doc.h(1, f"Report: {run.name}")
    doc.p(f"Source: `{run}`. Every number and picture here is read from that directory.")
    if (run / "comparison.json").is_file():
        cmp = json.loads((run / "comparison.json").read_text(encoding="utf-8"))
        doc.h(2, f"Comparison ({cmp['split']} split, seeds {cmp['seeds']})")
        doc.table(["row", *cmp["tasks"], "average"], _comparison_rows(cmp))
        comparison_bars(cmp, out / "comparison.png")
        doc.img(out / "comparison.png", "Average score per row (mean, seeds and spread) and parameters")
        for name, cap in (("curves.png", "Dev score against step, per task and row"),
                          ("skill_map.png", "Learned task-skill map (first seed)")):
            if (run / name).is_file():
                doc.img(run / name, cap)
    elif (run / "results.json").is_file():
        results = json.loads((run / "results.json").read_text(encoding="utf-8"))
        doc.h(2, f"Results: method {results.get('method')}, {results.get('steps')} steps, "
                 f"{results.get('seconds', 0):.0f} s")
        doc.table(["task", "metric", "selected step", "dev", "test", "trivial dev", "trivial test"],
                  _results_rows(results))
        if results["tasks"] and "dev_curve" in next(iter(results["tasks"].values())):
            dev_curves(results, out / "dev_curves.png")
            doc.img(out / "dev_curves.png", "Dev curve per task; the dashed line marks the checkpoint whose scores "
                                            "are reported")
        if results.get("task_mix"):
            task_mix(results, out / "task_mix.png")
            doc.img(out / "task_mix.png", "Target task mix of the sampler against the realised mix")
        if task_skill_map(run, results, out / "skill_map.png"):
            doc.img(out / "skill_map.png", "Which skills each task activates")
        if results.get("params", {}).get("tasks"):
            parameters(results["params"], out / "parameters.png")
            doc.img(out / "parameters.png", "Activated and trainable parameters per task")
    else:
        log = read_log(run)
        if not pretrain_curves(log, out / "pretrain.png"):
            raise FileNotFoundError(f"{run}: no results.json, comparison.json or per-objective log.jsonl to draw")
        doc.h(2, "Pre-training")
        doc.img(out / "pretrain.png", "Loss, accuracy and mix per objective")
        last = [r for r in log if r.get("split", "train") == "train"][-1]
        doc.p(f"Last logged step: {last['step']}.")
    (out / "report.html").write_text(doc.html(run.name), encoding="utf-8")
    return out / "report.html"


def build_parser() -> Parser:
    p = Parser("skillnet.finetune.report", description=__doc__.split("\n\n")[0])
    p.add_argument("run", help="a fine-tuning run, a finetune.compare directory or a pre-training run")
    p.add_argument("--out", default=None, help="where the PNGs and report.html go (default: RUN/report)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("error: the report needs matplotlib: pip install 'skillnet[plots]'", file=sys.stderr)
        return 2
    try:
        page = build(Path(a.run), Path(a.out) if a.out else None)
    except (FileNotFoundError, KeyError, json.JSONDecodeError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(page)
    return 0


if __name__ == "__main__":
    sys.exit(main())
