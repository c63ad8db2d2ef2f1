"""Nothing a user types loses data: each case below is what a command does with output that already exists,
a damaged checkpoint or a degenerate option. CASES is also the table in docs/safety.md
(``SKILLNET_WRITE_DOCS=1 pytest tests/test_output_safety.py -k docs`` rewrites it).

Every command runs through its ``main()`` in this process, as its command line does (exit status, stdout,
stderr): what is tested is what each command does with its arguments, not the interpreter around it, and a
traceback is an exception that fails the test. One pre-training run and one fine-tuning run are shared by
the tests that need one (copied where a test changes it)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
TINY = ["--synthetic", "64", "--preset", "tiny", "--max-seq-len", "32", "--no-progress", "--no-tensorboard",
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
    ("finetune.compare", "`--output-dir` holds a comparison of the same config (or one from before folders were "
     "marked)", "continues it (finished runs kept)"),
    ("finetune.compare, reproduce", "`--report` (`--write`) exists and the command did not write it",
     "refused before anything runs; `--overwrite` replaces it"),
    ("reproduce", "`--out` holds other files, or a reproduction of another profile",
     "refused (no `--overwrite`: pick another folder)"),
    ("reproduce", "`--out` holds a reproduction of the same profile (or one from before folders were marked)",
     "continues it (finished stages kept)"),
    ("reproduce", "`--dry-run --redo STAGE` on a finished stage", "lists the stage's commands; forgets nothing"),
    ("reproduce", "another reproduction is writing `--out` now (a second terminal, a job still running)",
     "refused in one line naming its pid (a `--dry-run` too: it writes the stages' configs); runs once that one is gone"),
    ("data_prep vocab, train-tokenizer", "`--out` holds files the command did not write (a vocab.txt of one's own)",
     "refused, nothing changed; `--overwrite` writes there; the same run again is redone"),
    ("data_prep sample-corpus, build `--report-json`", "the output file exists and the command did not write it",
     "refused before any work; `--overwrite` replaces it; its own earlier file is replaced"),
    ("every command", "an output path that is a file (a folder, for a file output), or cannot be written",
     "refused in one line"),
    ("every command", "`--lr` <= 0, `--max-steps` 0, `--batch-size` 0, `--gpus` 0, `--seed` -1, other values out of range",
     "one line naming the option and range"),
]


class Run(NamedTuple):
    rc: int
    err: str
    out: str


def _main(main: Callable[[list[str]], int], argv: Sequence[object]) -> Run:
    """``main(argv)`` as its command line runs it: exit status (argparse's SystemExit included), stderr,
    stdout. An exception escaping it, a traceback on the command line, fails the test."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            rc = main([str(a) for a in argv])
        except SystemExit as e:
            rc = e.code if isinstance(e.code, int) else 1
    return Run(rc, err.getvalue(), out.getvalue())


def _pretrain(*argv: object) -> Run:
    from skillnet.pretrain.run import main

    return _main(main, [*TINY, *argv])


def _export(*argv: object) -> Run:
    from skillnet.pretrain.export import main

    return _main(main, argv)


def _finetune(*argv: object) -> Run:
    from skillnet.finetune.cli import main

    return _main(main, ["--config", FT_CONFIG, "--no-progress", "--no-tensorboard", *argv])


def _data_prep(*argv: object) -> Run:
    from skillnet.data_prep.__main__ import main

    return _main(main, argv)


def _files(d: Path) -> dict[str, bytes]:
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder holding one tiny plain pre-training run, pt/, with checkpoints at steps 2 and 4."""
    d = tmp_path_factory.mktemp("safety")
    r = _pretrain("--max-steps", 4, "--save-every", 2, "--keep-last", 3, "--output-dir", d / "pt")
    assert r.rc == 0, r.err[-2000:]
    return d


@pytest.fixture(scope="module")
def ft_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-step fine-tuning run of finetune/configs/tiny.json (its export/ is what predict reads)."""
    d = tmp_path_factory.mktemp("ft") / "ft"
    r = _finetune("--output-dir", d, "--max-steps", 2)
    assert r.rc == 0, r.err[-2000:]
    return d


def _copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


# ---- export --------------------------------------------------------------------------------------------
def test_export_never_clobbers(runs: Path, tmp_path: Path) -> None:
    run = runs / "pt"
    other = tmp_path / "mine"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    r = _export("--checkpoint", run, "--out", other)
    assert r.rc == 2 and "--overwrite" in r.err and (other / "notes.txt").read_text() == "keep me"
    before = _files(run)
    for out in (run, runs):  # the run itself, and a folder holding it
        r = _export("--checkpoint", run, "--out", out, "--overwrite")
        assert r.rc == 2 and "run being exported" in r.err, r.err
    assert _files(run) == before
    hf = tmp_path / "hf"
    assert _export("--checkpoint", run, "--out", hf).rc == 0
    r = _export("--checkpoint", run, "--out", hf)  # the same export again: replaced, said so
    assert r.rc == 0 and "replacing the earlier export" in r.err
    r = _export("--checkpoint", run, "--out", hf, "--tag", "step_00000002")  # another checkpoint
    assert r.rc == 2 and "other settings" in r.err
    r = _export("--checkpoint", run, "--out", other, "--overwrite")
    assert r.rc == 0 and not (other / "notes.txt").exists() and (other / "config.json").is_file()
    r = _export("--checkpoint", run, "--out", run / "run_args.json")  # a file
    assert r.rc == 2 and "is a file" in r.err


# ---- pre-training ----------------------------------------------------------------------------------------
def test_pretrain_refuses_another_model_in_the_same_dir(runs: Path, tmp_path: Path) -> None:
    run = _copy_run(runs / "pt", tmp_path / "pt")
    before = _files(run)
    r = _pretrain("--preset", "small", "--max-steps", 6, "--output-dir", run)
    assert r.rc == 2 and "other settings (preset)" in r.err and _files(run) == before, r.err
    r = _pretrain("--dense", "--max-steps", 6, "--output-dir", run)
    assert r.rc == 2 and _files(run) == before
    r = _pretrain("--preset", "small", "--max-steps", 1, "--output-dir", run, "--overwrite")
    assert r.rc == 0 and '"step": 1' in r.out, r.err[-2000:]


@pytest.mark.parametrize("damage", ["plain.pt", "trainer_rank0.pt", "truncate"])
def test_a_damaged_latest_checkpoint_falls_back(runs: Path, tmp_path: Path, damage: str) -> None:
    run = _copy_run(runs / "pt", tmp_path / "pt")
    step4 = run / "checkpoints" / "step_00000004"
    if damage == "truncate":
        data = (step4 / "plain.pt").read_bytes()
        (step4 / "plain.pt").write_bytes(data[: len(data) // 2])
    else:
        (step4 / damage).unlink()
    r = _pretrain("--max-steps", 4, "--output-dir", run)  # the run's own schedule (4 steps), continued from step 2
    assert r.rc == 0, r.err[-2000:]
    assert "skipped damaged checkpoint(s) step_00000004" in r.err and "resumed from" in r.out
    assert "at step 2" in r.out and '"step": 4' in r.out
    # nothing intact at all: one line, no traceback
    for step in (run / "checkpoints").glob("step_*"):
        (step / "trainer_rank0.pt").unlink(missing_ok=True)
    r = _pretrain("--max-steps", 6, "--output-dir", run)
    assert r.rc == 2 and "no intact checkpoint" in r.err, r.err[-1500:]


def test_resume_of_a_step_without_its_marker_is_refused(runs: Path, tmp_path: Path) -> None:
    run = _copy_run(runs / "pt", tmp_path / "pt")
    step4 = run / "checkpoints" / "step_00000004"
    (step4 / "complete").unlink()  # `latest` still names it
    r = _pretrain("--max-steps", 6, "--output-dir", run, "--resume", step4)
    assert r.rc == 2 and "no 'complete' marker" in r.err, r.err[-1500:]


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


def test_zero3_layout_needs_every_ranks_model_states(tmp_path: Path) -> None:
    """ZeRO-3 writes one model-states file per rank: a marked checkpoint missing rank 1's is damaged (resume falls
    back to an older one) instead of failing inside DeepSpeed's load."""
    from skillnet.training.checkpoint import checkpoint_problem, mark_complete

    d = tmp_path / "checkpoints" / "step_00000002"
    d.mkdir(parents=True)
    for r in range(2):
        torch.save({"step": 2, "world_size": 2}, d / f"trainer_rank{r}.pt")
        torch.save({}, d / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
        torch.save({}, d / f"zero_pp_rank_{r}_mp_rank_00_model_states.pt")
    mark_complete(d, 2)
    assert checkpoint_problem(d) is None
    (d / "zero_pp_rank_1_mp_rank_00_model_states.pt").unlink()
    assert "rank 1's DeepSpeed model states are missing" in (checkpoint_problem(d) or "")


# ---- fine-tuning -----------------------------------------------------------------------------------------
def test_finetune_leaves_a_finished_run_and_refuses_another(ft_run: Path, tmp_path: Path) -> None:
    ft = _copy_run(ft_run, tmp_path / "ft")
    before = _files(ft)
    r = _finetune("--output-dir", ft, "--max-steps", 2)  # the same configuration, finished: nothing changes
    assert r.rc == 0 and "nothing to do" in r.err and _files(ft) == before
    r = _finetune("--output-dir", ft, "--max-steps", 2, "--seed", 1)  # another run: refused
    assert r.rc == 2 and "other settings" in r.err and _files(ft) == before
    (tmp_path / "f").write_text("x")
    r = _finetune("--output-dir", tmp_path / "f", "--max-steps", 2)
    assert r.rc == 2 and "is a file" in r.err
    r = _finetune("--output-dir", ft, "--max-steps", 1, "--seed", 1, "--overwrite")
    assert r.rc == 0 and json.loads((ft / "results.json").read_text()) and _files(ft) != before


# ---- data_prep -------------------------------------------------------------------------------------------
def test_data_prep_build_refuses_another_build_and_empty_input(tmp_path: Path) -> None:
    dp = ["build", "--no-progress", "--unit-bytes", "40"]
    a, b, empty, o = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "empty.txt", tmp_path / "o"
    a.write_text("第一句。第二句！\n另一个文档。很好。\n" * 8, encoding="utf-8")
    b.write_text("完全不同的文本。\n", encoding="utf-8")
    empty.write_text("", encoding="utf-8")
    assert _data_prep(*dp, a, "--out", o).rc == 0
    assert len(list(o.glob("shard-*.bin"))) > 1
    before = _files(o)
    r = _data_prep(*dp, b, "--out", o)
    assert r.rc == 2 and "--overwrite" in r.err and _files(o) == before
    r = _data_prep(*dp, a, "--out", o)  # the same build again: continues, keeps the shards
    assert r.rc == 0 and _files(o).keys() == before.keys()
    r = _data_prep(*dp, b, "--out", o, "--overwrite")
    assert r.rc == 0 and len(list(o.glob("shard-*.bin"))) == 1  # no stale shard left
    r = _data_prep(*dp, empty, "--out", tmp_path / "e")
    assert r.rc == 1 and "no document was kept" in r.err
    r = _data_prep(*dp, a, "--out", tmp_path / "t", "--max-doc-bytes", 0)
    assert r.rc == 2 and "--max-doc-bytes 0: must be > 0" in r.err
    r = _data_prep(*dp, a, "--out", a)
    assert r.rc == 2 and "is a file" in r.err


def test_data_prep_vocab_tokenizer_corpus_and_report_never_clobber(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    assert _data_prep("sample-corpus", "--out", corpus, "--max-docs", 40).rc == 0
    assert _data_prep("sample-corpus", "--out", corpus, "--max-docs", 30).rc == 0  # its own file: replaced
    mine = tmp_path / "notes.txt"
    mine.write_text("my own notes\n", encoding="utf-8")
    r = _data_prep("sample-corpus", "--out", mine)
    assert r.rc == 2 and "--overwrite" in r.err and mine.read_text(encoding="utf-8") == "my own notes\n"
    assert _data_prep("sample-corpus", "--out", tmp_path / "c2.txt", "--max-docs", 0).rc == 2
    for cmd, extra in (("vocab", []), ("train-tokenizer", ["--vocab-size", "300", "--min-frequency", "1"])):
        own = tmp_path / f"own_{cmd}"
        own.mkdir()
        (own / "vocab.txt").write_text("[PAD]\nmine\n", encoding="utf-8")
        r = _data_prep(cmd, corpus, *extra, "--out", own)
        assert r.rc == 2 and "--overwrite" in r.err and (own / "vocab.txt").read_text() == "[PAD]\nmine\n", r.err
        out = tmp_path / f"new_{cmd}"
        assert _data_prep(cmd, corpus, *extra, "--out", out).rc == 0
        assert _data_prep(cmd, corpus, *extra, "--out", out).rc == 0  # the same run again: redone
        assert _data_prep(cmd, corpus, *extra, "--out", own, "--overwrite").rc == 0
        assert (own / "vocab.txt").read_text() != "[PAD]\nmine\n"
    report = tmp_path / "report.json"
    report.write_text('{"mine": 1}', encoding="utf-8")
    r = _data_prep("build", corpus, "--out", tmp_path / "shards", "--no-progress", "--report-json", report)
    assert r.rc == 2 and "--report-json" in r.err and not (tmp_path / "shards").exists()
    r = _data_prep("build", corpus, "--out", tmp_path / "shards", "--no-progress", "--report-json", tmp_path / "r2.json")
    assert r.rc == 0 and json.loads((tmp_path / "r2.json").read_text()).keys() == {"counts", "bytes", "examples"}
    r = _data_prep("build", corpus, "--out", tmp_path / "shards", "--no-progress", "--report-json", tmp_path / "r2.json")
    assert r.rc == 0  # its own report of the same build: rewritten


# ---- the other commands: task conversion, predict, compare, the reproduction ------------------------------
def test_task_convert_claims_its_folder(tmp_path: Path) -> None:
    from skillnet.data_prep.tasks.__main__ import main

    src = tmp_path / "in.json"
    src.write_text("".join(json.dumps({"sentence": f"第{i}句", "label": str(i % 2)}) + "\n" for i in range(40)))
    conv = ["convert", "chnsenticorp", "--input", src]
    (tmp_path / "afile").write_text("x")
    rc, err, _ = _main(main, [*conv, "--out", tmp_path / "afile"])
    assert rc == 2 and "is a file" in err
    other = tmp_path / "other"
    other.mkdir()
    (other / "train.jsonl").write_text("keep me")
    rc, err, _ = _main(main, [*conv, "--out", other])
    assert rc == 2 and "--overwrite" in err and (other / "train.jsonl").read_text() == "keep me"
    out = tmp_path / "task"
    assert _main(main, [*conv, "--out", out])[0] == 0
    before = _files(out)
    rc, err, _ = _main(main, [*conv, "--out", out])  # the same conversion again: rewritten, said so
    assert rc == 0 and "replacing" in err and _files(out) == before
    rc, err, _ = _main(main, [*conv, "--out", out, "--seed", "3"])
    assert rc == 2 and "other settings (seed)" in err and _files(out) == before
    rc, err, _ = _main(main, ["convert", "chnsenticorp", "--input", f"train={src}", "--out", out, "--overwrite"])
    assert rc == 0 and sorted(p.name for p in out.iterdir() if p.suffix) == [".skillnet_output.json", "task.json",
                                                                             "train.jsonl"]  # no stale dev/test
    (tmp_path / "empty.json").write_text("")
    rc, err, _ = _main(main, ["convert", "chnsenticorp", "--input", tmp_path / "empty.json", "--out", tmp_path / "e"],
                    )
    assert rc == 1 and "no record" in err
    for opt, value, rule in [("--max-examples", "0", "must be >= 1"), ("--max-eval-examples", "-1", "must be >= 0"),
                             ("--clean-ratio", "2", "must be in [0, 1]"), ("--max-chars", "0", "must be >= 1"),
                             ("--negatives", "0", "must be >= 1")]:
        rc, err, _ = _main(main, [*conv, "--out", tmp_path / "t", opt, value])
        assert rc == 2 and f"{opt} {value}" in err and rule in err, err
    assert not (tmp_path / "t").exists()


def test_predict_never_clobbers(ft_run: Path, tmp_path: Path) -> None:
    from skillnet.finetune.predict import main

    src = tmp_path / "in.jsonl"
    src.write_text(json.dumps({"text": "很好", "task": "sentiment"}, ensure_ascii=False) + "\n")
    text = src.read_text()
    pred = ["--model", ft_run / "export", "--input", src, "--no-progress"]
    for extra in (["--output", src], ["--output", src, "--overwrite"]):  # its own input: refused, always
        rc, err, _ = _main(main, [*pred, *extra])
        assert rc == 2 and "input" in err and src.read_text() == text, err
    notes = tmp_path / "notes.jsonl"
    notes.write_text("keep me\n")
    rc, err, _ = _main(main, [*pred, "--output", notes])
    assert rc == 2 and "--overwrite" in err and notes.read_text() == "keep me\n"
    out = tmp_path / "out.jsonl"
    assert _main(main, [*pred, "--output", out])[0] == 0
    assert _main(main, [*pred, "--output", out])[0] == 0  # its own predictions: replaced
    assert "prediction" in json.loads(out.read_text())
    assert _main(main, [*pred, "--output", notes, "--overwrite"])[0] == 0 and "prediction" in notes.read_text()
    rc, err, _ = _main(main, [*pred, "--output", tmp_path])
    assert rc == 2 and "is a folder" in err
    rc, err, _ = _main(main, [*pred, "--output", tmp_path / "o2.jsonl", "--batch-size", "0"])
    assert rc == 2 and "--batch-size 0: must be >= 1" in err
    rc, err, _ = _main(main, ["--model", ft_run / "export", "--input", tmp_path / "missing.jsonl", "--output",
                           tmp_path / "o3.jsonl"])
    assert rc == 2 and "missing.jsonl" in err
    assert not (tmp_path / "o2.jsonl").exists() and not (tmp_path / "o3.jsonl").exists()


def test_compare_claims_its_folder_and_report(tmp_path: Path) -> None:
    from skillnet.finetune.compare import main

    cmp = ["--config", FT_CONFIG, "--methods", "skillnet", "--seeds", "0", "--no-plots", "--dry-run"]
    (tmp_path / "afile").write_text("x")
    rc, err, _ = _main(main, [*cmp, "--output-dir", tmp_path / "afile"])
    assert rc == 2 and "is a file" in err
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    rc, err, _ = _main(main, [*cmp, "--output-dir", other])
    assert rc == 2 and _files(other) == {"notes.txt": b"keep me"}, err
    rc, err, _ = _main(main, [*cmp, "--output-dir", tmp_path / "c", "--report", tmp_path / "afile"])
    assert rc == 2 and "--report" in err and (tmp_path / "afile").read_text() == "x"
    assert _main(main, [*cmp, "--output-dir", tmp_path / "c"])[0] == 0
    assert _main(main, [*cmp, "--output-dir", tmp_path / "c"])[0] == 0  # its own folder: resumed
    old = tmp_path / "before_markers"  # a comparison written before folders were marked still resumes
    (old / "skillnet" / "seed0").mkdir(parents=True)
    (old / "skillnet" / "seed0" / "run.log").write_text("$ python -m skillnet.finetune.run ...\n")
    assert _main(main, [*cmp, "--output-dir", old])[0] == 0
    for opt, value, rule in [("--nproc", "0", "must be >= 1"), ("--threads", "0", "must be >= 1"),
                             ("--max-steps", "0", "must be >= 1"), ("--jobs", "0", "must be >= 1"),
                             ("--seeds", "-1", "must be >= 0")]:
        rc, err, _ = _main(main, [*cmp, "--output-dir", tmp_path / "d", opt, value])
        assert rc == 2 and f"{opt} {value}: {rule}" in err, err
    rc, err, _ = _main(main, [*cmp, "--output-dir", tmp_path / "d", "--nproc", "2", "--ds-config",
                              tmp_path / "missing.json"])  # every run would fail on it, one by one
    assert rc == 2 and "--ds-config" in err and "missing.json" in err, err
    assert not (tmp_path / "d").exists()


def test_reproduce_claims_its_folder_and_checks_options(tmp_path: Path) -> None:
    from skillnet.experiments.__main__ import main

    rep = ["--quick", "--dry-run", "--stages", "corpus"]
    (tmp_path / "afile").write_text("x")
    rc, err, _ = _main(main, [*rep, "--out", tmp_path / "afile"])
    assert rc == 2 and "is a file" in err
    other = tmp_path / "other"
    other.mkdir()
    (other / "notes.txt").write_text("keep me")
    rc, err, _ = _main(main, [*rep, "--out", other])
    assert rc == 2 and "Pick another folder" in err and _files(other) == {"notes.txt": b"keep me"}, err
    assert _main(main, [*rep, "--out", tmp_path / "r"])[0] == 0
    assert _main(main, [*rep, "--out", tmp_path / "r"])[0] == 0  # its own: continued
    old = tmp_path / "before_markers"  # a reproduction written before folders were marked still resumes
    (old / "stages").mkdir(parents=True)
    (old / "stages" / "corpus.json").write_text(json.dumps({"stage": "corpus", "seconds": 1.0}))
    assert _main(main, [*rep, "--out", old])[0] == 0
    rc, err, _ = _main(main, ["--profile", "full", "--dry-run", "--stages", "corpus", "--out", tmp_path / "r"])
    assert rc == 2 and "other settings (profile)" in err
    rc, err, _ = _main(main, [*rep, "--out", tmp_path / "r2", "--report", tmp_path / "afile"])
    assert rc == 2 and "--report" in err and (tmp_path / "afile").read_text() == "x"
    rc, err, _ = _main(main, ["--estimate", "--write", tmp_path / "afile"])
    assert rc == 2 and "--write" in err and (tmp_path / "afile").read_text() == "x"
    rc, err, _ = _main(main, ["--estimate", "--write", tmp_path])
    assert rc == 2 and "is a folder" in err
    for opt, value in [("--gpus", "0"), ("--gpus", "-2"), ("--jobs", "0"), ("--threads", "-1")]:
        rc, err, _ = _main(main, [*rep, "--out", tmp_path / "d", opt, value])
        assert rc == 2 and f"{opt} {value}: must be >= 1" in err, err
    assert not (tmp_path / "d").exists()


def test_a_second_reproduction_in_the_same_folder_is_refused_while_the_first_runs(tmp_path, capsys):
    """Two reproductions writing one folder (a second terminal, a rerun of a job still running) would run the
    same stages at once; the second is refused in one line naming the first's pid, and runs once it is gone."""
    import multiprocessing as mp

    from skillnet.common.outputs import exclusive
    from skillnet.experiments.__main__ import main

    out = tmp_path / "rq"
    args = ["--quick", "--out", str(out), "--stages", "report", "--report", str(tmp_path / "r.md")]
    ctx = mp.get_context("spawn")
    held, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold_lock, args=(str(out), held, release))
    holder.start()
    try:
        assert held.wait(60)
        capsys.readouterr()
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: --out {out}: another reproduction (pid {holder.pid}) is writing it now")
        assert "\n" not in err
        assert main([*args, "--dry-run"]) == 2  # it writes the stages' configs, which the running one reads
    finally:
        release.set()
        holder.join(60)
    assert main(args) == 0  # the lock went with the first process
    with exclusive(out, option="--out", command="reproduction"):  # and this one released it when it finished
        pass


def test_a_killed_reproduction_leaves_the_folder_locked_while_its_stage_command_runs(tmp_path: Path) -> None:
    """A reproduction killed (SIGKILL, an out-of-memory kill, a closed session) while a stage runs leaves that
    stage's command running and writing; a rerun started then would run the same stage beside it. The command
    holds the folder's lock too, so the rerun is refused in one line until it ends."""
    import signal
    import subprocess
    import sys
    import time

    from skillnet.common.outputs import OutputError, exclusive

    out, started = tmp_path / "rq", tmp_path / "child.pid"
    stage = f"import os, time; open({str(started)!r}, 'w').write(str(os.getpid())); time.sleep(120)"
    parent_code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from skillnet.experiments.profiles import PROFILES\n"
        "from skillnet.experiments.runner import Runner\n"
        "from skillnet.common.outputs import exclusive\n"
        f"out = Path({str(out)!r})\n"
        "with exclusive(out, option='--out', command='reproduction') as fd:\n"
        "    r = Runner(out, PROFILES['quick'], lock_fd=fd)\n"
        "    r.stage = 'stage'\n"
        f"    r.run([sys.executable, '-c', {stage!r}])\n")
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    child_pid = None
    try:
        deadline = time.time() + 60
        while not (started.is_file() and started.read_text()) and time.time() < deadline:
            assert parent.poll() is None, "the reproduction ended before its stage command started"
            time.sleep(0.1)
        child_pid = int(started.read_text())
        parent.send_signal(signal.SIGKILL)
        parent.wait(30)
        with pytest.raises(OutputError) as e, exclusive(out, option="--out", command="reproduction"):
            pass
        msg = str(e.value)
        assert f"pid {parent.pid}, not running here; a command it started may still run" in msg and "\n" not in msg
    finally:
        if parent.poll() is None:
            parent.kill()
        if child_pid is not None:
            os.kill(child_pid, signal.SIGKILL)
    deadline = time.time() + 30
    while time.time() < deadline:  # the killed command's descriptor closes as it exits
        try:
            with exclusive(out, option="--out", command="reproduction"):
                break
        except OutputError:
            time.sleep(0.1)
    else:
        raise AssertionError("the lock outlived every process holding it")


def test_a_dry_run_of_a_redo_forgets_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from skillnet.experiments.__main__ import main

    out = tmp_path / "rq"
    args = ["--quick", "--out", str(out), "--stages", "corpus"]
    record = out / "stages" / "corpus.json"
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({"stage": "corpus", "seconds": 1.0}))
    assert main([*args, "--dry-run"]) == 0 and "done before" in capsys.readouterr().out
    assert main([*args, "--dry-run", "--redo", "corpus"]) == 0
    assert "data_prep sample-corpus" in capsys.readouterr().out  # the plan shows the stage's commands
    assert record.is_file()  # and the stage stays done


def _hold_lock(out: str, held, release) -> None:  # noqa: ANN001
    from skillnet.common.outputs import exclusive

    with exclusive(out, option="--out", command="reproduction"):
        held.set()
        release.wait(60)


# ---- degenerate options ----------------------------------------------------------------------------------
@pytest.mark.parametrize("run, argv, message", [
    # one rule for the flag and the config file's field (training.config.TrainConfig): lr 0 is a frozen control run
    (_pretrain, ["--lr", "-1"], "--lr -1.0: must be >= 0"),
    (_pretrain, ["--max-steps", "0"], "--max-steps 0: must be >= 1"),
    (_finetune, ["--lr", "-1"], "--lr -1.0: must be >= 0"),
    (_finetune, ["--max-steps", "0"], "--max-steps 0: must be >= 1"),
    (_pretrain, ["--seed", "-1"], "--seed -1: must be >= 0"),  # numpy's generators take no negative seed
    (_finetune, ["--seed", "-1"], "--seed -1: must be >= 0"),
])
def test_degenerate_options_get_one_line(tmp_path: Path, run: Callable[..., Run], argv: list[str],
                                         message: str) -> None:
    r = run(*argv, "--output-dir", tmp_path / "out")
    assert r.rc == 2 and r.err.strip().splitlines()[-1].endswith(message), r.err[-1500:]  # argparse: usage, error
    assert not any(tmp_path.iterdir())  # nothing written


def render_table() -> str:
    rows = "\n".join(f"| {c} | {s} | {w} |" for c, s, w in CASES)
    return ("<!-- written by tests/test_output_safety.py from its CASES (SKILLNET_WRITE_DOCS=1 to rewrite) -->\n"
            "# What each command does with existing output, damaged checkpoints and bad options\n\n"
            "Every command that writes a folder marks it (`.skillnet_output.json`: the command and the settings "
            "that make two runs the same one, common/outputs.py). It resumes or replaces only its own output "
            "of the same settings; anything else is refused in one line unless `--overwrite` says otherwise. "
            "Each row is checked by a test in tests/test_output_safety.py.\n\n"
            "| command | situation | what it does |\n| --- | --- | --- |\n" + rows + "\n")


# What follows this line in docs/safety.md is written by hand (what loading trusts, what a save survives).
HAND_WRITTEN = "<!-- written by hand below this line -->\n"


def test_docs_table_is_written_from_the_cases() -> None:
    doc = REPO / "docs" / "safety.md"
    text = doc.read_text(encoding="utf-8")
    tail = text[text.index(HAND_WRITTEN):] if HAND_WRITTEN in text else ""
    if os.environ.get("SKILLNET_WRITE_DOCS"):
        doc.write_text(render_table() + ("\n" + tail if tail else ""), encoding="utf-8")
        text = doc.read_text(encoding="utf-8")
    assert text == render_table() + ("\n" + tail if tail else ""), "docs/safety.md is stale: SKILLNET_WRITE_DOCS=1"
