"""The report's "What changed since the last committed run" section (issue 56): the committed protocol-1 report read
back as numbers (experiments/report_snapshot.py, scripts/snapshot_protocol1.py), and the section that sets a new
run's comparisons beside them (experiments/report_changes.py)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from skillnet.experiments import report_changes as rc
from skillnet.experiments.parts import PROTOCOL_VERSION
from skillnet.experiments.profiles import PROFILES
from skillnet.experiments.report_protocol import PROTOCOL_CHANGES
from skillnet.experiments.report_snapshot import budgets, cell, sections, snapshot, tables
from skillnet.finetune.document import Document

REPO = Path(__file__).resolve().parents[1]

# Two results tables as Document writes them, the second with a '-' cell and a column after Avg; a parameter table
# and a non-table '|' line; a claims list; a code block whose '## ' line is not a heading.
FIXTURE = """# A report

Written by `scripts/reproduce.py` (profile `full`) from the outputs. How to read the tables: mean ± std over the
seeds [0, 1, 2].

## What this run cut, relative to the papers

- Model size: BERT hidden 128, 2 layers (paper: BERT-base, 768 and 12).
- Pre-training: 4000 dense steps of 32 sequences (one process), then 500 sparse steps of 2 x 32 sequences, 128 tokens each, peak lr 0.001, on text.
- Fine-tuning: 2400 steps of batch 8 on at most 4000 training examples per task (paper: more), checkpoints chosen on 300 dev examples per task, scored on up to 1000 test examples; new task 600 steps.
- Model size: BART hidden 128, 2+2 layers (paper: BART-large).
- Fine-tuning: 800 steps of batch 16 on at most 3000 training examples per task, peak lr 0.002, 50 evaluation examples, beam 4; new task 500 steps.
- Seeds: 3 for the main tables, 1 for the ablation and sampling studies.

## SkillNet-NLU: multi-task training (Table 3 layout)

| task | stands in for | skills |
|---|---|---|
| sentiment | ChnSentiCorp | s1 s4 s7 |

| model | sentiment (accuracy) | ner (f1) | Avg |
|---|---|---|---|
| Task-specific fine-tuning | 79.8 ± 1.5 | 65.8 ± 0.9 | 72.8 ± 0.3 |
| SkillNet-NLU | **78.2** ± 1.7 | 50.4 ± 0.2 | 64.3 ± 0.4 |

| model | total params | trainable |
|---|---|---|
| SkillNet-NLU | 2.16 M | 2.16 M |

## Skill ablation (Table 6 layout)

| not a table: no separator row |

| model | sentiment (accuracy, 1,000 test) | ner (f1) | Avg | updates / task |
|---|---|---|---|---|
| SkillNet-NLU (all skills) | 73.7 | - | 73.7 | 240 |
| without s1 | 74.6 | 36.0 | 55.3 | 240 |

## Where the papers' claims hold at this scale

- sentiment: the best neural row (`task_specific`, 79.8) is at or below the TF-IDF baseline (82.9).
- SkillNet-NLU beats task-specific fine-tuning on average (Table 3): **does not hold**: the opposite, beyond the noise (x).
- Sparse pre-training improves SkillNet-NLU (Table 3, last rows): points the same way, **within the noise** (y).

## The exact commands

```
# corpus
## not a heading
```
"""


def test_markdown_tables_cells_and_sections() -> None:
    secs = sections(FIXTURE)
    assert list(secs) == ["What this run cut, relative to the papers", "SkillNet-NLU: multi-task training (Table 3 "
                          "layout)", "Skill ablation (Table 6 layout)", "Where the papers' claims hold at this scale",
                          "The exact commands"]
    found = tables(FIXTURE)
    assert [h[0] for h, _ in found] == ["task", "model", "model", "model"]  # the '|' line without separator is none
    assert found[1][1][1] == ["SkillNet-NLU", "**78.2** ± 1.7", "50.4 ± 0.2", "64.3 ± 0.4"]
    assert cell("81.2 ± 0.5") == {"mean": 81.2, "std": 0.5}
    assert cell("81.2") == {"mean": 81.2, "std": None}
    assert cell("-") is None and cell("**-0.3**") == {"mean": -0.3, "std": None}
    with pytest.raises(ValueError):
        cell("2.16 M")


def test_snapshot_of_a_report() -> None:
    snap = snapshot(("r.md", FIXTURE), {}, "abc", 1)
    assert (snap["profile"], snap["seeds"], snap["protocol_version"], snap["commit"]) == ("full", "[0, 1, 2]", 1, "abc")
    main = snap["tables"]["nlu_main"]
    assert main["columns"] == ["sentiment", "ner", "Avg"] and main["metrics"] == {"sentiment": "accuracy", "ner": "f1"}
    assert main["rows"][0] == {"model": "Task-specific fine-tuning", "cells": {
        "sentiment": {"mean": 79.8, "std": 1.5}, "ner": {"mean": 65.8, "std": 0.9}, "Avg": {"mean": 72.8, "std": 0.3}}}
    assert main["rows"][1]["cells"]["sentiment"] == {"mean": 78.2, "std": 1.7}
    ablate = snap["tables"]["nlu_ablate"]  # a column after Avg is not a score; a test count is not a metric
    assert ablate["columns"] == ["sentiment", "ner", "Avg"] and ablate["metrics"]["sentiment"] == "accuracy"
    assert ablate["rows"][0]["cells"] == {"sentiment": {"mean": 73.7, "std": None}, "ner": None,
                                          "Avg": {"mean": 73.7, "std": None}}
    assert set(snap["tables"]) == {"nlu_main", "nlu_ablate"}
    assert [(c["claim"], c["verdict"]) for c in snap["claims"]] == [
        ("SkillNet-NLU beats task-specific fine-tuning on average (Table 3)", "does not hold"),
        ("Sparse pre-training improves SkillNet-NLU (Table 3, last rows)", "same direction, within the noise")]
    assert len(snap["findings"]) == 1
    # each half's bullets: BERT's and BART's "Fine-tuning:" are told apart by the "Model size" bullet before them
    assert budgets(snap["budgets_text"]) == snap["budgets"]
    assert {k: snap["budgets"][k] for k in ("dense_pt_steps", "sparse_pt_steps", "pt_lr", "nlu_steps", "nlu_dev",
                                            "adapt_steps", "nlg_steps", "nlg_lr", "nlg_test", "nlg_adapt_steps",
                                            "seeds", "side_seeds")} == {
        "dense_pt_steps": 4000, "sparse_pt_steps": 500, "pt_lr": 0.001, "nlu_steps": 2400, "nlu_dev": 300,
        "adapt_steps": 600, "nlg_steps": 800, "nlg_lr": 0.002, "nlg_test": 50, "nlg_adapt_steps": 500, "seeds": 3,
        "side_seeds": 1}
    # a half report that shows other numbers for the same table is refused
    other = FIXTURE.replace("79.8 ± 1.5", "79.9 ± 1.5")
    with pytest.raises(ValueError, match="other numbers"):
        snapshot(("r.md", FIXTURE), {"nlu": ("c.md", other)}, "abc", 1)
    assert snapshot(("r.md", FIXTURE), {"nlu": ("c.md", FIXTURE)}, "abc", 1)["tables"]["nlu_main"]["same_in"] == ["c.md"]


def _score(mean: float, values: list[float], metric: str = "accuracy") -> dict[str, Any]:
    return {"mean": mean, "std": 0.4, "values": values, "metric": metric}


def _comparison() -> dict[str, Any]:
    """A new nlu_main: ner scored by another metric, a task the old table lacks, a row the old one lacks
    (pals) and none of the old's task-specific row."""
    def row(s: float, n: float, d: float, avg: float) -> dict[str, Any]:
        return {"tasks": {"sentiment": _score(s, [s, s]), "ner": _score(n, [n, n], "span_f1"),
                          "domain": _score(d, [d, d])}, "average": _score(avg, [avg, avg])}
    return {"tasks": ["sentiment", "ner", "domain"], "seeds": [0, 1],
            "methods": {"skillnet": row(80.0, 55.0, 96.0, 77.0), "pals": row(77.0, 50.0, 95.0, 74.0)}}


def _write_snapshot(tmp_path: Path) -> Path:
    snap = snapshot(("docs/report.md", FIXTURE), {}, "0123456789abcdef", 1)
    path = tmp_path / "tables.json"
    path.write_text(json.dumps(snap))
    return path


def _markdown(doc: Document) -> str:
    return doc.markdown()


def test_changes_section_rows_and_differences(tmp_path: Path) -> None:
    snap = _write_snapshot(tmp_path)
    findings = ["SkillNet-NLU beats task-specific fine-tuning on average (Table 3): **holds** here (z).",
                "Sparse pre-training improves SkillNet-NLU over the same pre-training done densely (Table 3, last "
                "rows): points the other way, **within the noise** (w).",
                "The learnable skill combination beats SkillNet's fixed map (learnable-skill-combination Table 1): "
                "not measured in this run.",
                "qa_match: the best neural row is above the TF-IDF baseline."]
    doc = Document()
    rc.changes_section(doc, PROFILES["full"], ("nlu",), {"nlu_main": _comparison(), "nlu_ablate": None}, findings,
                       snapshot=snap)
    md = _markdown(doc)
    assert md.startswith(f"## {rc.HEADING}\n")
    assert "differ in budget, data (a decontaminated pre-training corpus; dev and test de-duplicated" in md
    assert "selection rule" in md and "not a method effect" in md
    assert all(item in md for item in PROTOCOL_CHANGES)  # the protocol's changes as report_protocol lists them
    new = f"new (protocol {PROTOCOL_VERSION})"
    assert f"| model | task | old (protocol 1) | {new} | difference |" in md
    table = md.split("### NLU Table 3 (`nlu_main`)")[1]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
            if line.startswith("| ") and not line.startswith("| model")]
    assert rows == [
        ["Task-specific fine-tuning", "every task", "-", "-", "row only in protocol 1"],
        ["SkillNet-NLU", "sentiment", "78.2 ± 1.7", "80.0 ± 0.4", "+1.8"],
        ["SkillNet-NLU", "ner", "50.4 ± 0.2", "55.0 ± 0.4", "not comparable: metric f1 → span_f1"],
        ["SkillNet-NLU", "domain", "-", "96.0 ± 0.4", f"task only in protocol {PROTOCOL_VERSION}"],
        ["SkillNet-NLU", "Avg", "64.3 ± 0.4", "77.0 ± 0.4", "not comparable: it averages ner (f1 → span_f1)"],
        ["BERT and PALs (joint)", "every task", "-", "-", f"row only in protocol {PROTOCOL_VERSION}"],
    ]
    # same tasks, same metrics: the average's difference is a number
    same = {"tasks": ["sentiment", "ner"], "seeds": [0], "methods": {"skillnet": {
        "tasks": {"sentiment": _score(80.0, [80.0]), "ner": _score(55.0, [55.0], "f1")}, "average": _score(67.5, [67.5])}}}
    old = json.loads(snap.read_text())["tables"]["nlu_main"]
    assert rc.compare_table(old, same, "nlu_main", 1, 2)[-1] == ["SkillNet-NLU", "Avg", "64.3 ± 0.4", "67.5", "+3.2"]
    # the old ablation has no new comparison: said in one line, no table
    assert "Tables on one side only: NLU Table 6 (skill ablation) (`nlu_ablate`): only in protocol 1." in md
    # claims: matched by their words, or by the paper table they name when protocol 2 made the words precise
    assert ("| SkillNet-NLU beats task-specific fine-tuning on average (Table 3) | does not hold | holds |" in md)
    assert ("| Sparse pre-training improves SkillNet-NLU over the same pre-training done densely (Table 3, last rows) "
            "| same direction, within the noise | other direction, within the noise |") in md
    assert ("| The learnable skill combination beats SkillNet's fixed map (learnable-skill-combination Table 1) | "
            "not claimed in protocol 1 | not measured |") in md
    assert "| NLU fine-tuning steps (a joint row) | 2,400 | 4,800 |" in md  # budgets: the old report's, the profile's
    assert "BART" not in md.split("| setting |")[1].split("\n\n")[0]  # an NLU-only report lists NLU budgets


def test_changes_section_without_snapshot_or_of_another_profile(tmp_path: Path) -> None:
    doc = Document()
    rc.changes_section(doc, PROFILES["full"], ("nlu",), {}, [], snapshot=tmp_path / "absent.json")
    lines = _markdown(doc).strip().split("\n\n")
    assert lines[0] == f"## {rc.HEADING}" and len(lines) == 2 and "No snapshot of the last committed run" in lines[1]
    assert not doc.problems()  # the one line is a statement, not a section left empty
    doc = Document()
    rc.changes_section(doc, PROFILES["quick"], ("nlu",), {"nlu_main": _comparison()}, [],
                       snapshot=_write_snapshot(tmp_path))
    assert "is of profile `full`, this report of `quick`: their tables are not comparable" in _markdown(doc)


def test_the_report_places_the_section_after_the_claims(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from skillnet.experiments.report import build

    monkeypatch.setattr(rc, "SNAPSHOT", _write_snapshot(tmp_path))
    path, _ = build(tmp_path / "out", PROFILES["full"], [], tmp_path / "r.md", "t", ("nlu",))
    heads = re.findall(r"^## (.+)$", path.read_text(encoding="utf-8"), flags=re.M)
    i = heads.index("Where the papers' claims hold at this scale")
    assert heads[i + 1] == rc.HEADING and heads[i + 2] == "Pre-training"


def _plain_table3(report: str) -> dict[str, list[tuple[float, float | None]]]:
    """NLU Table 3 of a committed report by a plain regex: the first `| model | ... | Avg |` table after the
    section's heading, each cell `mean ± std` or `mean`."""
    section = report.split("## SkillNet-NLU: multi-task training", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^\| model \|.*\| Avg \|\n\|[-|]+\|\n((?:\|.*\|\n)+)", section, flags=re.M)
    assert block
    out = {}
    for line in block[1].splitlines():
        name, *cells = [c.strip() for c in line.strip("|").split("|")]
        out[name] = [(float(m[1]), float(m[2]) if m[2] else None)
                     for m in (re.fullmatch(r"([\d.]+)(?: ± ([\d.]+))?", c) for c in cells) if m]
        assert len(out[name]) == len(cells), line
    return out


def test_committed_snapshot_holds_the_committed_table3() -> None:
    """results/protocol1/tables.json is committed, and its NLU Table 3 is docs/report.md's at the commit it names."""
    path = REPO / "results" / "protocol1" / "tables.json"
    assert path.is_file(), "run scripts/snapshot_protocol1.py"
    snap = json.loads(path.read_text(encoding="utf-8"))
    assert snap["protocol_version"] == 1 and snap["profile"] == "full"
    try:
        report = subprocess.run(["git", "show", f"{snap['commit']}:docs/report.md"], cwd=REPO, capture_output=True,
                                text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"no git history holding {snap['commit']} here")
    table = snap["tables"]["nlu_main"]
    mine = {r["model"]: [(v["mean"], v["std"]) if v else None for v in (r["cells"][c] for c in table["columns"])]
            for r in table["rows"]}
    assert mine == _plain_table3(report)
    assert len(mine) == 8 and table["columns"][-1] == "Avg"
