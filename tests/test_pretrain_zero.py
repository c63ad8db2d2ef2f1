"""Multi-rank DeepSpeed runs through the real launcher on CPU (2 ranks, fp32, tiny shards).

Acceptance (issue 4): ZeRO-2 pre-training for a few dozen steps lowers the MLM loss and leaves both
ranks with identical weights; 2N straight vs N + SIGTERM + N gives the same losses and final weights
for ZeRO-2 and ZeRO-1 (the ZeRO-1 interruption signals the whole process group, launcher included).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.fixtures.pretrain.helpers import (
    REPO,
    build_shards,
    launch,
    losses_by_step,
    read_log,
)

pytestmark = pytest.mark.slow

N = 12  # steps before the interruption; the straight run does 2N


@pytest.fixture(scope="module")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_shards(tmp_path_factory.mktemp("pt_shards"))


def _args(shards: Path, out: Path, ds_config: str, max_steps: int, *extra: str) -> list[str]:
    return [
        "--ds_config",
        ds_config,
        "--shards",
        str(shards),
        "--preset",
        "tiny",
        "--max_seq_len",
        "32",
        "--max_steps",
        str(max_steps),
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


def _weights(path: Path) -> dict[str, torch.Tensor]:
    return load_file(str(path))


def _straight_and_split(
    shards: Path, tmp: Path, ds_config: str, group_signal: bool
) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """2N straight; N then SIGTERM; resume to 2N.

    group_signal=False: every rank raises SIGTERM in itself after step N. True: rank 0 sends SIGTERM to
    the whole process group after step N (the `deepspeed` runner, launch.py and all ranks), as Slurm's
    scancel / time limit and Ctrl-C do; the launcher then also terminates its children.
    """
    straight, split = tmp / "straight", tmp / "split"
    launch("pretrain/run.py", _args(shards, straight, ds_config, 2 * N))
    hook = ["--sigterm_at_step", str(N)] + (["--sigterm_group"] if group_signal else [])
    first = launch("pretrain/run.py", _args(shards, split, ds_config, 2 * N, *hook), check=not group_signal)
    assert '"stopped_by_signal": true' in first.stdout, first.stdout[-2000:] + first.stderr[-3000:]
    root = split / "checkpoints"
    assert (root / "latest").read_text().strip() == f"step_{N:08d}"
    assert (root / f"step_{N:08d}" / "trainer_rank1.pt").is_file()
    launch("pretrain/run.py", _args(shards, split, ds_config, 2 * N))
    return straight, split, first


def _assert_same_run(straight: Path, split: Path) -> None:
    a, b = losses_by_step(straight), losses_by_step(split)
    assert sorted(a) == list(range(1, 2 * N + 1)) and sorted(b) == sorted(a)
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5, abs=1e-6), f"loss differs at step {step}"
    wa, wb = _weights(straight / "rank0_weights.safetensors"), _weights(split / "rank0_weights.safetensors")
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=1e-5, atol=1e-6, msg=k)


def test_zero2_two_ranks_learns_resumes_and_keeps_replicas_identical(shards: Path, tmp_path: Path) -> None:
    straight, split, _ = _straight_and_split(shards, tmp_path, "ds_configs/cpu_fp32.json", group_signal=False)
    recs = read_log(straight)
    mlm = [r["mlm/loss"] for r in recs if "mlm/loss" in r]
    assert len(mlm) >= 8 and "nsp/loss" in json.dumps(recs), "both objectives must be sampled"
    first, last = sum(mlm[:3]) / 3, sum(mlm[-3:]) / 3
    assert last < first - 0.5, f"MLM loss did not decrease: first {mlm[:3]} last {mlm[-3:]}"
    assert all("tokens_per_s" in r and "lr" in r and "grad_norm" in r for r in recs)
    assert any(r.get("skill_grad_norm/s2", 0) > 0 for r in recs)
    # Both replicas hold identical weights after ZeRO-2.
    w0, w1 = (
        _weights(straight / "rank0_weights.safetensors"),
        _weights(straight / "rank1_weights.safetensors"),
    )
    assert w0.keys() == w1.keys()
    for k in w0:
        assert torch.equal(w0[k], w1[k]), f"ranks disagree on {k}"
    _assert_same_run(straight, split)


def test_zero1_resume_after_process_group_sigterm_matches_straight_run(shards: Path, tmp_path: Path) -> None:
    # zero1.json with micro batch 4 x 2 accumulation steps: also covers gradient accumulation under DeepSpeed.
    ds = json.loads((REPO / "ds_configs" / "zero1.json").read_text())
    ds.update(train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2)
    cfg = tmp_path / "zero1_accum2.json"
    cfg.write_text(json.dumps(ds))
    straight, split, first = _straight_and_split(shards, tmp_path, str(cfg), group_signal=True)
    assert '"grad_accum": 2' in first.stdout and '"zero_stage": 1' in first.stdout
    _assert_same_run(straight, split)
