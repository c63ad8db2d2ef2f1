"""A one-node Slurm on localhost for the tests: Debian's packages (`make slurm` installs them), munged, slurmctld
and slurmd with every file (config, key, state, spool, logs, sockets) in one temporary folder, torn down by
pid. Nothing under /etc or /var is used, so it runs beside a machine's own Slurm, if any.

    cluster = LocalSlurm(Path("/tmp/x")); cluster.start(); cluster.sbatch([...]); cluster.stop()
    python -m tests.slurm_cluster /tmp/x      # bring one up by hand; Ctrl-C tears it down

Settings are the ones the issue tested by hand (#43): select/cons_tres, proctrack/linuxproc, task/none,
JobRequeue=1, KillWait 30 s (Slurm's default, what the docs' kill window assumes). cred_expire is 5 s
instead of 120 s: it is also how long a requeued job waits before it may start again, and the tests
requeue several times. The scheduler looks at pending jobs every 2 s instead of 60 s (its main loop) and 30 s
(backfill), for the same reason: a requeued job becomes eligible again between those passes.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "scancel", "sacct")
_SBIN = ("/usr/sbin", "/usr/bin")


def _which(name: str) -> str | None:
    return shutil.which(name) or next((f"{d}/{name}" for d in _SBIN if os.access(f"{d}/{name}", os.X_OK)), None)


def unavailable() -> str | None:
    """Why a local Slurm cannot run here (one line), or None."""
    missing = [b for b in BINARIES if _which(b) is None]
    if missing:
        return f"no local Slurm ({', '.join(missing)} not found): `make slurm` installs slurm-wlm and munge as root on Debian"
    if os.geteuid() != 0:
        return "a local Slurm needs root (slurmd starts jobs as their user); run the tests as root"
    try:
        pwd.getpwnam("munge")
    except KeyError:
        return "no `munge` user (the munge package creates it): `make slurm`"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LocalSlurm:
    """munged + slurmctld + slurmd on this host, state under ``root``."""

    def __init__(self, root: Path, cpus: int = 2, memory_mb: int | None = None) -> None:
        self.root = root.resolve()
        self.cpus = cpus
        self.memory_mb = memory_mb or int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20 * 0.8)
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.root / "slurm.conf"
        self.munge_socket = self.root / "munge" / "munge.socket"
        self.pids: dict[str, Path] = {
            "slurmd": self.root / "slurmd.pid",
            "slurmctld": self.root / "slurmctld.pid",
            "munged": self.root / "munge" / "munged.pid",
        }

    # ------------------------------------------------------------------ environment
    @property
    def env(self) -> dict[str, str]:
        """What a client command needs to reach this cluster (and not a system one)."""
        return {"SLURM_CONF": str(self.conf)}

    def client_env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env = {k: v for k, v in env.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SALLOC_"))}
        env.update(self.env)
        env["PATH"] = ":".join([*_SBIN, env.get("PATH", "")])
        return env

    # ------------------------------------------------------------------ life cycle
    def start(self, timeout: float = 60.0) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.chmod(0o755)  # munged (as `munge`) must traverse to its folder
        for parent in self.root.parents:  # and every folder above (a 0700 tmp would stop it)
            if parent.stat().st_mode & 0o001 == 0:
                raise RuntimeError(f"{parent}: not searchable by others, so the munge user cannot reach {self.root}")
        self._start_munge()
        self._write_conf()
        for d in ("state", "spool"):
            (self.root / d).mkdir(exist_ok=True)
        self._run([_which("slurmctld") or "slurmctld", "-f", str(self.conf)], "slurmctld")
        self._run([_which("slurmd") or "slurmd", "-f", str(self.conf), "-N", self.node], "slurmd")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r = self.cmd(["sinfo", "-h", "-N", "-o", "%t"], check=False)
            if r.returncode == 0 and r.stdout.strip() in ("idle", "mix", "alloc"):
                return
            time.sleep(0.5)
        raise RuntimeError(f"local Slurm did not come up in {timeout:.0f} s: sinfo says {r.stdout.strip()!r} "
                           f"{r.stderr.strip()!r}; logs in {self.root}")

    def _start_munge(self) -> None:
        mdir = self.root / "munge"
        mdir.mkdir(exist_ok=True)
        key = mdir / "munge.key"
        if not key.exists():
            key.write_bytes(os.urandom(1024))
        munge = pwd.getpwnam("munge")
        # munged refuses a key, socket or log folder that anyone but its user can write or read.
        for p in (mdir, key):
            os.chown(p, munge.pw_uid, munge.pw_gid)
        mdir.chmod(0o755)  # clients (slurmd as root, jobs as any user) reach the socket in it
        key.chmod(0o400)
        cmd = [_which("munged") or "munged", "--socket", str(self.munge_socket), "--key-file", str(key),
               "--pid-file", str(self.pids["munged"]), "--log-file", str(mdir / "munged.log"),
               "--seed-file", str(mdir / "munged.seed"), "--num-threads", "2"]
        r = subprocess.run(["setpriv", f"--reuid={munge.pw_uid}", f"--regid={munge.pw_gid}", "--init-groups", *cmd],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"munged failed to start: {r.stderr.strip() or r.stdout.strip()}")

    def _write_conf(self) -> None:
        r = self.root
        self.conf.write_text(f"""\
ClusterName=skillnet-test
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.munge_socket},cred_expire=5
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool
SlurmctldPidFile={self.pids["slurmctld"]}
SlurmdPidFile={self.pids["slurmd"]}
SlurmctldLogFile={r}/slurmctld.log
SlurmdLogFile={r}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU_Memory
JobRequeue=1
DefMemPerCPU={self.memory_mb // self.cpus}
KillWait=30
MinJobAge=600
ReturnToService=2
SchedulerType=sched/backfill
SchedulerParameters=sched_interval=2,bf_interval=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
PluginDir=/usr/lib/x86_64-linux-gnu/slurm-wlm
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN
PartitionName=debug Nodes={self.node} Default=YES MaxTime=INFINITE State=UP
""")

    def _run(self, cmd: list[str], name: str) -> None:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=self.client_env())
        if r.returncode != 0:
            log = self.root / f"{name}.log"
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            raise RuntimeError(f"{name} failed to start ({r.returncode}): {r.stderr.strip()}\n{tail}")

    def stop(self) -> None:
        """Cancel every job, then end the daemons by their pid files: slurmd, slurmctld, munged."""
        with contextlib.suppress(Exception):
            self.cmd(["scancel", "--full", "--user=root"], check=False, timeout=10)
            time.sleep(1)
        for name in ("slurmd", "slurmctld", "munged"):
            pidfile = self.pids[name]
            try:
                pid = int(pidfile.read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            for _ in range(100):
                if not _alive(pid):
                    break
                time.sleep(0.1)
            else:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    # ------------------------------------------------------------------ clients
    def cmd(self, argv: list[str], check: bool = True, timeout: float = 60, **kw: object
            ) -> subprocess.CompletedProcess[str]:
        exe = _which(argv[0]) or argv[0]
        r = subprocess.run([exe, *argv[1:]], capture_output=True, text=True, timeout=timeout,
                           env=self.client_env(kw.pop("env", None)), **kw)  # type: ignore[call-overload]
        if check and r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({r.returncode}): {r.stderr.strip()}")
        return r

    def sbatch(self, argv: list[str], env: dict[str, str] | None = None, cwd: Path | None = None) -> int:
        r = self.cmd(["sbatch", "--parsable", *argv], env=env, cwd=cwd)
        return int(r.stdout.strip().split(";")[0])

    def job(self, job_id: int | str) -> dict[str, str]:
        """`scontrol show job` as a dict (JobState, Restarts, ExitCode, Reason, ...)."""
        r = self.cmd(["scontrol", "-o", "show", "job", str(job_id)], check=False)
        if r.returncode != 0:
            return {}
        line = r.stdout.strip().splitlines()[0] if r.stdout.strip() else ""
        return dict(m.groups() for m in re.finditer(r"(\w+(?::\w+)?)=(\S*)", line))

    def state(self, job_id: int | str) -> str:
        return self.job(job_id).get("JobState", "")

    def wait(self, job_id: int | str, states: tuple[str, ...] = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT",
             "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE", "PREEMPTED"), timeout: float = 300,
             poll: float = 0.5) -> dict[str, str]:
        """Wait until the job is in one of ``states`` (default: ended) and stays there for a moment (a
        requeue first shows the job as COMPLETING/REQUEUED, then PENDING). Returns its fields."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            info = self.job(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(poll)
        raise TimeoutError(f"job {job_id} still {self.job(job_id).get('JobState')} after {timeout:.0f} s")

    def wait_running(self, job_id: int | str, timeout: float = 120) -> dict[str, str]:
        return self.wait(job_id, ("RUNNING",), timeout=timeout, poll=0.2)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError):  # a zombie of ours counts as gone
        if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return False
    return True


if __name__ == "__main__":
    why = unavailable()
    if why:
        sys.exit(why)
    c = LocalSlurm(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/skillnet-slurm"))
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # kill <pid> tears it down like Ctrl-C
    c.start()
    print(f"up: export SLURM_CONF={c.conf}   (Ctrl-C stops it)", flush=True)
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        c.stop()
