"""Commands run without an interpreter's start-up each: the runs of a comparison (finetune/compare.py), up to
`jobs` at once, in long-lived worker processes, and the reproduction's comparisons, exports and held-out
checks in its own process (``InProcessCommands``).

Why: on the CPU demo a fine-tuning run is seconds of training behind seconds of start-up (importing torch,
transformers and the model code, ~10 s on a laptop core, plus the caches a run warms: metric scorers,
lexical baselines). A plain ``python -m skillnet.finetune.run`` therefore runs inside a long-lived worker
(``_run_in_process``) rather than as a fresh interpreter, and within `shared_workers` the same workers
serve every comparison of the process (a reproduction runs several). Measured on `make demo` (2 cores,
bench/in_process.py, docs/speed.md "Long-lived workers"): 165 s with them against 401 s with a fresh
interpreter per command (``--subprocesses``), 58% less (56-59% over two repetitions). Runs under a
launcher (DeepSpeed, a cluster) are subprocesses as before. A worker dies with the comparison that started it and holds the output folder's
lock while it lives.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from skillnet.common.cli import output_to

REPO = Path(__file__).resolve().parents[1]  # the checkout: where a subprocess run starts


def _run_in_process(cmd: list[str], rdir: Path) -> tuple[int, float]:
    """The run of `cmd` (a plain `python -m skillnet.finetune.run ...`) in this process, its output in
    run.log: no interpreter and library start-up per run (seconds each, which dominate tiny runs)."""
    import logging

    import torch
    from skillnet.finetune.cli import main as finetune_main

    rdir.mkdir(parents=True, exist_ok=True)
    args = cmd[cmd.index("skillnet.finetune.run") + 1:]
    t0 = time.time()
    threads = torch.get_num_threads()
    with open(rdir / "run.log", "a", encoding="utf-8") as logf:
        logf.write(f"$ {shlex.join(cmd)}   (in process)\n")
        logf.flush()
        # Every log record of the run goes to its run.log: the root logger gets one handler on that file for
        # the duration (the run's own logging.basicConfig is then a no-op), restored afterwards.
        handler = logging.StreamHandler(logf)
        handler.setFormatter(logging.Formatter("%(message)s"))
        root = logging.getLogger()
        saved = (root.handlers[:], root.level)
        root.handlers[:] = [handler]
        root.setLevel(logging.INFO)
        try:
            with output_to(logf):
                rc = finetune_main(args)
        except Exception:  # noqa: BLE001 (a failed run is reported like a failed subprocess)
            import traceback

            logf.write(traceback.format_exc())
            rc = 1
        finally:
            root.handlers[:], level = saved
            root.setLevel(level)
            torch.set_num_threads(threads)
    return rc, time.time() - t0


def _run_one(cmd: list[str], rdir: Path) -> tuple[int, float]:
    rdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    t0 = time.time()
    with open(rdir / "run.log", "a", encoding="utf-8") as logf:
        logf.write(f"$ {shlex.join(cmd)}\n")
        logf.flush()
        r = subprocess.run(cmd, cwd=REPO, stdout=logf, stderr=subprocess.STDOUT, env=env)
    return r.returncode, time.time() - t0


Job = tuple[str, list[str], Path, bool]  # (progress line head, command, run dir, in process)


_RUNNING: list[Path] = []  # the run a worker process is in (read by its parent watch)


def _run_job(job: Job) -> tuple[int, float]:
    _, cmd, rdir, in_process = job
    t0 = time.time()
    _RUNNING.append(rdir)
    try:
        return (_run_in_process if in_process else _run_one)(cmd, rdir)
    except Exception as e:  # noqa: BLE001 (an error outside the run reports like a failed run)
        rdir.mkdir(parents=True, exist_ok=True)
        with open(rdir / "run.log", "a", encoding="utf-8") as f:
            f.write(f"run aborted: {type(e).__name__}: {e}\n")
        return 1, time.time() - t0
    finally:
        _RUNNING.remove(rdir)


def _watch_parent(parent: int, grace_s: float = 120.0, held: Any = None) -> None:
    """Worker initializer: when the comparison's process is gone (killed, or stopped by SIGTERM), the worker
    gets SIGTERM itself (its run saves a checkpoint and stops, as a preempted run does), and exits after
    `grace_s` at the latest; an orphaned worker would otherwise wait for work forever. `held`: the descriptor
    of an output folder's lock (an _InheritedFd in the parent), open in the worker for as long as it lives:
    nothing closes it, so the worker holds the lock; its number is all that arrives here."""
    import signal
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)
        end = time.time() + grace_s
        while _RUNNING and time.time() < end:  # the run is saving its checkpoint
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


class _InheritedFd:
    """A file descriptor that a spawned worker inherits under the same number: multiprocessing passes it to
    the child when the worker's start arguments are pickled (this is how its own pipes reach the child)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing import reduction

        return (_detach, (reduction.DupFd(self.fd),))


def _detach(dup: Any) -> int:
    return dup.detach()


def _new_pool(jobs: int, lock_fd: int | None = None) -> Any:
    import concurrent.futures as cf
    import multiprocessing as mp

    held = None if lock_fd is None else _InheritedFd(lock_fd)
    return cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=_watch_parent,
                                  initargs=(os.getpid(), 120.0, held))


# The worker pool shared by the comparisons of this process, by number of workers (shared_workers), or None.
_SHARED: dict[int, Any] | None = None
_SHARED_LOCK_FD: int | None = None


@contextlib.contextmanager
def shared_workers(lock_fd: int | None = None) -> Iterator[None]:
    """Within the block, the in-process runs of every comparison that this process runs (``main``, called once
    per comparison, as a reproduction does) go to one pool of worker processes, kept from one comparison to
    the next: a worker pays its start-up (importing torch, transformers and the model code: ~10 s on a
    laptop core) and warms its caches (metric scorers, baselines) once, not once per comparison. `lock_fd`:
    the descriptor of an output folder's lock (training/outputs.exclusive), which every worker holds too,
    so that the folder stays locked while a worker runs even if this process is killed."""
    global _SHARED, _SHARED_LOCK_FD
    if _SHARED is not None:  # nested: the outer block's pool serves
        yield
        return
    _SHARED, _SHARED_LOCK_FD = {}, lock_fd
    try:
        yield
    finally:
        pools, _SHARED, _SHARED_LOCK_FD = _SHARED, None, None
        for pool in pools.values():
            pool.shutdown(wait=True, cancel_futures=True)


def run_all(todo: list[Job], jobs: int, finished: Callable[[Job, int, float], None]) -> None:
    """Every run of `todo`, up to `jobs` at once; `finished(job, exit code, seconds)` as each ends. In-process
    runs go to long-lived worker processes (start-up paid once per worker, not per run; once per process
    within ``shared_workers``); the others are subprocesses anyway."""
    if jobs <= 1 or len(todo) <= 1:
        for job in todo:
            print(f"{job[0]}: running (log: {job[2] / 'run.log'})", file=sys.stderr, flush=True)
            finished(job, *_run_job(job))
        return
    import concurrent.futures as cf

    pool: cf.Executor
    owned = True
    if all(j[3] for j in todo):
        if _SHARED is not None:
            if jobs not in _SHARED:
                _SHARED[jobs] = _new_pool(jobs, _SHARED_LOCK_FD)
            pool, owned = _SHARED[jobs], False
        else:
            pool = _new_pool(min(jobs, len(todo)))
    else:
        pool = cf.ThreadPoolExecutor(max_workers=min(jobs, len(todo)))
    with contextlib.ExitStack() as stack:
        if owned:
            stack.enter_context(pool)
        futures = {pool.submit(_run_job, job): job for job in todo}
        print(f"[compare] {len(todo)} runs, {jobs} at a time (logs: <run dir>/run.log)", file=sys.stderr, flush=True)
        for f in cf.as_completed(futures):
            try:
                rc, secs = f.result()
            except Exception as e:  # noqa: BLE001 (the worker process itself died)
                print(f"{futures[f][0]}: worker died: {e}", file=sys.stderr, flush=True)
                rc, secs = 1, 0.0
                # a broken pool takes no more work: the next comparison starts another
                if (not owned and isinstance(e, cf.process.BrokenProcessPool) and _SHARED is not None
                        and _SHARED.pop(jobs, None) is not None):
                    pool.shutdown(wait=False)
            finished(futures[f], rc, secs)


class InProcessCommands:
    """``python -m <module> ...`` of MODULES, run in this process by calling the module's ``main(argv)``: the same
    command line, output, exit code and files as a subprocess, without its start-up. A comparison's runs go to
    the worker processes every comparison of this process shares (``shared_workers``). `lock_fd`: the output
    folder's lock, which the workers hold too, as a subprocess does."""

    # The reproduction's torch commands other than training (DeepSpeed launches its ranks; pre-training keeps
    # its own process).
    MODULES = ("skillnet.finetune.compare", "skillnet.pretrain.export", "skillnet.pretrain.heldout")

    def __init__(self, lock_fd: int | None = None) -> None:
        self.lock_fd = lock_fd
        self._workers: contextlib.ExitStack | None = None

    def takes(self, cmd: list[str]) -> bool:
        return len(cmd) > 2 and cmd[:2] == [sys.executable, "-m"] and cmd[2] in self.MODULES

    def run(self, cmd: list[str], f: IO[str], env: dict[str, str]) -> int:
        import importlib
        import traceback

        f.write("(run in the reproduction's process)\n")
        with _environ(env):
            try:
                # imported outside output_to: a library's log handler made at import (transformers') must write
                # to this process's stderr, not to a stage log that is closed afterwards
                module = importlib.import_module(cmd[2])
                if cmd[2] == "skillnet.finetune.compare" and self._workers is None:
                    self._workers = contextlib.ExitStack()
                    self._workers.enter_context(shared_workers(self.lock_fd))
            except Exception:  # noqa: BLE001 (reported like a subprocess that fails at start-up)
                f.write(traceback.format_exc())
                return 1
            with output_to(f):
                try:
                    return int(module.main(cmd[3:]) or 0)
                except SystemExit as e:  # argparse's errors and the like, as a subprocess would exit
                    if isinstance(e.code, str):
                        print(e.code, file=sys.stderr)
                    return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
                except Exception:  # noqa: BLE001 (a failed command fails its stage like a failed subprocess)
                    traceback.print_exc()
                    return 1

    def close(self) -> None:
        """Stop the worker processes (they finish a run in progress first)."""
        if self._workers is not None:
            self._workers.close()
            self._workers = None


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """os.environ is `env` within the block (a command run in this process sees what a subprocess would)."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
