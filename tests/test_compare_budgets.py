"""`compare` compares rows at equal updates per task (issue 49): a comparison whose rows get different updates
is refused before it runs (or, with --allow-unequal-budgets, flagged), and every table shows each row's updates."""

from __future__ import annotations

import json
import math

import pytest
from skillnet.finetune import compare

from tests.test_finetune_e2e import tiny_config


def _config(tmp_path, sentiment: dict | None = None, **train) -> str:
    d = tiny_config(tmp_path / "unused")
    d["train"].update(max_steps=3, eval_every=3, log_every=3, **train)
    d["tasks"][0].update(sentiment or {})
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(d, ensure_ascii=False), encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("case", ["task_specific_full", "own_max_steps", "own_sampler"])
def test_rows_with_different_updates_per_task_are_refused_in_one_line(tmp_path, capsys, case):
    cfg = _config(tmp_path, task_specific_budget="full" if case == "task_specific_full" else "share")
    rows = {"task_specific_full": ["skillnet", "task_specific"],
            "own_max_steps": ["skillnet", "long=skillnet", "--args-for", "long=--max-steps 6"],
            "own_sampler": ["skillnet", "uniform=skillnet", "--args-for", "uniform=--sampler proportional --alpha 0"]}
    args = ["--config", cfg, "--methods", *rows[case], "--seeds", "0", "--no-plots",
            "--output-dir", str(tmp_path / "cmp"), "--dry-run"]
    assert compare.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: rows get different updates per task: ")
    assert "--allow-unequal-budgets" in err[0]
    assert not (tmp_path / "cmp").exists()  # refused before any run
    assert compare.main([*args, "--allow-unequal-budgets"]) == 0  # the escape hatch


def test_rows_at_the_same_budget_pass_the_plan(tmp_path):
    """Joint rows, task-specific models under "share", and variants that change no budget have one plan."""
    cfg = _config(tmp_path)
    rows = compare.resolve_rows(["skillnet", "dense_joint", "task_specific", "no_s1=skillnet"],
                                args_for=["no_s1=--drop-skill s1"])
    plans = {r.label: compare.budget_plan(compare.row_config(cfg, r)) for r in rows}
    assert compare.check_budgets(plans) is None, plans
    assert plans["skillnet"] == "3 steps shared by round_robin sampling"


def test_updates_of_a_joint_and_a_task_specific_run():
    joint = {"method": "dense_joint", "steps": 2400, "tasks": {"ner": {}, "span": {}},
             "task_mix": {"ner": {"target": 0.2, "realised": 0.194}, "span": {"target": 0.8, "realised": 0.806}}}
    expected, realised = compare.run_updates(joint)
    assert expected == pytest.approx({"ner": 480.0, "span": 1920.0})
    assert realised == pytest.approx({"ner": 465.6, "span": 1934.4})
    ts = {"method": "task_specific", "steps": 2400, "tasks": {"ner": {"steps": 480}, "span": {"steps": 1920}}}
    assert compare.run_updates(ts) == ({"ner": 480.0, "span": 1920.0},) * 2
    assert compare.run_updates({"method": "skillnet", "steps": 5, "tasks": {"ner": {}}}) is None  # older results


def _row(updates: dict[str, float] | None) -> dict:
    t = {"ner": {"mean": 50.0, "std": 1.0, "values": [50.0, 50.0], "metric": "f1"}}
    return {"tasks": t, "average": {"mean": 50.0, "std": 1.0, "values": [50.0, 50.0]}, "steps": 2400,
            "params": {"total": 1000, "trainable": 900, "activated": {"ner": 800}},
            "seconds": {"mean": 3.0, "values": [3.0, 3.0]}, "updates": updates}


def test_the_table_gives_each_rows_updates_and_flags_unequal_budgets():
    agg = {"split": "test", "seeds": [0, 1], "tasks": ["ner"],
           "methods": {"skillnet": _row({"ner": 480.0}), "task_specific": _row({"ner": 480.4})}}
    agg["budget_gaps"] = compare.budget_gaps(agg)
    md = compare.document(agg, {}, "skillnet", "T", {}, "cmd").markdown()
    assert "| method | ner (f1) | average | steps | updates / task | wall time / run |" in md
    assert "| skillnet | 50.0 ± 1.0 | 50.0 ± 1.0 | 2400 | 480 | 3 s |" in md
    assert "Unequal budgets" not in md
    # the full profile's committed Table 3: task-specific 1,200 steps on NER against ~480 in a joint run
    agg["methods"]["task_specific"] = _row({"ner": 1200.0})
    agg["budget_gaps"] = compare.budget_gaps(agg)
    assert agg["budget_gaps"] == {"ner": {"skillnet": 480.0, "task_specific": 1200.0}}
    md = compare.document(agg, {}, "skillnet", "T", {}, "cmd").markdown()
    assert "**Unequal budgets" in md and "ner: skillnet 480, task_specific 1,200" in md
    assert "| task_specific | 50.0 ± 1.0 | 50.0 ± 1.0 | 2400 | 1,200 (unequal) | 3 s |" in md
    assert compare.updates_cell({"a": 466.0, "b": 1920.0}) == "466-1,920" and compare.updates_cell(None) == "-"
    assert not math.isnan(agg["methods"]["skillnet"]["updates"]["ner"])


def test_a_compare_of_a_joint_and_a_task_specific_row_reports_equal_updates(tmp_path):
    cfg = _config(tmp_path, sentiment={"positive_label": "pos", "metric": "auc"})
    out = tmp_path / "cmp"
    assert compare.main(["--config", cfg, "--methods", "skillnet", "task_specific", "--seeds", "0", "--no-plots",
                         "--output-dir", str(out), "--in-process", "--threads", "1"]) == 0
    agg = json.loads((out / "comparison.json").read_text())
    # round robin over 3 tasks, 3 steps: one update per task in either row
    assert {m: r["updates"] for m, r in agg["methods"].items()} == {m: {"sentiment": 1.0, "ner": 1.0, "qa_match": 1.0}
                                                                  for m in ("skillnet", "task_specific")}
    assert agg["budget_gaps"] == {} and agg["budgets"]["equal"]
    assert "| updates / task |" in (out / "comparison.md").read_text()
    # a binary task is scored (and its checkpoint selected) by ROC-AUC, from the positive-class probability
    for row in ("skillnet", "task_specific"):
        res = json.loads((out / row / "seed0" / "results.json").read_text())["tasks"]["sentiment"]
        assert res["metric"] == "auc" and 0.0 <= res["test"]["auc"] <= 100.0 and "accuracy" in res["test"]
