"""DeepSpeed's C++ ops at launch: imported prebuilt where the install carries them, else JIT-built by torch under
a lock whose dead builder does not block.

torch's ``_jit_compile`` guards each build with ``FileBaton(<build dir>/lock)``, which a build killed by a signal
never removes: every later launch that builds or loads that op (a shared home: every job of the user) polls for
it without end. `guard_op_builds` (every launch, through training/dist.py's prepare_extensions) takes the first
route that applies: **prebuilt** ops (DeepSpeed installed with them compiled in, ``DS_BUILD_SHM_COMM=1
DS_BUILD_FUSED_ADAM=1 pip install deepspeed``, lists them in ``installed_ops`` and imports them: no build, no
lock, nothing patched); the **patch** (torch 2.13: the lock records its builder, who holds a flock on it that
the kernel or the NFS server drops however the builder dies; a waiter that finds it free takes the lock over in
one rename and rebuilds, and while the builder lives says whom it waits for); else one line, once, with the
command that clears a dead lock.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import functools
import json
import math
import os
import socket
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from .deepspeed_patches import installed_series

__all__ = ["LAUNCH_OPS", "PATCH_WRITTEN_FOR", "guard_op_builds", "install_op_build_lock", "prebuilt"]

# The ops a launch builds on a CPU rank (intra-node collectives, the fused optimizer); `python -m
# skillnet.training.warmup` builds the same ahead, by their DeepSpeed builders.
LAUNCH_OPS = {"deepspeed_shm_comm": "ShareMemCommBuilder", "fused_adam": "FusedAdamBuilder"}
PATCH_WRITTEN_FOR = (2, 13)  # the torch series whose cpp_extension the patch replaces names of
_noticed: list[str] = []  # the notice of the unguarded route, once per process


def prebuilt(ops: Sequence[str] = tuple(LAUNCH_OPS)) -> bool:
    """Whether the installed DeepSpeed carries every one of `ops` compiled in for this accelerator, so that
    ``OpBuilder.load`` imports it instead of building it (DeepSpeed's own test, in that method)."""
    try:
        from deepspeed.accelerator import get_accelerator  # noqa: PLC0415
        from deepspeed.git_version_info import accelerator_name, installed_ops  # noqa: PLC0415
    except ImportError:
        return False
    return accelerator_name == get_accelerator()._name and all(installed_ops.get(op, False) for op in ops)


def guard_op_builds(extensions: str | os.PathLike[str], ops: Sequence[str] = tuple(LAUNCH_OPS)) -> str:
    """Make sure no launch waits forever on a dead op build's lock in `extensions` (module docstring): returns
    the route, "prebuilt", "patched" or "unguarded"."""
    if prebuilt(ops):
        return "prebuilt"
    if install_op_build_lock():
        return "patched"
    if not _noticed:
        _noticed.append("said")
        have = ".".join(map(str, installed_series("torch")))
        want = ".".join(map(str, PATCH_WRITTEN_FOR))
        print(f"[skillnet] torch {have}: the op-build lock patch (torch {want}) is off, so an op build killed "
              f"mid-way leaves a lock the next launch waits on forever; clear it with: rm -f {extensions}/*/lock",
              file=sys.stderr, flush=True)
    return "unguarded"


OP_LOCK_UNOWNED_STALE_S = 600.0  # a lock without an owner record (torch's own, an older SkillNet): see _gone
_CHECK_EVERY_S = 1.0  # how often a waiter looks at the lock's owner (torch polls the file every 0.1 s)
_SAY_AFTER_S = 5.0  # a waiter says whom it waits for once it has waited this long (the usual wait: an up-to-date op)
_SAY_EVERY_S = 60.0  # and then again this often
_TAKEN: dict[str, int] = {}  # lock path -> fd of a lock this process took over in wait(), for its rebuild


class _Rebuild(Exception):
    """wait() took over a dead builder's lock: the build must run again, in this process."""


def _boot_id() -> str:
    with contextlib.suppress(OSError), open("/proc/sys/kernel/random/boot_id", encoding="ascii") as f:
        return f.read().strip()
    return ""


def _started(pid: int) -> str | None:
    """The start time of process `pid` in clock ticks since boot (tells a reused pid apart); None if none runs."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _owner_record() -> bytes:
    pid = os.getpid()
    return json.dumps({"pid": pid, "host": socket.gethostname(), "boot_id": _boot_id(), "started": _started(pid),
                       "since": time.time()}).encode()


def _try_flock(fd: int) -> bool | None:
    """Take the flock of `fd` without waiting: True taken, False another process holds it, None unsupported."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    except OSError as e:
        if e.errno in (errno.EAGAIN, errno.EACCES):
            return False
        return None  # ENOLCK, EOPNOTSUPP, EBADF: a filesystem without locks


def _lock_file(path: str, place: Callable[[str, str], None]) -> int | None:
    """A new lock file of this process (owner record written, flock held) put at `path` by ``place(tmp, path)``:
    os.link (only where nothing is: an acquire) or os.replace (a takeover). The record is complete and the flock
    held before the name appears, so no one sees an ownerless lock of ours. Returns its fd, None if `path` is
    taken."""
    tmp = f"{path}.{socket.gethostname()}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_RDWR, 0o644)
    try:
        _try_flock(fd)
        os.write(fd, _owner_record())
        try:
            place(tmp, path)
        except FileExistsError:
            os.close(fd)
            return None
        except OSError as e:  # a filesystem without hard links: torch's own O_EXCL create, record written after
            if e.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP) or place is not os.link:
                raise
            os.close(fd)
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o644)
            except FileExistsError:
                return None
            _try_flock(fd)
            os.write(fd, _owner_record())
        return fd
    except BaseException:
        with contextlib.suppress(OSError):
            os.close(fd)
        raise
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _held_open_here(path: str) -> bool:
    """Whether another process on this machine that this user can see has `path` open (torch's own FileBaton
    keeps its lock open for the whole build)."""
    target, me = os.path.realpath(path), str(os.getpid())
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        if fd_dir.parent.name == me:  # this process has it open only to look at it
            continue
        with contextlib.suppress(OSError):
            for fd in fd_dir.iterdir():
                with contextlib.suppress(OSError):
                    if os.readlink(fd) == target:
                        return True
    return False


def _describe(owner: dict[str, Any] | None, st: os.stat_result) -> str:
    if not owner:
        return f"a build without an owner record, its lock {(time.time() - st.st_mtime) / 60:.0f} min old"
    return (f"the build of pid {owner.get('pid')} on {owner.get('host')}, "
            f"started {(time.time() - float(owner.get('since', st.st_mtime))) / 60:.1f} min ago")


def _gone(owner: dict[str, Any] | None, st: os.stat_result, flocked: bool | None, path: str) -> str | None:
    """Why the builder of the lock at `path` is gone, or None if it may still run. `flocked`: this process just
    took the lock file's flock (True), found it held (False: never called then), or the filesystem has none."""
    age = time.time() - st.st_mtime
    if owner is None:
        # torch's own lock (or an older SkillNet's): no owner to ask; a local builder still has it open, and a
        # build on another machine of a shared home takes minutes, not this long
        if _held_open_here(path) or age < OP_LOCK_UNOWNED_STALE_S:
            return None
        return (f"it records no owner, no process on this machine has it open, and it is {age / 60:.0f} min old "
                "(a build takes minutes)")
    if flocked:
        return f"pid {owner.get('pid')} on {owner.get('host')} no longer holds it (killed during the build)"
    if owner.get("host") == socket.gethostname():  # a filesystem without flock: ask the process table
        if owner.get("boot_id") != _boot_id():
            return f"{owner.get('host')} has restarted since pid {owner.get('pid')} took it"
        if _started(int(owner.get("pid", -1))) != owner.get("started"):
            return f"pid {owner.get('pid')} on this machine has ended"
        return None
    if age >= OP_LOCK_UNOWNED_STALE_S:
        return f"its builder on {owner.get('host')} cannot be asked (no flock here) and it is {age / 60:.0f} min old"
    return None


def _take_over_if_gone(path: str) -> tuple[int | None, str]:
    """(fd of this process's lock now at `path`, why the old builder is gone) if it was gone, else
    (None, whom the lock belongs to). Two waiters never both take one dead lock: each holds the dead file's
    flock while it checks, and replaces it only while `path` still names that very file."""
    try:
        fd = os.open(path, os.O_RDWR)  # flock over NFS needs a file open for writing
    except FileNotFoundError:
        return None, "nothing (released)"
    except OSError as e:
        return None, f"a lock this user cannot inspect ({e.strerror})"
    try:
        st = os.fstat(fd)
        raw = os.pread(fd, 4096, 0)
        try:
            owner = json.loads(raw) if raw.strip() else None
        except ValueError:
            owner = None
        owner = owner if isinstance(owner, dict) else None
        flocked = _try_flock(fd)
        if flocked is False:
            return None, _describe(owner, st)
        reason = _gone(owner, st, flocked, path)
        if reason is None:
            return None, _describe(owner, st)
        try:
            now = os.stat(path)
        except FileNotFoundError:
            return None, "nothing (released)"
        if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):  # released and taken again meanwhile
            return None, "a new build"
        return _lock_file(path, os.replace), reason
    finally:
        os.close(fd)


def _op_name(path: str) -> str:
    return Path(path).parent.name


def _owned_baton_class() -> type:
    from torch.utils.file_baton import FileBaton  # noqa: PLC0415

    class OwnedBaton(FileBaton):  # type: ignore[misc]
        """torch's FileBaton with an owner: see `install_op_build_lock`."""

        def try_acquire(self) -> bool:
            fd = _TAKEN.pop(self.lock_file_path, None)
            if fd is None:
                fd = _lock_file(self.lock_file_path, os.link)
            if fd is None:
                return False
            self.fd = fd
            return True

        def wait(self) -> None:
            path, t0, said, checked = self.lock_file_path, time.monotonic(), -math.inf, -math.inf
            while os.path.exists(path):
                now = time.monotonic()
                if now - checked >= _CHECK_EVERY_S:
                    checked = now
                    fd, why = _take_over_if_gone(path)
                    if fd is not None:
                        _TAKEN[path] = fd
                        print(f"[skillnet] {path}: the build that held it is gone ({why}): building "
                              f"{_op_name(path)} here", file=sys.stderr, flush=True)
                        raise _Rebuild(path)
                    if now - t0 >= _SAY_AFTER_S and now - said >= _SAY_EVERY_S and os.path.exists(path):
                        said = now
                        print(f"[skillnet] op {_op_name(path)}: waiting for {why} ({path}; waited "
                              f"{now - t0:.0f} s; a lock whose builder dies is taken over)",
                              file=sys.stderr, flush=True)
                time.sleep(self.wait_seconds)

        def release(self) -> None:
            # the name goes before the flock: a waiter that takes the flock then finds another file (or none)
            if self.fd is not None:
                with contextlib.suppress(OSError):
                    if os.path.samestat(os.stat(self.lock_file_path), os.fstat(self.fd)):
                        os.remove(self.lock_file_path)
                os.close(self.fd)
                self.fd = None

    return OwnedBaton


def install_op_build_lock() -> bool:
    """Make torch's JIT op builds (DeepSpeed's ``OpBuilder.load``) use a lock whose dead builder does not block:
    call before any op is built (training/dist.py's prepare_extensions does, in every rank and in
    ``python -m skillnet.training.warmup``, through `guard_op_builds`). Idempotent; False where torch is not the
    series it was written for (PATCH_WRITTEN_FOR).

    torch 2.13's ``_jit_compile`` takes ``FileBaton(<build dir>/lock)`` (a module global), builds when it got
    it and otherwise ``wait()``\\s until the file is gone, then imports the op. Its versioner builds only the
    first time a process sees an op, so a waiter that takes a dead lock over raises out of ``wait()`` and
    ``_jit_compile`` runs again with the op forgotten: the build (ninja redoes only what the dead one left
    unfinished) happens under the lock it now holds."""
    if installed_series("torch") != PATCH_WRITTEN_FOR:
        return False
    from torch.utils import cpp_extension  # noqa: PLC0415

    if getattr(cpp_extension._jit_compile, "_skillnet_op_lock", False):
        return True
    original = cpp_extension._jit_compile

    @functools.wraps(original)
    def _jit_compile(name: str, *args: Any, **kwargs: Any) -> Any:
        while True:
            try:
                return original(name, *args, **kwargs)
            except _Rebuild:
                cpp_extension.JIT_EXTENSION_VERSIONER.entries.pop(name, None)

    _jit_compile._skillnet_op_lock = True  # type: ignore[attr-defined]
    cpp_extension.FileBaton = _owned_baton_class()
    cpp_extension._jit_compile = _jit_compile
    return True
