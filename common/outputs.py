"""Output folders no command clobbers, and one-line checks of degenerate option values.

Every command that writes a folder claims it first (``claim_output``):

* a folder that does not exist, or is empty, is created and marked as this command's
  (``.skillnet_output.json``: the command and what identifies its configuration);
* a folder marked by the same command with the same configuration is the command's own state: the
  caller resumes it, or replaces what it wrote there before, and says so;
* anything else (another command's output, another configuration, files nobody marked) is refused with
  one line naming the folder and what it holds, unless ``--overwrite`` is given;
* a path that is a file, or a folder that cannot be written, is refused in one line too.

A command that writes one file (predictions, a report) claims it with ``claim_file``: an existing file is
replaced only when it is what the command writes (its own test, e.g. the report's "Written by" line) or with
``--overwrite``; a folder, an unwritable place or one of the command's inputs is refused.

A command that runs for hours and resumes from its folder (the reproduction) also holds ``exclusive`` on it while
it runs: a second one started on the same folder (another terminal, a rerun of a job still running) is refused
in one line naming the first one's pid, instead of both writing the same stages. The lock is held by the
commands it starts too (``exclusive`` yields the lock's descriptor for them to inherit), so a reproduction killed
with its stage still running leaves the folder locked until that stage ends.

``check_options`` turns a value outside an option's range (``--lr -1``, ``--max-steps 0``) into one line
naming the option and the range, through the command's own parser (exit status 2, as argparse does).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["MARKER", "OutputError", "Claim", "claim_output", "replace_dir", "check_options", "Rule",
           "positive", "non_negative", "at_least", "in_range", "remove_own", "claim_file", "starts_with", "exclusive",
           "LOCK"]

MARKER = ".skillnet_output.json"
LOCK = ".skillnet_lock"


class OutputError(ValueError):
    """An output path a command will not write (the message names the option, the path and the way out)."""


@dataclass(frozen=True)
class Claim:
    path: Path
    state: str  # "new" | "own" (same command and configuration) | "overwrite" (--overwrite on another's)
    previous: dict[str, Any] | None  # the marker found there, if any


@contextlib.contextmanager
def exclusive(path: str | Path, *, option: str, command: str) -> Iterator[int | None]:
    """Hold an exclusive lock on the folder ``path`` (its LOCK file) while the block runs; raise OutputError in
    one line when another process holds it. Yields the lock's file descriptor: a child process given it
    (``pass_fds``) shares the lock, which lasts until the last process holding it ends, so a killed parent leaves
    nothing to clean up, and the folder stays locked while a command it started directly still runs (that
    command's own children, e.g. DeepSpeed's ranks, do not hold it: they end with it). Where the platform has no fcntl
    (Windows) or the filesystem no locks (some network mounts), nothing is locked and None is yielded."""
    try:
        import fcntl
    except ImportError:
        yield None
        return
    lock = Path(path) / LOCK
    lock.parent.mkdir(parents=True, exist_ok=True)
    # No explicit unlock: closing this descriptor ends the lock only when no child holds it any more.
    with open(lock, "a+", encoding="utf-8") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            if not isinstance(e, BlockingIOError):  # a filesystem without locks: go on
                yield None
                return
            f.seek(0)
            holder = f.read().strip() or "?"
            who = f"pid {holder}"
            if holder.isdigit() and not _alive(int(holder)):  # or it runs in another container or on another host
                who += ", not running here; a command it started may still run"
            raise OutputError(f"{option} {path}: another {command} ({who}) is writing it now; wait for it to "
                              "finish (rerunning then continues where it stopped) or give another folder") from None
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        yield f.fileno()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists, owned by someone else
        return True
    return True


def _writable(path: Path) -> bool:
    p = path
    while not p.exists():
        if p.parent == p:
            return False
        p = p.parent
    return p.is_dir() and os.access(p, os.W_OK | os.X_OK)


def claim_output(path: str | Path, *, option: str, command: str, identity: dict[str, Any], overwrite: bool | None,
                 describe: Callable[[Path], str] | None = None, ignore: Iterable[str] = (),
                 write: bool = True, adopt: Callable[[Path], bool] | None = None) -> Claim:
    """Create or take over ``path`` for ``command`` (module docstring). ``identity``: JSON-able settings that
    make two runs the same one (a resume or a redo), e.g. the source checkpoint of an export. ``ignore``:
    names that do not make a folder non-empty (a caller's own log of the command, written first).
    ``write=False``: decide (and raise) without creating or marking anything, e.g. on every rank of a
    launch before rank 0 claims the folder. ``overwrite=None``: the command has no ``--overwrite`` (it cannot
    tell its own files from others' to remove them), so a refusal only names another folder. ``adopt``:
    recognises an unmarked folder as this command's output from before folders were marked (it is marked and
    taken as its own, not refused)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise OutputError(f"{option} {p}: is a file, not a folder; give a folder path")
    if not _writable(p):
        raise OutputError(f"{option} {p}: cannot be written (permissions); give a folder you can write")
    ident = json.loads(json.dumps(identity, sort_keys=True, default=str))
    mine = {"command": command, "identity": ident}
    marker = p / MARKER
    skip = {MARKER, *ignore}
    # Empty, or holding nothing but a marker (a run that stopped before writing anything): nothing to lose.
    if not p.exists() or not any(q.name not in skip for q in p.iterdir()):
        if write:
            p.mkdir(parents=True, exist_ok=True)
            marker.write_text(json.dumps(mine, indent=2, sort_keys=True) + "\n")
        return Claim(p, "new", None)
    previous = None
    if marker.is_file():
        try:
            previous = json.loads(marker.read_text())
        except ValueError:
            previous = None
    if previous == mine:
        return Claim(p, "own", previous)
    if previous is None and adopt is not None and adopt(p):
        if write:
            marker.write_text(json.dumps(mine, indent=2, sort_keys=True) + "\n")
        return Claim(p, "own", None)
    if overwrite:
        if write:
            marker.write_text(json.dumps(mine, indent=2, sort_keys=True) + "\n")
        return Claim(p, "overwrite", previous)
    if previous is None:
        what = describe(p) if describe else "files this command did not write"
    elif previous.get("command") != command:
        what = f"the output of `{previous.get('command')}`"
    else:
        diff = sorted(k for k in set(ident) | set(previous.get("identity", {}))
                      if ident.get(k) != previous.get("identity", {}).get(k))
        what = f"an earlier `{command}` with other settings ({', '.join(diff)})"
    way_out = "Pick another folder" + (", or add --overwrite to replace it" if overwrite is not None else "")
    raise OutputError(f"{option} {p}: holds {what}; nothing was changed. {way_out}")


def starts_with(text: str, within: int = 4096) -> Callable[[Path], bool]:
    """The ``own`` test of ``claim_file`` for a file whose first ``within`` characters hold ``text`` (a
    report's "Written by `command`" line)."""
    def own(path: Path) -> bool:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                return text in f.read(within)
        except OSError:
            return False
    return own


def claim_file(path: str | Path, *, option: str, overwrite: bool, own: Callable[[Path], bool] | None = None,
               inputs: Iterable[str | Path] = ()) -> Path:
    """Check that the single output file ``path`` may be written (module docstring); create its folder. An
    input of the command (``inputs``) is refused even with ``overwrite``: it would be read and lost at once."""
    p = Path(path)
    if p.is_dir():
        raise OutputError(f"{option} {p}: is a folder, not a file; give a file path")
    if not _writable(p.parent):
        raise OutputError(f"{option} {p}: its folder cannot be written (permissions, or a file in the way); "
                          f"give a path you can write")
    if p.exists() and any(Path(i).exists() and p.samefile(i) for i in inputs):
        raise OutputError(f"{option} {p}: is also this command's input; give another file")
    if p.exists() and not overwrite and not (own is not None and own(p)):
        raise OutputError(f"{option} {p}: exists and was not written by this command; nothing was changed. "
                          f"Give another path, or add --overwrite to replace it")
    p.parent.mkdir(parents=True, exist_ok=True)
    return p


def replace_dir(tmp: Path, out: Path) -> None:
    """Put the finished folder ``tmp`` at ``out``: the old ``out`` moves aside first and is deleted only once
    the new one is in place, so a crash leaves one of them whole."""
    old = out.with_name(out.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if out.exists():
        os.replace(out, old)
    os.replace(tmp, out)
    shutil.rmtree(old, ignore_errors=True)


def remove_own(folder: Path, patterns: Iterable[str]) -> None:
    """Delete what a command wrote in ``folder`` (glob patterns of its files and folders), nothing else: what
    ``--overwrite`` replaces."""
    for pattern in patterns:
        for target in folder.glob(pattern):
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)


@dataclass(frozen=True)
class Rule:
    check: Callable[[Any], bool]
    text: str  # the allowed range, as the error states it


def positive() -> Rule:
    return Rule(lambda v: v > 0, "must be > 0")


def non_negative() -> Rule:
    return Rule(lambda v: v >= 0, "must be >= 0")


def at_least(lo: float) -> Rule:
    return Rule(lambda v: v >= lo, f"must be >= {lo}")


def in_range(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False) -> Rule:
    left, right = ("(" if lo_open else "["), (")" if hi_open else "]")
    return Rule(lambda v: (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi),
                f"must be in {left}{lo}, {hi}{right}")


def check_options(parser: argparse.ArgumentParser, args: argparse.Namespace,
                  rules: dict[str, Rule] | Iterable[tuple[str, Rule]]) -> None:
    """``parser.error`` (one line, exit 2) for the first option whose value breaks its rule; options left
    unset (None) are not checked."""
    for dest, rule in (rules.items() if isinstance(rules, dict) else rules):
        value = getattr(args, dest, None)
        if value is None:
            continue
        values = value if isinstance(value, list | tuple) else [value]
        for v in values:
            if isinstance(v, int | float) and not rule.check(v):
                parser.error(f"--{dest.replace('_', '-')} {v}: {rule.text}")
