"""A rank that dies is named (issue 58): `python -m skillnet.training.ds_launch` (the Slurm scripts' launcher), 2 ranks,
rank 1 SIGKILLed after the first checkpoint: one line on stderr names rank 1, its host and pid, the signal and the
command that resumes, and the run's log.jsonl holds the same event."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from skillnet.training.rank_death import describe_exit

from tests.fixtures.pretrain.helpers import REPO, free_port, subprocess_env

pytestmark = pytest.mark.slow


def test_exit_statuses_are_described() -> None:
    assert describe_exit(-9) == "killed by SIGKILL" and describe_exit(3) == "exit code 3"


def _pids_of(*words: str) -> list[int]:
    out = []
    for p in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if all(w in cmd for w in words):
            out.append(int(p.name))
    return out


def test_a_killed_rank_is_named_with_the_resume_command(tmp_path: Path) -> None:
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "skillnet.training.ds_launch", "--num_gpus", "2", "--master_port", str(free_port()),
           "pretrain/run.py", "--ds-config", str(REPO / "ds_configs" / "cpu_fp32.json"), "--synthetic", "64",
           "--preset", "tiny", "--max-steps", "100000", "--save-every", "2", "--output-dir", str(out),
           "--no-progress", "--no-tensorboard"]
    p = subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(), start_new_session=True, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 400
        # any complete checkpoint: a fast machine saves every 2 steps and rotates step 2 away within a poll
        while not (out / "checkpoints" / "latest").is_file():
            assert p.poll() is None and time.monotonic() < deadline, "the run saved no checkpoint"
            time.sleep(0.5)
        victims = _pids_of("pretrain/run.py", "--local_rank=1", str(out))
        assert len(victims) == 1, victims
        os.kill(victims[0], signal.SIGKILL)
        _, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
    assert p.returncode != 0
    lines = [ln for ln in err.splitlines() if ln.startswith("[skillnet] rank ")]
    assert len(lines) == 1, err[-4000:]
    assert lines[0].startswith(f"[skillnet] rank 1 (host {socket.gethostname()}, pid {victims[0]}) died: killed by "
                               f"SIGKILL; the other ranks are stopped. To resume from step_"), lines[0]
    assert lines[0].endswith("rerun: " + " ".join(cmd)), lines[0]
    events = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines() if '"rank_died"' in x]
    assert len(events) == 1 and events[0]["rank"] == 1 and events[0]["pid"] == victims[0]
    assert events[0]["returncode"] == -9 and events[0]["resume_from"].startswith("step_")
