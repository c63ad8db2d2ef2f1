"""A rank that dies is named (issue 58), 2 ranks, rank 1 SIGKILLed after the first checkpoint: one line on stderr names
rank 1, its host and pid, the signal and the command that resumes, and the run's log.jsonl holds the same event.
Under `python -m skillnet.training.ds_launch` (the Slurm scripts' launcher) the launcher says it (from the exit
status); under torchrun and DeepSpeed's own `deepspeed` the surviving rank does (from the ranks' records). The
lookup itself, without a launch, is in tests/test_dead_peer_lookup.py."""

from __future__ import annotations

import json
import os
import shlex
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


def _tiny_run(out: Path) -> list[str]:
    return ["pretrain/run.py", "--ds-config", str(REPO / "ds_configs" / "cpu_fp32.json"), "--synthetic", "64",
            "--preset", "tiny", "--max-steps", "100000", "--save-every", "2", "--output-dir", str(out),
            "--no-progress", "--no-tensorboard"]


def _rank_of(pid: int) -> str | None:
    env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return next((e[5:].decode() for e in env if e.startswith(b"RANK=")), None)


@pytest.mark.parametrize("launcher", ["torchrun", "deepspeed"])
def test_the_surviving_rank_names_the_killed_one(launcher: str, tmp_path: Path) -> None:
    out, port = tmp_path / "run", free_port()
    if launcher == "torchrun":
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(port)]
    else:
        cmd = ["deepspeed", "--num_gpus", "2", "--master_port", str(port)]
    cmd += _tiny_run(out)
    p = subprocess.Popen(cmd, cwd=REPO, env=subprocess_env(), start_new_session=True, stdout=subprocess.DEVNULL,
                         stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 400
        record = out / ".ranks" / "rank1.json"
        while not ((out / "checkpoints" / "latest").is_file() and record.is_file()):
            assert p.poll() is None and time.monotonic() < deadline, "the run saved no checkpoint"
            time.sleep(0.5)
        victim = json.loads(record.read_text())["pid"]
        assert _rank_of(victim) == "1" and str(out) in Path(f"/proc/{victim}/cmdline").read_text()
        os.kill(victim, signal.SIGKILL)
        _, err = p.communicate(timeout=180)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
        # a killed rank never reaches the trainer's end, which removes the run's shared-memory buffers
        for path in Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"):
            path.unlink(missing_ok=True)
    assert p.returncode != 0
    lines = [ln for ln in err.splitlines() if ln.startswith("[skillnet] rank ")]
    assert len(lines) == 1, err[-4000:]
    print(lines[0])
    assert lines[0].startswith(f"[skillnet] rank 1 (host {socket.gethostname()}, pid {victim}) is gone"), lines[0]
    assert "rank 0's collective failed (" in lines[0] and ". To resume from step_" in lines[0], lines[0]
    rerun = lines[0].split(", rerun: ", 1)[1]
    # the launcher's own command line: torchrun's as given, `deepspeed`'s as its script runs (interpreter first)
    assert (rerun == shlex.join(cmd)) if launcher == "torchrun" else rerun.endswith(" " + shlex.join(cmd[1:])), rerun
    events = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines() if '"rank_died"' in x]
    assert len(events) == 1 and events[0]["rank"] == 1 and events[0]["pid"] == victim, events
    assert events[0]["seen_by"] == 0 and events[0]["resume"] == rerun and events[0]["resume_from"].startswith("step_")
