"""Every method of the comparison from one config value, one checkpoint for all tasks, annealing that
anneals, the task-specific budget, and the `compare` command on tiny fixtures."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import pytest
import torch
from skillnet.finetune import compare as compare_cli
from skillnet.finetune import run as run_cli
from skillnet.finetune import workers as compare_workers
from skillnet.finetune.build import build_model
from skillnet.finetune.config import ConfigError, FinetuneConfig
from skillnet.finetune.samplers import SamplerConfig, annealing_warning, build_sampler
from transformers import BertConfig, BertModel

from tests.test_finetune_e2e import tiny_config


def _dense_bert(path: Path) -> BertModel:
    torch.manual_seed(5)
    cfg = BertConfig(vocab_size=21128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=128, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    m = BertModel(cfg)
    m.save_pretrained(str(path))
    return m


def _build(tmp_path: Path, method: str, **kw) -> torch.nn.Module:
    cfg = FinetuneConfig.from_dict(tiny_config(tmp_path / method, method=method, **kw))
    from skillnet.data_prep.tokenizer import load_tokenizer

    data = run_cli.load_task_data(cfg, load_tokenizer(None))
    model, _ = build_model(cfg, data)
    return model.eval()


def test_dense_joint_and_skillnet_from_the_same_dense_bert_agree_before_training(tmp_path):
    dense = _dense_bert(tmp_path / "bert")
    ids = torch.randint(1, 21128, (3, 11))
    mask = torch.ones_like(ids)
    mask[1, 7:] = 0
    want = dense.eval()(input_ids=ids, attention_mask=mask).last_hidden_state
    for method in ("skillnet", "dense_joint"):
        m = _build(tmp_path, method, model={"init": str(tmp_path / "bert")})
        for task in ("sentiment", "ner", "qa_match"):
            got = m.bert(ids, mask, task=task).last_hidden_state
            torch.testing.assert_close(got, want, atol=1e-5, rtol=0, msg=f"{method}/{task}")


def test_methods_start_from_the_same_weights(tmp_path):
    ref = _build(tmp_path, "skillnet")
    dense = _build(tmp_path, "dense_joint")
    s7 = ref.config.skill_index("s7")
    sd_ref, sd_dense = ref.state_dict(), dense.state_dict()
    for k, v in sd_dense.items():
        if ".skill_ffn.skills.0." in k:
            assert torch.equal(v, sd_ref[k.replace(".skills.0.", f".skills.{s7}.")]), k
        else:
            assert torch.equal(v, sd_ref[k]), k  # embeddings, attention, LayerNorms, pooler, heads
    assert dense.config.skill_names == ["shared"]
    assert {tuple(dense.config.task_skill_names(t)) for t in ("sentiment", "ner")} == {("shared",)}


def test_a_task_head_starts_the_same_whatever_the_other_tasks(tmp_path):
    full = _build(tmp_path, "skillnet")
    d = tiny_config(tmp_path / "one")
    d["tasks"] = [t for t in d["tasks"] if t["name"] == "ner"]
    from skillnet.data_prep.tokenizer import load_tokenizer

    cfg = FinetuneConfig.from_dict(d)
    one, _ = build_model(cfg, run_cli.load_task_data(cfg, load_tokenizer(None)))
    for k, v in one.heads["ner"].state_dict().items():
        assert torch.equal(v, full.heads["ner"].state_dict()[k]), k


def test_method_config_errors():
    with pytest.raises(ConfigError, match="method: unknown method 'mmoe'"):
        FinetuneConfig.from_dict(tiny_config(Path("x"), method="mmoe"))
    with pytest.raises(ConfigError, match="apply to method 'skillnet', not 'dense_joint'"):
        FinetuneConfig.from_dict(tiny_config(Path("x"), method="dense_joint",
                                             new_skills=[{"name": "s8"}], freeze_old_skills=True))
    with pytest.raises(ConfigError, match="train: selection='best'"):
        FinetuneConfig.from_dict(tiny_config(Path("x"), train={"selection": "best"}))


@pytest.mark.slow  # measured 20 s
def test_one_checkpoint_for_all_tasks_by_default_per_task_on_request(tmp_path):
    mean = run_cli.run(FinetuneConfig.from_dict(tiny_config(tmp_path / "mean")), tensorboard=False, progress=False)
    summary = json.loads((tmp_path / "mean" / "results.json").read_text())
    best = summary["tasks"]["sentiment"]["best_step"]
    assert {r["checkpoint"] for r in mean.values()} == {"best (mean dev)"}
    assert {r["best_step"] for r in mean.values()} == {best}  # the same step for every task
    assert not (tmp_path / "mean" / "best_per_task").exists()
    evals = [json.loads(x) for x in (tmp_path / "mean" / "log.jsonl").read_text().splitlines()]
    evals = [e for e in evals if e["split"] == "eval"]
    assert max(evals, key=lambda e: (e["mean_dev"], -e["step"]))["step"] == best
    assert all(r["dev_curve"] for r in mean.values())

    per = run_cli.run(FinetuneConfig.from_dict(tiny_config(tmp_path / "per", train={
        **tiny_config(tmp_path)["train"], "selection": "per_task"})), tensorboard=False, progress=False)
    assert {r["checkpoint"] for r in per.values()} == {f"best_per_task/{t}" for t in per}
    md = (tmp_path / "per" / "results.md").read_text()
    assert "each task from its own best-on-dev checkpoint (per-task selection)" in md


def test_annealed_sampling_derives_epochs_from_the_run_and_warns_when_it_cannot_anneal(caplog):
    sizes = {"a": 900, "b": 100}
    s = build_sampler(SamplerConfig(kind="annealed"), sizes, seed=1, steps_per_epoch=50, max_steps=400)
    assert s.num_epochs == 8
    assert s.alpha_at(0) == 1.0 and s.alpha_at(399) == pytest.approx(0.2)
    assert annealing_warning(s, 400) is None
    one = build_sampler(SamplerConfig(kind="annealed"), sizes, seed=1, steps_per_epoch=500, max_steps=400)
    assert one.num_epochs == 1 and "no annealing" in annealing_warning(one, 400)
    short = build_sampler(SamplerConfig(kind="annealed", num_epochs=10), sizes, steps_per_epoch=50, max_steps=100)
    assert "only falls to" in annealing_warning(short, 100)


def test_annealing_warning_and_alpha_schedule_in_the_plan(tmp_path, capsys, caplog):
    d = tiny_config(tmp_path / "ann", sampler={"kind": "annealed"})
    d["train"]["max_steps"] = 2
    with caplog.at_level(logging.WARNING, logger="finetune"):
        run_cli.run(FinetuneConfig.from_dict(d), tensorboard=False, progress=False)
    assert "alpha per epoch: e1@0: 1.00" in capsys.readouterr().err
    assert any("no annealing" in r.message for r in caplog.records)


def test_task_specific_budget_adds_up_to_one_joint_run(tmp_path):
    cfg = FinetuneConfig.from_dict(tiny_config(tmp_path, sampler={"kind": "proportional"},
                                               train={"max_steps": 100}))
    b = run_cli.task_specific_budget(cfg, {"sentiment": 60, "ner": 30, "qa_match": 10}, global_batch=4)
    assert b == {"sentiment": 60, "ner": 30, "qa_match": 10}
    cfg.train.task_specific_budget = "full"
    assert set(run_cli.task_specific_budget(cfg, {"sentiment": 6, "ner": 3, "qa_match": 1}, 4).values()) == {100}


@pytest.mark.slow  # keeps make test-fast under 3 min (measured 9-30 s on 2 loaded cores)
def test_task_specific_trains_one_model_per_task(tmp_path):
    out = tmp_path / "ts"
    res = run_cli.run(FinetuneConfig.from_dict(tiny_config(out, method="task_specific")), tensorboard=False,
                      progress=False)
    assert set(res) == {"sentiment", "ner", "qa_match"}
    for t in res:
        sub = json.loads((out / t / "finetune_config.json").read_text())
        assert [x["name"] for x in sub["tasks"]] == [t] and sub["method"] == "task_specific"
        assert (out / t / "export" / "config.json").is_file()
    summary = json.loads((out / "results.json").read_text())
    assert summary["steps"] == sum(summary["budget"].values()) == 6
    assert summary["params"]["total"] == sum(summary["params"]["per_task_models"].values())


@pytest.fixture(scope="module")
def compared(tmp_path_factory) -> tuple[Path, list[str], str]:
    """`compare` of two methods x two seeds in subprocesses, two at a time: (work dir, its arguments, its
    stderr)."""
    import contextlib
    import io

    tmp = tmp_path_factory.mktemp("compare")
    cfg = tmp / "cfg.json"
    d = tiny_config(tmp / "unused")
    d["train"].update(max_steps=4, eval_every=2, log_every=2)
    cfg.write_text(json.dumps(d, ensure_ascii=False), encoding="utf-8")
    args = ["--config", str(cfg), "--methods", "skillnet", "dense_joint", "--seeds", "0", "1",
            "--output-dir", str(tmp / "cmp"), "--jobs", "2", "--report", str(tmp / "doc" / "cmp.md")]
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        assert compare_cli.main(args) == 0
    return tmp, args, err.getvalue()


@pytest.mark.slow
def test_compare_two_methods_two_seeds_resumable(compared, capsys):
    tmp_path, args, err = compared
    out = tmp_path / "cmp"
    assert err.count("finished in") == 4
    agg = json.loads((out / "comparison.json").read_text())
    assert set(agg["methods"]) == {"skillnet", "dense_joint"} and agg["seeds"] == [0, 1]
    row = agg["methods"]["dense_joint"]
    assert len(row["tasks"]["ner"]["values"]) == 2 and row["params"]["total"] > 0
    md = (tmp_path / "doc" / "cmp.md").read_text()
    assert "| skillnet |" in md and "± " in md and "img/cmp_curves.png" in md
    assert (tmp_path / "doc" / "img" / "cmp_curves.png").stat().st_size > 0
    # rerun: nothing runs again
    (out / "comparison.md").unlink()
    assert compare_cli.main(args) == 0
    err = capsys.readouterr().err
    assert err.count("done before, kept") == 4 and "finished in" not in err
    assert (out / "comparison.md").is_file()


def test_compare_names_a_failed_run_by_its_row_and_seed_and_keeps_the_others(tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    d = tiny_config(tmp_path / "unused")
    d["train"].update(max_steps=2, eval_every=2, log_every=2)
    cfg.write_text(json.dumps(d, ensure_ascii=False), encoding="utf-8")
    args = ["--config", str(cfg), "--methods", "skillnet", "bad=skillnet", "--seeds", "3",
            "--args-for", "bad=--drop-skill s99", "--output-dir", str(tmp_path / "cmp"), "--in-process",
            "--threads", "1", "--no-plots"]
    assert compare_cli.main(args) == 1
    err = capsys.readouterr().err
    assert "[compare] (2/2) bad seed 3: FAILED" in err
    assert "error: 1 run(s) failed: [('bad', 3)]" in err
    assert (tmp_path / "cmp" / "skillnet" / "seed3" / "results.json").is_file()
    assert not (tmp_path / "cmp" / "comparison.json").exists()


def test_compare_bad_arguments_end_with_one_error_line(tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(tiny_config(tmp_path)), encoding="utf-8")
    assert compare_cli.main(["--config", str(cfg), "--methods", "skillnet", "mmoe", "--no-plots"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --methods: unknown method(s) ['mmoe']")


def test_learnable_run_logs_alpha_and_writes_its_map(tmp_path):
    out = tmp_path / "learn"
    d = tiny_config(out, method="learnable")
    d["train"]["skill_map_lr"] = 0.5
    run_cli.run(FinetuneConfig.from_dict(d), tensorboard=False, progress=False)
    doc = json.loads((out / "skill_map.json").read_text())
    assert doc["tasks"] == ["sentiment", "ner", "qa_match"] and doc["estimator"] == "ste"
    assert len(doc["alpha"]) == 3 and len(doc["alpha"][0]) == 7
    assert all(row[doc["skills"].index("s7")] for row in doc["active"])  # the generic skill stays on
    assert "changed_cells" in doc and (out / "skill_map.png").stat().st_size > 0
    evals = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    evals = [e for e in evals if e.get("split") == "eval"]
    assert evals and "skill_map/alpha/ner/s2" in evals[-1] and "skill_map/size/ner" in evals[-1]
    # prediction uses exactly the trained skill sets: the export's config holds the final map
    cfg = json.loads((out / "export" / "config.json").read_text())
    final = {t: [s for s, on in zip(doc["skills"], row) if on] for t, row in zip(doc["tasks"], doc["active"])}
    assert {t: cfg["tasks"][t] for t in final} == final
    params = json.loads((out / "params.json").read_text())
    assert params["tasks"]["ner"]["skills"]  # plan and counts read the learned map


@pytest.mark.parametrize("method", ["moe", "pals", "learnable"])
def test_parameter_accounting_of_each_method(tmp_path, method):
    m = _build(tmp_path, method)
    from skillnet.model import activated_parameters, count_parameters

    c = count_parameters(m)
    for task in ("sentiment", "ner"):
        act = activated_parameters(m, task)
        assert c["shared"] < act < c["total"]
    if method == "moe":
        per = c["skills"]["s1"]
        assert activated_parameters(m, "ner") == c["shared"] + 2 * per + c["heads"]["ner"]
    if method == "pals":
        assert c["heads"]["ner"] > sum(p.numel() for p in m.heads["ner"].parameters())  # PALs of the task


def test_compare_rows_can_be_variants_with_their_own_init_and_options(tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(tiny_config(tmp_path)), encoding="utf-8")
    dense = tmp_path / "dense"
    _dense_bert(dense)
    args = ["--config", str(cfg), "--methods", "skillnet", "skillnet_dense=skillnet", "s8=skillnet", "--seeds", "0",
            "--output-dir", str(tmp_path / "cmp"), "--dry-run", "--init-for", f"skillnet_dense={dense}",
            "--args-for", "s8=--new-skill s8 --freeze-old-skills"]
    assert compare_cli.main(args) == 0
    err = capsys.readouterr().err.splitlines()
    cmds = {line.split(":")[0].split(") ")[1].split(" seed")[0]: line for line in err if "seed 0:" in line}
    assert set(cmds) == {"skillnet", "skillnet_dense", "s8"}
    assert f"--init {dense}" in cmds["skillnet_dense"] and "--init" not in cmds["skillnet"]
    assert "--new-skill s8 --freeze-old-skills" in cmds["s8"] and "--method skillnet" in cmds["s8"]
    assert str(tmp_path / "cmp" / "s8" / "seed0") in cmds["s8"]
    bad = ["--config", str(cfg), "--methods", "skillnet", "--init-for", "nope=x", "--no-plots"]
    assert compare_cli.main(bad) == 2
    assert capsys.readouterr().err.strip().startswith("error: --init-for 'nope=x': no row labelled 'nope'")


def test_compare_init_per_seed_and_every_row_checked_before_running(tmp_path, capsys):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(tiny_config(tmp_path)), encoding="utf-8")
    for seed in (0, 1):
        _dense_bert(tmp_path / f"mt{seed}")
    args = ["--config", str(cfg), "--methods", "skillnet", "--seeds", "0", "1", "--init", str(tmp_path / "mt{seed}"),
            "--output-dir", str(tmp_path / "cmp"), "--dry-run"]
    assert compare_cli.main(args) == 0
    err = capsys.readouterr().err
    assert f"--init {tmp_path / 'mt0'}" in err and f"--init {tmp_path / 'mt1'}" in err
    # seed 2 has no folder: one error line before anything runs
    assert compare_cli.main([*args[:5], "0", "2", *args[7:]]) == 2
    out = capsys.readouterr().err.strip().splitlines()
    assert len(out) == 1 and "row skillnet, seed 2: initial weights" in out[0]
    # a row whose config does not fit its model is caught before running too
    bad = tiny_config(tmp_path)
    bad["tasks"][0]["skills"] = ["s1", "s99"]
    cfg.write_text(json.dumps(bad), encoding="utf-8")
    assert compare_cli.main(["--config", str(cfg), "--methods", "skillnet", "--seeds", "0", "--no-plots",
                             "--output-dir", str(tmp_path / "cmp2")]) == 2
    assert "unknown skill 's99'" in capsys.readouterr().err
    assert not (tmp_path / "cmp2" / "skillnet").exists()


@pytest.mark.slow  # uses the subprocess runs of `compared`
def test_compare_in_process_gives_the_same_results_as_subprocesses(compared, tmp_path):
    """The same runs as the subprocess `compare` above (seed 0), in this process."""
    work, args, _ = compared
    cfg = args[args.index("--config") + 1]
    base = ["--config", cfg, "--methods", "skillnet", "dense_joint", "--seeds", "0", "--threads", "1", "--no-plots"]
    assert compare_cli.main([*base, "--output-dir", str(tmp_path / "inp"), "--in-process"]) == 0
    for m in ("skillnet", "dense_joint"):
        a = json.loads((work / "cmp" / m / "seed0" / "results.json").read_text())["tasks"]
        b = json.loads((tmp_path / "inp" / m / "seed0" / "results.json").read_text())["tasks"]
        for t in a:
            assert a[t]["dev"] == b[t]["dev"] and a[t]["test"] == b[t]["test"], (m, t)
        log = (tmp_path / "inp" / m / "seed0" / "run.log").read_text()
        assert "(in process)" in log and "method" in log  # the run's own output went to its log


def test_a_run_in_process_logs_what_bypasses_sys_stderr(tmp_path, capfd, monkeypatch):
    """An in-process run's log gets what a subprocess's would: also output that does not go through sys.stderr,
    such as a library's log handler made with the process's first stderr (transformers' load report) or C
    code writing to descriptor 2. Before, that went to the terminal of the process that started the workers."""
    import os

    lib = logging.getLogger("some_library")
    handler = logging.StreamHandler(sys.__stderr__)
    lib.addHandler(handler)
    lib.propagate = False

    def run(args):
        lib.warning("from the library's handler")
        os.write(2, b"from descriptor 2\n")
        print("from print", file=sys.stderr)
        return 0

    from skillnet.finetune import cli as finetune_cli

    monkeypatch.setattr(finetune_cli, "main", run)
    try:
        rc, _ = compare_workers._run_in_process([sys.executable, "-m", "skillnet.finetune.run", "--seed", "0"], tmp_path)
        os.write(2, b"after the run\n")
    finally:
        lib.removeHandler(handler)
    log = (tmp_path / "run.log").read_text(encoding="utf-8")
    assert rc == 0 and all(x in log for x in ("from the library's handler", "from descriptor 2", "from print"))
    err = capfd.readouterr().err
    assert "after the run" in err and "library" not in err and "descriptor 2" not in err


@pytest.mark.slow  # uses the subprocess runs of `compared`
def test_compare_jobs_two_gives_the_same_results_as_one_at_a_time(compared, tmp_path, capsys):
    """`--jobs 2 --in-process`: the same four runs in two worker processes, one thread each, give the
    results of `compared`'s subprocess runs (two at a time, one thread each; the test above checks seed 0 run
    one at a time against them), and each run's output still goes to its own log. They run as two comparisons
    of one process inside `shared_workers`, as a reproduction runs its stages: both use the same two workers,
    and each worker holds the output folder's lock that it was given."""
    import os

    from skillnet.common.outputs import LOCK, exclusive

    work, args, _ = compared
    cfg = args[args.index("--config") + 1]
    base = ["--config", cfg, "--seeds", "0", "1", "--no-plots", "--in-process", "--jobs", "2"]
    with (exclusive(tmp_path, option="--out", command="reproduction") as fd,
          compare_workers.shared_workers(fd)):
        assert compare_cli.main([*base, "--methods", "skillnet", "--output-dir", str(tmp_path / "jobs")]) == 0
        workers = set(compare_workers._SHARED[2]._processes)
        assert len(workers) == 2
        for pid in workers:
            held = {os.readlink(f"/proc/{pid}/fd/{n}") for n in os.listdir(f"/proc/{pid}/fd")}
            assert str(tmp_path / LOCK) in held, pid
        assert compare_cli.main([*base, "--methods", "dense_joint", "--output-dir", str(tmp_path / "jobs2")]) == 0
        assert set(compare_workers._SHARED[2]._processes) == workers  # the second comparison started no worker
    assert compare_workers._SHARED is None and not any(os.path.exists(f"/proc/{pid}/cmdline") for pid in workers)
    err = capsys.readouterr().err
    assert err.count("2 runs, 2 at a time") == 2 and err.count("finished in") == 4
    for m, folder in (("skillnet", "jobs"), ("dense_joint", "jobs2")):
        for seed in (0, 1):
            a = json.loads((work / "cmp" / m / f"seed{seed}" / "results.json").read_text())["tasks"]
            b = json.loads((tmp_path / folder / m / f"seed{seed}" / "results.json").read_text())["tasks"]
            for t in a:
                assert a[t]["dev"] == b[t]["dev"] and a[t]["test"] == b[t]["test"], (m, seed, t)
            log = (tmp_path / folder / m / f"seed{seed}" / "run.log").read_text()
            assert "(in process)" in log and "--threads 1" in log
    with pytest.raises(SystemExit) as bad:  # the shared option check: argparse's one-line error, exit 2
        compare_cli.main([*base, "--methods", "skillnet", "--output-dir", str(tmp_path / "bad"), "--jobs", "0"])
    assert bad.value.code == 2 and "--jobs 0: must be >= 1" in capsys.readouterr().err


def test_paired_test_is_scipys_and_undefined_without_spread():
    from scipy import stats
    from skillnet.finetune.stats import paired_test

    a, b = [70.1, 72.3, 69.8], [68.0, 71.9, 66.5]
    assert paired_test(a, b) == pytest.approx(stats.ttest_rel(a, b).pvalue)
    assert paired_test([40.0, 40.0], [40.0, 40.0]) == 1.0
    assert paired_test([30.0, 30.0], [40.0, 40.0]) is None  # the same gap twice: no spread to judge
    assert paired_test([1.0], [2.0]) is None


def test_a_gap_that_differs_only_by_rounding_has_no_spread():
    """0.3 and 1.3 - 1.0 differ in the last bit: that is the same gap twice, not a gap with a spread of
    1e-17 (scipy then gives p ~ 1e-16, "beyond the noise", with a precision-loss warning)."""
    import warnings

    from skillnet.finetune.stats import paired_test

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert paired_test([0.3, 1.3], [0.0, 1.0]) is None
        assert paired_test([66.7, 66.7 + 1e-13], [66.7, 66.7]) == 1.0
        a, b = [70.1, 72.3, 69.8], [68.0, 71.9, 66.5]
        assert paired_test(a, b) < 0.2  # a real spread is still tested


def test_a_dense_joint_model_folder_is_a_valid_init(tmp_path):
    """A dense_joint model (router 'dense' since the router seam) starts a run as it did when it was saved
    as a one-skill 'task' router: the check accepts any router that keeps one FFN set per task."""
    dense = _build(tmp_path, "dense_joint")
    assert dense.config.router == "dense"
    dense.save_pretrained(str(tmp_path / "dj"))
    d = tiny_config(tmp_path / "again", model={"init": str(tmp_path / "dj")})
    for t in d["tasks"]:
        t["skills"] = ["shared"]  # the model's one FFN
    FinetuneConfig.from_dict(d).check_model(where="config")
    moe = _build(tmp_path, "moe")
    moe.save_pretrained(str(tmp_path / "moe_dir"))
    bad = FinetuneConfig.from_dict(tiny_config(tmp_path / "bad", model={"init": str(tmp_path / "moe_dir")}))
    with pytest.raises(ConfigError, match="'topk'-router model"):
        bad.check_model(where="config")


@pytest.mark.slow
def test_compare_workers_stop_and_checkpoint_when_the_comparison_is_killed(tmp_path):
    """SIGKILL of `compare --jobs 2`: its worker processes must not live on. Each gets SIGTERM (its run saves
    a checkpoint, as a preempted run does) and is gone within the grace period."""
    import os
    import signal
    import subprocess
    import sys
    import time

    cfg = tmp_path / "cfg.json"
    d = tiny_config(tmp_path / "unused")
    d["train"].update(max_steps=100_000, eval_every=100_000, log_every=1)
    cfg.write_text(json.dumps(d, ensure_ascii=False), encoding="utf-8")
    out = tmp_path / "cmp"
    proc = subprocess.Popen([sys.executable, "-m", "skillnet.finetune.compare", "--config", str(cfg), "--methods",
                             "skillnet", "dense_joint", "--seeds", "0", "--output-dir", str(out), "--in-process",
                             "--jobs", "2", "--no-plots"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    logs = [out / m / "seed0" / "log.jsonl" for m in ("skillnet", "dense_joint")]
    deadline = time.time() + 120
    while time.time() < deadline and not all(f.is_file() and f.stat().st_size > 0 for f in logs):
        time.sleep(0.5)
    assert all(f.is_file() for f in logs), "the two runs did not start"
    workers = [int(x) for x in subprocess.run(["pgrep", "-f", "-P", str(proc.pid), "multiprocessing.spawn"],
                                              capture_output=True, text=True).stdout.split()]
    assert len(workers) == 2
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    t_kill = time.time()
    deadline = t_kill + 150
    alive = workers
    while alive and time.time() < deadline:
        time.sleep(1.0)
        alive = [w for w in workers if os.path.exists(f"/proc/{w}") and
                 Path(f"/proc/{w}/stat").read_text().split()[2] != "Z"]
    for w in alive:
        os.kill(w, signal.SIGKILL)
    assert not alive, "workers outlived the comparison"
    assert time.time() - t_kill < 60  # they left once their runs had saved, not at the end of the grace period
    for m in ("skillnet", "dense_joint"):  # each run stopped like a preempted run: a checkpoint to resume from
        assert any((out / m / "seed0" / "checkpoints").glob("step_*")), m
