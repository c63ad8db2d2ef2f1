"""Reading raw corpora: input globs -> work units -> batches of documents, with bad input counted.

Inputs are plain text (one document per line, or documents separated by blank lines) or JSONL with a
text field, optionally gzip (.gz) or zstd (.zst) compressed. Reading is block-based (a few MB at a time,
split with C-level bytes/str methods), so memory stays bounded and per-document Python work is small.

Work units are the deterministic grain of parallelism: sorted input files are packed (small files) or
cut into byte ranges (large uncompressed line-oriented files) of about `unit_bytes`; unit k always
becomes shard k, whatever the number of workers or cluster jobs.
"""

from __future__ import annotations

import dataclasses
import glob
import gzip
import io
import json
import os
import re
import zlib
from collections.abc import Callable, Iterator

BLOCK_BYTES = 1 << 20
BINARY_SNIFF_BYTES = 1 << 16

REASONS = {
    "invalid_utf8": "document is not valid UTF-8",
    "nul_bytes": "document contains NUL bytes",
    "empty_document": "document is empty or has no tokens",
    "too_long": "document longer than --max-doc-bytes",
    "binary_file": "file looks binary (many control bytes)",
    "bad_json": "JSONL line is not valid JSON",
    "missing_text_field": "JSON object has no string text field",
    "corrupt_compressed": "compressed stream is truncated or corrupt (documents before it kept)",
    "unreadable_file": "file could not be read",
}


class BadInputError(ValueError):
    """Raised for bad input under --strict; the message names file and line/offset."""


@dataclasses.dataclass
class BadInputReport:
    """Per-reason counts (items and bytes) plus a few example locations."""

    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    nbytes: dict[str, int] = dataclasses.field(default_factory=dict)
    examples: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    strict: bool = False

    def add(self, reason: str, nbytes: int, where: str | Callable[[], str], count: int = 1) -> None:
        if reason not in REASONS:
            raise KeyError(reason)
        if self.strict:
            loc = where() if callable(where) else where
            raise BadInputError(
                f"{loc}: {REASONS[reason]} ({reason}); rerun without --strict to skip and count"
            )
        self.counts[reason] = self.counts.get(reason, 0) + count
        self.nbytes[reason] = self.nbytes.get(reason, 0) + nbytes
        ex = self.examples.setdefault(reason, [])
        if len(ex) < 3:
            ex.append(where() if callable(where) else where)

    def merge(self, other: BadInputReport | dict) -> None:
        o = other if isinstance(other, BadInputReport) else BadInputReport.from_json(other)
        for r, c in o.counts.items():
            self.counts[r] = self.counts.get(r, 0) + c
            self.nbytes[r] = self.nbytes.get(r, 0) + o.nbytes.get(r, 0)
            ex = self.examples.setdefault(r, [])
            ex.extend(o.examples.get(r, [])[: max(0, 3 - len(ex))])

    def total(self) -> int:
        return sum(self.counts.values())

    def to_json(self) -> dict:
        keys = sorted(self.counts)
        return {
            "counts": {k: self.counts[k] for k in keys},
            "bytes": {k: self.nbytes.get(k, 0) for k in keys},
            "examples": {k: self.examples.get(k, []) for k in keys},
        }

    @classmethod
    def from_json(cls, d: dict) -> BadInputReport:
        return cls(
            dict(d.get("counts", {})),
            dict(d.get("bytes", {})),
            {k: list(v) for k, v in d.get("examples", {}).items()},
        )

    def table(self) -> str:
        if not self.counts:
            return "bad input: none"
        lines = ["bad input (skipped, counted):", f"  {'reason':<20} {'items':>10} {'bytes':>14}  example"]
        for r in sorted(self.counts):
            ex = (self.examples.get(r) or [""])[0]
            lines.append(f"  {r:<20} {self.counts[r]:>10,} {self.nbytes.get(r, 0):>14,}  {ex}")
        return "\n".join(lines)


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


@dataclasses.dataclass
class ReadConfig:
    fmt: str = "auto"  # auto | text | jsonl
    doc_separator: str = "line"  # line | blank
    text_field: str = "text"
    max_doc_bytes: int = 4 << 20
    batch_bytes: int = 1 << 20

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


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


class _CountingReader(io.RawIOBase):
    """Counts raw (compressed) bytes read, for the progress bar."""

    def __init__(self, f: io.BufferedReader) -> None:
        self.f = f
        self.nread = 0

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        n = self.f.readinto(b)
        self.nread += n or 0
        return n


def _open(path: str) -> tuple[io.RawIOBase | io.BufferedReader, _CountingReader | io.BufferedReader, object]:
    raw = open(path, "rb")  # noqa: SIM115 - closed by the caller
    if path.endswith(".gz"):
        counter = _CountingReader(raw)
        return gzip.GzipFile(fileobj=io.BufferedReader(counter)), counter, raw
    if path.endswith((".zst", ".zstd")):
        import zstandard

        counter = _CountingReader(raw)
        reader = zstandard.ZstdDecompressor().stream_reader(counter, read_across_frames=True)
        return reader, counter, raw
    return raw, raw, raw


def _looks_binary(head: bytes) -> bool:
    if not head:
        return False
    ctrl = sum(head.count(bytes([c])) for c in range(32) if c not in (9, 10, 12, 13))
    return ctrl > 0.05 * len(head)


_COMPRESSION_ERRORS: tuple[type[BaseException], ...] = (EOFError, zlib.error, gzip.BadGzipFile)
try:
    import zstandard as _zstd

    _COMPRESSION_ERRORS = (*_COMPRESSION_ERRORS, _zstd.ZstdError)
except ImportError:  # pragma: no cover
    pass


def _line_chunks(
    f, seg: Segment, max_line: int, report: BadInputReport, progress: Callable[[int], None], counter
) -> Iterator[tuple[bytes, int]]:
    """Yields (chunk of complete lines, absolute offset of the chunk) for the lines the segment owns.

    A line longer than `max_line` is counted as too_long and skipped without ever being held whole.
    """
    pos = seg.start
    skipping = False
    if seg.start > 0:  # the line containing byte start-1 belongs to the previous segment
        f.seek(seg.start - 1)
        pos = seg.start - 1
        skipping = True
    buf = b""
    long_bytes, long_where = 0, ""
    counted = getattr(counter, "nread", None)
    broken: BaseException | None = None
    while True:
        if counted is None:
            block = f.read(BLOCK_BYTES)
        else:
            block, broken = _read_compressed(f)
        if counted is None:
            progress(len(block))
        else:  # compressed: report compressed bytes, like the on-disk total of the progress bar
            progress(counter.nread - counted)
            counted = counter.nread
        eof = not block
        if skipping and block:
            i = block.find(b"\n")
            if i < 0:
                pos += len(block)
                long_bytes += len(block)
                continue
            pos += i + 1
            long_bytes += i
            block = block[i + 1 :]
            skipping = False
        if long_where and (not skipping or eof):  # a too-long line ended: count it with its full size
            report.add("too_long", long_bytes, long_where)
            long_bytes, long_where = 0, ""
        if skipping:  # EOF while skipping
            return
        buf += block
        if broken is not None:  # keep the complete lines decoded before the damage, drop the cut-off one
            buf = buf[: buf.rfind(b"\n") + 1]
            eof = True
        cut = len(buf) if eof else buf.rfind(b"\n") + 1
        done = eof
        if seg.end is not None:
            limit = seg.end - pos
            if limit <= 0:
                return
            if cut >= limit:
                cut = buf.find(b"\n", limit - 1) + 1 or len(buf)
                done = True
        if cut:
            yield buf[:cut], pos
            buf = buf[cut:]
            pos += cut
        if done:
            if broken is not None:
                raise broken
            return
        if len(buf) > max_line:
            long_where = _where(seg.path)(pos)
            if report.strict:
                report.add("too_long", len(buf), long_where)
            long_bytes = len(buf)
            pos += len(buf)
            buf = b""
            skipping = True


def _read_compressed(f, limit: int = BLOCK_BYTES) -> tuple[bytes, BaseException | None]:
    """Up to `limit` bytes of decompressed data in small steps, so a corrupt tail loses only itself."""
    parts: list[bytes] = []
    n = 0
    read1 = getattr(f, "read1", f.read)
    try:
        while n < limit:
            b = read1(limit - n)
            if not b:
                break
            parts.append(b)
            n += len(b)
    except _COMPRESSION_ERRORS as e:
        return b"".join(parts), e
    return b"".join(parts), None


_BLANK_SEP = re.compile(r"\n(?:[ \t\r\f\v\u3000]*\n)+")


def _split_text_lines(
    chunk: bytes, where: Callable[[int], str], report: BadInputReport, max_doc: int
) -> list[str]:
    """Decodes a chunk of complete lines; fast path is one decode + one split for the whole chunk."""
    if chunk.endswith(b"\n"):
        chunk = chunk[:-1]
    if b"\x00" not in chunk:
        try:
            lines = chunk.decode("utf-8").split("\n")
            if len(chunk) <= max_doc or max(map(len, lines)) * 4 <= max_doc:
                return lines
        except UnicodeDecodeError:
            pass
    out: list[str] = []
    off = 0
    for raw in chunk.split(b"\n"):
        o = off
        off += len(raw) + 1
        if b"\x00" in raw:
            report.add("nul_bytes", len(raw), lambda o=o: where(o))
            continue
        if len(raw) > max_doc:
            report.add("too_long", len(raw), lambda o=o: where(o))
            continue
        try:
            out.append(raw.decode("utf-8"))
        except UnicodeDecodeError:
            report.add("invalid_utf8", len(raw), lambda o=o: where(o))
    return out


def _where(path: str) -> Callable[[int], str]:
    def f(offset: int) -> str:
        # Line numbers are only computed on error, by counting newlines up to the offset.
        if is_compressed(path):
            return f"{path}: uncompressed byte {offset}"
        try:
            with open(path, "rb") as fh:
                n = fh.read(offset).count(b"\n")
            return f"{path}:{n + 1}"
        except OSError:
            return f"{path}: byte {offset}"

    return f


def iter_documents(
    unit: Unit, cfg: ReadConfig, report: BadInputReport, progress: Callable[[int], None] = lambda n: None
) -> Iterator[list[str]]:
    """Batches (~cfg.batch_bytes) of non-empty documents of a unit, in input order."""
    batch: list[str] = []
    size = 0
    for seg in unit.segments:
        for docs, nbytes in _segment_docs(seg, cfg, report, progress):
            batch.extend(docs)
            size += nbytes
            if size >= cfg.batch_bytes:
                yield batch
                batch, size = [], 0
    if batch:
        yield batch


def _drop_empty(docs: list[str], report: BadInputReport, where: str) -> list[str]:
    # One C-level pass; the slow filter runs only when an empty document is present.
    if all(map(str.strip, docs)):
        return docs
    out = []
    for d in docs:
        if d.strip():
            out.append(d)
        else:
            report.add("empty_document", len(d.encode("utf-8")), where)
    return out


def _segment_docs(
    seg: Segment, cfg: ReadConfig, report: BadInputReport, progress: Callable[[int], None]
) -> Iterator[tuple[list[str], int]]:
    fmt = file_format(seg.path, cfg.fmt)
    try:
        f, counter, raw = _open(seg.path)
    except OSError as e:
        report.add("unreadable_file", 0, f"{seg.path}: {e}")
        return
    where = _where(seg.path)
    try:
        try:
            head = (
                _read_compressed(f, BINARY_SNIFF_BYTES)[0]
                if is_compressed(seg.path)
                else f.read(BINARY_SNIFF_BYTES)
            )
            if _looks_binary(head):
                if seg.start == 0:  # count a split binary file once
                    report.add("binary_file", os.path.getsize(seg.path), seg.path)
                progress((seg.end or os.path.getsize(seg.path)) - seg.start)
                return
            if is_compressed(seg.path):
                f.close()
                raw.close()
                f, counter, raw = _open(seg.path)
            else:
                f.seek(seg.start)
            chunks = _line_chunks(f, seg, cfg.max_doc_bytes, report, progress, counter)
            if fmt == "jsonl":
                yield from _jsonl_docs(chunks, cfg, report, where)
            elif cfg.doc_separator == "blank":
                yield from _blank_docs(chunks, cfg, report, where, seg.path)
            else:
                for chunk, off in chunks:
                    docs = _split_text_lines(
                        chunk, lambda o, off=off: where(off + o), report, cfg.max_doc_bytes
                    )
                    yield _drop_empty(docs, report, f"{seg.path}: near byte {off}"), len(chunk)
        except _COMPRESSION_ERRORS as e:
            report.add("corrupt_compressed", 0, f"{seg.path}: {type(e).__name__}: {e}")
        except OSError as e:
            report.add("unreadable_file", 0, f"{seg.path}: {e}")
    finally:
        f.close()
        raw.close()


def _jsonl_docs(chunks, cfg: ReadConfig, report: BadInputReport, where) -> Iterator[tuple[list[str], int]]:
    field = cfg.text_field
    for chunk, off in chunks:
        lines = _split_text_lines(chunk, lambda o, off=off: where(off + o), report, cfg.max_doc_bytes)
        docs: list[str] = []
        try:  # one parser call for the whole chunk; per-line fallback only if some line is bad
            objs = json.loads("[" + ",".join(lines) + "]")
            if len(objs) != len(lines):
                raise ValueError("line count mismatch")
        except ValueError:
            objs = []
            lo = off
            for line in lines:
                o, n = lo, len(line.encode("utf-8"))
                lo += n + 1
                if not line.strip():
                    report.add("empty_document", n, lambda o=o: where(o))
                    continue
                try:
                    objs.append(json.loads(line))
                except ValueError:
                    report.add("bad_json", n, lambda o=o: where(o))
        for obj in objs:
            t = obj.get(field) if isinstance(obj, dict) else None
            if isinstance(t, str):
                docs.append(t)
            else:
                report.add(
                    "missing_text_field",
                    0,
                    lambda off=off: f"{where(off)} (chunk): no string field {field!r}",
                )
        yield _drop_empty(docs, report, where(off)), len(chunk)


def _blank_docs(
    chunks, cfg: ReadConfig, report: BadInputReport, where, path: str
) -> Iterator[tuple[list[str], int]]:
    carry = ""
    dropping = False  # inside a document already counted as too long
    for chunk, off in chunks:
        lines = _split_text_lines(chunk, lambda o, off=off: where(off + o), report, cfg.max_doc_bytes)
        text = carry + "\n".join(lines) + "\n"
        parts = _BLANK_SEP.split(text)
        carry = parts.pop()  # may continue in the next chunk
        if dropping:  # the rest of a document already counted as too long
            if parts:
                parts.pop(0)
                dropping = False
            else:
                carry = ""
        docs = [p for p in parts if p.strip()]
        for d in docs:
            if len(d) > cfg.max_doc_bytes:
                report.add("too_long", len(d.encode("utf-8")), f"{path}: near byte {off}")
        docs = [d for d in docs if len(d) <= cfg.max_doc_bytes]
        if len(carry) > cfg.max_doc_bytes:
            report.add("too_long", len(carry.encode("utf-8")), f"{path}: near byte {off}")
            carry, dropping = "", True
        yield docs, len(chunk)
    if carry.strip() and not dropping:
        yield [carry.strip("\n")], 0


def iter_texts(patterns: list[str], cfg: ReadConfig, max_bytes: int | None = None) -> Iterator[str]:
    """All documents of the inputs (bad input skipped), e.g. to train a tokenizer."""
    paths = expand_inputs(patterns)
    report = BadInputReport()
    seen = 0
    for unit in plan_units(paths, 1 << 62, lambda p: False):
        for docs in iter_documents(unit, cfg, report):
            for d in docs:
                yield d
                seen += len(d)
                if max_bytes is not None and seen >= max_bytes:
                    return


def describe_inputs(paths: list[str]) -> str:
    total = sum(os.path.getsize(p) for p in paths)
    return f"{len(paths)} files, {total / 1e6:,.1f} MB on disk"


__all__ = [
    "BadInputError",
    "BadInputReport",
    "ReadConfig",
    "Segment",
    "Unit",
    "expand_inputs",
    "iter_documents",
    "iter_texts",
    "plan_units",
]
