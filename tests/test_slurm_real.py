"""Every sbatch script of scripts/slurm/ as shipped, on a real one-node Slurm on localhost (tests/slurm_cluster.py:
Debian's slurm-wlm and munge, which `make slurm` installs), 2 CPUs, submitted as docs/training.md and
docs/data_prep.md say, with only the variables and sbatch options they tell a user to set.

    python -m pytest -m slurm tests          # these alone; skipped (one line) where Slurm cannot run

Measured 2026-11-28 on 2 quiet cores: 4:21 for the 11 tests (`python -m pytest tests/test_slurm_real.py`),
most of it the DeepSpeed start-ups of 9 training jobs and the 1-minute --time job (Slurm counts time limits in
minutes); under load from other test runs it took up to 6 min.

What they hold: the smoke job and the multinode job on a fresh OUT complete with a complete checkpoint; the
data_prep array plus its merge equals a one-process build byte for byte; a preemption (scancel --signal=TERM,
and a 1-minute --time whose stop signal the script sends half a minute in) saves, requeues once per stop,
resumes at the exact step and ends with the weights of a straight run bit for bit; a deterministic failure
(wrong REPO, a refused OUT, a rank killed before any save, the V100 recipe on 2 ranks, a --time too short to
save in) ends without a requeue, with its error in the job's log; a plain scancel ends without a requeue. The
logs land in the submit directory (no folder to create).

SKILLNET_SLURM_SCRIPTS=<folder> runs them against other copies of the scripts (e.g. an older commit's)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.fixtures.pretrain.helpers import REPO, subprocess_env
from tests.slurm_cluster import LocalSlurm, unavailable

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SCRIPTS = Path(os.environ.get("SKILLNET_SLURM_SCRIPTS", REPO / "scripts" / "slurm"))
# A straight run and its preempted twins: tiny BERT, 2 ranks, ~35-40 s of training on 2 cores, so that a 1-minute
# --time's stop signal (half a minute in) lands mid-run.
MULTI = {"PRESET": "tiny", "RANKS_PER_NODE": "2", "MAX_STEPS": "1600", "SAVE_EVERY": "1000"}


@pytest.fixture(scope="session")
def slurm() -> Iterator[LocalSlurm]:
    why = unavailable()
    if why:
        pytest.skip(why)
    # Under /tmp itself: the munge user must reach its folder, and pytest's own tmp root is 0700.
    root = Path(tempfile.mkdtemp(prefix="skillnet-slurm-"))
    cluster = LocalSlurm(root, cpus=2)
    try:
        cluster.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        cluster.stop()  # installed but not starting is a fault to see, not a skip (its logs stay in root)
        pytest.fail(f"local Slurm did not start (logs in {root}): {e}")
    yield cluster
    cluster.stop()
    shutil.rmtree(root, ignore_errors=True)  # the daemons are gone: their state, spool and logs go too


@pytest.fixture(scope="session")
def shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.fixtures.pretrain.helpers import build_shards

    return build_shards(tmp_path_factory.mktemp("slurm_shards"))


_SUBMITTED: list[int] = []  # every job of this module, so that a failed test leaves none running


@pytest.fixture(autouse=True)
def _cancel_leftovers(slurm: LocalSlurm) -> Iterator[None]:
    """A test that failed mid-way (a requeue loop, a job that cannot start) must not hold the node for the next."""
    yield
    live = [j for j in _SUBMITTED if slurm.state(j) not in ("", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")]
    if live:
        slurm.cmd(["scancel", *map(str, live)], check=False)


class Job:
    """A submitted job: its id, the folder it was submitted from (where its log lands) and its log."""

    def __init__(self, cluster: LocalSlurm, job_id: int, cwd: Path, name: str) -> None:
        self.cluster, self.id, self.cwd, self.name = cluster, job_id, cwd, name

    @property
    def log_path(self) -> Path:
        return self.cwd / f"{self.name}-{self.id}.out"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def info(self) -> dict[str, str]:
        return self.cluster.job(self.id)

    def wait_end(self, timeout: float = 240, max_restarts: int = 0) -> dict[str, str]:
        """Wait until the job ended, then check it stays ended (a requeued job would go back to PENDING). A job
        requeued more than ``max_restarts`` times fails the test at once (a requeue loop never ends)."""
        deadline = time.monotonic() + timeout
        pending_since: float | None = None
        while True:
            info = self.info()
            state = info.get("JobState", "")
            assert int(info.get("Restarts") or 0) <= max_restarts, \
                f"job {self.id} requeued {info.get('Restarts')} times (at most {max_restarts} expected):\n{self.log()[-3000:]}"
            if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
                time.sleep(1.0)  # a self-requeue (scontrol requeue before the script exits) never shows an end state
                again = self.info()
                if again.get("JobState") == state and again.get("Restarts") == info.get("Restarts"):
                    return again
                continue
            # A job that can never start (a request the node cannot meet) stays PENDING with a reason.
            if state == "PENDING" and info.get("Reason") not in ("None", "Priority", "Resources", "BeginTime",
                                                                  "Dependency", "(null)"):
                pending_since = pending_since or time.monotonic()
                assert time.monotonic() - pending_since < 20, f"job {self.id} cannot start: {info.get('Reason')}"
            assert time.monotonic() < deadline, f"job {self.id} still {state} after {timeout:.0f} s\n{self.log()[-3000:]}"
            time.sleep(0.5)

    def wait_for(self, pattern: str, timeout: float = 180, max_restarts: int = 0) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while True:
            m = re.search(pattern, self.log())
            if m:
                return m
            info = self.info()
            state = info.get("JobState")
            assert int(info.get("Restarts") or 0) <= max_restarts, \
                f"job {self.id} requeued {info.get('Restarts')} times before {pattern!r}:\n{self.log()[-3000:]}"
            assert state not in ("FAILED", "CANCELLED", "COMPLETED", "TIMEOUT"), \
                f"job {self.id} {state} before {pattern!r}:\n{self.log()[-3000:]}"
            assert time.monotonic() < deadline, f"no {pattern!r} in job {self.id}'s log:\n{self.log()[-3000:]}"
            time.sleep(0.3)


def submit(cluster: LocalSlurm, cwd: Path, script: str, *sbatch_args: str, env: dict[str, str] | None = None,
           args: tuple[str, ...] = ()) -> Job:
    """`VAR=... sbatch [options] scripts/slurm/<script> [args]` from ``cwd`` (the submit directory)."""
    cwd.mkdir(parents=True, exist_ok=True)
    job_env = {**subprocess_env(), "REPO": str(REPO), "PYTHON": sys.executable, **(env or {})}
    r = cluster.cmd(["sbatch", "--parsable", *sbatch_args, str(SCRIPTS / script), *args], env=job_env, cwd=cwd,
                    check=False)
    assert r.returncode == 0, f"sbatch {script} refused: {r.stderr.strip()}"
    job_id = int(r.stdout.strip().split(";")[0])
    _SUBMITTED.append(job_id)
    name = re.search(r"^#SBATCH --job-name=(\S+)", (SCRIPTS / script).read_text(), re.M)
    return Job(cluster, job_id, cwd, name.group(1) if name else script)


def weights(run: Path) -> dict[str, torch.Tensor]:
    latest = (run / "checkpoints" / "latest").read_text().strip()
    state = torch.load(run / "checkpoints" / latest / "mp_rank_00_model_states.pt", map_location="cpu",
                       weights_only=False)
    return state["module"]


def assert_complete(run: Path, step: int) -> None:
    tag = f"step_{step:08d}"
    assert (run / "checkpoints" / "latest").read_text().strip() == tag
    assert (run / "checkpoints" / tag / "complete").is_file()


# ---------------------------------------------------------------------------------------------------- jobs
def test_the_smoke_job_completes_on_two_cpus(slurm: LocalSlurm, tmp_path: Path) -> None:
    job = submit(slurm, tmp_path / "submit", "pretrain_cpu_smoke.sbatch",
                 env={"STEPS": "6", "OUT": str(tmp_path / "smoke")})
    info = job.wait_end()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", job.log()[-3000:]
    assert job.log_path.is_file()  # in the submit directory, which holds no logs/ folder: none was needed
    assert not (job.cwd / "logs").exists()
    assert '"world_size": 2' in job.log()  # two ranks, one Slurm task each
    assert_complete(tmp_path / "smoke", 6)


def test_the_data_prep_array_and_merge_equal_a_one_process_build(slurm: LocalSlurm, tmp_path: Path) -> None:
    py = [sys.executable, "-m", "skillnet.data_prep"]
    corpus = tmp_path / "corpus.txt"
    run = lambda cmd: subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,  # noqa: E731
                                     env=subprocess_env())
    r = run([*py, "sample-corpus", "--out", str(corpus), "--max-docs", "400"])
    assert r.returncode == 0, r.stderr[-2000:]
    unit = ["--unit-bytes", str(max(4096, corpus.stat().st_size // 5))]
    one = run([*py, "build", str(corpus), "--out", str(tmp_path / "one"), "--no-progress", *unit])
    assert one.returncode == 0, one.stderr[-2000:]
    sub, out = tmp_path / "submit", tmp_path / "array"
    env = {"BUILD_ARGS": " ".join(unit)}
    # docs/data_prep.md's two lines: the array, then the merge once every task succeeded.
    array = submit(slurm, sub, "data_prep_array.sbatch", "--array=0-1", env=env, args=(str(corpus), str(out)))
    merge = submit(slurm, sub, "data_prep_array.sbatch", f"--dependency=afterok:{array.id}",
                   "--export=ALL,STAGE=merge", env=env, args=(str(corpus), str(out)))
    info = merge.wait_end()
    assert info["JobState"] == "COMPLETED", merge.log()[-2000:] + "".join(p.read_text() for p in sub.glob("*.out"))
    assert re.search(r"^ok: \d+ shards", merge.log(), re.M), merge.log()[-1000:]  # the merge verified
    assert not list(sub.glob("*4294967294*"))  # the merge's log is named by its own job id, not "%a"
    files = lambda d: {p.name: p.read_bytes() for p in sorted(d.iterdir())  # noqa: E731
                       if not p.name.startswith("manifest.part")}
    assert files(tmp_path / "one") == files(out)


@pytest.fixture(scope="module")
def straight(slurm: LocalSlurm, shards: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The multinode job on 1 node x 2 ranks, a fresh OUT, uninterrupted: the reference of the preemptions."""
    tmp = tmp_path_factory.mktemp("slurm_straight")
    job = submit(slurm, tmp / "submit", "pretrain_multinode.sbatch",
                 env={**MULTI, "SHARDS": str(shards), "OUT": str(tmp / "out")})
    try:
        info = job.wait_end()
    except AssertionError:
        slurm.cmd(["scancel", str(job.id)], check=False)  # not left to loop under the next tests
        raise
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "0", job.log()[-4000:]
    return tmp / "out"


def test_the_multinode_job_completes_on_a_fresh_out(straight: Path) -> None:
    assert_complete(straight, int(MULTI["MAX_STEPS"]))
    assert not list(straight.glob("hostfile*"))  # the hostfile stays out of the run folder


def test_a_preemption_saves_requeues_once_and_resumes_to_the_same_weights(
        slurm: LocalSlurm, shards: Path, straight: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    job = submit(slurm, tmp_path / "submit", "pretrain_multinode.sbatch",
                 env={**MULTI, "SHARDS": str(shards), "OUT": str(out)})
    job.wait_for(r'"event": "start"')
    time.sleep(2)  # a few steps in
    slurm.cmd(["scancel", "--signal=TERM", str(job.id)])  # what a preemption or --signal sends the ranks
    info = job.wait_end(max_restarts=1)
    log = job.log()
    assert info["JobState"] == "COMPLETED" and info["Restarts"] == "1", log[-4000:]
    stops = re.findall(r"stop requested \(SIGTERM\) at step (\d+): checkpoint \S+ saved in", log)
    resumed = re.findall(r"resumed from \S+ at step (\d+)", log)
    assert len(stops) == 1 and resumed == stops, log[-4000:]  # one save, one requeue, the exact step
    assert log.count("[sbatch] not finished: requeueing") == 1
    assert_complete(out, int(MULTI["MAX_STEPS"]))
    mine, ref = weights(out), weights(straight)
    assert mine.keys() == ref.keys()
    assert all(torch.equal(mine[k], ref[k]) for k in ref), "weights differ from the uninterrupted run"


# The script's own guard against a requeue loop (MAX_REQUEUES), lowered so that a loop fails the test in minutes.
TIME_LIMIT_CAP = 12


def assert_progress(log: str, max_steps: int) -> list[tuple[int, int]]:
    """Every attempt of a job saved a later step than it began at, and the last one ended at `max_steps`: the
    job never requeued without progress, however many attempts a slow machine needed. Returns (began, saved)."""
    ends = re.findall(r"\[sbatch\] training exited with \d+; latest checkpoint: (\S+) \(this attempt began at (\S+)\)",
                      log)
    assert ends, log[-3000:]
    attempts = [(-1 if b == "none" else int(b[5:]), -1 if e == "none" else int(e[5:])) for e, b in ends]
    for i, (began, saved) in enumerate(attempts):
        assert saved > began, f"attempt {i + 1} began at step {began} and saved nothing later ({saved}):\n{log[-3000:]}"
    assert attempts[-1][1] == max_steps, log[-3000:]
    assert all(a[1] == b[0] for a, b in zip(attempts, attempts[1:])), f"an attempt did not resume where the last saved: {attempts}"
    return attempts


def test_the_progress_rule_fails_on_a_requeue_without_progress() -> None:
    line = "[sbatch] training exited with 0; latest checkpoint: {} (this attempt began at {})\n"
    good = line.format("step_00000467", "none") + line.format("step_00000800", "step_00000467")
    assert assert_progress(good, 800) == [(-1, 467), (467, 800)]
    stuck = line.format("step_00000467", "none") + line.format("step_00000467", "step_00000467") + \
        line.format("step_00000800", "step_00000467")
    with pytest.raises(AssertionError, match="attempt 2 began at step 467 and saved nothing later"):
        assert_progress(stuck, 800)


def test_a_short_time_limit_saves_requeues_once_per_stop_and_ends_with_the_straight_weights(
        slurm: LocalSlurm, shards: Path, straight: Path, tmp_path: Path) -> None:
    """--time=2 (minutes): the script's stop signal comes half the time limit before it (MIN_SIGNAL_LEAD lowered as
    its header allows), mid-run; the ranks save, the job requeues once per stop and resumes at the saved step,
    and the run ends COMPLETED with the weights of the uninterrupted run, bit for bit. How many stops it takes is
    the machine's speed: judged is that every attempt progressed (the script's cap only stops a loop). Two
    minutes, not one: on a loaded 2-core machine a start alone took over the 30 s one minute leaves to train, and
    an attempt stopped before its first step is, by the script's rule, not requeued."""
    out = tmp_path / "out"
    job = submit(slurm, tmp_path / "submit", "pretrain_multinode.sbatch", "--time=2",
                 env={**MULTI, "MIN_SIGNAL_LEAD": "20", "SHARDS": str(shards), "OUT": str(out),
                      "MAX_REQUEUES": str(TIME_LIMIT_CAP)})
    # one attempt lasts at most the two minutes of its time limit, plus its requeue
    info = job.wait_end(timeout=150 * (TIME_LIMIT_CAP + 1), max_restarts=TIME_LIMIT_CAP)
    log = job.log()
    assert info["JobState"] == "COMPLETED", log[-4000:]
    attempts = assert_progress(log, int(MULTI["MAX_STEPS"]))
    stops = re.findall(r"stop requested \(SIGTERM\) at step (\d+): checkpoint \S+ saved in", log)
    resumed = re.findall(r"resumed from \S+ at step (\d+)", log)
    # at least one stop came from the time limit, each stop was one save and one requeue, each resume at its step
    assert stops and resumed == stops and int(info["Restarts"]) == len(stops) == len(attempts) - 1, log[-4000:]
    assert log.count("[sbatch] not finished: requeueing") == len(stops)
    assert_complete(out, int(MULTI["MAX_STEPS"]))
    mine, ref = weights(out), weights(straight)
    assert mine.keys() == ref.keys()
    assert all(torch.equal(mine[k], ref[k]) for k in ref), "weights differ from the uninterrupted run"


def test_a_plain_scancel_ends_the_job_without_a_requeue(slurm: LocalSlurm, shards: Path, tmp_path: Path) -> None:
    """scancel without a signal (the user's "stop this job") ends a training job for good, whatever it saved."""
    job = submit(slurm, tmp_path / "submit", "pretrain_multinode.sbatch",
                 env={**MULTI, "MAX_STEPS": "100000", "SHARDS": str(shards), "OUT": str(tmp_path / "out")})
    job.wait_for(r'"event": "start"')
    slurm.cmd(["scancel", str(job.id)])
    info = job.wait_end()
    log = job.log()
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "0", log[-4000:]
    assert "not finished: requeueing" not in log and "cancelled: not requeued" in log, log[-3000:]


@pytest.mark.parametrize("case", ["wrong-repo", "refused-out", "killed-rank", "time-too-short"])
def test_a_deterministic_failure_ends_the_job_without_a_requeue(
        slurm: LocalSlurm, shards: Path, tmp_path: Path, case: str) -> None:
    out = tmp_path / "out"
    env = {**MULTI, "MAX_STEPS": "100000", "SHARDS": str(shards), "OUT": str(out)}
    extra: tuple[str, ...] = ()
    if case == "wrong-repo":
        env["REPO"] = str(tmp_path / "not-a-clone")
        expected = "not a SkillNet clone"
    elif case == "refused-out":
        out.mkdir()
        (out / "notes.txt").write_text("someone else's files\n")
        env["RANKS_PER_NODE"] = "1"  # the refusal comes before any collective: one rank starts faster
        expected = "holds a run without a marker"
    elif case == "time-too-short":
        extra = ("--time=1",)  # half a minute is under MIN_SIGNAL_LEAD's 60 s: no time to train, then save
        expected = "too short to train and still save"
    else:
        expected = "exits with return code = -9"
    job = submit(slurm, tmp_path / "submit", "pretrain_multinode.sbatch", *extra, env=env)
    if case == "killed-rank":
        job.wait_for(r'"event": "start"')
        time.sleep(1)
        # rank 1 of this job: its command line names this test's OUT (a lost GPU, the OOM killer)
        victims = [int(p.name) for p in Path("/proc").glob("[0-9]*")
                   if all(w in _cmdline(p) for w in ("pretrain/run.py", "--local_rank=1", str(out)))]
        assert victims, "rank 1 not found"
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
    info = job.wait_end()
    log = job.log()
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", info.get("JobState") + log[-3000:]
    assert expected in log, log[-3000:]
    assert "requeueing" not in log


def _cmdline(p: Path) -> str:
    try:
        return (p / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_the_v100_job_refuses_two_ranks_without_a_requeue(slurm: LocalSlurm, shards: Path, tmp_path: Path) -> None:
    """The paper's recipe on a CPU cluster (docs/training.md: the resources overridden on the sbatch line): its
    JSON fixes 32 ranks, run.py says so in one line, and the job ends there."""
    job = submit(slurm, tmp_path / "submit", "pretrain_v100x32.sbatch", "--nodes=1", "--ntasks-per-node=2",
                 "--gpus-per-node=0", env={"SHARDS": str(shards), "OUT": str(tmp_path / "out")})
    info = job.wait_end()
    log = job.log()
    assert info["JobState"] == "FAILED" and info["Restarts"] == "0", log[-3000:]
    assert "This JSON expects 32 ranks" in log and "requeueing" not in log, log[-3000:]
