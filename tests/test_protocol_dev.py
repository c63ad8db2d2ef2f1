"""Every choice of the reproduction made on dev, alike for every method, and the report's Protocol section
(issue 55, item 2): the loss-scale study decides on dev and Table 3 trains with its winner (or refuses a table of
another); each main-table row's lr is chosen on dev by one search for all; adaptation starts from the dev-selected
checkpoint, answer_select's task-specific row from the pre-trained dense BERT."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from skillnet.experiments import nlg, nlu, tune
from skillnet.experiments.profiles import PROFILES
from skillnet.experiments.runner import Runner
from skillnet.finetune.document import Document, claim, decide_claims

from tests.test_finetune_e2e import tiny_config


def _result(method: str, dev: dict[str, float], test: dict[str, float], steps: int = 10) -> dict[str, Any]:
    """A finished run's results.json, as finetune.run writes it, with the scores given."""
    tasks = {t: {"metric": "f1", "type": "x", "dev": {"f1": dev[t]}, "test": {"f1": test[t]}, "dev_curve": [],
                 "steps": steps} for t in dev}
    return {"method": method, "steps": steps, "seconds": 2.0, "tasks": tasks,
            "params": {"total": 1, "trainable": 1, "tasks": {t: {"activated": 1} for t in dev}}}


def _write_run(folder: Path, res: dict[str, Any]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "results.json").write_text(json.dumps(res), encoding="utf-8")


def _rows(command: str) -> dict[str, Any]:
    """The rows of a recorded finetune.compare command, by label."""
    from skillnet.finetune import compare

    a = compare.build_parser().parse_args(shlex.split(command)[3:])
    return {r.label: r for r in compare.resolve_rows(a.methods, a.init, a.init_for, a.args_for)}


# ------------------------------------------------------------------------------------------ the loss-scale study
def test_the_loss_scale_study_decides_on_dev_not_on_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Dev prefers token_mean for every row, test prefers sentence_mean: the study's winner is token_mean, written
    to loss_scale.json with each arm's dev score, and its table says so. The task-specific row is one of the
    study's rows (its NER head changes with the arm too)."""
    from skillnet.experiments import loss_scale
    from skillnet.finetune import compare

    tasks = ["sentiment", "ner", "qa_match"]

    def fake_compare(argv: list[str]) -> int:
        a = compare.build_parser().parse_args(argv)
        out = Path(a.output_dir)
        good_on_dev = "token_mean" in out.name
        for m in a.methods:
            for s in a.seeds:
                dev = {t: (60.0 if good_on_dev else 40.0) + s for t in tasks}
                test = {t: (40.0 if good_on_dev else 60.0) + s for t in tasks}
                _write_run(out / m / f"seed{s}", _result(m, dev, test))
        agg = compare.aggregate(out, a.methods, a.seeds)
        (out / "comparison.json").write_text(json.dumps(agg), encoding="utf-8")
        return 0

    monkeypatch.setattr(compare, "main", fake_compare)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(tiny_config(tmp_path / "unused")), encoding="utf-8")
    out = tmp_path / "study"
    assert loss_scale.main(["--config", str(cfg), "--seeds", "0", "1", "--out", str(out),
                            "--arms", "sentence_mean", "token_mean"]) == 0
    study = json.loads((out / "loss_scale.json").read_text())
    assert set(study["scores"]) == {"dense_joint", "skillnet", "task_specific"}
    assert study["scores"]["skillnet"]["sentence_mean"]["average"]["mean"] > \
        study["scores"]["skillnet"]["token_mean"]["average"]["mean"]  # test would pick sentence_mean
    assert study["winner"] == "token_mean"
    assert study["decision"]["split"] == "dev"
    assert study["decision"]["by_arm"] == pytest.approx({"sentence_mean": 40.5, "token_mean": 60.5})
    md = (out / "loss_scale.md").read_text()
    assert "**Decision, on dev**" in md and "Winner: `token_mean`" in md


def test_the_decision_breaks_ties_by_the_arm_order_and_ignores_rows_without_dev() -> None:
    from skillnet.experiments.loss_scale import decide

    def ms(v: float) -> dict[str, Any]:
        return {"average": {"mean": v}}

    dev = {"scores": {"a": {"x": ms(50.0), "y": ms(50.0)}, "b": {"x": ms(float("nan")), "y": ms(float("nan"))}}}
    assert decide(dev, ["y", "x"])["winner"] == "y"
    assert decide(dev, ["x", "y"])["winner"] == "x"


def _study(root: Path, winner: str | None) -> None:
    (root / "loss_scale").mkdir(parents=True, exist_ok=True)
    rec = {} if winner is None else {"winner": winner, "decision": {"winner": winner, "by_arm": {winner: 1.0}}}
    (root / "loss_scale" / "loss_scale.json").write_text(json.dumps(rec))


def _ner(cfg_path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    cfg = json.loads(cfg_path.read_text())
    return next(t for t in cfg["tasks"] if t["type"] == "ner"), cfg["train"]


def test_every_nlu_table_trains_with_the_studys_winner_and_a_table_of_another_is_refused(tmp_path: Path) -> None:
    from skillnet.experiments.loss_scale import config_arm

    r = Runner(tmp_path, PROFILES["quick"], dry_run=True)
    _study(tmp_path, "token_mean+ema")
    r.stage = "nlu_main"
    assert nlu.stage_nlu_main(r)["ner_loss"] == "token_mean+ema"
    ner, train = _ner(tmp_path / "configs" / "nlu_main.json")
    assert ner["head"]["loss_reduction"] == "token_mean" and train["task_grad_norm"] == "ema"
    nlu.stage_nlu_ablate(r)
    assert config_arm(json.loads((tmp_path / "configs" / "nlu_ablate.json").read_text())) == "token_mean+ema"
    # the study's own config is not set to its winner: it varies the arm
    nlu.stage_nlu_loss_scale(r)
    assert "task_grad_norm" not in _ner(tmp_path / "configs" / "nlu_loss_scale.json")[1]
    # a finished Table 3 trained with another NER loss: compare would not rerun it, so the stage refuses
    run = tmp_path / "compare" / "nlu_main" / "skillnet" / "seed0"
    run.mkdir(parents=True)
    other = json.loads((tmp_path / "configs" / "nlu_loss_scale.json").read_text())
    (run / "finetune_config.json").write_text(json.dumps(other))
    with pytest.raises(RuntimeError, match=r"NER loss sentence_mean, the study's winner token_mean\+ema"):
        nlu.stage_nlu_main(r)


def test_a_real_run_needs_the_studys_decision(tmp_path: Path) -> None:
    r = Runner(tmp_path, PROFILES["quick"])
    r.stage = "nlu_main"
    with pytest.raises(RuntimeError, match="run stage nlu_loss_scale first"):
        nlu.stage_nlu_main(r)
    _study(tmp_path, None)  # a study from before the dev decision
    with pytest.raises(RuntimeError, match="predates the study's decision on dev"):
        nlu.stage_nlu_main(r)


# ------------------------------------------------------------------------------------------ the lr search
def _fake_search(root: Path, part: str, rows: list[str], grid: list[float], dev_best: dict[str, float],
                 tasks: list[str]) -> None:
    """A finished search comparison: each row's run at `dev_best[row]` scores best on dev and worst on test."""
    from skillnet.finetune import compare

    out = root / "compare" / f"{part}_tune"
    labels = []
    for row in rows:
        for lr in grid:
            lab = tune.grid_label(row, lr)
            labels.append(lab)
            best = lr == dev_best[tune.label_of(row)]
            _write_run(out / lab / "seed0", _result(row.split("=")[-1], {t: 70.0 if best else 50.0 for t in tasks},
                                                    {t: 30.0 if best else 50.0 for t in tasks}))
    (out / "comparison.json").write_text(json.dumps(compare.aggregate(out, labels, [0])))


def test_the_tuning_stage_picks_each_rows_lr_on_dev_and_the_main_table_trains_with_it(tmp_path: Path) -> None:
    p = PROFILES["quick"]
    assert len(p.nlu_lr_grid) >= 2 and len(p.nlg_lr_grid) >= 2
    r = Runner(tmp_path, p)
    _study(tmp_path, "sentence_mean")
    grid = tune.search(p, "nlu").grid
    best = {tune.label_of(x): grid[i % len(grid)] for i, x in enumerate(p.nlu_methods)}
    assert len(set(best.values())) > 1  # rows differ in their choice
    _fake_search(tmp_path, "nlu", p.nlu_methods, grid, best, ["sentiment", "ner"])
    r.stage = "nlu_tune"
    info = nlu.stage_nlu_tune(r)
    assert info["chosen"] == best
    rec = json.loads(tune.result_path(tmp_path, "nlu").read_text())
    assert rec["split"] == "dev" and rec["grid"] == grid and rec["seed"] == p.seeds[0]
    assert rec["steps"] == p.nlu_tune_steps and rec["runs"] == len(grid) * len(p.nlu_methods)
    assert rec["dev"]["skillnet"][f"{best['skillnet']:g}"] == 70.0 and rec["total_run_seconds"] > 0
    # every row searched the same grid, from the weights its Table 3 row starts from
    rows = _rows(r.commands[-1])
    assert {lab: row.args for lab, row in rows.items()} == {
        tune.grid_label(x, lr): ("--lr", f"{lr:g}") for x in p.nlu_methods for lr in grid}
    assert rows[tune.grid_label("skillnet", grid[0])].init == nlu.bert_init(r, "skillnet")
    assert rows[tune.grid_label("dense_joint", grid[0])].init == nlu.bert_init(r, "dense_joint")
    # Table 3: each row at its chosen lr (the finished comparison is skipped, its command still recorded)
    (tmp_path / "compare" / "nlu_main").mkdir(parents=True)
    (tmp_path / "compare" / "nlu_main" / "comparison.json").write_text("{}")
    r.stage = "nlu_main"
    assert nlu.stage_nlu_main(r)["lr"] == best
    main = _rows(r.commands[-1])
    assert {lab: row.args for lab, row in main.items()} == {lab: ("--lr", f"{lr:g}") for lab, lr in best.items()}
    # a finished run of Table 3 at another lr is refused
    run = tmp_path / "compare" / "nlu_main" / "skillnet" / "seed0"
    run.mkdir(parents=True)
    cfg = json.loads((tmp_path / "configs" / "nlu_main.json").read_text())
    cfg["train"]["lr"] = 0.123
    (run / "finetune_config.json").write_text(json.dumps(cfg))
    with pytest.raises(RuntimeError, match=r"skillnet/seed0: lr 0.123, chosen"):
        nlu.stage_nlu_main(r)


def test_the_search_runs_first_and_every_other_study_trains_at_a_dev_chosen_lr(tmp_path: Path) -> None:
    """No lr of any table is the profile's own (it was once chosen on a test score): the search runs before the
    loss-scale study, without its decision; the study trains each row at that row's chosen lr; the side studies
    and the new task's SkillNet rows at SkillNet's, its task-specific row at task-specific's; NLG alike."""
    from skillnet.experiments.stages import PARTS, STAGES

    names = [s.name for s in STAGES]
    assert names.index("nlu_tune") < names.index("nlu_loss_scale") < names.index("nlu_main")
    assert PARTS["nlu"][2].index("nlu_tune") < PARTS["nlu"][2].index("nlu_loss_scale")
    p = PROFILES["quick"]
    grid = tune.search(p, "nlu").grid
    best = {tune.label_of(x): grid[i % len(grid)] for i, x in enumerate(p.nlu_methods)}
    best["skillnet"], best["task_specific"] = grid[0], grid[-1]
    _fake_search(tmp_path, "nlu", p.nlu_methods, grid, best, ["sentiment", "ner"])
    r = Runner(tmp_path, p)
    r.stage = "nlu_tune"
    assert nlu.stage_nlu_tune(r)["chosen"] == best  # no loss_scale.json yet: the search does not need it
    g_grid = tune.search(p, "nlg").grid
    g_best = {tune.label_of(x): g_grid[-1 - i % len(g_grid)] for i, x in enumerate(p.nlg_methods)}
    _fake_search(tmp_path, "nlg", p.nlg_methods, g_grid, g_best, ["csc"])
    r.stage = "nlg_tune"
    nlg.stage_nlg_tune(r)
    d = Runner(tmp_path, p, dry_run=True)
    nlu.stage_nlu_loss_scale(d)
    args = shlex.split(d.commands[-1])
    lrs = {args[i + 1].split("=")[0]: args[i + 1].split("=", 1)[1] for i, a in enumerate(args) if a == "--args-for"}
    assert lrs == {m: f"--lr {best[m]:g}" for m in ("dense_joint", "skillnet", "task_specific")}
    lr = ("--lr", f"{best['skillnet']:g}")
    for stage in (nlu.stage_nlu_ablate, nlu.stage_nlu_alpha):
        stage(d)
        assert all(row.args[-2:] == lr for row in _rows(d.commands[-1]).values())
    nlu.stage_nlu_adapt(d)
    rows = _rows(d.commands[-1])
    assert {lab: row.args[-2:] for lab, row in rows.items()} == {
        **{lab: lr for lab in ("a_existing", "b_s8_frozen", "c_s8_all")},
        "task_specific": ("--lr", f"{best['task_specific']:g}")}
    (tmp_path / "pt_bart" / "hf").mkdir(parents=True)
    nlg.stage_nlg_temp(d)
    assert all(row.args[-2:] == ("--lr", f"{g_best['skillnet']:g}") for row in _rows(d.commands[-1]).values())
    nlg.stage_nlg_adapt(d)
    assert _rows(d.commands[-1])["task_specific"].args == ("--lr", f"{g_best['task_specific']:g}")


def test_nlg_main_trains_each_row_at_its_lr_chosen_on_dev(tmp_path: Path) -> None:
    p = PROFILES["quick"]
    r = Runner(tmp_path, p)
    grid = tune.search(p, "nlg").grid
    best = {tune.label_of(x): grid[-1 - i % len(grid)] for i, x in enumerate(p.nlg_methods)}
    _fake_search(tmp_path, "nlg", p.nlg_methods, grid, best, ["csc", "poetry_title"])
    r.stage = "nlg_tune"
    assert nlg.stage_nlg_tune(r)["chosen"] == best
    (tmp_path / "compare" / "nlg_main").mkdir(parents=True)
    (tmp_path / "compare" / "nlg_main" / "comparison.json").write_text("{}")
    r.stage = "nlg_main"
    nlg.stage_nlg_main(r)
    assert {lab: row.args for lab, row in _rows(r.commands[-1]).items()} == {
        lab: ("--lr", f"{lr:g}") for lab, lr in best.items()}


def test_a_main_table_without_the_search_stops_and_a_profile_without_a_grid_keeps_its_lr(tmp_path: Path) -> None:
    import dataclasses

    r = Runner(tmp_path, PROFILES["quick"])
    r.stage = "nlg_main"
    with pytest.raises(RuntimeError, match="run stage nlg_tune first"):
        nlg.stage_nlg_main(r)
    scale = Runner(tmp_path / "s", dataclasses.replace(PROFILES["scale"]), dry_run=True)
    assert not PROFILES["scale"].nlu_lr_grid and not PROFILES["scale"].nlg_lr_grid  # the papers' lr
    assert tune.chosen_lrs(scale, "nlu") == {} and nlg.stage_nlg_tune(scale) == {"searched": False, "lr": 3e-5}


def test_an_lr_joins_a_rows_other_options() -> None:
    assert tune.with_lrs(["--args-for", "a=--new-skill s8", "--reference", "a"], {"a": 1e-3, "b": 2e-3}) == [
        "--args-for", "a=--new-skill s8 --lr 0.001", "--reference", "a", "--args-for", "b=--lr 0.002"]
    assert tune.pick({"r": {"0.001": 5.0, "0.002": 5.0, "0.004": None}}, [1e-3, 2e-3, 4e-3]) == {"r": 1e-3}


# ------------------------------------------------------------------------------------------ adaptation
def test_adaptation_starts_from_the_dev_selected_checkpoint(tmp_path: Path) -> None:
    """NLU Table 5 and NLG Table 4 continue each seed's SkillNet at its dev-selected weights (best/, a full
    export that finetune/evaluation.py writes), not the last step's export/; answer_select's task-specific row
    starts from the pre-trained dense BERT that Table 3's task-specific row starts from (the paper's Table 4)."""
    r = Runner(tmp_path, PROFILES["full"], dry_run=True)
    nlu.stage_nlu_adapt(r)
    rows = _rows(r.commands[-1])
    want = str(tmp_path / "compare" / "nlu_main" / "skillnet" / "seed{seed}" / "best")
    assert {lab: row.init for lab, row in rows.items() if lab != "task_specific"} == {
        lab: want for lab in ("a_existing", "b_s8_frozen", "c_s8_all")}
    assert rows["task_specific"].init == nlu.bert_init(r, "task_specific") != want
    nlg.stage_nlg_adapt(r)
    (tmp_path / "pt_bart" / "hf").mkdir(parents=True)  # compare checks that a fixed init exists
    rows = _rows(r.commands[-1])
    assert {lab: row.init for lab, row in rows.items() if lab != "task_specific"} == {
        lab: str(tmp_path / "compare" / "nlg_main" / "skillnet" / "seed{seed}" / "best")
        for lab in ("a_existing", "c_new_skill")}
    # NLG Table 4's task-specific fine-tuning: the pre-trained BART, not the multi-task model
    assert rows["task_specific"].init == str(tmp_path / "pt_bart" / "hf")
    assert "best" in Path(__file__).parent.parent.joinpath("finetune", "evaluation.py").read_text().split(
        "save_model_dir(model, self.out / ")[2][:10]  # the folder the shared dev-selected export goes to


# ------------------------------------------------------------------------------------------ the Protocol section
def _fake_run(root: Path) -> None:
    (root / "tune").mkdir(parents=True)
    (root / "tune" / "nlu.json").write_text(json.dumps({
        "part": "nlu", "split": "dev", "seed": 0, "steps": 1200, "grid": [0.0005, 0.001, 0.002], "runs": 24,
        "total_run_seconds": 1800.0, "chosen": {"skillnet": 0.002, "dense_joint": 0.0005},
        "dev": {"skillnet": {"0.0005": 50.0, "0.001": 51.0, "0.002": 53.5},
                "dense_joint": {"0.0005": 49.0, "0.001": 48.0, "0.002": None}}}))
    (root / "loss_scale").mkdir()
    (root / "loss_scale" / "loss_scale.json").write_text(json.dumps({
        "seeds": [0, 1, 2], "scores": {"dense_joint": {}, "skillnet": {}, "task_specific": {}}, "winner": "token_mean",
        "decision": {"rule": "r", "split": "dev", "winner": "token_mean",
                     "by_arm": {"token_mean": 55.25, "sentence_mean": 54.0}}}))
    (root / "configs").mkdir()
    (root / "configs" / "nlu_main.json").write_text(json.dumps(
        {"tasks": [{"name": "ner", "type": "ner", "head": {"loss_reduction": "token_mean"}}], "train": {}}))
    (root / "corpus").mkdir()
    (root / "corpus" / "decontamination.json").write_text(json.dumps({
        "rule": "a shared character 13-gram", "ngram": 13,
        "corpus": {"docs_in": 10_000, "docs_dropped": 1_234, "docs_out": 8_766},
        "heldout": {"docs_in": 100, "docs_dropped": 7},
        "by_task": {"span": {"test": {"examples": 500, "examples_matched": 499}}},
        "dedup": {"qa_match": {"test": {"examples_in": 2000, "removed": 213}}}}))
    for d in ("pt_sparse/seed0", "pt_sparse/seed1", "pt_dense/hf"):
        (root / d).mkdir(parents=True)


def test_the_protocol_section_renders_from_a_run_folder(tmp_path: Path) -> None:
    from skillnet.experiments.report_protocol import PROTOCOL, count_claims, protocol_section

    _fake_run(tmp_path)
    cmps = {"nlu_main": {"tasks": ["ner", "span"], "budget_gaps": {}, "methods": {
        "skillnet": {"updates_realised": {"ner": 960.0, "span": 950.0}, "updates_per_seed": [{}, {}, {}]},
        "task_specific": {"updates_realised": {"ner": 960.0, "span": 950.0}}}},
        "nlu_adapt": {"rows": {"a_existing": {"init": "x/skillnet/seed{seed}/best"},
                               "task_specific": {"init": "x/pt_dense_ctrl/seed{seed}/hf"}}}}
    findings: list[str] = []
    claim(findings, "A beats B", {"diff": 2.0, "p": 0.01}, 3)
    claim(findings, "A beats C", {"diff": -1.0, "p": 0.4}, 3)
    claim(findings, "A beats D", None, 3)  # not measured: not a decided claim
    findings.append("Sampling: the best average here is at alpha = 1.")
    assert count_claims(findings) == 2
    findings = decide_claims(findings)  # the report counts them after they are decided and worded
    assert count_claims(findings) == 2
    doc = Document()
    protocol_section(doc, tmp_path, PROFILES["full"], ("nlu", "nlg"), cmps, count_claims(findings))
    assert doc.problems() == []
    md = doc.markdown()
    assert md.startswith(f"## {PROTOCOL}")
    # what was tuned on what
    assert "grid 0.0005, 0.001, 0.002, seed 0, 1,200 steps per run (24 runs, 30.0 min of run time)" in md
    assert "`skillnet` 0.002 (dev 0.0005: 50.0, 0.001: 51.0, 0.002: 53.5)" in md and "0.002: -" in md
    assert "NLG learning rate: to be chosen on dev from 0.001, 0.002, 0.004" in md
    assert "winner `token_mean`. Table 3 trained with `token_mean`, the winner." in md
    assert "`token_mean` 55.25, `sentence_mean` 54.00" in md
    assert "`a_existing` start from each seed's dev-selected multi-task checkpoint (`best/`)" in md
    assert "Batch size and steps: budget choices fixed before any run" in md
    # decontamination, budgets, pre-training, the rule
    assert "10,000 documents in, 1,234 dropped" in md and "7 of 100 documents" in md
    assert "| span | test | 500 | 499 | - | - |" in md and "| qa_match | test | - | - | 2,000 | 213 |" in md
    assert "`nlu_main`: equal in every row, task and seed." in md
    assert "| row | ner | span | seeds recorded |" in md and "| skillnet | 960 | 950 | 3 |" in md
    assert "| task_specific | 960 | 950 | - |" in md
    assert "`pt_dense` one run" in md and "`pt_sparse` seeds 0, 1" in md
    assert "2 claims" in md or "over the report's 2 claims" in md


def test_the_report_has_a_protocol_section_that_check_accepts(tmp_path: Path) -> None:
    """An empty run folder still gets the section, saying what it lacks, and --check does not flag it."""
    from skillnet.experiments.report import build
    from skillnet.experiments.stages import PARTS, STAGES

    _, parts, names = PARTS["all"]
    path, problems = build(tmp_path, PROFILES["quick"], [s for s in STAGES if s.name in names],
                           tmp_path / "r.md", "t", parts)
    md = path.read_text()
    assert "\n## Protocol\n" in md and "wrote no `corpus/decontamination.json`" in md
    assert not [x for x in problems if "Protocol" in x]
