"""Naming a rank that died, for the launcher that saw it die (training/ds_launch.py).

When one rank is killed (the OOM killer, a lost GPU, a SIGKILL) the others fail in their next collective with a
bare "Connection reset by peer", and DeepSpeed 0.19's launcher names the last command it spawned, not the rank
that failed. The launcher is the one process that knows: it spawned the ranks and reads their exit status. It
prints one line on stderr,

    [skillnet] rank 1 (host node3, pid 4242) died: killed by SIGKILL; the other ranks are stopped. To resume from
    step_00000400 (the newest complete checkpoint), rerun: <the command>

and appends the same as an event to the run's ``log.jsonl`` (``"split": "event"``, at the step the run resumes
from, so a resume keeps the line).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import sys
from pathlib import Path
from typing import Any

from .checkpoint import checkpoint_root, complete_tags

__all__ = ["RESUME_ENV", "describe_exit", "report_dead_rank"]

# The command that resumes the run, set by whoever knows it best (a job script: its sbatch line); the launcher
# command itself otherwise.
RESUME_ENV = "SKILLNET_RESUME_CMD"


def describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _option(cmd: list[str], name: str) -> str | None:
    """The value of ``--name`` (or ``--name_with_underscores``) in a command line."""
    spellings = {f"--{name}", f"--{name.replace('-', '_')}"}
    for i, arg in enumerate(cmd):
        key, eq, value = arg.partition("=")
        if key in spellings:
            return value if eq else (cmd[i + 1] if i + 1 < len(cmd) else None)
    return None


def report_dead_rank(procs: list[Any]) -> dict[str, Any] | None:
    """Name the first of `procs` (the launcher's ``subprocess.Popen`` objects, each with ``env`` kept as
    ``skillnet_env``) that ended with a non-zero status; returns the event written (None: none failed)."""
    dead = next((p for p in procs if p.poll() is not None and p.returncode != 0), None)
    if dead is None:
        return None
    env = getattr(dead, "skillnet_env", None) or {}
    cmd = [str(a) for a in (dead.args if isinstance(dead.args, list | tuple) else [dead.args])]
    out = _option(cmd, "output-dir")
    tags = complete_tags(checkpoint_root(out)) if out else []
    resume = os.environ.get(RESUME_ENV) or shlex.join(sys.argv)
    event = {
        "split": "event", "event": "rank_died", "step": int(tags[-1][5:]) if tags else 0,
        "rank": int(env["RANK"]) if str(env.get("RANK", "")).isdigit() else None, "host": socket.gethostname(),
        "pid": dead.pid, "returncode": dead.returncode, "how": describe_exit(dead.returncode),
        "resume_from": tags[-1] if tags else None, "resume": resume,
    }
    where = f"{tags[-1]} (the newest complete checkpoint)" if tags else "the start (no complete checkpoint yet)"
    print(f"[skillnet] rank {event['rank']} (host {event['host']}, pid {dead.pid}) died: {event['how']}; the other "
          f"ranks are stopped. To resume from {where}, rerun: {resume}", file=sys.stderr, flush=True)
    if out and Path(out).is_dir():
        with open(Path(out) / "log.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(event) + "\n")
    return event
