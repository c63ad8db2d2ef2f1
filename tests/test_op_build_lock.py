"""A JIT op build killed by a signal never makes a later build or launch wait on its lock (issue 50, item 7).

torch's FileBaton leaves ``<TORCH_EXTENSIONS_DIR>/<op>/lock`` behind when its builder is killed, and every later
build of that op polls for it without end. training/op_build.py install_op_build_lock (the fallback where the
ops are not prebuilt) records the
builder in the lock and takes a dead builder's lock over (tests/test_deepspeed_patches.py checks that torch
still builds the way it assumes). Every test here builds into its own TORCH_EXTENSIONS_DIR: the user's cache is
only read, to copy DeepSpeed's already compiled objects so that a rebuild is a link, not minutes of compiling.
"""

from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.fixtures.pretrain.helpers import REPO, subprocess_env

BUILD = REPO / "tests" / "fixtures" / "op_build.py"
SLOW_S = 1.0  # each compiler call of a build that is to be killed sleeps this long first: a wide window


def _env(ext: Path, slow: Path | None = None) -> dict[str, str]:
    env = {**subprocess_env(), "TORCH_EXTENSIONS_DIR": str(ext)}
    if slow is not None:
        env["PATH"] = f"{slow}{os.pathsep}{env['PATH']}"
    return env


def _slow_compiler(tmp: Path) -> Path:
    """A folder whose `c++` sleeps, then runs the real one (build.ninja names `c++` either way, so the
    unkilled rebuild after it is not a changed command)."""
    real = shutil.which("c++")
    if real is None:
        pytest.skip("no C++ compiler: torch cannot build ops here")
    d = tmp / "slow_bin"
    d.mkdir(exist_ok=True)
    (d / "c++").write_text(f'#!/bin/sh\nsleep {SLOW_S}\nexec {real} "$@"\n')
    (d / "c++").chmod(0o755)
    return d


def _kill_during_build(ext: Path, args: list[str], delay: float, slow: Path, lock: Path) -> bool:
    """Start a build, SIGKILL its whole process group (python, ninja, the compiler) `delay` s after it starts
    building, as a preemption or Ctrl-C does; returns whether it left its lock behind."""
    p = subprocess.Popen([sys.executable, str(BUILD), *args], cwd=REPO, env=_env(ext, slow), stdout=subprocess.PIPE,
                         stderr=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        assert p.stdout is not None
        for line in p.stdout:
            if line.startswith("building"):
                break
        time.sleep(delay)
    finally:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    return lock.exists()


def _build(ext: Path, args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    try:
        r = subprocess.run([sys.executable, str(BUILD), *args], cwd=REPO, env=_env(ext), capture_output=True,
                           text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"the build after a killed one waited {timeout} s: {e.stderr!r}") from None
    assert r.returncode == 0, r.stderr[-3000:]
    return r


@pytest.mark.slow
def test_a_build_killed_at_random_points_never_blocks_the_next(tmp_path: Path) -> None:
    """SIGKILL a tiny op's build at random points (before, during the compile, during the link, after); the
    next build completes within seconds each time and loads what this round's source says (a rebuild, not a
    half-written op)."""
    ext, slow, src = tmp_path / "ext", _slow_compiler(tmp_path), tmp_path / "tiny.cpp"
    lock = ext / "tiny_op" / "lock"
    rng = random.Random(50)
    delays = [0.5 * SLOW_S, *(rng.uniform(0.0, 2.5 * SLOW_S) for _ in range(3))]
    left = []
    for k, delay in enumerate(delays, start=1):
        src.write_text(f'extern "C" int skillnet_tiny_op(int x) {{ return x + {k}; }}\n')
        left.append(_kill_during_build(ext, [str(src)], delay, slow, lock))
        r = _build(ext, [str(src)], timeout=60)
        # a copy: this process's dlopen would hand back the first round's library for the same path
        so = shutil.copy(r.stdout.split("built ", 1)[1].strip(), tmp_path / f"round{k}.so")
        assert ctypes.CDLL(so).skillnet_tiny_op(41) == 41 + k, f"round {k}: the op is not this round's build"
        if left[-1]:
            assert "the build that held it is gone" in r.stderr and "building tiny_op here" in r.stderr
        assert not lock.exists()
    assert left[0], "the kill inside the compile left no lock: the test did not test the stale lock"


def _hold(path: Path, then: str = "time.sleep(120)") -> subprocess.Popen[str]:
    """A process that takes the op lock as torch's build does (patch installed), says so, then runs `then`."""
    code = ("import sys, time\nfrom skillnet.training.op_build import install_op_build_lock\n"
            "install_op_build_lock()\nfrom torch.utils import cpp_extension\n"
            f"b = cpp_extension.FileBaton({str(path)!r})\nassert b.try_acquire()\nprint('held', flush=True)\n"
            f"{then}\nb.release()\n")
    p = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, env=subprocess_env(), stdout=subprocess.PIPE,
                         text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "held"
    return p


def test_a_live_builder_is_named_and_waited_for_a_killed_one_is_taken_over(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from skillnet.training import op_build as dsp

    assert dsp.install_op_build_lock()
    monkeypatch.setattr(dsp, "_SAY_AFTER_S", 0.0)  # named at once, not after the seconds an up-to-date op takes
    from torch.utils import cpp_extension

    lock = tmp_path / "op" / "lock"
    lock.parent.mkdir()
    holder = _hold(lock, then="time.sleep(2.5)")  # a live build that ends by itself
    fd, who = dsp._take_over_if_gone(str(lock))
    assert fd is None and f"the build of pid {holder.pid} on " in who
    t0 = time.monotonic()
    cpp_extension.FileBaton(str(lock)).wait()  # returns once the builder releases: nothing taken over
    assert holder.wait(timeout=30) == 0 and time.monotonic() - t0 > 1.0
    err = capsys.readouterr().err
    assert f"[skillnet] op op: waiting for the build of pid {holder.pid} on " in err and str(lock) in err

    holder = _hold(lock)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert lock.exists()  # what a killed build leaves
    with pytest.raises(dsp._Rebuild):
        cpp_extension.FileBaton(str(lock)).wait()
    assert f"pid {holder.pid} on " in capsys.readouterr().err
    mine = cpp_extension.FileBaton(str(lock))
    assert mine.try_acquire()  # the lock taken over is this process's now, for its rebuild
    assert f'"pid": {os.getpid()}' in lock.read_text()
    mine.release()
    assert not lock.exists()


def test_a_lock_without_an_owner_is_waited_for_while_open_here_or_young_and_taken_over_when_old(
        tmp_path: Path) -> None:
    """torch's own FileBaton (or an older SkillNet) writes no owner: a process of this machine that has it open
    is its live builder; otherwise it is taken as dead once older than any build."""
    from skillnet.training import op_build as dsp

    lock = tmp_path / "op" / "lock"
    lock.parent.mkdir()
    lock.write_text("")
    old = time.time() - 2 * dsp.OP_LOCK_UNOWNED_STALE_S
    os.utime(lock, (old, old))
    opener = subprocess.Popen([sys.executable, "-c", f"f = open({str(lock)!r}); print('open', flush=True); "
                               "import time; time.sleep(120)"], stdout=subprocess.PIPE, text=True)
    try:
        assert opener.stdout is not None and opener.stdout.readline().strip() == "open"
        fd, who = dsp._take_over_if_gone(str(lock))
        assert fd is None and "without an owner record" in who
    finally:
        opener.kill()
        opener.wait()
    os.utime(lock, None)  # young and open nowhere: a build elsewhere may still run
    assert dsp._take_over_if_gone(str(lock))[0] is None
    os.utime(lock, (old, old))
    fd, why = dsp._take_over_if_gone(str(lock))
    assert fd is not None and "records no owner" in why
    os.close(fd)


@pytest.mark.slow
def test_a_two_rank_launch_after_a_killed_deepspeed_op_build_completes(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """The issue's case: DeepSpeed's deepspeed_shm_comm build SIGKILLed while it holds its lock, then a 2-rank
    CPU launch on the same folder; it completes, and the op it loads is rebuilt (the killed build's link never
    finished)."""
    from skillnet.training.dist import extensions_dir

    from tests.fixtures.warm import launch_fixture

    monkeypatch.delenv("TORCH_EXTENSIONS_DIR", raising=False)
    cached, ext = extensions_dir() / "deepspeed_shm_comm", tmp_path / "ext"
    if (cached / "build.ninja").is_file():  # compiled objects from `make setup`: the rebuild below only links
        shutil.copytree(cached, ext / "deepspeed_shm_comm")
    so, lock = ext / "deepspeed_shm_comm" / "deepspeed_shm_comm.so", ext / "deepspeed_shm_comm" / "lock"
    so.unlink(missing_ok=True)
    assert _kill_during_build(ext, ["--deepspeed"], 0.5 * SLOW_S, _slow_compiler(tmp_path), lock), \
        "the killed build left no lock"
    assert not so.exists()
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(ext))
    r = launch_fixture("pretrain/run.py", ["--synthetic", "64", "--preset", "tiny", "--max_steps", "2",
                                           "--ds_config", "ds_configs/cpu_fp32.json", "--output_dir",
                                           str(tmp_path / "run"), "--no_progress", "--no_tensorboard"],
                       timeout=600, check=False)
    assert r.returncode == 0, r.stdout[-4000:]
    assert "the build that held it is gone" in r.stdout and "building deepspeed_shm_comm here" in r.stdout
    assert so.is_file() and not lock.exists()
