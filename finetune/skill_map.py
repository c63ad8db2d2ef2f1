"""The task x skill map of a run: Table 2 (fixed) or the learned map (the learnable skill combination paper
Figure 2), as data (`snapshot`), as JSON (`skill_map.json`) and as a heatmap (`skill_map.png`)."""

from __future__ import annotations

import contextlib
import json
import textwrap
from pathlib import Path
from typing import Any

import torch
from skillnet.finetune.document import pyplot, save_figure


def snapshot(model: torch.nn.Module, tasks: list[str]) -> dict[str, Any] | None:
    """{"tasks", "skills", "active" [task][skill] bool, "alpha", "threshold", ...} of a model whose router
    learns its task-skill map; None for every other model (its map is the config's, fixed)."""
    enc = getattr(model, "base_model", model)
    router = getattr(enc, "router", None)
    lm = None if router is None else router.learned_map(enc)
    if lm is None:
        return None
    cfg = enc.config
    skills = cfg.skill_names
    with torch.no_grad():
        alpha = lm.alpha()
        hard = lm.hard_map()
    rows = [lm.task_index(t) for t in tasks]
    return {
        "tasks": list(tasks), "skills": skills, "router": cfg.router,
        "alpha": [[round(float(alpha[j, i]), 4) for i in range(len(skills))] for j in rows],
        "active": [[bool(hard[j, i]) for i in range(len(skills))] for j in rows],
        "threshold": lm.threshold, "estimator": lm.estimator, "sharpness": lm.sharpness,
    }


def scalars(snap: dict[str, Any]) -> dict[str, float]:
    """What TensorBoard gets at each evaluation: alpha per (task, skill) and the size of each skill set."""
    out: dict[str, float] = {}
    for j, t in enumerate(snap["tasks"]):
        out[f"skill_map/size/{t}"] = float(sum(snap["active"][j]))
        for i, s in enumerate(snap["skills"]):
            if "alpha" in snap:
                out[f"skill_map/alpha/{t}/{s}"] = snap["alpha"][j][i]
    return out


def changed_cells(a: dict[str, Any], b: dict[str, Any]) -> int:
    return sum(x != y for ra, rb in zip(a["active"], b["active"]) for x, y in zip(ra, rb))


def write(out_dir: Path, final: dict[str, Any], initial: dict[str, Any] | None, plot: bool = True) -> None:
    """skill_map.json (final and initial maps, cells that changed) and skill_map.png (if matplotlib is there)."""
    doc = {**final}
    if initial is not None:
        doc["initial_active"] = initial["active"]
        if "alpha" in initial:
            doc["initial_alpha"] = initial["alpha"]
        doc["changed_cells"] = changed_cells(initial, final)
    (out_dir / "skill_map.json").write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    if plot:
        with contextlib.suppress(ImportError):  # pictures are an optional extra (skillnet[plots])
            draw(doc, out_dir / "skill_map.png")


def draw(doc: dict[str, Any], path: Path, title: str | None = None) -> None:
    plt = pyplot()
    tasks, skills, active = doc["tasks"], doc["skills"], doc["active"]
    learned = "alpha" in doc
    values = doc["alpha"] if learned else [[float(x) for x in row] for row in active]
    fig, ax = plt.subplots(figsize=(1.0 + 0.75 * len(skills), 1.2 + 0.45 * len(tasks)))
    im = ax.imshow(values, cmap="Blues", vmin=0.0, vmax=1.0, aspect="auto")
    for j in range(len(tasks)):
        for i in range(len(skills)):
            on = active[j][i]
            if learned:
                ax.text(i, j, f"{values[j][i]:.2f}", ha="center", va="center", fontsize=8,
                        color="white" if values[j][i] > 0.6 else "black", fontweight="bold" if on else "normal")
            if on:
                ax.add_patch(plt.Rectangle((i - 0.5, j - 0.5), 1, 1, fill=False, edgecolor="darkorange", lw=2))
            was = doc.get("initial_active")
            if was is not None and was[j][i] != on:
                ax.plot(i + 0.35, j - 0.3, marker="*", color="crimson", ms=7)
    ax.set_xticks(range(len(skills)), skills)
    ax.set_yticks(range(len(tasks)), tasks)
    ax.set_xlabel("skill")
    if learned:
        fig.colorbar(im, ax=ax, fraction=0.04, pad=0.02, label="alpha (Eq. 3)")
        sub = (f"alpha per task and skill; boxed = selected (alpha > {doc['threshold']}, generic always on)"
               + ("; * = changed since the start" if "initial_active" in doc else ""))
    else:
        sub = "boxed = skill activated by the task (fixed map, Table 2)"
    ax.set_title(title or "Task x skill map", fontsize=10)
    width = max(40, int(fig.get_size_inches()[0] * 11))
    fig.text(0.01, 0.01, textwrap.fill(sub, width), fontsize=7.5, va="bottom")
    save_figure(fig, path, dpi=120, rect=(0, 0.06 + 0.035 * (len(sub) // width), 1, 1))
