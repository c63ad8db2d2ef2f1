"""`python -m skillnet.training.ds_launch` (DeepSpeed's launcher, same arguments; scripts/slurm/pretrain_multinode.sbatch
starts ranks with it) on a stop signal sent to every process, as Slurm sends it to every process of a step: the
launcher neither dies at once (the `deepspeed` runner's exit 143) nor kills the ranks after 30 s
(`deepspeed.launcher.launch`), but waits for them to save and exits with their status."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.pretrain.helpers import REPO, free_port, subprocess_env

pytestmark = pytest.mark.slow  # two DeepSpeed launcher start-ups

RANK = """
import signal, sys, time
from pathlib import Path
out = Path(sys.argv[-1])
def stop(*_):
    time.sleep(4)  # a save longer than the signal's delivery, shorter than the test
    (out / "saved").write_text("ok")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
(out / "ready").write_text("ok")
time.sleep(120)
"""


@pytest.mark.parametrize("launcher", ["ds_launch", "deepspeed"])
def test_the_launcher_waits_for_the_ranks_save_on_a_stop_signal(tmp_path: Path, launcher: str) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    head = [sys.executable, "-m", "skillnet.training.ds_launch"] if launcher == "ds_launch" else ["deepspeed"]
    cmd = [*head, "--num_gpus", "1", "--master_port", str(free_port()), str(script), str(tmp_path)]
    p = subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(), start_new_session=True, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "ready").exists():
        assert p.poll() is None and time.monotonic() < deadline, p.stdout.read() if p.stdout else ""
        time.sleep(0.1)
    os.killpg(p.pid, signal.SIGTERM)  # every process of the "step": runner, node launcher, rank
    rc = p.wait(timeout=60)
    saved_when_launcher_ended = (tmp_path / "saved").exists()
    if launcher == "ds_launch":
        assert rc == 0 and saved_when_launcher_ended, p.stdout.read() if p.stdout else ""
    else:  # DeepSpeed's own runner: gone before the rank's save (what srun would then see as the task's end)
        assert rc != 0 and not saved_when_launcher_ended
        for _ in range(300):  # the orphaned rank still finishes its save: let it, before tmp_path goes
            if (tmp_path / "saved").exists():
                break
            time.sleep(0.1)
