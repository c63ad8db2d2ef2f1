"""Nothing a user types loses data: each case below is what a command does with output that already exists,
a damaged checkpoint or a degenerate option. CASES is also the table in docs/safety.md
(``SKILLNET_WRITE_DOCS=1 pytest tests/test_output_safety.py -k docs`` rewrites it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
PT = [sys.executable, str(REPO / "pretrain" / "run.py")]
TINY = ["--synthetic", "200", "--preset", "tiny", "--max-seq-len", "32", "--no-progress", "--no-tensorboard",
        "--log-every", "1"]
FT_CONFIG = str(REPO / "finetune" / "configs" / "tiny.json")

# (command, situation, what it does) -> the test that shows it
CASES = [
    ("export", "`--out` holds files an export did not write", "refused, nothing changed; `--overwrite` replaces them"),
    ("export", "`--out` is the run being exported (or holds it)", "refused, even with `--overwrite`"),
    ("export", "`--out` holds an export of another checkpoint or other settings", "refused; `--overwrite` replaces it"),
    ("export", "`--out` holds an export of the same checkpoint and settings", "replaced (says so), atomically"),
    ("export", "the newest checkpoint is damaged", "exports the newest intact one, with a one-line warning"),
    ("finetune.run", "`--output-dir` holds this configuration's finished run", "nothing to do (says so), exit 0"),
    ("finetune.run", "`--output-dir` holds this configuration's unfinished run", "resumes it (says so)"),
    ("finetune.run", "`--output-dir` holds another run or other files", "refused; `--overwrite` removes that run's files"),
    ("data_prep build", "`--out` holds a build of other inputs or settings", "refused; `--overwrite` removes its shards first"),
    ("data_prep build", "`--out` holds a build of the same inputs and settings", "resumes (finished shards kept)"),
    ("data_prep build", "no document is kept (empty input, `--max-doc-bytes` too small)", "exit 1, names why"),
    ("pretrain/run.py", "`--output-dir` holds a run of another model or data", "refused; `--overwrite` starts over"),
    ("pretrain/run.py", "`--output-dir` holds a run of the same model and data", "resumes it"),
    ("pretrain/run.py", "the newest checkpoint lost `plain.pt` / `trainer_rank0.pt`, or is cut short",
     "resumes from the newest intact one, with a one-line warning; an error if none is intact"),
    ("pretrain/run.py", "`--resume .../step_N` has no `complete` marker (or is damaged)", "refused"),
    ("pretrain/run.py", "DeepSpeed: a rank's files missing, `latest` naming a missing tag", "that checkpoint is skipped"),
    ("data_prep.tasks convert", "`--out` holds files a conversion did not write, or one of other settings",
     "refused; `--overwrite` removes the earlier conversion's files"),
    ("data_prep.tasks convert", "`--out` holds the same conversion", "rewritten (says so); a failed rerun leaves it whole"),
    ("data_prep.tasks convert", "no record is kept (empty or wrong-format input)", "exit 1, names why, writes nothing"),
    ("finetune.predict", "`--output` is its own `--input`", "refused, even with `--overwrite`"),
    ("finetune.predict", "`--output` exists and holds no predictions", "refused; `--overwrite` replaces it"),
    ("finetune.predict", "`--output` holds earlier predictions", "replaced, atomically"),
    ("finetune.compare", "`--output-dir` holds other files, or a comparison of another config",
     "refused (no `--overwrite`: pick another folder)"),
    ("finetune.compare", "`--output-dir` holds a comparison of the same config", "continues it (finished runs kept)"),
    ("finetune.compare, reproduce", "`--report` (`--write`) exists and the command did not write it",
     "refused before anything runs; `--overwrite` replaces it"),
    ("reproduce", "`--out` holds other files, or a reproduction of another profile",
     "refused (no `--overwrite`: pick another folder)"),
    ("reproduce", "`--out` holds a reproduction of the same profile", "continues it (finished stages kept)"),
    ("every command", "an output path that is a file (a folder, for a file output), or cannot be written",
     "refused in one line"),
    ("every command", "`--lr` <= 0, `--max-steps` 0, `--batch-size` 0, `--gpus` 0, other values out of range",
     "one line naming the option and range"),
]


def _run(cmd: list[str], cwd: Path, **kw) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=300, env=env, **kw)


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny plain pre-training run with checkpoints at steps 2 and 4 (and an export of it)."""
    d = tmp_path_factory.mktemp("safety")
    r = _run([*PT, *TINY, "--max-steps", "4", "--save-every", "2", "--keep-last", "3", "--output-dir", "pt"], d)
    assert r.returncode == 0, r.stderr[-2000:]
    return d


def _copy_run(runs: Path, dst: Path) -> Path:
    import shutil

    shutil.copytree(runs / "pt", dst)
    return dst


# ---- export --------------------------------------------------------------------------------------------
def test_export_never_clobbers(runs: Path, tmp_path: Path) -> None:
    export = [sys.executable, "-m", "skillnet.pretrain.export", "--checkpoint", str(runs / "pt")]
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    r = _run([*export, "--out", str(other)], tmp_path)
    assert r.returncode == 2 and "--overwrite" in r.stderr and (other / "notes.txt").read_text() == "keep me"
    before = _files(runs / "pt")
    for out in (runs / "pt", runs):  # the run itself, and a folder holding it
        r = _run([*export, "--out", str(out), "--overwrite"], tmp_path)
        assert r.returncode == 2 and "run being exported" in r.stderr, r.stderr
    assert _files(runs / "pt") == before
    r = _run([*export, "--out", str(tmp_path / "hf")], tmp_path)
    assert r.returncode == 0, r.stderr
    r = _run([*export, "--out", str(tmp_path / "hf")], tmp_path)  # the same export again: replaced, said so
    assert r.returncode == 0 and "replacing the earlier export" in r.stderr
    r = _run([*export, "--out", str(tmp_path / "hf"), "--tag", "step_00000002"], tmp_path)  # another checkpoint
    assert r.returncode == 2 and "other settings" in r.stderr
    r = _run([*export, "--out", str(other), "--overwrite"], tmp_path)
    assert r.returncode == 0 and not (other / "notes.txt").exists() and (other / "config.json").is_file()
    r = _run([*export, "--out", str(runs / "pt" / "run_args.json")], tmp_path)  # a file
    assert r.returncode == 2 and "is a file" in r.stderr


# ---- pre-training ----------------------------------------------------------------------------------------
def test_pretrain_refuses_another_model_in_the_same_dir(runs: Path, tmp_path: Path) -> None:
    run = _copy_run(runs, tmp_path / "pt")
    before = _files(run)
    r = _run([*PT, *TINY, "--preset", "small", "--max-steps", "6", "--output-dir", str(run)], tmp_path)
    assert r.returncode == 2 and "other settings (preset)" in r.stderr and _files(run) == before, r.stderr
    r = _run([*PT, *TINY, "--dense", "--max-steps", "6", "--output-dir", str(run)], tmp_path)
    assert r.returncode == 2 and _files(run) == before
    r = _run([*PT, *TINY, "--preset", "small", "--max-steps", "1", "--output-dir", str(run), "--overwrite"], tmp_path)
    assert r.returncode == 0 and '"step": 1' in r.stdout, r.stderr[-2000:]


@pytest.mark.parametrize("damage", ["plain.pt", "trainer_rank0.pt", "truncate"])
def test_a_damaged_latest_checkpoint_falls_back(runs: Path, tmp_path: Path, damage: str) -> None:
    run = _copy_run(runs, tmp_path / "pt")
    step4 = run / "checkpoints" / "step_00000004"
    if damage == "truncate":
        data = (step4 / "plain.pt").read_bytes()
        (step4 / "plain.pt").write_bytes(data[: len(data) // 2])
    else:
        (step4 / damage).unlink()
    r = _run([*PT, *TINY, "--max-steps", "5", "--output-dir", str(run)], tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "skipped damaged checkpoint(s) step_00000004" in r.stderr and "resumed from" in r.stdout
    assert "at step 2" in r.stdout and '"step": 5' in r.stdout
    # nothing intact at all: one line, no traceback
    for step in (run / "checkpoints").glob("step_*"):
        (step / "trainer_rank0.pt").unlink(missing_ok=True)
    r = _run([*PT, *TINY, "--max-steps", "6", "--output-dir", str(run)], tmp_path)
    assert r.returncode == 2 and "no intact checkpoint" in r.stderr and "Traceback" not in r.stderr, r.stderr[-1500:]


def test_resume_of_a_step_without_its_marker_is_refused(runs: Path, tmp_path: Path) -> None:
    run = _copy_run(runs, tmp_path / "pt")
    step4 = run / "checkpoints" / "step_00000004"
    (step4 / "complete").unlink()  # `latest` still names it
    r = _run([*PT, *TINY, "--max-steps", "6", "--output-dir", str(run), "--resume", str(step4)], tmp_path)
    assert r.returncode == 2 and "no 'complete' marker" in r.stderr and "Traceback" not in r.stderr, r.stderr[-1500:]


def test_deepspeed_layout_checks(tmp_path: Path) -> None:
    """A ZeRO-2 checkpoint of 2 ranks missing rank 1's optimizer partition, and `latest` naming a missing tag."""
    from skillnet.training.checkpoint import CheckpointManager, checkpoint_problem, mark_complete

    root = tmp_path / "checkpoints"
    for step in (2, 4):
        d = root / f"step_{step:08d}"
        d.mkdir(parents=True)
        for r in range(2):
            torch.save({"step": step, "world_size": 2}, d / f"trainer_rank{r}.pt")
            torch.save({}, d / f"bf16_zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
        torch.save({}, d / "mp_rank_00_model_states.pt")
        mark_complete(d, step)
    assert checkpoint_problem(root / "step_00000004") is None
    (root / "step_00000004" / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    assert "rank 1's DeepSpeed optimizer partition is missing" in checkpoint_problem(root / "step_00000004")
    (root / "latest").write_text("step_00000009\n")  # names a tag that is not there
    mgr = CheckpointManager(tmp_path, 0, 2, 2)
    assert mgr.locate("auto") == root / "step_00000002"


# ---- fine-tuning -----------------------------------------------------------------------------------------
def test_finetune_leaves_a_finished_run_and_refuses_another(tmp_path: Path) -> None:
    ft = [sys.executable, "-m", "skillnet.finetune.run", "--config", FT_CONFIG, "--output-dir", "ft", "--no-progress",
          "--no-tensorboard", "--max-steps", "2"]
    r = _run(ft, tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    before = _files(tmp_path / "ft")
    r = _run(ft, tmp_path)  # the same configuration, finished: nothing trains, nothing changes
    assert r.returncode == 0 and "nothing to do" in r.stderr and _files(tmp_path / "ft") == before
    r = _run([*ft, "--seed", "1"], tmp_path)  # another run: refused
    assert r.returncode == 2 and "other settings" in r.stderr and _files(tmp_path / "ft") == before
    (tmp_path / "f").write_text("x")
    r = _run([*ft[:6], "f", *ft[7:]], tmp_path)
    assert r.returncode == 2 and "is a file" in r.stderr
    r = _run([*ft, "--seed", "1", "--overwrite"], tmp_path)
    assert r.returncode == 0 and json.loads((tmp_path / "ft" / "results.json").read_text())


# ---- data_prep -------------------------------------------------------------------------------------------
def test_data_prep_build_refuses_another_build_and_empty_input(tmp_path: Path) -> None:
    dp = [sys.executable, "-m", "skillnet.data_prep", "build", "--no-progress", "--unit-bytes", "40"]
    (tmp_path / "a.txt").write_text("第一句。第二句！\n另一个文档。很好。\n" * 20, encoding="utf-8")
    (tmp_path / "b.txt").write_text("完全不同的文本。\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    assert _run([*dp, "a.txt", "--out", "o"], tmp_path).returncode == 0
    n_shards = len(list((tmp_path / "o").glob("shard-*.bin")))
    assert n_shards > 1
    before = _files(tmp_path / "o")
    r = _run([*dp, "b.txt", "--out", "o"], tmp_path)
    assert r.returncode == 2 and "--overwrite" in r.stderr and _files(tmp_path / "o") == before
    r = _run([*dp, "a.txt", "--out", "o"], tmp_path)  # the same build again: continues, keeps the shards
    assert r.returncode == 0 and _files(tmp_path / "o").keys() == before.keys()
    r = _run([*dp, "b.txt", "--out", "o", "--overwrite"], tmp_path)
    assert r.returncode == 0 and len(list((tmp_path / "o").glob("shard-*.bin"))) == 1  # no stale shard left
    r = _run([*dp, "empty.txt", "--out", "e"], tmp_path)
    assert r.returncode == 1 and "no document was kept" in r.stderr
    r = _run([*dp, "a.txt", "--out", "t", "--max-doc-bytes", "0"], tmp_path)
    assert r.returncode == 2 and "--max-doc-bytes 0: must be > 0" in r.stderr
    r = _run([*dp, "a.txt", "--out", "a.txt"], tmp_path)
    assert r.returncode == 2 and "is a file" in r.stderr


# ---- the other commands: task conversion, predict, compare, the reproduction ------------------------------
def _call(main, argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """A command's main() in this process: (exit status, stderr); an exception (a traceback) fails the test."""
    try:
        rc = main([str(x) for x in argv])
    except SystemExit as e:  # argparse's one-line errors
        rc = e.code
    return rc, capsys.readouterr().err


def test_task_convert_claims_its_folder(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from skillnet.data_prep.tasks.__main__ import main

    src = tmp_path / "in.json"
    src.write_text("".join(json.dumps({"sentence": f"第{i}句", "label": str(i % 2)}) + "\n" for i in range(40)))
    conv = ["convert", "chnsenticorp", "--input", src]
    (tmp_path / "afile").write_text("x")
    rc, err = _call(main, [*conv, "--out", tmp_path / "afile"], capsys)
    assert rc == 2 and "is a file" in err
    other = tmp_path / "other"
    other.mkdir()
    (other / "train.jsonl").write_text("keep me")
    rc, err = _call(main, [*conv, "--out", other], capsys)
    assert rc == 2 and "--overwrite" in err and (other / "train.jsonl").read_text() == "keep me"
    out = tmp_path / "task"
    assert _call(main, [*conv, "--out", out], capsys)[0] == 0
    before = _files(out)
    rc, err = _call(main, [*conv, "--out", out], capsys)  # the same conversion again: rewritten, said so
    assert rc == 0 and "replacing" in err and _files(out) == before
    rc, err = _call(main, [*conv, "--out", out, "--seed", "3"], capsys)
    assert rc == 2 and "other settings (seed)" in err and _files(out) == before
    rc, err = _call(main, ["convert", "chnsenticorp", "--input", f"train={src}", "--out", out, "--overwrite"], capsys)
    assert rc == 0 and sorted(p.name for p in out.iterdir() if p.suffix) == [".skillnet_output.json", "task.json",
                                                                             "train.jsonl"]  # no stale dev/test
    (tmp_path / "empty.json").write_text("")
    rc, err = _call(main, ["convert", "chnsenticorp", "--input", tmp_path / "empty.json", "--out", tmp_path / "e"],
                    capsys)
    assert rc == 1 and "no record" in err
    for opt, value, rule in [("--max-examples", "0", "must be >= 1"), ("--max-eval-examples", "-1", "must be >= 0"),
                             ("--clean-ratio", "2", "must be in [0, 1]"), ("--max-chars", "0", "must be >= 1"),
                             ("--negatives", "0", "must be >= 1")]:
        rc, err = _call(main, [*conv, "--out", tmp_path / "t", opt, value], capsys)
        assert rc == 2 and f"{opt} {value}" in err and rule in err, err
    assert not (tmp_path / "t").exists()


@pytest.fixture(scope="module")
def ft_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-step fine-tuning run of finetune/configs/tiny.json (its export/ is what predict reads)."""
    d = tmp_path_factory.mktemp("ft")
    r = _run([sys.executable, "-m", "skillnet.finetune.run", "--config", FT_CONFIG, "--output-dir", "ft",
              "--no-progress", "--no-tensorboard", "--max-steps", "2"], d)
    assert r.returncode == 0, r.stderr[-2000:]
    return d / "ft"


def test_predict_never_clobbers(ft_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from skillnet.finetune.predict import main

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "很好", "task": "sentiment"}, ensure_ascii=False) + "\n")
    text = src.read_text()
    pred = ["--model", ft_run / "export", "--input", src, "--no-progress"]
    for extra in (["--output", src], ["--output", src, "--overwrite"]):  # its own input: refused, always
        rc, err = _call(main, [*pred, *extra], capsys)
        assert rc == 2 and "input" in err and src.read_text() == text, err
    notes = tmp_path / "notes.jsonl"
    notes.write_text("keep me\n")
    rc, err = _call(main, [*pred, "--output", notes], capsys)
    assert rc == 2 and "--overwrite" in err and notes.read_text() == "keep me\n"
    out = tmp_path / "out.jsonl"
    assert _call(main, [*pred, "--output", out], capsys)[0] == 0
    assert _call(main, [*pred, "--output", out], capsys)[0] == 0  # its own predictions: replaced
    assert "prediction" in json.loads(out.read_text())
    assert _call(main, [*pred, "--output", notes, "--overwrite"], capsys)[0] == 0 and "prediction" in notes.read_text()
    rc, err = _call(main, [*pred, "--output", tmp_path], capsys)
    assert rc == 2 and "is a folder" in err
    rc, err = _call(main, [*pred, "--output", tmp_path / "o2.jsonl", "--batch-size", "0"], capsys)
    assert rc == 2 and "--batch-size 0: must be >= 1" in err
    rc, err = _call(main, ["--model", ft_run / "export", "--input", tmp_path / "missing.jsonl", "--output",
                           tmp_path / "o3.jsonl"], capsys)
    assert rc == 2 and "missing.jsonl" in err
    assert not (tmp_path / "o2.jsonl").exists() and not (tmp_path / "o3.jsonl").exists()


def test_compare_claims_its_folder_and_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from skillnet.finetune.compare import main

    cmp = ["--config", FT_CONFIG, "--methods", "skillnet", "--seeds", "0", "--no-plots", "--dry-run"]
    (tmp_path / "afile").write_text("x")
    rc, err = _call(main, [*cmp, "--output-dir", tmp_path / "afile"], capsys)
    assert rc == 2 and "is a file" in err
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    rc, err = _call(main, [*cmp, "--output-dir", other], capsys)
    assert rc == 2 and _files(other) == {"notes.txt": b"keep me"}, err
    rc, err = _call(main, [*cmp, "--output-dir", tmp_path / "c", "--report", tmp_path / "afile"], capsys)
    assert rc == 2 and "--report" in err and (tmp_path / "afile").read_text() == "x"
    assert _call(main, [*cmp, "--output-dir", tmp_path / "c"], capsys)[0] == 0
    assert _call(main, [*cmp, "--output-dir", tmp_path / "c"], capsys)[0] == 0  # its own folder: resumed
    for opt, value, rule in [("--nproc", "0", "must be >= 1"), ("--threads", "0", "must be >= 1"),
                             ("--max-steps", "0", "must be >= 1"), ("--jobs", "0", "must be >= 1")]:
        rc, err = _call(main, [*cmp, "--output-dir", tmp_path / "d", opt, value], capsys)
        assert rc == 2 and f"{opt} {value}: {rule}" in err, err
    assert not (tmp_path / "d").exists()


def test_reproduce_claims_its_folder_and_checks_options(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from skillnet.experiments.__main__ import main

    rep = ["--quick", "--dry-run", "--stages", "corpus"]
    (tmp_path / "afile").write_text("x")
    rc, err = _call(main, [*rep, "--out", tmp_path / "afile"], capsys)
    assert rc == 2 and "is a file" in err
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    rc, err = _call(main, [*rep, "--out", other], capsys)
    assert rc == 2 and "Pick another folder" in err and _files(other) == {"notes.txt": b"keep me"}, err
    assert _call(main, [*rep, "--out", tmp_path / "r"], capsys)[0] == 0
    assert _call(main, [*rep, "--out", tmp_path / "r"], capsys)[0] == 0  # its own: continued
    rc, err = _call(main, ["--profile", "full", "--dry-run", "--stages", "corpus", "--out", tmp_path / "r"], capsys)
    assert rc == 2 and "other settings (profile)" in err
    rc, err = _call(main, [*rep, "--out", tmp_path / "r2", "--report", tmp_path / "afile"], capsys)
    assert rc == 2 and "--report" in err and (tmp_path / "afile").read_text() == "x"
    rc, err = _call(main, ["--estimate", "--write", tmp_path / "afile"], capsys)
    assert rc == 2 and "--write" in err and (tmp_path / "afile").read_text() == "x"
    rc, err = _call(main, ["--estimate", "--write", tmp_path], capsys)
    assert rc == 2 and "is a folder" in err
    for opt, value in [("--gpus", "0"), ("--gpus", "-2"), ("--jobs", "0"), ("--threads", "-1")]:
        rc, err = _call(main, [*rep, "--out", tmp_path / "d", opt, value], capsys)
        assert rc == 2 and f"{opt} {value}: must be >= 1" in err, err
    assert not (tmp_path / "d").exists()


# ---- degenerate options ----------------------------------------------------------------------------------
@pytest.mark.parametrize("cmd, message", [
    ([*PT, "--synthetic", "10", "--lr", "-1"], "--lr -1.0: must be > 0"),
    ([*PT, "--synthetic", "10", "--lr", "0"], "--lr 0.0: must be > 0"),
    ([*PT, "--synthetic", "10", "--max-steps", "0"], "--max-steps 0: must be >= 1"),
    ([sys.executable, "-m", "skillnet.finetune.run", "--config", FT_CONFIG, "--lr", "-1"], "--lr -1.0: must be > 0"),
    ([sys.executable, "-m", "skillnet.finetune.run", "--config", FT_CONFIG, "--max-steps", "0"],
     "--max-steps 0: must be >= 1"),
])
def test_degenerate_options_get_one_line(tmp_path: Path, cmd: list[str], message: str) -> None:
    r = _run(cmd, tmp_path)
    assert r.returncode == 2 and message in r.stderr and "Traceback" not in r.stderr, r.stderr[-1500:]
    assert not any(tmp_path.iterdir())  # nothing written


def render_table() -> str:
    rows = "\n".join(f"| {c} | {s} | {w} |" for c, s, w in CASES)
    return ("<!-- written by tests/test_output_safety.py from its CASES (SKILLNET_WRITE_DOCS=1 to rewrite) -->\n"
            "# What each command does with existing output, damaged checkpoints and bad options\n\n"
            "Every command that writes a folder marks it (`.skillnet_output.json`: the command and the settings "
            "that make two runs the same one, training/outputs.py). It resumes or replaces only its own output "
            "of the same settings; anything else is refused in one line unless `--overwrite` says otherwise. "
            "Each row is checked by a test in tests/test_output_safety.py.\n\n"
            "| command | situation | what it does |\n| --- | --- | --- |\n" + rows + "\n")


def test_docs_table_is_written_from_the_cases() -> None:
    doc = REPO / "docs" / "safety.md"
    if os.environ.get("SKILLNET_WRITE_DOCS"):
        doc.write_text(render_table(), encoding="utf-8")
    assert doc.read_text(encoding="utf-8") == render_table(), "docs/safety.md is stale: SKILLNET_WRITE_DOCS=1"
