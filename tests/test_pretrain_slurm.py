"""The Slurm path on CPU: the smoke sbatch script under a stand-in `srun` that starts one process per
task with Slurm's variables (SLURM_PROCID, SLURM_LOCALID, SLURM_NTASKS), as real srun does."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.fixtures.pretrain.helpers import REPO, free_port, losses_by_step, subprocess_env

pytestmark = pytest.mark.slow

FAKE_SRUN = """#!/usr/bin/env bash
# stand-in for srun: drop srun options, start SLURM_NTASKS copies of the command, fail if any fails
while [[ "$1" == -* ]]; do shift; done
pids=()
for ((i = 0; i < SLURM_NTASKS; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=$i "$@" &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=$?; done
exit $rc
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
[ "$1 $2" = "show hostnames" ] && echo 127.0.0.1
"""


def test_cpu_smoke_sbatch_runs_two_ranks_under_srun(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    out = tmp_path / "run"
    env = {
        **subprocess_env(),
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "REPO": str(REPO),
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_JOB_ID": "1234",
        "MASTER_PORT": str(free_port()),
        "SLURM_NTASKS": "2",
        "STEPS": "6",
        "OUT": str(out),
    }
    r = subprocess.run(
        ["bash", str(REPO / "scripts/slurm/pretrain_cpu_smoke.sbatch")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert '"world_size": 2' in r.stdout and '"zero_stage": 2' in r.stdout
    assert max(losses_by_step(out)) == 6
    assert (out / "checkpoints" / "latest").read_text().strip() == "step_00000006"
