"""Replicated, fair pre-training, NLG test sets that can decide and side studies with a noise estimate (issue 55,
items 4, 6 and 8): the reproduction's stage graph as its dry run records it, the report's side-study findings
on hand-made comparisons, and the CPU time estimate by hand."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from skillnet.experiments import estimate as est
from skillnet.experiments.nlg import nlg_config, nlg_train_tasks, stage_nlg_tasks, stage_nlg_temp
from skillnet.experiments.nlu import (
    bert_init,
    stage_dense_ctrl_pt,
    stage_nlu_ablate,
    stage_nlu_alpha,
    stage_nlu_loss_scale,
    stage_nlu_main,
    stage_sparse_pt,
)
from skillnet.experiments.profiles import LOSS_SCALE_METHODS, PROFILES
from skillnet.experiments.runner import Runner
from skillnet.finetune.document import Document


def _dry(tmp_path: Path, name: str = "full") -> Runner:
    return Runner(tmp_path, PROFILES[name], dry_run=True)


def _pretrain_runs(r: Runner, stage: str, fn: Any) -> dict[int, dict[str, Any]]:
    """seed -> (parsed pretrain/run.py options, export folder, ds JSON) of each run the stage records."""
    from skillnet.pretrain import run as run_mod

    r.stage = stage
    first = len(r.commands)
    fn(r)
    cmds = [shlex.split(c) for c in r.commands[first:]]
    out: dict[int, dict[str, Any]] = {}
    for i, c in enumerate(cmds):
        if "pretrain/run.py" not in c:
            continue
        argv = c[c.index("pretrain/run.py") + 1:]
        a = run_mod.build_parser().parse_args(argv)
        export = cmds[i + 1]
        assert "skillnet.pretrain.export" in export and export[export.index("--checkpoint") + 1] == a.output_dir
        out[a.seed] = {"args": a, "export": export[export.index("--out") + 1], "launch": c[:c.index("pretrain/run.py")],
                       "ds": json.loads(Path(a.ds_config).read_text())}
    return out


@pytest.mark.parametrize("name", ["quick", "full"])
def test_fine_tuning_seed_k_starts_from_pretraining_seed_k(tmp_path: Path, name: str) -> None:
    """Sparse rows of Table 3 (and of the loss-scale study) start seed k from sparse pre-training seed k, every
    other row from the dense control's seed k; each pre-training seed is its own run, exported where the
    fine-tuning looks for it."""
    from skillnet.finetune import compare

    r = _dry(tmp_path, name)
    seeds = r.p.seeds
    sparse = _pretrain_runs(r, "sparse_pt", stage_sparse_pt)
    ctrl = _pretrain_runs(r, "dense_ctrl_pt", stage_dense_ctrl_pt)
    assert sorted(sparse) == sorted(ctrl) == sorted(seeds) and len(seeds) >= 2
    assert len({v["export"] for v in [*sparse.values(), *ctrl.values()]}) == 2 * len(seeds)  # no shared folder
    r.stage = "nlu_main"
    stage_nlu_main(r)
    a = compare.build_parser().parse_args(shlex.split(r.commands[-1])[3:])
    rows = compare.resolve_rows(a.methods, a.init, a.init_for, a.args_for)
    assert a.seeds == seeds
    for row in rows:
        for k in seeds:
            want = (sparse if row.label in r.p.nlu_sparse_rows else ctrl)[k]["export"]
            assert row.init.replace("{seed}", str(k)) == want, (row.label, k)
    labels = {row.label for row in rows}
    assert {"skillnet", "skillnet_dense", "dense_joint", "task_specific"} <= labels
    # the loss-scale study: each row from the weights its Table 3 row starts from
    r.stage = "nlu_loss_scale"
    stage_nlu_loss_scale(r)
    cmd = shlex.split(r.commands[-1])
    init = cmd[cmd.index("--init") + 1]
    init_for = dict(cmd[i + 1].split("=", 1) for i, x in enumerate(cmd) if x == "--init-for")
    for m in LOSS_SCALE_METHODS:
        assert init_for.get(m, init) == bert_init(r, m) == next(row.init for row in rows if row.label == m)


def test_the_dense_control_repeats_the_sparse_runs_pretraining_without_skills(tmp_path: Path) -> None:
    """Same steps, objectives (MLM+NSP), data, lr, schedule, seed, ranks and batch geometry from the same dense
    BERT; only --dense differs (issue 55: pt_sparse was pt_dense plus 500 steps and NSP)."""
    r = _dry(tmp_path)
    sparse = _pretrain_runs(r, "sparse_pt", stage_sparse_pt)
    ctrl = _pretrain_runs(r, "dense_ctrl_pt", stage_dense_ctrl_pt)
    for k in r.p.seeds:
        s, c = vars(sparse[k]["args"]), vars(ctrl[k]["args"])
        assert s["objectives"] == c["objectives"] == ["mlm", "nsp"]
        assert (s["dense"], c["dense"]) == (False, True)
        assert s["max_steps"] == c["max_steps"] == r.p.sparse_pt_steps
        assert s["init_from_dense"] == c["init_from_dense"] == str(tmp_path / "pt_dense" / "hf")
        differ = {key for key in s if s[key] != c[key]}
        assert differ == {"dense", "output_dir", "ds_config"}, differ
        assert sparse[k]["ds"] == ctrl[k]["ds"] and sparse[k]["launch"] == ctrl[k]["launch"]
        assert s["seed"] == k


def test_nlg_test_sets_hold_at_least_500_examples_on_the_full_profile(tmp_path: Path) -> None:
    """Every NLG task (the new one included) is converted with a test cap of at least 500 or none (the whole
    split); dev stays at nlg_eval, decoded at every evaluation."""
    r = _dry(tmp_path)
    stage_nlg_tasks(r)
    caps = {}
    for c in r.commands:
        cmd = shlex.split(c)
        caps[Path(cmd[cmd.index("--out") + 1]).name] = (int(cmd[cmd.index("--max-eval-examples") + 1])
                                                        if "--max-eval-examples" in cmd else None)
    assert len(caps) == 5 and all(v is None or v >= 500 for v in caps.values()), caps
    tasks = json.loads(nlg_config(r, nlg_train_tasks(), 10, "x").read_text())["tasks"]
    assert {t["max_dev_examples"] for t in tasks} == {r.p.nlg_eval}


@pytest.mark.parametrize("stage", [stage_nlu_ablate, stage_nlu_alpha, stage_nlg_temp])
def test_side_studies_run_at_least_two_seeds_on_the_full_profile(tmp_path: Path, stage: Any) -> None:
    r = _dry(tmp_path)
    stage(r)
    cmd = shlex.split(r.commands[-1])
    i = cmd.index("--seeds") + 1
    seeds = []
    while i < len(cmd) and not cmd[i].startswith("--"):
        seeds.append(int(cmd[i]))
        i += 1
    assert len(seeds) >= 2 and seeds == r.p.side_seeds


def _study(rows: dict[str, list[float]]) -> dict[str, Any]:
    """A comparison of one task whose rows score `values` per seed."""
    import statistics

    def agg(v: list[float]) -> dict[str, Any]:
        return {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0, "values": v,
                "metric": "accuracy"}

    n = len(next(iter(rows.values())))
    return {"tasks": ["t"], "seeds": list(range(n)),
            "methods": {k: {"tasks": {"t": agg(v)}, "average": agg(v)} for k, v in rows.items()}}


def test_a_sampling_study_names_no_best_value_within_the_noise() -> None:
    """The highest average is called the best only when a paired test over the seeds puts it beyond the noise of
    every other value; the finding states the spread."""
    from scipy import stats
    from skillnet.experiments.tables import study_best

    tied = _study({"T_1": [50.0, 52.0], "T_4": [51.0, 52.5], "T_1024": [49.0, 51.5]})
    order = [(k, f"T = {k[2:]}") for k in tied["methods"]]
    text = study_best(Document(), tied, order, "Temperature", "T = 4")
    p = stats.ttest_rel([51.0, 52.5], [50.0, 52.0]).pvalue
    assert "the best average" not in text and "do not single out a best value" in text
    assert f"T = 1 (+0.8, p = {p:.3f})" in text and "2 seeds" in text and "±1.1 to ±1.8" in text
    clear = _study({"T_1": [50.0, 50.1, 50.3], "T_4": [55.0, 55.2, 55.3]})
    text = study_best(Document(), clear, [(k, f"T = {k[2:]}") for k in clear["methods"]], "Temperature", "T = 4")
    assert "the best average is at T = 4, beyond the noise of every other value" in text
    one = _study({"alpha_0": [50.0], "alpha_1": [51.0]})
    assert "no value can be called the best" in study_best(Document(), one, [], "Sampling", "alpha = 1.0")


def test_the_ablation_is_judged_against_its_own_unablated_row(tmp_path: Path) -> None:
    """Table 6's finding compares each removal with the unablated row of the same study (same steps and seeds),
    not with the spread of the main table's rows, and says which removals are beyond the noise."""
    from skillnet.experiments.report_nlu import nlu_part

    c = _study({"skillnet": [60.0, 61.0, 62.0], "no_s7": [50.0, 51.2, 51.9], "no_s1": [60.5, 60.0, 62.5]})
    (tmp_path / "configs").mkdir()
    (tmp_path / "configs" / "nlu_ablate.json").write_text(json.dumps({"train": {"max_steps": 1200}, "tasks": []}))
    cmps = {k: None for k in ("nlu_main", "nlu_adapt", "nlu_alpha")} | {"nlu_ablate": c}
    findings: list[str] = []
    doc = Document()
    nlu_part(doc, cmps, tmp_path / "compare", tmp_path, findings)
    text = next(f for f in findings if f.startswith("Ablation"))
    assert "3 seeds" in text and "1,200 steps" in text and "unablated row of the same study" in text
    assert "removing s7 (+10.0, p = 0.00" in text and "lowers the average beyond the noise" in text
    assert "removing s1 (+0.0, p = 1.000) changes it within the noise" in text
    assert "main table" not in text
    assert "Differences from the unablated row of this study" in doc.markdown()


def test_the_nlg_table_gives_each_tasks_test_size_beside_its_score() -> None:
    from skillnet.experiments.tables import score_table

    c = _study({"skillnet": [10.0, 11.0]})
    c["methods"]["skillnet"]["params"] = {"total": 1e6, "trainable": 1e6, "activated": {"t": 1e6}}
    doc = Document()
    score_table(doc, c, [("skillnet", "SkillNet-NLG")], sizes={"t": 500})
    assert "| model | t (accuracy, 500 test) | Avg |" in doc.markdown()


def test_the_cpu_estimate_scales_the_measured_stage_times_by_the_work() -> None:
    """By hand: a profile with the measured run's ablation settings gets its measured time back (unpacked);
    twice the side seeds, twice the time; the dense control costs the sparse run's; the 500-example NLG test
    sets add their beam search."""
    import dataclasses

    full = PROFILES["full"]
    then = dataclasses.replace(full, side_seeds=[0], nlu_side_steps=1200, nlg_test=None, nlg_eval=50)
    bound = est.cpu_estimate(then, packed=False)
    assert bound["nlu_ablate"] == pytest.approx(19.3 * 60)
    assert est.cpu_estimate(dataclasses.replace(then, side_seeds=[0, 1]), packed=False)["nlu_ablate"] == (
        pytest.approx(2 * 19.3 * 60))
    assert bound["sparse_pt"] == bound["dense_ctrl_pt"] == pytest.approx(3 * 4.8 * 60)  # 3 seeds of one run's time
    assert est.extra_test_decoding(then) == {"nlg_main": 0, "nlg_temp": 0, "nlg_adapt": 0}
    # 3 seeds x 4 rows, 3 tasks from 50 to 500 test examples (csc: its whole split both times), 2 runs at once
    assert est.extra_test_decoding(full)["nlg_main"] == pytest.approx(12 * 3 * 450 * est.DECODE_S_PER_EXAMPLE / 2)
    packed = est.cpu_estimate(full)
    assert packed["dense_pt"] == pytest.approx(19.2 * 60 * 2 * 0.15 / 0.29)
    # `--estimate` of a CPU profile gives it per stage; the GPU profile's stays in GPU-hours
    assert "on 2 CPU cores" in est.write_estimate(full, None)
    assert "CPU cores" not in est.write_estimate(PROFILES["scale"], None)


def test_dense_pretraining_continues_a_dense_export_on_mlm_and_nsp(tmp_path: Path) -> None:
    """pretrain/run.py --dense --objectives mlm nsp --init-from-dense: the dense control's command trains both
    objectives on a plain BERT (no skill layers) and exports a plain BERT."""
    from skillnet.export import hf_folder as export_mod
    from skillnet.pretrain import run as run_mod

    def argv(out: Path, *extra: str) -> list[str]:
        return ["--synthetic", "64", "--synthetic_vocab", "1024", "--max_seq_len", "16", "--micro_batch_size", "2",
                "--max_steps", "6", "--log_every", "1", "--output_dir", str(out), "--no_progress", "--no_tensorboard",
                "--dense", *extra]

    assert run_mod.main(argv(tmp_path / "dense", "--objectives", "mlm")) == 0
    hf = export_mod.export(tmp_path / "dense", tmp_path / "dense" / "hf")
    ctrl = tmp_path / "ctrl"
    assert run_mod.main(argv(ctrl, "--objectives", "mlm", "nsp", "--init-from-dense", str(hf), "--seed", "1")) == 0
    recs = [json.loads(x) for x in (ctrl / "log.jsonl").read_text().splitlines()]
    recs = [x for x in recs if x.get("split", "train") == "train" and "step" in x]
    assert any("mlm/loss" in x for x in recs) and any("nsp/loss" in x for x in recs)
    assert not any(k.startswith("skill_grad_norm") for x in recs for k in x)
    out = export_mod.export(ctrl, ctrl / "hf")
    assert json.loads((out / "export_info.json").read_text())["kind"] == "dense-bert"
