"""`python pretrain/run.py --ds-config ...` without a launcher (an interactive node, a debugger): it runs as
one rank and says so in one line, instead of DeepSpeed's MPI discovery dying with an mpi4py traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.fixtures.pretrain.helpers import REPO, subprocess_env

LAUNCHER_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMPI_COMM_WORLD_RANK", "PMI_RANK")


def test_plain_python_with_a_ds_config_runs_as_one_rank(tmp_path: Path) -> None:
    env = {k: v for k, v in subprocess_env().items() if k not in LAUNCHER_VARS and not k.startswith("SLURM_")}
    r = subprocess.run(
        [sys.executable, str(REPO / "pretrain" / "run.py"), "--ds-config", str(REPO / "ds_configs" / "cpu_fp32.json"),
         "--synthetic", "64", "--preset", "tiny", "--max-steps", "2", "--output-dir", str(tmp_path / "run"),
         "--no-progress", "--no-tensorboard"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "mpi4py" not in r.stderr
    assert "[skillnet] no launcher: running as one rank" in r.stderr
    assert '"world_size": 1' in r.stdout and '"zero_stage": 2' in r.stdout
    assert (tmp_path / "run" / "checkpoints" / "step_00000002" / "complete").is_file()
    assert "RANK" not in os.environ  # the test process itself untouched
