"""Multi-rank DeepSpeed runs through the real launcher on CPU (2 ranks, fp32, tiny shards).

Acceptance: ZeRO-2 pre-training for a few dozen steps lowers the MLM loss and leaves both
ranks with identical weights; 2N straight vs N + SIGTERM + N gives the same losses and final weights
for ZeRO-2 and ZeRO-1 (the ZeRO-1 interruption signals the whole process group, launcher included).
"""

from __future__ import annotations

import glob
import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tests.fixtures.pretrain.helpers import (
    REPO,
    launch,
    losses_by_step,
    read_log,
)
from tests.fixtures.warm import launch_fixture

pytestmark = pytest.mark.slow

N = 12  # steps before the interruption; the straight run does 2N


@pytest.fixture(scope="module")
def shards(default_shards: Path) -> Path:
    return default_shards


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


CPU_FP32 = "ds_configs/cpu_fp32.json"
# pretrain/run.py with a SIGTERM at a given step, injected from the test side: run.py has no flag for it.
SIGTERM_RUN = "tests/fixtures/pretrain/sigterm_run.py"


SHM = "/dev/shm/deepspeed_allreduce_buffer_*"


@pytest.fixture(scope="module")
def straight_fp32(shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """2N steps straight on 2 ranks with ds_configs/cpu_fp32.json: the reference of several tests (its ranks
    start warm, tests/fixtures/warm.py: the runs compared with it are the user's `deepspeed` command). Also
    records the shared-memory files the run's ranks left behind (``shm_left.json``): those of its own port, so
    that another launch on this machine is not counted, and before the launcher's own clean-up."""
    from tests.fixtures.pretrain.helpers import free_port

    out = tmp_path_factory.mktemp("straight") / "run"
    port = free_port()
    launch_fixture("pretrain/run.py", _args(shards, out, CPU_FP32, 2 * N), port=port, remove_shm=False)
    left = sorted(glob.glob(SHM.replace("*", f"*_127.0.0.1_{port}_*")))
    for path in left:
        Path(path).unlink(missing_ok=True)
    (out / "shm_left.json").write_text(json.dumps(left))
    return out


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this OS")
def test_a_two_rank_launch_leaves_no_shared_memory_buffers(straight_fp32: Path) -> None:
    """DeepSpeed's CPU shared-memory allreduce creates one 66 MB /dev/shm/deepspeed_allreduce_buffer_* file per
    rank and launch and never removes it; a day of CPU launches filled a 24 GB /dev/shm and got a process
    OOM-killed. The trainer removes its rank's file once every rank has finished training."""
    assert json.loads((straight_fp32 / "shm_left.json").read_text()) == []


def _straight_and_split(
    shards: Path, tmp: Path, ds_config: str, group_signal: bool, straight: Path | None = None,
    start: Callable[..., subprocess.CompletedProcess[str]] = launch,
    resume: Callable[..., subprocess.CompletedProcess[str]] = launch_fixture, extra: tuple[str, ...] = (),
) -> tuple[Path, Path, subprocess.CompletedProcess[str]]:
    """2N straight; N then SIGTERM; resume to 2N.

    group_signal=False: every rank raises SIGTERM in itself after step N. True: rank 0 sends SIGTERM to
    the whole process group after step N (the `deepspeed` runner, launch.py and all ranks), as Slurm's
    scancel / time limit and Ctrl-C do; the launcher then also terminates its children.
    The straight run is only the reference: its ranks start warm (tests/fixtures/warm.py); the interrupted
    run is started by ``start`` (the user's `deepspeed` command unless the caller says) and the resumed one by
    ``resume`` (warm ranks: the killed-rank test below reruns through `deepspeed`).
    """
    split = tmp / "split"
    if straight is None:
        straight = tmp / "straight"
        launch_fixture("pretrain/run.py", _args(shards, straight, ds_config, 2 * N, *extra))
    fault = ["--sigterm-at-step", str(N)] + (["--sigterm-group"] if group_signal else [])
    first = start(SIGTERM_RUN, [*fault, *_args(shards, split, ds_config, 2 * N, *extra)], check=not group_signal)
    assert '"stopped_by_signal": true' in first.stdout, first.stdout[-2000:] + first.stderr[-3000:]
    root = split / "checkpoints"
    assert (root / "latest").read_text().strip() == f"step_{N:08d}"
    assert (root / f"step_{N:08d}" / "trainer_rank1.pt").is_file()
    resume("pretrain/run.py", _args(shards, split, ds_config, 2 * N, *extra))
    return straight, split, first


def _assert_same_run(straight: Path, split: Path, skip: str | None = None) -> None:
    """Same losses at every step and the same final weights (``skip``: a suffix of weights left out)."""
    a, b = losses_by_step(straight), losses_by_step(split)
    assert sorted(a) == list(range(1, 2 * N + 1)) and sorted(b) == sorted(a)
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5, abs=1e-6), f"loss differs at step {step}"
    wa, wb = _weights(straight / "rank0_weights.safetensors"), _weights(split / "rank0_weights.safetensors")
    for k in wa:
        if skip is None or not k.endswith(skip):
            torch.testing.assert_close(wb[k], wa[k], rtol=1e-5, atol=1e-6, msg=k)


def test_activation_checkpointing_on_zero2_ranks_trains_as_without(shards: Path, tmp_path: Path,
                                                                  straight_fp32: Path) -> None:
    """--gradient-checkpointing on 2 ZeRO-2 ranks: the straight run's losses and final weights
    (the tiny preset has dropout on: the recomputation replays the same masks)."""
    out = tmp_path / "ckpt"
    r = launch_fixture("pretrain/run.py", _args(shards, out, CPU_FP32, 2 * N, "--gradient_checkpointing"))
    assert "activation checkpointing on: every layer recomputed in the backward pass [flag]" in r.stdout
    _assert_same_run(straight_fp32, out)


def test_zero2_two_ranks_learns_resumes_and_keeps_replicas_identical(
    shards: Path, tmp_path: Path, straight_fp32: Path
) -> None:
    # Each rank stops itself (no launcher in the signal's path): warm ranks. The ZeRO-1 test below interrupts
    # the user's `deepspeed` command as a whole.
    straight, split, _ = _straight_and_split(shards, tmp_path, CPU_FP32, group_signal=False, straight=straight_fp32,
                                             start=launch_fixture)
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


def test_packed_bart_denoising_on_zero2_ranks_resumes_exactly_and_follows_the_unpacked_run(
    shards: Path, tmp_path: Path
) -> None:
    """BART denoising packs both sides by default: 2N straight and N + SIGTERM + N agree exactly, and with
    dropout off the packed run follows the same losses as --no-packing while computing fewer slots."""
    nodrop = tmp_path / "nodrop.json"
    nodrop.write_text(json.dumps({"dropout": 0.0, "attention_dropout": 0.0, "activation_dropout": 0.0}))
    bart = ("--arch", "bart", "--model_config", str(nodrop))
    straight, split, _ = _straight_and_split(shards, tmp_path, CPU_FP32, group_signal=False, start=launch_fixture,
                                             extra=bart)
    r = launch_fixture("pretrain/run.py", _args(shards, tmp_path / "unpacked", CPU_FP32, 2 * N, *bart, "--no-packing"))
    assert "one sample per row [--no-packing]" in r.stdout
    _assert_same_run(straight, split)
    # A key bias shifts every score of a query alike, so softmax cancels it: its gradient is rounding noise
    # (~1e-9) that differs with the layout's summation order, and Adam scales any noise to a full step.
    _assert_same_run(straight, tmp_path / "unpacked", skip="k_proj.bias")
    share = {name: [rec["denoise/real_token_share"] for rec in read_log(tmp_path / name)]
             for name in ("straight", "unpacked")}
    # per step: packed where that saves slots, as it was otherwise
    assert all(k >= u for k, u in zip(share["straight"], share["unpacked"]))
    assert sum(share["straight"]) > sum(share["unpacked"])


def test_zero1_resume_after_process_group_sigterm_matches_straight_run(shards: Path, tmp_path: Path) -> None:
    # zero1.json with micro batch 4 x 2 accumulation steps: also covers gradient accumulation under DeepSpeed.
    ds = json.loads((REPO / "ds_configs" / "zero1.json").read_text())
    ds.update(train_micro_batch_size_per_gpu=4, gradient_accumulation_steps=2)
    cfg = tmp_path / "zero1_accum2.json"
    cfg.write_text(json.dumps(ds))
    straight, split, first = _straight_and_split(shards, tmp_path, str(cfg), group_signal=True)
    assert '"grad_accum": 2' in first.stdout and '"zero_stage": 1' in first.stdout
    _assert_same_run(straight, split)


def test_a_killed_rank_ends_the_run_in_bounded_time_and_a_rerun_resumes_exactly(
    shards: Path, tmp_path: Path, straight_fp32: Path
) -> None:
    """SIGKILL one of 2 ranks mid-step (a node lost): the launcher ends the other rank within seconds, not
    at a 30-minute collective timeout, and exits non-zero; rerunning the same command resumes from the last
    complete checkpoint and follows the uninterrupted run's loss path exactly."""
    import os
    import signal
    import time

    import psutil

    from tests.fixtures.pretrain.helpers import free_port, subprocess_env

    straight, killed = straight_fp32, tmp_path / "killed"
    args = _args(shards, killed, CPU_FP32, 2 * N, "--save_every", "4")
    port = free_port()
    cmd = ["deepspeed", "--num_gpus", "2", "--master_port", str(port), "pretrain/run.py", *args]
    proc = subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(), start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 300
        while _last_logged_step(killed) < 6:
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before step 6"
            time.sleep(0.05)
        rank1 = [p for p in psutil.Process(proc.pid).children(recursive=True)
                 if "--local_rank=1" in " ".join(p.cmdline())]
        assert len(rank1) == 1
        os.kill(rank1[0].pid, signal.SIGKILL)
        t0 = time.monotonic()
        proc.wait(timeout=120)
        ended_after = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        # A killed rank never reaches the trainer's end, which removes the run's 66 MB shared-memory buffers.
        for path in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_127.0.0.1_{port}_*"):
            path.unlink(missing_ok=True)
    out = proc.stdout.read() if proc.stdout else ""
    assert proc.returncode != 0, out[-2000:]
    assert ended_after < 45, f"the surviving rank took {ended_after:.0f} s to end"
    print(f"killed rank: launcher exited {proc.returncode} after {ended_after:.1f} s")
    root = killed / "checkpoints"
    last = int((root / "latest").read_text().strip().removeprefix("step_"))
    assert 4 <= last < 2 * N and last % 4 == 0, last
    assert not any((root / f"step_{s:08d}" / "complete").exists() for s in range(last + 1, 2 * N + 1))
    again = launch("pretrain/run.py", args)
    assert "resumed from" in again.stdout + again.stderr
    a, b = losses_by_step(straight), losses_by_step(killed)  # the rerun's records come last and win
    assert sorted(b) == sorted(a)
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5, abs=1e-6), f"loss differs at step {step}"


def _last_logged_step(out_dir: Path) -> int:
    """The newest step in a log.jsonl that is being written (a half-written last line is skipped)."""
    f = out_dir / "log.jsonl"
    steps = [0]
    if f.is_file():
        for line in f.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("split") == "train":
                steps.append(int(rec["step"]))
    return max(steps)


def test_two_simulated_nodes_run_the_job_of_one_node(shards: Path, tmp_path: Path, straight_fp32: Path) -> None:
    """Two "nodes" on this machine, one rank each (DeepSpeed's launcher with --no_ssh and --node_rank, as
    scripts/multinode_local.sh and the Slurm script start it): the same loss at every step and the same
    final weights as one node with 2 ranks."""
    from tests.fixtures.pretrain.helpers import free_port, subprocess_env

    out = tmp_path / "two_nodes"
    env = {**subprocess_env(), "NODES": "2", "RANKS_PER_NODE": "1", "MASTER_PORT": str(free_port())}
    r = subprocess.run(["bash", "scripts/multinode_local.sh", "pretrain/run.py", *_args(shards, out, CPU_FP32, 2 * N)],
                       cwd=REPO, env=env, capture_output=True, text=True, timeout=600, start_new_session=True)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert '"world_size": 2' in r.stdout  # one job of 2 ranks, not two jobs of 1
    _assert_same_run(straight_fp32, out)
