"""The stop path against a kill window (docs/training.md, "Running on Slurm"): on SIGTERM the trainer saves at
once, and a save slower than the window the scheduler (KillWait) or a launcher grants is cut by SIGKILL without
losing the previous checkpoint: the log says, before the save, which checkpoint stays the resume point, and
after it (when it finished) that the new one is; the resumed run names the cut save it skipped.

The slow save is fault injection from this file only: the child process wraps checkpoint.mark_complete (the
last act of a save, after every file is written) with a sleep; nothing in the production code knows of it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.pretrain.helpers import REPO, subprocess_env

# A toy run of tests/test_training_trainer.py: checkpoints every 4 steps, SIGTERM (tests/faults.py) at step 6,
# then a save of step 6 that takes SAVE_DELAY seconds more than its writes.
CHILD = """
import sys, time
from pathlib import Path
from skillnet.training import Trainer
from skillnet.training import checkpoint as C
from tests.faults import SigtermAt
from tests.test_training_trainer import ToyModel, ToySource, _cfg

delay, out, resume = float(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
real = C.mark_complete

def slow_mark_complete(ckpt_dir, step):
    if step == 6:
        time.sleep(delay)
    real(ckpt_dir, step)

C.mark_complete = slow_mark_complete
kw = dict(max_steps=8, log_every=1, save_every=4, keep_last=3, tensorboard=False)
if resume == "resume":
    r = Trainer(ToyModel(), ToySource(8, 1), _cfg(out, resume="auto", **kw)).train()
else:
    r = Trainer(ToyModel(), ToySource(8, 1), _cfg(out, **kw), callbacks=[SigtermAt(6)]).train()
print("END", r.step, r.stop_reason, flush=True)
"""


def _start(delay: float, out: Path, mode: str, log: Path) -> subprocess.Popen[bytes]:
    f = open(log, "wb")  # noqa: SIM115  (the child writes it; closed with the process)
    return subprocess.Popen([sys.executable, "-c", CHILD, str(delay), str(out), mode], cwd=REPO, stdout=f,
                            stderr=subprocess.STDOUT, env=subprocess_env())


def _run_with_kill_window(tmp: Path, delay: float, window: float) -> tuple[str, int]:
    """Start the run; once it announces its stop-save, give it `window` seconds, then SIGKILL it (what Slurm
    does after KillWait). Returns its log and exit status."""
    log = tmp / "stop.log"
    p = _start(delay, tmp / "run", "first", log)
    deadline = time.monotonic() + 120
    while "saving its checkpoint now" not in log.read_text(errors="replace"):
        assert p.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.05)
    try:
        rc = p.wait(timeout=window)
    except subprocess.TimeoutExpired:
        os.kill(p.pid, signal.SIGKILL)
        rc = p.wait()
    return log.read_text(errors="replace"), rc


def _resume(tmp: Path) -> str:
    log = tmp / "resume.log"
    p = _start(0.0, tmp / "run", "resume", log)
    assert p.wait(timeout=120) == 0, log.read_text(errors="replace")[-3000:]
    return log.read_text(errors="replace")


@pytest.mark.parametrize("delay, window, finished", [(0.2, 20.0, True), (60.0, 3.0, False)],
                         ids=["save-inside-window", "save-cut-by-kill"])
def test_a_stop_save_either_finishes_or_leaves_the_previous_resume_point(
        tmp_path: Path, delay: float, window: float, finished: bool) -> None:
    text, rc = _run_with_kill_window(tmp_path, delay, window)
    root = tmp_path / "run" / "checkpoints"
    # Before the save: the resume point should it be cut (the checkpoint of step 4, saved by --save-every).
    assert "stop requested (SIGTERM) at step 6: saving its checkpoint now; if the save is cut short the resume " \
           "point stays step_00000004" in text, text[-3000:]
    resumed = _resume(tmp_path)
    if finished:
        assert rc == 0 and "END 6 signal" in text, text[-3000:]
        assert "step_00000006 saved in" in text and "the resume point" in text
        assert (root / "step_00000006" / "complete").is_file()
        assert "at step 6" in resumed and "skipped" not in resumed, resumed[-2000:]
    else:
        assert rc == -signal.SIGKILL and "saved in" not in text, text[-3000:]
        assert not (root / "step_00000006" / "complete").exists()  # written, never marked
        assert "resumed from" in resumed and "step_00000004 at step 4; skipped step_00000006 (no 'complete' " \
               "marker: its save was cut short)" in resumed, resumed[-2000:]
    assert "END 8 max_steps" in resumed
