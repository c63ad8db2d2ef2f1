"""The tables of a committed report, read back as numbers (issue 56): a rebuilt report overwrites docs/report.md,
comparison.md and nlg.md, so the run they showed is kept first as results/protocol1/tables.json
(scripts/snapshot_protocol1.py), which the report's "What changed" section (report_changes.py) compares against.

Only Markdown as `finetune.document.Document` writes it is read: level-2 sections, tables (consecutive lines that
start with '|': a header row, a separator row, the rows), bullets. A score cell is ``mean ± std``, ``mean`` or
``-``; anything else in a score table is an error rather than a silently missing number.
"""

from __future__ import annotations

import re
from typing import Any

# The results tables of a report: comparison key (finetune.compare's folder) -> the start of its section's heading
# in the report, and the papers' name for it. The headings are the old report's: a snapshot is read from it.
TABLES: dict[str, tuple[str, str]] = {
    "nlu_main": ("SkillNet-NLU: multi-task training", "NLU Table 3"),
    "nlu_adapt": ("Adaptation to a new task (", "NLU Tables 4 and 5 (adaptation)"),
    "nlu_ablate": ("Skill ablation", "NLU Table 6 (skill ablation)"),
    "nlu_alpha": ("Task sampling", "NLU Figure 3 (task sampling alpha)"),
    "nlg_main": ("SkillNet-NLG: multi-task generation", "NLG Table 3"),
    "nlg_adapt": ("Adaptation to a new generation task", "NLG Table 4 (adaptation)"),
    "nlg_temp": ("Sampling temperature T", "NLG §3.4 (sampling temperature T)"),
}
CLAIMS_HEADING = "Where the papers' claims hold at this scale"
CUTS_HEADING = "What this run cut, relative to the papers"
AVG = "Avg"

# The budgets a report's cut list states, keyed by the Profile field that sets them (so the new run's value is read
# from its profile, report_changes.budget_now). Each: (half whose bullets hold it, label, pattern of its number).
# The halves' bullets are told apart by the "Model size" bullet that opens each half (report.cuts writes them so).
BUDGETS: tuple[tuple[str, str, str, str], ...] = (
    ("nlu", "dense_pt_steps", "BERT dense pre-training steps", r"^Pre-training: ([\d,]+) dense steps"),
    ("nlu", "sparse_pt_steps", "BERT sparse pre-training steps", r"then ([\d,]+) sparse steps"),
    ("nlu", "pt_batch", "BERT pre-training sequences per step and rank", r"^Pre-training: [\d,]+ dense steps of ([\d,]+) sequences"),
    ("nlu", "pt_lr", "BERT pre-training peak lr", r"^Pre-training: .*?peak lr ([0-9.e+-]+)"),
    ("nlu", "nlu_steps", "NLU fine-tuning steps (a joint row)", r"^Fine-tuning: ([\d,]+) steps of batch"),
    ("nlu", "nlu_batch", "NLU fine-tuning batch", r"^Fine-tuning: [\d,]+ steps of batch ([\d,]+)"),
    ("nlu", "nlu_train", "NLU training examples per task (at most)", r"on at most ([\d,]+) training examples"),
    ("nlu", "nlu_dev", "NLU dev examples per task", r"chosen on ([\d,]+) dev examples"),
    ("nlu", "nlu_eval", "NLU test examples per task (at most)", r"scored on up to ([\d,]+) test examples"),
    ("nlu", "adapt_steps", "NLU new-task steps", r"new task ([\d,]+) steps"),
    ("nlu", "nlu_side_steps", "NLU ablation and sampling steps", r"the ablation and sampling studies ([\d,]+) steps"),
    ("nlu", "nlu_task_specific_steps", "NLU task-specific model's steps on its task",
     r"each task-specific model trains ([\d,]+) steps"),
    ("nlg", "bart_pt_steps", "BART pre-training steps", r"^BART pre-training: ([\d,]+) denoising steps"),
    ("nlg", "bart_pt_batch", "BART pre-training sequences per step and rank",
     r"^BART pre-training: [\d,]+ denoising steps of \d+ x ([\d,]+) sequences"),
    ("nlg", "bart_pt_lr", "BART pre-training peak lr", r"^BART pre-training: .*?peak lr ([0-9.e+-]+)"),
    ("nlg", "nlg_steps", "NLG fine-tuning steps (a joint row)", r"^Fine-tuning: ([\d,]+) steps of batch"),
    ("nlg", "nlg_batch", "NLG fine-tuning batch", r"^Fine-tuning: [\d,]+ steps of batch ([\d,]+)"),
    ("nlg", "nlg_train", "NLG training examples per task (at most)", r"on at most ([\d,]+) training examples"),
    ("nlg", "nlg_lr", "NLG fine-tuning peak lr", r"^Fine-tuning: .*?peak lr ([0-9.e+-]+)"),
    # protocol 1 scored dev and test on the same cap ("N evaluation examples"); protocol 2 caps them apart
    ("nlg", "nlg_eval", "NLG dev examples per task", r"([\d,]+) evaluation examples"),
    ("nlg", "nlg_test", "NLG test examples per task", r"([\d,]+) evaluation examples"),
    ("nlg", "nlg_beams", "NLG beam", r"beam ([\d,]+)"),
    ("nlg", "nlg_adapt_steps", "NLG new-task steps", r"new task ([\d,]+) steps"),
    ("nlg", "nlg_task_specific_steps", "NLG task-specific model's steps on its task",
     r"each task-specific model trains ([\d,]+) steps"),
    ("", "seeds", "seeds of the main tables", r"^Seeds: ([\d,]+) for the main tables"),
    ("", "side_seeds", "seeds of the ablation and sampling studies", r"([\d,]+) for the ablation and sampling"),
)

# How a claim's verdict begins in a report's findings (finetune.document.Claim.render; protocol 1 wrote the same
# words), and the short label the comparison shows.
VERDICTS: tuple[tuple[str, str], ...] = (
    ("**holds**", "holds"),
    ("points the same way, **within the noise**", "same direction, within the noise"),
    ("**does not hold**", "does not hold"),
    ("points the other way, **within the noise**", "other direction, within the noise"),
    ("no difference (", "no difference"),
    ("not measured in this run", "not measured"),
)
_CLAIM = re.compile(r"^(?P<claim>.+?): (?P<verdict>" + "|".join(re.escape(v) for v, _ in VERDICTS) + ")")
_CELL = re.compile(r"^(?P<mean>[+-]?\d+(?:\.\d+)?)(?:\s*±\s*(?P<std>\d+(?:\.\d+)?))?$")


def sections(text: str) -> dict[str, str]:
    """Each level-2 heading's text -> the body under it (to the next level-2 heading); headings inside code
    fences are code (the report's command list holds `# stage` lines)."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and line.startswith("## "):
            current = out.setdefault(line[3:].strip(), [])
        elif current is not None:
            current.append(line)
    return {k: "\n".join(v) for k, v in out.items()}


def split_row(line: str) -> list[str]:
    """A table line's cells: outer pipes dropped, split on pipes that are not escaped (``\\|``)."""
    body = line.strip()
    body = body[1:] if body.startswith("|") else body
    body = body[:-1] if body.endswith("|") and not body.endswith("\\|") else body
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", body)]


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """Every Markdown table of `text` as (header, rows). A table is a run of consecutive lines starting with '|'
    whose second line is a separator (cells of '-' and ':' only); a run without one is not a table."""
    out = []
    block: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith("|"):
            block.append(line)
            continue
        if len(block) >= 2 and all(c and set(c) <= set("-: ") for c in split_row(block[1])):
            out.append((split_row(block[0]), [split_row(r) for r in block[2:]]))
        block = []
    return out


def cell(text: str) -> dict[str, float | None] | None:
    """A score cell as numbers: ``81.2 ± 0.5`` -> mean and std, ``81.2`` -> std None, ``-`` -> None."""
    t = text.replace("**", "").strip()
    if t in ("-", "–", ""):
        return None
    m = _CELL.match(t)
    if not m:
        raise ValueError(f"not a score cell: {text!r}")
    return {"mean": float(m["mean"]), "std": None if m["std"] is None else float(m["std"])}


def task_of(head: str) -> tuple[str, str | None]:
    """A score column's head as (task, metric): ``ner (f1)`` or, as protocol 2 writes it, ``ner (f1, 1,000
    test)``; ``Avg`` has no metric."""
    m = re.match(r"^(.+?) \(([^,)]+)[^)]*\)$", head.strip())
    return (m[1], m[2]) if m else (head.strip(), None)


def score_table(body: str) -> dict[str, Any] | None:
    """The scores of a section: its first table headed ``model | <task (metric)>... | Avg``; the columns after
    Avg (protocol 2's updates per task) are not scores. None when the section has no such table."""
    for head, rows in tables(body):
        if head[0] != "model" or AVG not in head:
            continue
        heads = head[1:head.index(AVG) + 1]
        cols = [task_of(h) for h in heads]
        return {"headers": heads, "columns": [t for t, _ in cols],
                "metrics": {t: m for t, m in cols if m is not None},
                "rows": [{"model": r[0], "cells": {t: cell(v) for (t, _), v in zip(cols, r[1:])}} for r in rows]}
    return None


def bullets(body: str) -> list[str]:
    return [line[2:].strip() for line in body.splitlines() if line.startswith("- ")]


def parse_claim(text: str) -> dict[str, str] | None:
    """A finding that decides a claim, as {claim, verdict (short label), text}; None for any other finding."""
    m = _CLAIM.match(text)
    if not m:
        return None
    return {"claim": m["claim"], "verdict": dict(VERDICTS)[m["verdict"]], "text": text}


def budgets(cut_bullets: list[str]) -> dict[str, float | int]:
    """The budgets BUDGETS finds in a report's cut list (a budget the list does not state is left out)."""
    half = ""
    found: dict[str, float | int] = {}
    for b in cut_bullets:
        half = "nlu" if b.startswith("Model size: BERT") else "nlg" if b.startswith("Model size: BART") else half
        for part, key, _, pattern in BUDGETS:
            if key in found or (part and part != half):
                continue
            m = re.search(pattern, b)
            if m:
                raw = m[1].replace(",", "")
                found[key] = float(raw) if any(c in raw for c in ".e") else int(raw)
    return found


def snapshot(main: tuple[str, str], halves: dict[str, tuple[str, str]], commit: str,
             protocol_version: int) -> dict[str, Any]:
    """The results tables, claims and budgets of the whole report `main` (path, text), each table and claim marked
    with the half it belongs to ("nlu", "nlg"). `halves`: each half's own report of the same run (comparison.md,
    nlg.md), which must show the same numbers: a table they disagree on is an error, not a choice."""
    path, text = main
    secs = sections(text)
    head = text[:3000]
    profile = re.search(r"\(profile `([^`]+)`\)", head)
    seeds = re.search(r"over the\s+seeds (\[[\d, ]+\])", head)
    out: dict[str, Any] = {
        "protocol_version": protocol_version, "commit": commit, "main": path,
        "files": [path, *(p for p, _ in halves.values())],
        "profile": profile[1] if profile else None, "seeds": seeds[1] if seeds else None,
        "written_by": "scripts/snapshot_protocol1.py", "tables": {}, "claims": [], "findings": [],
    }
    cuts = bullets(secs.get(CUTS_HEADING, ""))
    out["budgets"] = budgets(cuts)
    out["budgets_text"] = cuts
    half_secs = {part: (p, sections(t)) for part, (p, t) in halves.items()}
    for key, (heading, name) in TABLES.items():
        found = [h for h in secs if h.startswith(heading)]
        table = score_table(secs[found[0]]) if found else None
        if table is None:
            continue
        table.update({"section": found[0], "name": name, "part": key[:3], "file": path, "same_in": []})
        if key[:3] in half_secs:
            other, osecs = half_secs[key[:3]]
            oh = [h for h in osecs if h.startswith(heading)]
            if oh:
                if score_table(osecs[oh[0]]) != {k: table[k] for k in ("headers", "columns", "metrics", "rows")}:
                    raise ValueError(f"{key}: {other} shows other numbers than {path}")
                table["same_in"].append(other)
        out["tables"][key] = table
    half_claims = {part: bullets(s.get(CLAIMS_HEADING, "")) for part, (_, s) in half_secs.items()}
    for b in bullets(secs.get(CLAIMS_HEADING, "")):
        c = parse_claim(b)
        if c is None:
            out["findings"].append(b)
            continue
        # the half a claim is about: the half report that states it (None: neither, or both)
        parts = [part for part, bs in half_claims.items() if b in bs]
        out["claims"].append({**c, "part": parts[0] if len(parts) == 1 else None})
    return out
