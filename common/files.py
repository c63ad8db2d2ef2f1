"""One atomic write for every file the project writes in place, and reads whose errors say which file and
which option it came from.

An atomic write goes to a temporary file beside the target (same directory, so the rename stays on one
file system), is flushed and fsync'ed, then renamed over the target: a reader sees the old file or the new
one, never a part, and a failed write removes its temporary file. Each write has a temporary of its own
(``.<name>.<random>.tmp``), so processes that write the same file at once (the jobs of a data_prep array
copying one vocab) never write into each other's. A process killed mid-write leaves its temporary behind:
whoever alone writes a file and resumes after such a kill removes them (`remove_temporaries`).

After the rename the folder itself is fsync'ed too (`fsync_dir`): a file's data reaches the disk with its own
fsync, but its name only with its folder's, so without it a machine crash (power loss, kernel panic) may lose the
rename while keeping what was written after it. A process crash loses neither: the kernel has both.
"""

from __future__ import annotations

import glob
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

# Files are created with the permissions open() would give them (mkstemp's own are 0600, which would hide
# a shared data folder's manifest from the other users of a cluster). Read once, at import.
_UMASK = os.umask(0o022)
os.umask(_UMASK)

__all__ = [
    "InputFileError",
    "atomic_torch_save",
    "atomic_write",
    "atomic_write_bytes",
    "atomic_write_json",
    "atomic_write_text",
    "fsync_dir",
    "fsync_tree",
    "read_bytes",
    "read_text",
    "remove_temporaries",
]


def atomic_write(path: str | os.PathLike[str], write: Callable[[IO[Any]], Any], *, binary: bool = False) -> Any:
    """Call ``write(f)`` on a temporary file beside `path`, fsync it and rename it onto `path`; returns what
    `write` returned. Text files are UTF-8 with ``\\n`` line ends."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o666 & ~_UMASK)
        with os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            result = write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)
    return result


def fsync_dir(path: str | os.PathLike[str]) -> None:
    """Make the names in folder `path` (files created, renamed or removed there) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a folder (they order their metadata themselves)
        pass
    finally:
        os.close(fd)


def fsync_tree(path: str | os.PathLike[str]) -> None:
    """fsync every file under folder `path`, then every folder bottom up (for files that others wrote with a
    plain open, e.g. DeepSpeed's ``torch.save``): afterwards a machine crash keeps all of them."""
    folders = []
    for root, _dirs, files in os.walk(path):
        folders.append(root)
        for name in files:
            try:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
            except FileNotFoundError:  # another writer's temporary, renamed meanwhile: its rename fsyncs it
                continue
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    for root in reversed(folders):
        fsync_dir(root)


def remove_temporaries(path: str | os.PathLike[str]) -> int:
    """Delete the temporaries that killed atomic writes of `path` left; returns how many. Only where no other
    process may be writing `path` now (its temporary would go too, and its rename then fail)."""
    path = Path(path)
    stale = list(path.parent.glob(f".{glob.escape(path.name)}.*.tmp"))
    for tmp in stale:
        tmp.unlink(missing_ok=True)
    return len(stale)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    atomic_write(path, lambda f: f.write(text))


def atomic_write_bytes(path: str | os.PathLike[str], data: bytes) -> None:
    atomic_write(path, lambda f: f.write(data), binary=True)


def atomic_write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2, sort_keys: bool = False) -> None:
    """`obj` as JSON (non-ASCII kept as is) and a final newline."""
    atomic_write_text(path, json.dumps(obj, indent=indent, sort_keys=sort_keys, ensure_ascii=False) + "\n")


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    import torch  # noqa: PLC0415  (only here: the data commands import this module without torch)

    atomic_write(path, lambda f: torch.save(obj, f), binary=True)


class InputFileError(ValueError):
    """A file given on the command line (or in a config) cannot be read as what it should be; the message
    names the option and the file."""


def _where(path: Path, option: str | None) -> str:
    return f"{option} {path}" if option else str(path)


def read_bytes(path: str | os.PathLike[str], *, option: str | None = None) -> bytes:
    """The bytes of `path`; a missing, unreadable or folder path fails naming `option` and the file."""
    path = Path(path)
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise InputFileError(f"{_where(path, option)}: file not found") from None
    except IsADirectoryError:
        raise InputFileError(f"{_where(path, option)}: is a folder, not a file") from None
    except OSError as e:
        raise InputFileError(f"{_where(path, option)}: cannot be read ({e.strerror or e})") from None


def read_text(path: str | os.PathLike[str], *, option: str | None = None, data: bytes | None = None) -> str:
    """`path` (or its bytes `data`, already read) as UTF-8 text; anything else, a binary file say, fails
    naming `option` and the file instead of with a bare codec error."""
    path = Path(path)
    data = read_bytes(path, option=option) if data is None else data
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InputFileError(f"{_where(path, option)}: not UTF-8 text (byte 0x{data[e.start]:02x} at offset "
                             f"{e.start}): is it a binary file?") from None
