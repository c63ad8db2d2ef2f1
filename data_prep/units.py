"""Input files and work units, the deterministic grain of parallelism: sorted input files are packed (small
files) or cut into byte ranges (large uncompressed line-oriented files) of about `unit_bytes`; unit k always
becomes shard k, whatever the number of workers or cluster jobs."""

from __future__ import annotations

import dataclasses
import glob
import os
import re
from collections.abc import Callable


@dataclasses.dataclass(frozen=True)
class Segment:
    """Byte range [start, end) of one input file; end=None = to EOF. Lines starting in the range are owned."""

    path: str
    start: int = 0
    end: int | None = None

    def to_json(self) -> list:
        return [self.path, self.start, self.end]


@dataclasses.dataclass(frozen=True)
class Unit:
    index: int
    segments: tuple[Segment, ...]
    nbytes: int

    def to_json(self) -> list:
        return [s.to_json() for s in self.segments]


def is_compressed(path: str) -> bool:
    return path.endswith((".gz", ".zst", ".zstd"))


def file_format(path: str, fmt: str) -> str:
    if fmt != "auto":
        return fmt
    base = re.sub(r"\.(gz|zst|zstd)$", "", path)
    return "jsonl" if base.endswith((".jsonl", ".json", ".ndjson")) else "text"


def expand_inputs(patterns: list[str]) -> list[str]:
    """Sorted, de-duplicated files matching the globs; a glob matching nothing is an error."""
    out: set[str] = set()
    for pat in patterns:
        hits = [p for p in glob.glob(pat, recursive=True) if os.path.isfile(p)]
        if not hits:
            raise FileNotFoundError(f"input pattern matches no file: {pat!r}")
        out.update(hits)
    return sorted(out)


def plan_units(paths: list[str], unit_bytes: int, splittable: Callable[[str], bool]) -> list[Unit]:
    """Deterministic work units: small files packed together, big splittable files cut into byte ranges."""
    units: list[Unit] = []
    cur: list[Segment] = []
    cur_bytes = 0

    def close() -> None:
        nonlocal cur, cur_bytes
        if cur:
            units.append(Unit(len(units), tuple(cur), cur_bytes))
        cur, cur_bytes = [], 0

    for p in paths:
        size = os.path.getsize(p)
        if size > unit_bytes and splittable(p):
            close()
            for a in range(0, size, unit_bytes):
                units.append(
                    Unit(len(units), (Segment(p, a, min(a + unit_bytes, size)),), min(unit_bytes, size - a))
                )
            continue
        if cur and cur_bytes + size > unit_bytes:
            close()
        cur.append(Segment(p, 0, None))
        cur_bytes += size
    close()
    return units
