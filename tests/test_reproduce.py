"""skillnet.experiments (scripts/reproduce.py): the stage plan, the report's completeness check (what CI's quick
run relies on) and the GPU estimate. The quick run itself is CI's last step (`make reproduce-quick`), not a
test: it takes ~4 minutes."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from skillnet.experiments import estimate as est
from skillnet.experiments.nlg import nlg_config, nlg_train_tasks, stage_nlg_temp
from skillnet.experiments.nlu import NLU_TASKS, nlu_config, stage_nlu_alpha
from skillnet.experiments.profiles import PROFILES
from skillnet.experiments.report import build
from skillnet.experiments.runner import Runner, paper_ratio_caps
from skillnet.experiments.stages import PARTS, STAGES
from skillnet.finetune.document import Document

REPO = Path(__file__).resolve().parents[1]


def test_dry_run_lists_every_stage_command(tmp_path):
    r = subprocess.run([sys.executable, "scripts/reproduce.py", "--quick", "--out", str(tmp_path), "--dry-run"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for st in STAGES:
        assert f") {st.name}:" in r.stdout
    assert "deepspeed --num_gpus 2 pretrain/run.py" in r.stdout
    assert "skillnet.finetune.compare" in r.stdout
    # the MLM floor is measured on text held out of pre-training (#32)
    assert "sample-corpus" in r.stdout and "--held-out" in r.stdout and "shards_heldout" in r.stdout
    # pt_dense, then each seed's sparse run and its dense control (issue 55)
    assert r.stdout.count("skillnet.pretrain.heldout") == 1 + 2 * len(PROFILES["quick"].seeds)
    assert not (tmp_path / "stages" / "corpus.json").exists()  # a dry run records nothing as done
    assert "--in-process" in r.stdout  # the CPU profile's comparisons run their runs in long-lived workers
    sub = subprocess.run([sys.executable, "scripts/reproduce.py", "--quick", "--out", str(tmp_path / "sub"),
                          "--dry-run", "--subprocesses"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert sub.returncode == 0 and "skillnet.finetune.compare" in sub.stdout, sub.stderr
    assert "--in-process" not in sub.stdout  # bench/in_process.py's other arm: a fresh interpreter per run


def test_problems_flag_empty_and_not_run_sections(tmp_path):
    d = Document()
    d.h(1, "t")
    d.h(2, "filled")
    d.p("a number: 1.0")
    d.h(2, "empty")
    d.h(2, "pending")
    d.p("Not run yet (stage x).")
    d.img(tmp_path / "absent.png", "a picture")
    assert d.problems() == [f"picture missing: {tmp_path / 'absent.png'}", "section empty: empty",
                            "section not run: pending"]
    ok = Document()
    ok.h(2, "filled")
    ok.table(["a"], [["1"]])
    assert ok.problems() == []


@pytest.mark.parametrize("part", ["nlu", "nlg", "all"])
def test_report_of_an_unfinished_run_is_incomplete(tmp_path, part):
    _, parts, names = PARTS[part]
    stages = [s for s in STAGES if s.name in names]
    path, problems = build(tmp_path, PROFILES["quick"], stages, tmp_path / "r.md", "t", parts)
    assert path.is_file() and path.with_suffix(".html").is_file()
    assert any(p.startswith("section not run") for p in problems)
    assert "section not run: Where the papers' claims hold at this scale" in problems


def test_a_rerun_shows_each_stage_time_beside_the_report_it_replaces(tmp_path: Path) -> None:
    """The wall-time table of a report that replaces an earlier reproduction's shows the earlier stage times and
    the change; a first report (or one over somebody else's file) shows its own times only."""
    import json

    from skillnet.experiments.report import WALL_TIMES, previous_wall_times

    stages = [s for s in STAGES if s.name in ("corpus", "dense_pt")]
    (tmp_path / "stages").mkdir()
    for name, sec in (("corpus", 4.0), ("dense_pt", 600.0)):
        (tmp_path / "stages" / f"{name}.json").write_text(json.dumps({"seconds": sec, "commands": []}))
    report = tmp_path / "r.md"
    report.write_text("# mine\n\nnot a reproduction's\n")
    build(tmp_path, PROFILES["quick"], stages, report, "t", ("nlu",))
    first = report.read_text()
    assert "now / before" not in first and "| dense_pt | dense MLM pre-training (BERT) | 10.0 min |" in first
    assert previous_wall_times(report) == {"corpus": 4.0, "dense_pt": 600.0}
    (tmp_path / "stages" / "dense_pt.json").write_text(json.dumps({"seconds": 300.0, "commands": []}))
    build(tmp_path, PROFILES["quick"], stages, report, "t", ("nlu",))
    table = report.read_text().split(f"## {WALL_TIMES}")[1]
    assert "| dense_pt | dense MLM pre-training (BERT) | 5.0 min | 10.0 min | 0.50x |" in table
    assert f"| corpus | {stages[0].title} | 4 s | 4 s | 1.00x |" in table


@pytest.mark.slow  # keeps make test-fast under 3 min (measured 9-30 s on 2 loaded cores)
def test_the_reports_of_one_reproduction_write_each_picture_once(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The full profile writes report.md, comparison.md and nlg.md side by side (docs/), each showing pictures of
    the same run: every picture lands once in their img/ folder (no byte-identical copy under a second name) and
    every report links a file that is there."""
    import re

    import skillnet.experiments.report as report

    def picture(run: Path) -> Path:  # a pre-training run's curves, without drawing them
        pic = run / "curves.png"
        pic.parent.mkdir(parents=True, exist_ok=True)
        pic.write_bytes(b"\x89PNG " + f"{run.parent.name}/{run.name}".encode())
        return pic

    monkeypatch.setattr(report, "pretrain_picture", picture)
    for seeded in ("pt_sparse", "pt_dense_ctrl"):  # the replicated runs: the report shows each stage's first seed
        (tmp_path / "out" / seeded / "seed0").mkdir(parents=True)
    docs = tmp_path / "docs"
    for part in ("all", "nlu", "nlg"):
        doc_name, parts, names = PARTS[part]
        build(tmp_path / "out", PROFILES["full"], [s for s in STAGES if s.name in names], docs / doc_name, "t", parts)
    written: dict[bytes, list[str]] = {}
    for f in sorted((docs / "img").iterdir()):
        written.setdefault(f.read_bytes(), []).append(f.name)
    assert len(written) == 4 and all(len(names) == 1 for names in written.values()), written
    links = {m for md in docs.glob("*.md") for m in re.findall(r"\]\((img/[^)]+)\)", md.read_text(encoding="utf-8"))}
    assert len(links) == 4 and all((docs / link).is_file() for link in links), links


def test_check_exits_nonzero_on_an_incomplete_report(tmp_path):
    r = subprocess.run([sys.executable, "scripts/reproduce.py", "--quick", "--out", str(tmp_path), "--stages",
                        "report", "--check", "--report", str(tmp_path / "r.md")],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "error: report incomplete: section not run" in r.stderr


@pytest.mark.parametrize("name", list(PROFILES))
def test_every_profile_writes_fine_tuning_configs_that_load(tmp_path, name):
    """The scale profile names BERT-base and BART-base presets: each must exist for its architecture."""
    from skillnet.finetune.config import FinetuneConfig

    r = Runner(tmp_path, PROFILES[name], dry_run=True)
    nlu = nlu_config(r, {n: t for n, (_, _, t) in NLU_TASKS.items()}, 10, "nlu")
    nlg = nlg_config(r, nlg_train_tasks(), 10, "nlg")
    for path in (nlu, nlg):  # the model config of the preset (the runs pass --init; bart_pt uses the preset)
        cfg = FinetuneConfig.load(path)
        assert cfg._model_config(str(path)) is not None


def test_bart_base_preset_has_bart_base_sizes():
    from skillnet.model import SkillNetBartConfig

    c = SkillNetBartConfig.preset("base")
    assert (c.d_model, c.encoder_layers, c.decoder_layers, c.encoder_ffn_dim, c.encoder_attention_heads) == (
        768, 6, 6, 3072, 12)


def test_flops_per_token_by_hand():
    c = {"hidden_size": 4, "intermediate_size": 8, "num_hidden_layers": 2, "vocab_size": 10}
    # per layer: 4*d^2 = 64 and k=2 FFNs of 2*d*f = 64 each -> 192 multiply-adds; scores 4*seq*d = 48 at seq 3
    assert est.bert_flops_per_token(c, seq=3, k=2) == 3 * (2 * 2 * 192 + 2 * 48)
    assert est.bert_flops_per_token(c, seq=3, k=2, mlm=True) == 3 * (2 * 2 * 192 + 2 * 48 + 2 * 0.15 * 40)


def test_estimate_scales_with_the_profile():
    full = {r["stage"]: r for r in est.estimate(PROFILES["full"])}
    scale = {r["stage"]: r for r in est.estimate(PROFILES["scale"])}
    assert set(full) == set(scale) == {s.name for s in STAGES} - {"corpus", "shards", "nlu_tasks", "nlg_tasks", "vocab"}
    # the scale profile searches no lr (the papers' values apply to the base models): its tuning stages cost nothing
    assert scale["nlu_tune"]["pflop"] == scale["nlg_tune"]["pflop"] == 0 < full["nlu_tune"]["pflop"]
    assert all(scale[k]["pflop"] > 100 * full[k]["pflop"] > 0 for k in full if k not in ("nlu_tune", "nlg_tune"))


def test_sampling_studies_run_on_unbalanced_tasks(tmp_path):
    """With equal task sizes every alpha (and T) gives the same mix: the studies cut the tasks to the papers'
    relative sizes."""
    import json

    r = Runner(tmp_path, PROFILES["full"], dry_run=True)
    for fn, name in ((stage_nlu_alpha, "nlu_alpha"), (stage_nlg_temp, "nlg_temp")):
        fn(r)
        caps = [t["max_train_examples"] for t in json.loads((tmp_path / "configs" / f"{name}.json").read_text())["tasks"]]
        assert max(caps) == (r.p.nlu_train if name == "nlu_alpha" else r.p.nlg_train)
        assert max(caps) / min(caps) > 5
    assert paper_ratio_caps({"a": 10, "b": 40}, 400) == {"a": 100, "b": 400}


def test_activated_ffns_come_from_each_methods_model():
    """FFNs per token are counted on the model each method builds, not written per method."""
    from skillnet.data_prep.tasks.generation import GEN_TASKS
    from skillnet.experiments.nlg import NLG_FORMATS

    nlu_k = sum(len(t["skills"]) for _, _, t in NLU_TASKS.values()) / len(NLU_TASKS)
    assert est.activated_ffns("bert", "skillnet") == pytest.approx(nlu_k)
    assert est.activated_ffns("bart", "skillnet") == pytest.approx(
        sum(len(GEN_TASKS[n].skills) for n in NLG_FORMATS) / len(NLG_FORMATS))
    for arch in ("bert", "bart"):
        assert est.activated_ffns(arch, "moe") == 2.0  # top-2 gate
        assert est.activated_ffns(arch, "dense_joint") == est.activated_ffns(arch, "task_specific") == 1.0
    assert est.activated_ffns("bert", "pals") == 1.0  # PALs are the task's own parameters, not FFNs
    # a learned map starts from a random draw with most cells on: more FFNs than the fixed map
    assert nlu_k < est.activated_ffns("bert", "learnable") <= 7
    assert est.pretrain_ffns() == pytest.approx(2.5)  # MLM s2 s7, NSP s1 s3 s7


def test_a_labelled_row_is_costed_by_its_method():
    """`x=moe` is a top-2 MoE row like `moe` (it was costed as one FFN in the generation stages)."""
    import dataclasses

    def stage(p, name):
        return next(r["pflop"] for r in est.estimate(p) if r["stage"] == name)

    full = PROFILES["full"]
    for field, name in (("nlg_methods", "nlg_main"), ("nlu_methods", "nlu_main")):
        moe = stage(dataclasses.replace(full, **{field: ["moe"]}), name)
        assert stage(dataclasses.replace(full, **{field: ["x=moe"]}), name) == moe
        assert moe > stage(dataclasses.replace(full, **{field: ["dense_joint"]}), name)


def test_a_task_specific_row_is_costed_as_one_joint_run():
    """Under the one budget rule its task models split the joint run's steps by sampling share, so the row
    costs what a dense joint row costs, in every profile."""
    import dataclasses

    for p in PROFILES.values():
        for field, name in (("nlu_methods", "nlu_main"), ("nlg_methods", "nlg_main")):
            def cost(rows, p=p, field=field, name=name):
                return next(r["pflop"] for r in est.estimate(dataclasses.replace(p, **{field: rows}))
                            if r["stage"] == name)
            assert cost(["task_specific"]) == pytest.approx(cost(["dense_joint"])), (p.name, name)


def _compare_rows(command: str):
    """The rows (with their options) and the config of a recorded `finetune.compare` command."""
    import shlex

    from skillnet.finetune import compare

    a = compare.build_parser().parse_args(shlex.split(command)[3:])
    return compare.resolve_rows(a.methods, None, (), a.args_for), Path(a.config), a.allow_unequal_budgets


@pytest.mark.parametrize("name", ["quick", "full", "scale"])
def test_every_comparison_of_every_profile_keeps_the_budget_rule(tmp_path, name):
    """Every table's rows get the same updates per task (compare's budget plan), in every profile; only the
    sampling studies, whose variable is the mix, are run past the rule, and say so (issue 49: the full profile
    gave each task-specific model 1,200 steps against ~480 per task in a joint run)."""
    from skillnet.experiments import nlg, nlu
    from skillnet.finetune import compare

    r = Runner(tmp_path, PROFILES[name], dry_run=True)
    stages = {"nlu_main": nlu.stage_nlu_main, "nlu_ablate": nlu.stage_nlu_ablate, "nlu_alpha": nlu.stage_nlu_alpha,
              "nlu_adapt": nlu.stage_nlu_adapt, "nlg_main": nlg.stage_nlg_main, "nlg_temp": nlg.stage_nlg_temp,
              "nlg_adapt": nlg.stage_nlg_adapt}
    for stage, fn in stages.items():
        fn(r)
        rows, config, allowed = _compare_rows(r.commands[-1])
        plans = {row.label: compare.budget_plan(compare.row_config(config, row)) for row in rows}
        assert allowed == (stage in ("nlu_alpha", "nlg_temp")), stage
        assert (compare.check_budgets(plans) is None) == (not allowed), (stage, plans)
        assert "task_specific" not in dict((row.label, row.method) for row in rows if row.args).values()
    assert json.loads((tmp_path / "configs" / "nlu_main.json").read_text())["train"]["max_steps"] == PROFILES[name].nlu_steps


def test_the_side_studies_get_their_own_steps(tmp_path):
    """The full profile's single-seed side studies (ablation, alpha) train nlu_side_steps, the main table's
    rows nlu_steps."""
    from skillnet.experiments.nlu import stage_nlu_ablate, stage_nlu_alpha, stage_nlu_main

    full = PROFILES["full"]
    assert full.nlu_side_steps < full.nlu_steps
    r = Runner(tmp_path, full, dry_run=True)
    stage_nlu_main(r)
    assert "--max-steps" not in r.commands[-1]  # no row has a budget of its own
    steps = {}
    for stage, name in ((stage_nlu_ablate, "nlu_ablate"), (stage_nlu_alpha, "nlu_alpha")):
        stage(r)
        assert f"configs/{name}.json" in r.commands[-1]
    for name in ("nlu_main", "nlu_ablate", "nlu_alpha"):
        steps[name] = json.loads((tmp_path / "configs" / f"{name}.json").read_text())["train"]["max_steps"]
    assert steps == {"nlu_main": full.nlu_steps, "nlu_ablate": full.nlu_side_steps, "nlu_alpha": full.nlu_side_steps}


def test_csc_is_tested_on_the_whole_sighan_test_half(tmp_path):
    """The full profile converts csc without an evaluation cap (the SIGHAN-2015 test half: 334 sentences, 209
    edits; nlg_eval=50 left 32), tests the other NLG tasks on nlg_test examples, and selects every task on
    nlg_eval dev examples."""
    from skillnet.experiments.nlg import stage_nlg_tasks

    full = PROFILES["full"]
    r = Runner(tmp_path, full, dry_run=True)
    stage_nlg_tasks(r)
    convert = {c.split(" --out ")[1].split()[0].rsplit("/", 1)[-1]: c for c in r.commands}
    assert "--max-eval-examples" not in convert["csc"]
    assert f"--max-eval-examples {full.nlg_test}" in convert["insuranceqa_answer"]
    tasks = {t["name"]: t for t in json.loads(nlg_config(r, nlg_train_tasks(), 10, "x").read_text())["tasks"]}
    assert tasks["csc"]["max_dev_examples"] == tasks["poetry_title"]["max_dev_examples"] == full.nlg_eval


def test_sizes_formula_is_close_to_the_counted_flops():
    """The per-token formula of the profile estimate against FlopCounterMode on the real (tiny) model, for an
    MLM step (skills s2, s7)."""
    from skillnet.model import SkillNetBertConfig

    c = SkillNetBertConfig.preset("tiny").to_dict()
    counted = est.counted_flops_per_token("mlm", 64, batch=4, preset="tiny")
    assert est.bert_flops_per_token(c, 64, 2, mlm=True) == pytest.approx(counted, rel=0.1)


def test_run_many_runs_at_once_logs_in_order_and_reports_a_failure(tmp_path):
    import time

    r = Runner(tmp_path, PROFILES["quick"])
    r.stage = "demo"
    done = tmp_path / "done.txt"
    done.write_text("x")
    sleep = [sys.executable, "-c", "import time, sys; time.sleep(1.0); print(sys.argv[1])"]
    t0 = time.time()
    r.run_many([([*sleep, "first"], None), ([*sleep, "second"], None), ([*sleep, "skipped"], done)], jobs=2)
    assert time.time() - t0 < 1.9  # the two one-second commands ran at once
    log = (tmp_path / "logs" / "demo.log").read_text()
    assert log.index("first") < log.index("second") and "skipped\n" not in log
    assert len(r.commands) == 3  # a skipped command is still one of the stage's commands
    # the message shows the failed command's output, not the last lines of the stage log (another command's)
    with pytest.raises(RuntimeError, match=r"1 command\(s\) failed, first \(exit 3\)") as e:
        r.run_many([([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"], None),
                    ([sys.executable, "-c", "print('\\n'.join(['ok'] * 30))"], None)], jobs=2)
    assert "boom" in str(e.value) and "\n  ok" not in str(e.value)
    assert "boom" in (tmp_path / "logs" / "demo.log").read_text()


def test_run_streams_to_the_stage_log_skips_done_commands_and_reports_a_failure(tmp_path):
    r = Runner(tmp_path, PROFILES["quick"])
    r.stage = "demo"
    done = tmp_path / "done.txt"
    done.write_text("x")
    r.run([sys.executable, "-c", "print('ran')"])
    r.run([sys.executable, "-c", "print('never')"], check_file=done)
    log = (tmp_path / "logs" / "demo.log").read_text()
    assert "ran\n" in log and "never\n" not in log and len(r.commands) == 2
    with pytest.raises(RuntimeError, match=r"stage demo: command failed \(exit 3\)") as e:
        r.run([sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"])
    assert "boom" in str(e.value) and "demo.log" in str(e.value)
    assert "\n  ran" not in str(e.value)  # only the failed command's own output
    with pytest.raises(RuntimeError, match=r"exit 127\).*\n  cannot run /no/such/program"):
        r.run(["/no/such/program"])
    with pytest.raises(RuntimeError, match=r"1 command\(s\) failed, first \(exit 127\)"):
        r.run_many([(["/no/such/program"], None), ([sys.executable, "-c", "print('kept')"], None)], jobs=2)
    assert "kept" in (tmp_path / "logs" / "demo.log").read_text()


def test_a_comparison_runs_in_the_reproductions_process_with_its_output_and_exit_code(tmp_path):
    """A profile with in-process runs runs each `finetune.compare` stage command (and the exports and held-out
    checks) in the reproduction's own process (a comparison's runs then go to workers that every comparison
    shares): the command's output still goes to the stage log, also what it writes to descriptor 2 directly,
    and its exit code still fails the stage, as a subprocess's would. The scale profile keeps subprocesses."""
    import dataclasses

    compare = [sys.executable, "-m", "skillnet.finetune.compare"]
    r = Runner(tmp_path, PROFILES["quick"])
    r.stage = "demo"
    try:
        with pytest.raises(RuntimeError, match=r"stage demo: command failed \(exit 2\)") as e:
            r.run([*compare, "--config", str(tmp_path / "none.json"), "--methods", "skillnet", "--seeds", "0",
                   "--output-dir", str(tmp_path / "cmp")])
        assert "none.json" in str(e.value)  # compare's own one-line error, from the stage log
        r.run([*compare, "--help"])
        with pytest.raises(RuntimeError, match=r"stage demo: command failed \(exit 2\)") as e:
            r.run([sys.executable, "-m", "skillnet.pretrain.export", "--checkpoint", str(tmp_path / "none"),
                   "--out", str(tmp_path / "hf")])
        assert "none" in str(e.value)
    finally:
        r.close()
    log = (tmp_path / "logs" / "demo.log").read_text()
    assert log.count("(run in the reproduction's process") == 3 and "--jobs JOBS" in log
    sub = Runner(tmp_path / "sub", dataclasses.replace(PROFILES["quick"], in_process=False))
    sub.stage = "demo"
    sub.run([sys.executable, "-m", "skillnet.pretrain.heldout", "--help"])
    log = (tmp_path / "sub" / "logs" / "demo.log").read_text()
    assert "--max-windows" in log and "reproduction's process" not in log


def test_a_stage_spread_over_two_sittings_is_timed_over_both(tmp_path, monkeypatch):
    import json
    import time

    from skillnet.experiments import __main__ as cli
    from skillnet.experiments.runner import Stage

    calls: list[int] = []

    def demo(r):
        calls.append(1)
        time.sleep(0.3)
        if len(calls) == 1:
            raise RuntimeError("the first sitting stops here")
        return {}

    monkeypatch.setattr(cli, "STAGES", [Stage("demo", "a stage", demo)])
    args = ["--quick", "--out", str(tmp_path), "--stages", "demo"]
    assert cli.main(args) == 1
    partial = tmp_path / "stages" / "demo.partial.json"
    assert json.loads(partial.read_text())["seconds"] >= 0.3
    assert cli.main(args) == 0
    rec = json.loads((tmp_path / "stages" / "demo.json").read_text())
    assert rec["seconds"] >= 0.6 and 0.3 <= rec["this_sitting"] < rec["seconds"]
    assert not partial.exists()


def _converted(tasks: Path, name: str, p95: int) -> None:
    """A task directory as `data_prep.tasks convert` leaves it: only its task.json is read here."""
    (tasks / name).mkdir(parents=True, exist_ok=True)
    (tasks / name / "task.json").write_text(json.dumps({
        "name": name, "kind": "single", "files": {"train": "train.jsonl"},
        "lengths": {"train": {"n": 100, "p50": p95 // 2, "p95": p95, "max": 2 * p95}}}), encoding="utf-8")


@pytest.mark.parametrize("name,positions", [("full", 128), ("scale", 512)])
def test_nlu_tasks_get_a_length_that_fits_their_data(tmp_path, name, positions):
    """#32: each task's max_seq_len is its data's 95th percentile (rounded up to 8), at most the model's
    positions; a length the profile names explicitly wins."""
    import dataclasses

    p95 = {"sentiment": 189, "ner": 99, "domain": 20, "qa_match": 946, "span": 117}
    for t, v in p95.items():
        _converted(tmp_path / "tasks", t, v)

    def lengths(profile) -> dict[str, int]:
        r = Runner(tmp_path, profile, dry_run=True)
        cfg = json.loads(nlu_config(r, {n: t for n, (_, _, t) in NLU_TASKS.items()}, 10, "nlu").read_text())
        return {t["name"]: t["max_seq_len"] for t in cfg["tasks"]}

    got = lengths(PROFILES[name])
    assert got == {t: min(positions, -(-v // 8) * 8) for t, v in p95.items()}
    assert got["domain"] == 24 and got["qa_match"] == positions
    own = dataclasses.replace(PROFILES[name], nlu_seq_len={"domain": 48})
    assert lengths(own)["domain"] == 48


def test_nlu_lengths_are_measured_when_task_json_has_none(tmp_path):
    """A conversion from before the length statistics: the train file is measured instead."""
    d = tmp_path / "tasks" / "domain"
    d.mkdir(parents=True)
    (d / "task.json").write_text(json.dumps({"name": "domain", "kind": "single", "files": {"train": "train.jsonl"}}))
    (d / "train.jsonl").write_text("".join(json.dumps({"text": "保" * n, "label": "a"}, ensure_ascii=False) + "\n"
                                           for n in range(10, 60)), encoding="utf-8")
    r = Runner(tmp_path, PROFILES["full"], dry_run=True)
    cfg = json.loads(nlu_config(r, {"domain": NLU_TASKS["domain"][2]}, 10, "nlu").read_text())
    # lengths 12..61 ([CLS] + text + [SEP]): 95th percentile 59.55 -> 60 -> 64
    assert cfg["tasks"][0]["max_seq_len"] == 64


@pytest.mark.parametrize("name,positions", [("full", 128), ("scale", 512)])
def test_task_converters_warn_at_the_longest_length_the_task_can_get(tmp_path, name, positions):
    """The reproduction's converters check truncation at the model's positions (or the profile's own length):
    a task cut even there is cut in fine-tuning, whatever its fitted length."""
    import dataclasses

    from skillnet.experiments.nlu import stage_nlu_tasks

    r = Runner(tmp_path, dataclasses.replace(PROFILES[name], nlu_seq_len={"domain": 48}), dry_run=True)
    stage_nlu_tasks(r)
    lengths = {c.split("--out ")[1].split()[0].rsplit("/", 1)[-1]: c.split("--max-seq-len ")[1].split()[0]
               for c in r.commands if "data_prep.tasks convert" in c}
    assert lengths == {"sentiment": str(positions), "ner": str(positions), "domain": "48",
                       "qa_match": str(positions), "span": str(positions), "answer_select": str(positions)}


_SLOW_STAGE = """
import sys, time
import skillnet.experiments.__main__ as m
from skillnet.experiments.runner import Stage
m.HEARTBEAT_S = 0.1
i = [s.name for s in m.STAGES].index("corpus")
m.STAGES[i] = Stage("corpus", "a stage that takes its time", lambda r: time.sleep(float(sys.argv[2])) or {})
sys.exit(m.main(["--quick", "--out", sys.argv[1], "--stages", "corpus"]))
"""


def test_a_killed_sitting_still_counts_in_the_stage_wall_time(tmp_path: Path) -> None:
    """The report's wall-time table sums a stage's sittings. A sitting killed without a chance to record itself
    (SIGKILL, a closed session, a batch job's limit) was lost: the stage then looked as fast as its last sitting."""
    import signal
    import time

    out = tmp_path / "rq"
    partial, record = out / "stages" / "corpus.partial.json", out / "stages" / "corpus.json"
    p = subprocess.Popen([sys.executable, "-c", _SLOW_STAGE, str(out), "600"], cwd=REPO)
    try:
        deadline = time.time() + 120
        while not partial.is_file() and time.time() < deadline:
            assert p.poll() is None, "the reproduction ended before the stage ran"
            time.sleep(0.05)
        time.sleep(1.5)
        p.send_signal(signal.SIGKILL)
        p.wait(30)
    finally:
        if p.poll() is None:
            p.kill()
    first = json.loads(partial.read_text())["seconds"]
    assert first >= 1.0
    r = subprocess.run([sys.executable, "-c", _SLOW_STAGE, str(out), "0.5"], cwd=REPO, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rec = json.loads(record.read_text())
    assert rec["seconds"] >= first + 0.5 and rec["this_sitting"] < first + 0.5
    assert not partial.exists()


@pytest.mark.parametrize("name", ["quick", "full", "scale"])
def test_the_new_task_is_scored_by_auc_and_evaluated_on_dev_several_times(tmp_path, name):
    """answer_select (Tables 4-5) is scored where always-yes and chance are 50 (ROC-AUC; positive-class F1 gave
    always-yes 66.7), and its dev curve has at least two points (the full profile had one in 600 steps)."""
    from skillnet.experiments.nlu import stage_nlu_adapt

    r = Runner(tmp_path, PROFILES[name], dry_run=True)
    stage_nlu_adapt(r)
    d = json.loads((tmp_path / "configs" / "nlu_adapt.json").read_text())
    assert d["tasks"][0]["metric"] == "auc"
    assert d["train"]["max_steps"] // d["train"]["eval_every"] >= 2


def test_the_new_tasks_section_gives_accuracy_and_auc_beside_always_yes_and_chance(tmp_path):
    from skillnet.experiments.report_nlu import learning_metrics

    tasks = tmp_path / "tasks" / "answer_select"
    tasks.mkdir(parents=True)
    # the label counts convert writes to task.json: a report rebuilt from committed results has no task text
    (tasks / "task.json").write_text(json.dumps({"label_counts": {"test": {"0": 2, "1": 2}}}))
    for seed, (acc, auc) in enumerate(((60.0, 65.0), (62.0, 67.0))):
        f = tmp_path / "cmp" / "a_existing" / f"seed{seed}" / "results.json"
        f.parent.mkdir(parents=True)
        f.write_text(json.dumps({"tasks": {"answer_select": {"test": {"accuracy": acc, "auc": auc, "f1": 61.8}}}}))
    doc = Document()
    learning_metrics(doc, {"tasks": ["answer_select"], "methods": {"a_existing": {}}}, tmp_path / "cmp",
                     tmp_path / "tasks", [("a_existing", "(a) existing skills")])
    md = doc.markdown()
    assert "| (a) existing skills | 61.0 ± 1.4 | 66.0 ± 1.4 |" in md
    assert "| always yes | 50.0 | 50.0 |" in md and "| chance (random answer) | 50.0 | 50.0 |" in md


def test_a_rerun_shows_each_pretrained_models_value_beside_the_report_it_replaces(tmp_path: Path) -> None:
    """The pre-training floor table gives each model's tokens seen, and on a rerun the value of the report it
    replaces (what the new settings bought); a first report has no "before" column."""
    import json

    from skillnet.experiments.report import previous_floor_values

    stages = [s for s in STAGES if s.name == "dense_pt"]
    (tmp_path / "stages").mkdir()

    def record(value: float, tokens: float) -> None:
        info = {"floor_key": "held-out mlm acc", "floor": 0.1429, "floor_value": value, "floor_passed": True,
                "floor_enforced": True, "heldout_baseline_acc": 0.133, "heldout_masked": 9591}
        (tmp_path / "stages" / "dense_pt.json").write_text(json.dumps({"seconds": 60.0, "commands": [], "info": info}))
        (tmp_path / "pt_dense").mkdir(exist_ok=True)  # tokens seen: from the run's log (1,000 steps of 1 s)
        (tmp_path / "pt_dense" / "log.jsonl").write_text(json.dumps(
            {"step": 1000, "real_tokens_per_s": tokens / 1000, "seconds_per_step": 1.0, "split": "train"}) + "\n")

    report = tmp_path / "r.md"
    record(0.148, 11.7e6)
    build(tmp_path, PROFILES["quick"], stages, report, "t", ("nlu",))
    first = report.read_text()
    assert "| dense_pt | `held-out mlm acc` | 0.148 | 0.133 (9,591 masked tokens) | 0.1429 | 11.7M | passed |" in first
    assert previous_floor_values(report) == {"dense_pt": "0.148"}
    record(0.201, 23.4e6)
    build(tmp_path, PROFILES["quick"], stages, report, "t", ("nlu",))
    second = report.read_text()
    assert ("| dense_pt | `held-out mlm acc` | 0.201 | 0.148 | 0.133 (9,591 masked tokens) | 0.1429 | 23.4M | passed |"
            in second), second.split("## Pre-training")[1][:1500]
