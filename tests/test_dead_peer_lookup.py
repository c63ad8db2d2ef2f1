"""The survivors' side of naming a dead rank (training/rank_death.py, issue 58), without a launch: the peer lookup on
records of a dead pid, a zombie, a live pid, a reused pid and another host; the line and event a survivor writes;
silence when every peer it can check is alive; the resume command rebuilt from a launcher's environment. The
launches themselves (torchrun, `deepspeed`, ds_launch; a rank SIGKILLed) are in tests/test_dead_rank.py."""

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
from skillnet.training import rank_death
from skillnet.training.rank_death import (
    RECORDS,
    RESUME_ENV,
    Peer,
    _Watch,
    check_peers,
    resume_command,
    watch_peers,
)

HOST = socket.gethostname()


def _start(pid: int) -> int | None:
    return rank_death._start_time(pid)


def _reaped_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _zombie() -> subprocess.Popen[bytes]:
    """A child SIGKILLed and not reaped yet, as a rank is between its death and its launcher's next poll."""
    p = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    deadline = time.monotonic() + 60
    while (rank_death._stat(p.pid) or ["?"])[0] != "Z":
        assert time.monotonic() < deadline, "the child never became a zombie"
        time.sleep(0.02)
    return p


def test_the_lookup_tells_gone_alive_and_elsewhere() -> None:
    zombie = _zombie()
    try:
        me = os.getpid()
        peers = [Peer(1, HOST, _reaped_pid()), Peer(2, HOST, zombie.pid, _start(zombie.pid)),
                 Peer(3, HOST, me, _start(me)), Peer(4, HOST, me, (_start(me) or 0) + 1), Peer(5, "elsewhere", me)]
        gone, elsewhere = check_peers(peers, HOST)
    finally:
        zombie.wait()
    assert [(p.rank, code) for p, code in gone] == [(1, None), (2, -9), (4, None)]  # 4: its pid is another process now
    assert [p.rank for p in elsewhere] == [5]


def _watch(tmp_path: Path, world: int, peers: list[dict]) -> _Watch:
    out = tmp_path / "run"
    out.mkdir()
    for rec in peers:
        (out / RECORDS).mkdir(exist_ok=True)
        (out / RECORDS / f"rank{rec['rank']}.json").write_text(json.dumps({"token": 7, **rec}))
    return _Watch(out, Peer(0, HOST, os.getpid(), _start(os.getpid())), world, token=7)


def test_a_survivor_names_the_dead_peer_and_says_what_it_cannot_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(RESUME_ENV, "sbatch job.sh")
    monkeypatch.delenv(rank_death.LAUNCHER_NAMES_ENV, raising=False)
    dead = _reaped_pid()
    watch = _watch(tmp_path, 4, [{"rank": 1, "host": HOST, "pid": dead, "start": None},
                                 {"rank": 2, "host": "n2", "pid": 4242, "start": None},
                                 {"rank": 3, "host": HOST, "pid": 1, "token": 6}])  # an earlier launch's record
    assert json.loads((watch.out / RECORDS / "rank0.json").read_text())["pid"] == os.getpid()
    err = RuntimeError("[pair.cc:537] Read error [127.0.0.1]:903: Connection reset by peer. GLHF!")
    event = watch.explain(err)
    line = capsys.readouterr().err.strip()
    assert line == (f"[skillnet] rank 1 (host {HOST}, pid {dead}) is gone: rank 0's collective failed (Connection "
                    "reset by peer); rank 2 on host n2, rank 3 (no record from this launch): not checkable from here. "
                    "To resume from the start (no complete checkpoint yet), rerun: sbatch job.sh")
    logged = [json.loads(x) for x in (watch.out / "log.jsonl").read_text().splitlines()]
    assert logged == [event]
    assert event is not None and event["event"] == "rank_died" and event["rank"] == 1 and event["pid"] == dead
    assert event["seen_by"] == 0 and event["unchecked"] == [2, 3] and event["resume"] == "sbatch job.sh"
    # another survivor of the same launch leaves it said once
    assert _Watch(watch.out, Peer(2, HOST, os.getpid()), 4, token=7).explain(err) is None
    assert capsys.readouterr().err == ""


def test_the_context_manager_names_the_dead_and_lets_the_error_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the trainer wraps its loop in (no process group here: the launch token's all-reduce is rank 0's own)."""
    monkeypatch.setenv(RESUME_ENV, "rerun-me")
    monkeypatch.delenv(rank_death.LAUNCHER_NAMES_ENV, raising=False)
    dead, before = _reaped_pid(), signal.getsignal(signal.SIGTERM)
    with pytest.raises(RuntimeError, match="closed by peer"), watch_peers(tmp_path, 0, 2):
        token = json.loads((tmp_path / RECORDS / "rank0.json").read_text())["token"]
        record = {"rank": 1, "host": HOST, "pid": dead, "token": token}
        (tmp_path / RECORDS / "rank1.json").write_text(json.dumps(record))
        raise RuntimeError("Connection closed by peer")
    assert signal.getsignal(signal.SIGTERM) is before  # the stop signals are held only while it says so
    assert capsys.readouterr().err.startswith(
        f"[skillnet] rank 1 (host {HOST}, pid {dead}) is gone: rank 0's collective failed (Connection closed by peer). "
        "To resume from the start")


def test_no_line_when_the_rank_fails_on_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(rank_death, "_GONE_WAIT", 0.3)
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        watch = _watch(tmp_path, 2, [{"rank": 1, "host": HOST, "pid": alive.pid, "start": _start(alive.pid)}])
        assert watch.explain(ValueError("bad batch")) is None
        assert watch.explain(RuntimeError("Connection closed by peer")) is None  # every peer alive: not a death
    finally:
        alive.kill()
        alive.wait()
    assert capsys.readouterr().err == "" and not (watch.out / "log.jsonl").exists()


def test_a_peer_elsewhere_is_not_claimed_dead(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(rank_death, "_GONE_WAIT", 0.3)
    monkeypatch.delenv(rank_death.LAUNCHER_NAMES_ENV, raising=False)
    watch = _watch(tmp_path, 2, [{"rank": 1, "host": "n2", "pid": 4242, "start": None}])
    assert watch.explain(ValueError("bad batch")) is None
    event = watch.explain(RuntimeError("Connection closed by peer"))
    assert event is not None and event["rank"] is None and event["unchecked"] == [1]
    assert (f"rank 0's collective failed (Connection closed by peer), and no rank on host {HOST} is gone: the one "
            "that died is elsewhere (rank 1 on host n2: not checkable from here)") in capsys.readouterr().err


def test_the_resume_command_is_rebuilt_from_the_launchers_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rank_death, "_launcher_above", lambda pid: None)  # no launcher among the ancestors
    argv = ["pretrain/run.py", "--local_rank=1", "--output-dir", "runs/a b"]
    assert resume_command({RESUME_ENV: "sbatch x.sh", "TORCHELASTIC_RUN_ID": "1"}, argv) == "sbatch x.sh"
    assert resume_command({"TORCHELASTIC_RUN_ID": "1", "GROUP_WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "8"}, argv) == (
        "torchrun --nnodes 2 --nproc_per_node 8 pretrain/run.py --output-dir 'runs/a b'")
    ds = {"CROSS_SIZE": "2", "LOCAL_SIZE": "4", "MASTER_ADDR": "n1", "MASTER_PORT": "29500"}
    assert resume_command(ds, argv) == ("deepspeed --num_nodes 2 --num_gpus 4 --master_addr n1 --master_port 29500 "
                                        "pretrain/run.py --output-dir 'runs/a b'")
    assert resume_command({"SLURM_JOB_ID": "77", "ENVIRONMENT": "BATCH"}, argv) == "scontrol requeue 77"
    assert resume_command({}, argv).endswith("pretrain/run.py --output-dir 'runs/a b'")


def test_the_launcher_above_is_found(tmp_path: Path) -> None:
    """A rank under a launcher's command (a stand-in named torchrun, as the torchrun script runs: the interpreter,
    then the script) finds that command among its ancestors; under another command it finds none."""
    code = ("import subprocess, sys\n"
            "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print(child.pid, flush=True)\n"
            "sys.stdin.read()\n"
            "child.kill()\n")
    for name, found in (("torchrun", True), ("train.py", False)):
        script = tmp_path / name
        script.write_text(code)
        launcher = subprocess.Popen([sys.executable, str(script), "--nproc_per_node", "2"], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True)
        try:
            assert launcher.stdout is not None
            rank = int(launcher.stdout.readline())
            above = rank_death._launcher_above(rank)
        finally:
            launcher.communicate("", timeout=60)
        assert above == ([sys.executable, str(script), "--nproc_per_node", "2"] if found else None), above
