"""The report's "What changed since the last committed run" section (issue 56): the protocol's changes, the budgets,
the claims' verdicts and every results table of this run beside the committed run it replaces, whose numbers
scripts/snapshot_protocol1.py kept in results/protocol1/tables.json before the rebuilt report overwrote them.

Rows are matched by the name the report gives them (each table's row names: report_nlu.py, report_nlg.py), columns
by task name; a row or task on one side only is listed as such. The runs differ in budget, data and selection rule,
so a difference here is no evidence about a method, and the section says so.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from skillnet.experiments.parts import PROTOCOL_VERSION
from skillnet.experiments.report_nlg import ADAPT_ROWS as NLG_ADAPT_ROWS
from skillnet.experiments.report_nlg import temperature_rows
from skillnet.experiments.report_nlu import ADAPT_ROWS as NLU_ADAPT_ROWS
from skillnet.experiments.report_nlu import ablation_rows, alpha_rows
from skillnet.experiments.report_protocol import PROTOCOL_CHANGES
from skillnet.experiments.report_snapshot import AVG, BUDGETS, TABLES, parse_claim
from skillnet.experiments.runner import REPO
from skillnet.experiments.tables import NLG_ROWS, NLU_ROWS, load, ms, scored
from skillnet.finetune.document import Document

HEADING = "What changed since the last committed run"
SNAPSHOT = REPO / "results" / "protocol1" / "tables.json"


def row_names(key: str, c: dict[str, Any]) -> list[tuple[str, str]]:
    """(row label, the name the report's table gives it) of every row of comparison `key`; a label the report has
    no name for is shown as itself, as tables.score_table does."""
    orders = {"nlu_main": NLU_ROWS, "nlu_adapt": NLU_ADAPT_ROWS, "nlu_ablate": ablation_rows(c),
              "nlu_alpha": alpha_rows(c), "nlg_main": NLG_ROWS, "nlg_adapt": NLG_ADAPT_ROWS,
              "nlg_temp": temperature_rows(c)}
    names = dict(orders.get(key, []))
    return [(k, names.get(k, k)) for k in c.get("methods", {})]


def old_cell(v: dict[str, Any] | None) -> str:
    if not v or v.get("mean") is None:
        return "-"
    return f"{v['mean']:.1f}" + (f" ± {v['std']:.1f}" if v.get("std") is not None else "")


def _mean(v: dict[str, Any] | None) -> float | None:
    return float(v["mean"]) if v and scored(v.get("mean")) else None


def compare_table(old: dict[str, Any], c: dict[str, Any], key: str, v_old: int, v_new: int) -> list[list[str]]:
    """Rows (model, task, old, new, difference) of one results table: every model and task of either side, the old
    table's order first, then the average."""
    new_rows = {name: c["methods"][k] for k, name in row_names(key, c)}
    old_rows = {r["model"]: r["cells"] for r in old["rows"]}
    new_tasks = [*c.get("tasks", []), AVG]
    tasks = [t for t in [*old["columns"], *new_tasks] if t != AVG]
    tasks = [*dict.fromkeys(tasks), AVG]  # either side's tasks once, the old order first, the average last
    first = next(iter(c["methods"].values()), {})
    new_metric = {t: (first.get("tasks", {}).get(t) or {}).get("metric") for t in c.get("tasks", [])}
    renamed = {t: (was, new_metric[t]) for t, was in old.get("metrics", {}).items()
               if new_metric.get(t) and was != new_metric[t]}
    # an average over other tasks, or over a task scored another way, is no more comparable than that task
    avg_note = ("not comparable: it averages " + ", ".join(f"{t} ({a} → {b})" for t, (a, b) in renamed.items())
                if renamed else "not comparable: it averages other tasks"
                if set(old["columns"]) != set(new_tasks) else None)
    out = []
    for model in [*old_rows, *(m for m in new_rows if m not in old_rows)]:
        if model not in new_rows or model not in old_rows:
            out.append([model, "every task", "-", "-",
                        f"row only in protocol {v_old if model in old_rows else v_new}"])
            continue
        row = new_rows[model]
        for t in tasks:
            o = old_rows[model].get(t) if t in old["columns"] else None
            n = (row.get("average") if t == AVG else row.get("tasks", {}).get(t)) if t in new_tasks else None
            o_text, n_text = old_cell(o), ms(n) if n else "-"
            if t not in new_tasks or t not in old["columns"]:
                out.append([model, t, o_text, n_text, f"task only in protocol {v_old if t not in new_tasks else v_new}"])
                continue
            if t in renamed:
                diff = f"not comparable: metric {renamed[t][0]} → {renamed[t][1]}"
            elif t == AVG and avg_note:
                diff = avg_note
            else:
                a, b = _mean(o), _mean(n)
                diff = "-" if a is None or b is None else f"{b - a:+.1f}"
            out.append([model, t, o_text, n_text, diff])
    return out


def _claim_key(text: str) -> tuple[str, str]:
    """A claim's words and the paper table it names (its closing parenthesis), to match a claim whose words
    protocol 2 made more precise ("... improves SkillNet-NLU over the same pre-training done densely (...)")."""
    m = re.match(r"^(.*?)\s*(\([^()]*\))$", text)
    return (m[1], m[2]) if m else (text, "")


def same_claim(a: str, b: str) -> bool:
    (sa, ra), (sb, rb) = _claim_key(a), _claim_key(b)
    return a == b or (bool(ra) and ra == rb and (sa.startswith(sb) or sb.startswith(sa)))


def claim_rows(old: list[dict[str, Any]], findings: list[Any], v_old: int, v_new: int) -> list[list[str]]:
    """(claim, old verdict, new verdict) of every claim either run decided, matched by `same_claim`."""
    new = [c for f in findings if (c := parse_claim(str(f)))]
    used: set[int] = set()
    out = []
    for o in old:
        i = next((i for i, n in enumerate(new) if i not in used and same_claim(o["claim"], n["claim"])), None)
        if i is None:
            out.append([o["claim"], o["verdict"], f"not in protocol {v_new}'s report"])
        else:
            used.add(i)
            out.append([new[i]["claim"], o["verdict"], new[i]["verdict"]])
    out += [[n["claim"], f"not claimed in protocol {v_old}", n["verdict"]] for i, n in enumerate(new) if i not in used]
    return out


def budget_now(profile: Any, key: str) -> Any:
    """The value of BUDGETS' `key` in this run: the profile's field, with the defaults the stages apply."""
    from skillnet.experiments.nlg import nlg_train_tasks
    from skillnet.experiments.nlu import NLU_TASKS

    p = profile
    test = (f"{p.nlg_test or p.nlg_eval:,}" + "".join(f"; {t}: {'whole split' if n is None else f'{n:,}'}"
                                                    for t, n in p.nlg_eval_per_task.items()))
    derived = {
        "nlu_dev": p.nlu_dev or p.nlu_eval, "nlu_side_steps": p.nlu_side_steps or p.nlu_steps,
        "bart_pt_batch": p.bart_pt_batch or p.pt_batch, "bart_pt_lr": p.bart_pt_lr or p.pt_lr, "nlg_test": test,
        "nlg_adapt_steps": p.nlg_adapt_steps or p.adapt_steps, "seeds": len(p.seeds), "side_seeds": len(p.side_seeds),
        # BUDGET_RULE: a task-specific model trains its task's share of a joint row's steps
        "nlu_task_specific_steps": f"its task's share, ~{p.nlu_steps // len(NLU_TASKS):,}",
        "nlg_task_specific_steps": f"its task's share, ~{p.nlg_steps // len(nlg_train_tasks()):,}",
        "nlg_lr": (f"chosen on dev per row from {', '.join(f'{x:g}' for x in p.nlg_lr_grid)}" if p.nlg_lr_grid
                   else p.nlg_lr),
    }
    return derived[key] if key in derived else getattr(p, key, None)


def _value(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    return f"{v:,}" if isinstance(v, int) else f"{v:g}"


def _where(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def changes_section(doc: Document, profile: Any, parts: tuple[str, ...], cmps: dict[str, Any],
                    findings: list[Any], snapshot: Path | None = None) -> None:
    """The section, after the claims: `findings` are this report's decided claims (and other findings) as text;
    `snapshot`: the committed run's tables (default results/protocol1/tables.json)."""
    path = snapshot or SNAPSHOT
    doc.h(2, HEADING)
    snap = load(path)
    if not snap:
        doc.p(f"No snapshot of the last committed run here (`{_where(path)}`, written by "
              "`scripts/snapshot_protocol1.py`): there is nothing to compare this run with.")
        return
    v_old, v_new = snap["protocol_version"], PROTOCOL_VERSION
    commit = str(snap.get("commit", "?"))[:12]
    if snap.get("profile") != profile.name:
        doc.p(f"The last committed run (protocol {v_old}, commit `{commit}`) is of profile `{snap.get('profile')}`, "
              f"this report of `{profile.name}`: their tables are not comparable.")
        return
    doc.p(f"This run (protocol {v_new}) beside the last committed run of the `{profile.name}` profile (protocol "
          f"{v_old}, commit `{commit}`: its {', '.join(snap.get('files', []))}, whose numbers "
          f"`scripts/snapshot_protocol1.py` kept in `{_where(path)}`). **The two runs differ in budget, data (a "
          "decontaminated pre-training corpus; dev and test de-duplicated against train, so the test sets are not "
          "the same examples) and selection rule (every choice on dev; claims decided by the bootstrap with Holm's "
          "correction), so a difference between them is not a method effect**: it says how far a number moved, "
          "not why, and no claim is decided on it.")
    if (v_old, v_new) == (1, 2):
        doc.p(f"What protocol {v_new} changed:")
        doc.bullets(list(PROTOCOL_CHANGES))
    keys = [(key, label) for part, key, label, _ in BUDGETS if not part or part in parts]
    rows = [[label, _value(snap["budgets"][key]), _value(budget_now(profile, key))]
            for key, label in keys if key in snap.get("budgets", {})]
    if rows:
        doc.p(f"Budgets, as protocol {v_old}'s report stated them and as this run's profile sets them:")
        doc.table(["setting", f"protocol {v_old}", f"protocol {v_new}"], rows)
    old_claims = [c for c in snap.get("claims", []) if c.get("part") in (*parts, None)]
    claims = claim_rows(old_claims, findings, v_old, v_new)
    if claims:
        doc.p(f"The papers' claims, as each run decided them (protocol {v_old}: the seeds' paired t-test, p < 0.05, "
              f"uncorrected; protocol {v_new}: the decision rule of the Protocol section):")
        doc.table(["claim", f"protocol {v_old}", f"protocol {v_new}"], claims)
    missing = []
    for key, (_, name) in TABLES.items():
        old, new = snap.get("tables", {}).get(key), cmps.get(key)
        if key[:3] not in parts or not (old or new):
            continue
        if not (old and new):
            missing.append(f"{name} (`{key}`): only in protocol {v_old if old else v_new}")
            continue
        doc.h(3, f"{name} (`{key}`)")
        doc.p(f"Protocol {v_old} as its report printed it (one decimal), protocol {v_new} from this run's "
              f"`{key}` comparison ({len(new.get('seeds', []))} seeds); difference: protocol {v_new} minus "
              f"protocol {v_old}, in points of the task's metric.")
        doc.table(["model", "task", f"old (protocol {v_old})", f"new (protocol {v_new})", "difference"],
                  compare_table(old, new, key, v_old, v_new))
    if missing:
        doc.p("Tables on one side only: " + "; ".join(missing) + ".")
