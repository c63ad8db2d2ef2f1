"""Naming a rank that died, with the command that resumes the run (issue 58).

When one rank is killed (the OOM killer, a lost GPU, a SIGKILL) the others fail in their next collective with a
bare "Connection reset by peer", and DeepSpeed 0.19's launcher names the last command it spawned, not the rank
that failed. Two sides can tell, and say it the same way (``announce``): one line on stderr,

    [skillnet] rank 1 (host node3, pid 4242) died: killed by SIGKILL; the other ranks are stopped. To resume from
    step_00000400 (the newest complete checkpoint), rerun: <the command>

and the same as an event in the run's ``log.jsonl`` (``"split": "event"``, ``"event": "rank_died"``, at the step
the run resumes from, so a resume keeps the line; ``seen_by`` says who saw it).

- The project's launcher (training/ds_launch.py) spawned the ranks and reads their exit status
  (``report_dead_rank``): the line above.
- Under any other launcher (DeepSpeed's ``deepspeed``, torchrun, srun) the ranks that survive say it
  (``watch_peers``, around the trainer's loop): ``rank 1 (host node3, pid 4242) is gone (killed by SIGKILL): rank
  0's collective failed (Connection closed by peer). To resume ...``. At start every rank writes who it is
  (rank, host, pid, the process's start time) to ``<output_dir>/.ranks/rank<N>.json``; a rank whose training
  fails reads its peers there and checks each on its own host in /proc. Files, not the rendezvous store: under
  the DeepSpeed launcher rank 0 hosts the TCPStore, which dies with it, while the output folder outlives every
  rank and is on every node already (checkpoints need a shared file system). A peer on another host cannot be
  checked from here, which the line says. A launch token (rank 0's random number, agreed in one host all-reduce
  at start) tells this launch's records from an earlier launch's left in the folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shlex
import signal
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from skillnet.common.files import atomic_write_text

from . import dist as D
from .checkpoint import checkpoint_root, complete_tags

__all__ = ["LAUNCHER_NAMES_ENV", "Peer", "RESUME_ENV", "announce", "check_peers", "describe_exit", "report_dead_rank",
           "resume_command", "watch_peers"]

# The command that resumes the run, set by whoever knows it best (a job script: its sbatch line); the launcher
# command itself otherwise.
RESUME_ENV = "SKILLNET_RESUME_CMD"
# Set by a launcher that names its own dead ranks (ds_launch's per-node launcher): the ranks it started leave
# their own host's dead peers to it, so one death is one line.
LAUNCHER_NAMES_ENV = "SKILLNET_LAUNCHER_NAMES_DEAD"
RECORDS = ".ranks"
# How long a survivor waits for a peer whose connection broke to be seen gone: a SIGKILLed process closes its
# sockets before it becomes a zombie.
_GONE_WAIT = 5.0
# What a collective's error says when the other end went away (gloo, NCCL, the c10d store).
_PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe", "Connection refused",
              "timed out", "Timeout", "NCCL error", "ncclRemoteError", "ncclSystemError")


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


def announce(out: str | os.PathLike[str] | None, head: str, event: dict[str, Any], resume: str) -> dict[str, Any]:
    """Say `head` (who died, how, who saw it) in one line on stderr with the checkpoint the run resumes from
    and the command that does it, and append `event` with the same to ``<out>/log.jsonl``; returns the event."""
    tags = complete_tags(checkpoint_root(out)) if out else []
    event = {"split": "event", "event": "rank_died", "step": int(tags[-1][5:]) if tags else 0, **event,
             "resume_from": tags[-1] if tags else None, "resume": resume}
    where = f"{tags[-1]} (the newest complete checkpoint)" if tags else "the start (no complete checkpoint yet)"
    print(f"[skillnet] {head}. To resume from {where}, rerun: {resume}", file=sys.stderr, flush=True)
    if out and Path(out).is_dir():
        with open(Path(out) / "log.jsonl", "a", encoding="utf-8") as f:
            f.write(json.dumps(event) + "\n")
    return event


def report_dead_rank(procs: list[Any]) -> dict[str, Any] | None:
    """Name the first of `procs` (the launcher's ``subprocess.Popen`` objects, each with ``env`` kept as
    ``skillnet_env``) that ended with a non-zero status; returns the event written (None: none failed)."""
    dead = next((p for p in procs if p.poll() is not None and p.returncode != 0), None)
    if dead is None:
        return None
    env = getattr(dead, "skillnet_env", None) or {}
    cmd = [str(a) for a in (dead.args if isinstance(dead.args, list | tuple) else [dead.args])]
    rank = int(env["RANK"]) if str(env.get("RANK", "")).isdigit() else None
    host, how = socket.gethostname(), describe_exit(dead.returncode)
    return announce(_option(cmd, "output-dir"),
                    f"rank {rank} (host {host}, pid {dead.pid}) died: {how}; the other ranks are stopped",
                    {"rank": rank, "host": host, "pid": dead.pid, "returncode": dead.returncode, "how": how,
                     "seen_by": "launcher"},
                    os.environ.get(RESUME_ENV) or shlex.join(sys.argv))


# ---------------------------------------------------------------- the command that resumes, seen from a rank
def _cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [a.decode(errors="replace") for a in raw.rstrip(b"\0").split(b"\0")] if raw else []


def _stat(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from its third field (state) on: the command name before it may hold spaces."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rfind(")") + 2 :].split()


# The commands that start every rank of a launch (not a per-node launcher, whose runner is the one to rerun).
_LAUNCHERS = {"torchrun", "torch.distributed.run", "deepspeed", "deepspeed.launcher.runner",
              "skillnet.training.ds_launch"}


def _launcher_above(pid: int, depth: int = 6) -> list[str] | None:
    """The command line of the nearest launcher among `pid`'s ancestors on this host."""
    for _ in range(depth):
        stat = _stat(pid)
        if stat is None or int(stat[1]) <= 1:
            return None
        pid = int(stat[1])
        argv = _cmdline(pid)
        if "--skillnet-node" not in argv and {a.rsplit("/", 1)[-1] for a in argv[:3]} & _LAUNCHERS:
            return argv
    return None


def resume_command(env: dict[str, str] | None = None, argv: list[str] | None = None) -> str:
    """What reruns this rank's launch: $SKILLNET_RESUME_CMD, else the launcher command above this process
    (torchrun, `deepspeed`), else one rebuilt from what the launcher left in the environment (a `deepspeed`
    runner on another node, a Slurm batch job), else this process's own command."""
    env = dict(os.environ) if env is None else env
    argv = list(sys.argv) if argv is None else argv
    if env.get(RESUME_ENV):
        return env[RESUME_ENV]
    if (above := _launcher_above(os.getpid())) is not None:
        return shlex.join(above)
    script = [a for a in argv if not a.startswith("--local_rank=")]  # DeepSpeed's launcher adds it per rank
    if "TORCHELASTIC_RUN_ID" in env:
        return shlex.join(["torchrun", "--nnodes", env.get("GROUP_WORLD_SIZE", "1"), "--nproc_per_node",
                           env.get("LOCAL_WORLD_SIZE", "1"), *script])
    if "CROSS_SIZE" in env and "LOCAL_SIZE" in env:  # DeepSpeed's per-node launcher sets these
        return shlex.join(["deepspeed", "--num_nodes", env["CROSS_SIZE"], "--num_gpus", env["LOCAL_SIZE"],
                           "--master_addr", env.get("MASTER_ADDR", ""), "--master_port", env.get("MASTER_PORT", ""),
                           *script])
    if env.get("SLURM_JOB_ID") and env.get("ENVIRONMENT") == "BATCH":  # srun inside an sbatch script
        return f"scontrol requeue {env['SLURM_JOB_ID']}"
    return shlex.join([sys.executable, *script])


# ---------------------------------------------------------------- the survivors' side
@dataclass(frozen=True)
class Peer:
    """A rank as it recorded itself at start. ``start``: its process's start time (/proc, clock ticks since
    boot), so that a pid the system gave to another process since is not taken for the rank."""

    rank: int
    host: str
    pid: int
    start: int | None = None


def _start_time(pid: int) -> int | None:
    stat = _stat(pid)
    return int(stat[19]) if stat is not None and len(stat) > 19 else None


def _gone(peer: Peer) -> tuple[bool, int | None]:
    """Whether `peer` (on this host) is gone, and when it is a zombie its launcher has not reaped yet, its
    status as ``Popen.returncode`` gives it (negative: the signal)."""
    stat = _stat(peer.pid)
    if stat is None:
        if Path("/proc/self/stat").exists():
            return True, None
        try:  # no /proc: signal 0 tells whether the pid exists
            os.kill(peer.pid, 0)
        except ProcessLookupError:
            return True, None
        except PermissionError:
            pass
        return False, None
    if peer.start is not None and len(stat) > 19 and int(stat[19]) != peer.start:
        return True, None
    if stat[0] not in "ZX":
        return False, None
    if len(stat) > 49:  # exit_code (field 52, Linux >= 3.5), as waitpid gives it
        status = int(stat[49])
        return True, -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
    return True, None


def check_peers(peers: list[Peer], host: str) -> tuple[list[tuple[Peer, int | None]], list[Peer]]:
    """Split `peers` into those gone on this `host` (with their exit status where still readable) and
    those on other hosts, whose liveness cannot be checked from here; the rest are alive."""
    gone, elsewhere = [], []
    for p in peers:
        if p.host != host:
            elsewhere.append(p)
        elif (state := _gone(p))[0]:
            gone.append((p, state[1]))
    return gone, elsewhere


def _peer_lost(error: BaseException) -> str | None:
    """What in `error` (or the errors it came from) says a peer went away; None: nothing does."""
    seen: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and e not in seen and len(seen) < 8:
        seen.append(e)
        e = e.__cause__ or e.__context__
    for e in seen:
        for phrase in _PEER_LOST:
            if phrase.lower() in str(e).lower():
                return phrase
    with contextlib.suppress(ImportError, AttributeError):
        import torch.distributed as dist  # noqa: PLC0415

        for e in seen:
            if isinstance(e, dist.DistError):
                return (str(e).strip().splitlines() or [type(e).__name__])[0][:160]
    return None


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]}"


class _Watch:
    """One rank's record and what it says when its training fails (see the module's docstring)."""

    def __init__(self, out: Path, me: Peer, world: int, token: int) -> None:
        self.out, self.me, self.world, self.token = out, me, world, token
        self.resume = resume_command()
        atomic_write_text(out / RECORDS / f"rank{me.rank}.json", json.dumps({**asdict(me), "token": token}))

    def peers(self) -> tuple[list[Peer], list[int]]:
        """This launch's other ranks as they recorded themselves, and the ranks without a record of this launch
        (dead before they wrote it)."""
        found, missing = [], []
        for r in range(self.world):
            if r == self.me.rank:
                continue
            try:
                rec = json.loads((self.out / RECORDS / f"rank{r}.json").read_text(encoding="utf-8"))
            except (OSError, ValueError):
                rec = {}
            if rec.get("token") == self.token:
                found.append(Peer(rec["rank"], rec["host"], rec["pid"], rec.get("start")))
            else:
                missing.append(r)
        return found, missing

    def _first_to_say(self, key: str) -> bool:
        """Whether no other survivor of this launch has said `key` yet (one line per death, not one per rank)."""
        try:
            os.close(os.open(self.out / RECORDS / f"said-{self.token}-{key}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        except OSError:
            pass
        return True

    def explain(self, error: BaseException) -> dict[str, Any] | None:
        """Name the peer that died when `error` came from it; None when every peer this rank can check is alive
        and nothing says a peer went away (this rank failed on its own), or when another says it."""
        lost = _peer_lost(error)
        peers, missing = self.peers()
        gone, elsewhere = check_peers(peers, self.me.host)
        deadline = time.monotonic() + (_GONE_WAIT if lost else 0.0)
        while not gone and time.monotonic() < deadline:
            time.sleep(0.1)
            gone, elsewhere = check_peers(peers, self.me.host)
        failed = f"rank {self.me.rank}'s " + (f"collective failed ({lost})" if lost
                                              else f"training failed ({_first_line(error)})")
        unchecked = [f"rank {p.rank} on host {p.host}" for p in elsewhere] + [
            f"rank {r} (no record from this launch)" for r in missing]
        not_here = f"{', '.join(unchecked)}: not checkable from here" if unchecked else ""
        seen = {"seen_by": self.me.rank, "unchecked": [p.rank for p in elsewhere] + missing}
        if gone:
            if os.environ.get(LAUNCHER_NAMES_ENV):  # the launcher on this host names them, from their exit status
                return None
            (dead, code), others = gone[0], gone[1:]
            how = describe_exit(code) if code is not None else None
            if not self._first_to_say(str(dead.rank)):
                return None
            also = "".join(f"; rank {p.rank} (pid {p.pid}) is gone too" for p, _ in others)
            head = (f"rank {dead.rank} (host {dead.host}, pid {dead.pid}) is gone{f' ({how})' if how else ''}: "
                    f"{failed}{also}{'; ' + not_here if not_here else ''}")
            event = {"rank": dead.rank, "host": dead.host, "pid": dead.pid, "returncode": code, "how": how or "gone",
                     **seen, "also_gone": [p.rank for p, _ in others]}
            return announce(self.out, head, event, self.resume)
        if not (lost and unchecked) or not self._first_to_say("elsewhere"):
            return None
        head = f"{failed}, and no rank on host {self.me.host} is gone: the one that died is elsewhere ({not_here})"
        return announce(self.out, head, {"rank": None, "host": None, "pid": None, "returncode": None,
                                         "how": "not checkable from here", **seen}, self.resume)


@contextlib.contextmanager
def watch_peers(output_dir: str | os.PathLike[str], rank: int, world: int) -> Iterator[None]:
    """Around a rank's training: record this rank (every rank enters together: one host all-reduce), and when
    the training raises, name the peer whose death caused it, then let the error go on. One process: nothing."""
    if world < 2:
        yield
        return
    token = int(D.all_reduce_host_sum([float(secrets.randbits(52) + 1) if rank == 0 else 0.0])[0])
    watch = _Watch(Path(output_dir), Peer(rank, socket.gethostname(), os.getpid(), _start_time(os.getpid())),
                   world, token)
    try:
        yield
    except Exception as e:
        # The launcher's stop signal (it saw the death too) would end this rank mid-line: held until it is said,
        # by a handler (process-wide; a signal mask is per thread, and torch's threads would take the signal).
        held: list[int] = []
        old = {}
        for s in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(ValueError):  # not the main thread: no handlers, nothing held
                old[s] = signal.signal(s, lambda signum, frame: held.append(signum))
        try:
            watch.explain(e)
        except Exception as bad:  # naming the dead must never hide why this rank failed
            print(f"[skillnet] could not check the other ranks: {_first_line(bad)}", file=sys.stderr, flush=True)
        finally:
            for s, handler in old.items():
                signal.signal(s, signal.SIG_DFL if handler is None else handler)  # None: set outside Python
            for s in held:
                signal.raise_signal(s)
        raise
