"""The memory allocator the reproduction's commands run under (`--allocator`), and what bench/allocator.py
measures.

glibc returns every allocation above its mmap threshold (32 MB at most once it adapts) to the kernel, and the next
step faults it in again: a tiny model on 2 cores spent a quarter of its CPU time in the kernel (issue 56). Two
ways around it, neither changing any computation:

- tcmalloc: Debian's libtcmalloc-minimal4 preloaded (LD_PRELOAD), keeping freed pages;
- glibc-tuned: glibc with MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ raised, so large blocks come from the
  heap and stay there (no install needed).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys

ALLOCATORS = ("glibc", "tcmalloc", "glibc-tuned")
# 1 GiB: above any block of the full profile's steps (a 21k-vocab logit block is 170 MB)
TUNED = {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
_MARK = "SKILLNET_ALLOCATOR"


def current() -> str:
    """The allocator this process runs under (reexec_with marks it)."""
    return os.environ.get(_MARK, "glibc")


def find_library(stem: str) -> str | None:
    """The newest installed `lib<stem>.so*` (Debian's multiarch folders first), or None."""
    pats = [f"/usr/lib/*-linux-gnu/lib{stem}.so*", f"/usr/lib/lib{stem}.so*", f"/usr/lib64/lib{stem}.so*"]
    found = sorted(f for pat in pats for f in glob.glob(pat))
    return found[-1] if found else None


def allocator_env(name: str) -> dict[str, str] | None:
    """The environment variables that select allocator `name`; None when it is not installed here."""
    if name == "glibc":
        return {}
    if name == "glibc-tuned":
        return dict(TUNED)
    if name == "tcmalloc":
        lib = find_library("tcmalloc_minimal") or find_library("tcmalloc")
        return None if lib is None else {"LD_PRELOAD": lib}
    if name == "jemalloc":
        lib = find_library("jemalloc")
        return None if lib is None else {"LD_PRELOAD": lib}
    raise ValueError(f"unknown allocator {name!r}; known: {', '.join(ALLOCATORS)}, jemalloc")


# glibc's mallopt parameters (malloc.h): the same settings as the MALLOC_*_ variables, for a running process
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def _tune_this_process() -> bool:
    """Apply TUNED to this process's glibc (mallopt); False where libc has no mallopt (not glibc)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(p, int(TUNED[v])) == 1 for p, v in
               ((_M_MMAP_THRESHOLD, "MALLOC_MMAP_THRESHOLD_"), (_M_TRIM_THRESHOLD, "MALLOC_TRIM_THRESHOLD_")))


def reexec_with(name: str, argv: list[str] | None) -> None:
    """Put this reproduction under allocator `name`, every command it starts included. glibc-tuned applies in
    this process (mallopt) and in its children (the environment), so a caller in-process (a test calling main) is
    never replaced; tcmalloc must be preloaded, so the process runs again under it. Returns when it runs under
    `name`, or, with a warning, when the allocator is not available (then glibc)."""
    if name == "glibc" or os.environ.get(_MARK) == name:
        return
    if name == "glibc-tuned":
        if not _tune_this_process():
            print("warning: --allocator glibc-tuned: this C library has no mallopt; going on with its default",
                  file=sys.stderr)
            return
        os.environ.update({**TUNED, _MARK: name})
        return
    env = allocator_env(name)
    if env is None:
        print(f"warning: --allocator {name}: not installed here (apt-get install libtcmalloc-minimal4); "
              "going on with glibc", file=sys.stderr)
        return
    args = sys.argv[1:] if argv is None else list(argv)
    os.execve(sys.executable, [sys.executable, "-m", "skillnet.experiments", *args],
              {**os.environ, **env, _MARK: name})
