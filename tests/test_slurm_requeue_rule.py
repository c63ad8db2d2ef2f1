"""The requeue rule of scripts/slurm/pretrain_lib.sh (`finish_or_requeue`), run in bash on a stub run folder:
what the job's end status is once the training has stopped, in the cases that need no Slurm to tell apart.
The real-Slurm runs of the same rule are in tests/test_slurm_real.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.fixtures.pretrain.helpers import REPO

LIB = REPO / "scripts" / "slurm" / "pretrain_lib.sh"
FINAL = "step_00000800"


def finish(tmp_path: Path, status: int, latest: str, cancelled: bool = False) -> subprocess.CompletedProcess:
    out = tmp_path / "out"
    (out / "checkpoints").mkdir(parents=True, exist_ok=True)
    (out / "checkpoints" / "latest").write_text(latest)
    script = (f'source "{LIB}"; OUT="{out}"; MAX_STEPS=800; SLURM_JOB_ID=7; '
              f'{"CANCELLED=1; " if cancelled else ""}finish_or_requeue {status} step_00000440')
    return subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)


def test_a_stop_signal_that_lands_as_the_training_ends_is_a_completed_run(tmp_path: Path) -> None:
    """The stop timer's SIGTERM can reach the launcher after the last step's save (a run that ends a few
    seconds before the stop): the step exits 143 with the final checkpoint complete. That run is done: the job
    ends 0, not FAILED (a real-Slurm run ended FAILED this way)."""
    r = finish(tmp_path, 143, FINAL)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"final checkpoint {FINAL} is complete" in r.stdout


@pytest.mark.parametrize(("status", "cancelled"), [(1, False), (143, True), (0, False)])
def test_other_ends_at_the_final_checkpoint_keep_their_status(tmp_path: Path, status: int, cancelled: bool) -> None:
    """An error after the final save stays an error, a user's scancel stays a cancelled job's status, and a
    clean end stays 0."""
    r = finish(tmp_path, status, FINAL, cancelled)
    assert r.returncode == status, r.stdout + r.stderr
    assert "is complete" not in r.stdout
