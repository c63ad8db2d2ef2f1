"""Reading raw corpora: the documents of a work unit (units.py) in batches, with bad input counted
(bad_input.py).

Inputs are plain text (one document per line, or documents separated by blank lines) or JSONL with a
text field, optionally gzip (.gz) or zstd (.zst) compressed. Reading is block-based (a few MB at a time,
split with C-level bytes/str methods), so memory stays bounded and per-document Python work is small.
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import io
import json
import os
import re
import zlib
from bisect import bisect_right
from collections.abc import Callable, Iterator
from typing import Any

import zstandard

from .bad_input import BadInputError, BadInputReport
from .units import Segment, Unit, expand_inputs, file_format, is_compressed, plan_units

BLOCK_BYTES = 1 << 20
BINARY_SNIFF_BYTES = 1 << 16

@dataclasses.dataclass
class ReadConfig:
    fmt: str = "auto"  # auto | text | jsonl
    doc_separator: str = "line"  # line | blank
    text_field: str = "text"
    max_doc_bytes: int = 4 << 20
    batch_bytes: int = 1 << 20

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


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
        counter = _CountingReader(raw)
        reader = zstandard.ZstdDecompressor().stream_reader(counter, read_across_frames=True)
        return reader, counter, raw
    return raw, raw, raw


def _looks_binary(head: bytes) -> bool:
    if not head:
        return False
    ctrl = sum(head.count(bytes([c])) for c in range(32) if c not in (9, 10, 12, 13))
    return ctrl > 0.05 * len(head)


_COMPRESSION_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, zstandard.ZstdError)


def _line_chunks(
    f,
    seg: Segment,
    max_line: int,
    report: BadInputReport,
    progress: Callable[[int], None],
    counter,
    finder: _LineFinder,
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
    long_bytes, long_at = 0, -1  # a too-long line being skipped: its size so far and its offset
    counted = getattr(counter, "nread", None)
    broken: BaseException | None = None
    while True:
        if counted is None:
            block = f.read(BLOCK_BYTES)
            progress(len(block))
        else:  # compressed: report compressed bytes, like the on-disk total of the progress bar
            block, broken = _read_compressed(f)
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
        if long_at >= 0 and (not skipping or eof):  # a too-long line ended: count it with its full size
            report.add("too_long", long_bytes, lambda at=long_at: finder.at(at))
            long_bytes, long_at = 0, -1
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
            long_at = pos
            if report.strict:
                report.add("too_long", len(buf), finder.at(pos))
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
    chunk: bytes, at: Callable[[int, int | None], str], report: BadInputReport, max_doc: int
) -> tuple[list[str], Callable[[int], int]]:
    """Decodes a chunk of complete lines -> (lines, index of kept line k among the chunk's lines).

    `at(i, column)` names line i of the chunk. The fast path is one decode + one split for the whole
    chunk; only a chunk with a bad line is decoded line by line.
    """
    if chunk.endswith(b"\n"):
        chunk = chunk[:-1]
    if b"\x00" not in chunk:
        try:
            lines = chunk.decode("utf-8").split("\n")
            if len(chunk) <= max_doc or max(map(len, lines)) * 4 <= max_doc:
                return lines, _identity
        except UnicodeDecodeError:
            pass
    out: list[str] = []
    kept: list[int] = []
    for i, raw in enumerate(chunk.split(b"\n")):
        if b"\x00" in raw:
            col = _column(raw, raw.index(b"\x00"))
            report.add("nul_bytes", len(raw), lambda i=i, col=col: at(i, col))
            continue
        if len(raw) > max_doc:
            report.add("too_long", len(raw), lambda i=i: at(i, None))
            continue
        try:
            out.append(raw.decode("utf-8"))
            kept.append(i)
        except UnicodeDecodeError as e:
            col = _column(raw, e.start)
            report.add("invalid_utf8", len(raw), lambda i=i, col=col: at(i, col))
    return out, kept.__getitem__


def _identity(i: int) -> int:
    return i


def _column(raw: bytes, byte_index: int) -> int:
    """1-based character column of a byte of a line (bytes before it that are not UTF-8 count as one)."""
    return len(raw[:byte_index].decode("utf-8", errors="replace")) + 1


class _LineFinder:
    """Line numbers of (uncompressed) byte offsets of one input file, computed only when a report needs
    one: by counting newlines, resuming from the previous answer when offsets grow (as they do while a
    file is read), so naming a few bad lines costs at most about one extra read of the file."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._f: Any = None
        self._raw: Any = None
        self._pos = 0
        self._newlines = 0

    def line(self, offset: int) -> int | None:
        try:
            if offset < self._pos or self._f is None:
                self.close()
                self._f, _, self._raw = _open(self.path)
            while self._pos < offset:
                block = self._f.read(min(BLOCK_BYTES, offset - self._pos))
                if not block:
                    break
                self._newlines += block.count(b"\n")
                self._pos += len(block)
        except (OSError, *_COMPRESSION_ERRORS):
            return None
        return self._newlines + 1

    def at(self, offset: int, line_in_chunk: int = 0, column: int | None = None) -> str:
        """'path:line[:column]' of line `line_in_chunk` after the line starting at byte `offset`."""
        n = self.line(offset)
        if n is None:
            return f"{self.path}: byte {offset}"
        return f"{self.path}:{n + line_in_chunk}" + (f":{column}" if column else "")

    def close(self) -> None:
        for h in (self._f, self._raw):
            if h is not None:
                h.close()
        self._f = self._raw = None
        self._pos = self._newlines = 0


Locate = Callable[[int], str]  # index of a document in a batch -> "file:line", for reports


def iter_documents(
    unit: Unit, cfg: ReadConfig, report: BadInputReport, progress: Callable[[int], None] = lambda n: None
) -> Iterator[tuple[list[str], Locate]]:
    """Batches (~cfg.batch_bytes) of non-empty documents of a unit, in input order, each with a function
    naming where document i of the batch is (for problems found later, e.g. no tokens)."""
    batch: list[str] = []
    pieces: list[tuple[int, Locate]] = []  # (first index in the batch, locate within the piece)
    size = 0
    finders: dict[str, _LineFinder] = {}
    try:
        for seg in unit.segments:
            finder = finders.setdefault(seg.path, _LineFinder(seg.path))
            for docs, nbytes, locate in _segment_docs(seg, cfg, report, progress, finder):
                if docs:
                    pieces.append((len(batch), locate))
                    batch.extend(docs)
                size += nbytes
                if size >= cfg.batch_bytes:
                    yield batch, _batch_locate(pieces)
                    batch, pieces, size = [], [], 0
        if batch:
            yield batch, _batch_locate(pieces)
    finally:
        for finder in finders.values():
            finder.close()


def _batch_locate(pieces: list[tuple[int, Locate]]) -> Locate:
    starts = [p[0] for p in pieces]

    def locate(i: int) -> str:
        k = bisect_right(starts, i) - 1
        return pieces[k][1](i - starts[k])

    return locate


def _drop_empty(
    docs: list[str], report: BadInputReport, locate: Locate
) -> tuple[list[str], Callable[[int], int]]:
    """(non-empty documents, index among `docs` of kept document k); empty ones are reported."""
    # One C-level pass; the slow filter runs only when an empty document is present.
    if all(map(str.strip, docs)):
        return docs, _identity
    out, kept = [], []
    for i, d in enumerate(docs):
        if d.strip():
            out.append(d)
            kept.append(i)
        else:
            report.add("empty_document", len(d.encode("utf-8")), lambda i=i: locate(i))
    return out, kept.__getitem__


def _segment_docs(
    seg: Segment,
    cfg: ReadConfig,
    report: BadInputReport,
    progress: Callable[[int], None],
    finder: _LineFinder,
) -> Iterator[tuple[list[str], int, Locate]]:
    """(documents, input bytes, locate) per chunk of the segment."""
    fmt = file_format(seg.path, cfg.fmt)
    try:
        f, counter, raw = _open(seg.path)
    except OSError as e:
        report.add("unreadable_file", 0, f"{seg.path}: {e}")
        return
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
            chunks = _line_chunks(f, seg, cfg.max_doc_bytes, report, progress, counter, finder)
            if fmt == "jsonl":
                for chunk, off in chunks:
                    docs, locate = _jsonl_chunk(chunk, functools.partial(finder.at, off), cfg, report)
                    yield docs, len(chunk), locate
            elif cfg.doc_separator == "blank":
                yield from _blank_docs(chunks, cfg, report, finder)
            else:
                for chunk, off in chunks:
                    at = functools.partial(finder.at, off)  # at(i[, column]): line i of the chunk
                    lines, line_of = _split_text_lines(chunk, at, report, cfg.max_doc_bytes)
                    docs, kept = _drop_empty(lines, report, lambda k, at=at, lo=line_of: at(lo(k)))
                    yield docs, len(chunk), lambda k, at=at, lo=line_of, kept=kept: at(lo(kept(k)))
        except _COMPRESSION_ERRORS as e:
            report.add("corrupt_compressed", 0, f"{seg.path}: {type(e).__name__}: {e}")
        except OSError as e:
            report.add("unreadable_file", 0, f"{seg.path}: {e}")
    finally:
        f.close()
        raw.close()


def _jsonl_chunk(
    chunk: bytes, at: Callable[..., str], cfg: ReadConfig, report: BadInputReport
) -> tuple[list[str], Locate]:
    """Documents of a chunk of JSONL lines; bad lines are reported in line order (--strict stops at the
    first one)."""
    field = cfg.text_field
    lines, line_of = _split_text_lines(chunk, at, report, cfg.max_doc_bytes)
    try:  # one parser call for the whole chunk; per-line fallback only if some line is bad
        objs = json.loads("[" + ",".join(lines) + "]")
        if len(objs) != len(lines):
            raise ValueError("line count mismatch")
        texts = [o.get(field) if isinstance(o, dict) else None for o in objs]
        if all(isinstance(t, str) and t.strip() for t in texts):  # the common case: nothing to report
            return texts, lambda k: at(line_of(k))
        parsed: list[tuple[Any, int | None]] = [(t, None) for t in texts]
    except ValueError:
        parsed = [_parse_line(line, field) for line in lines]
    docs, doc_line = [], []
    for j, ((text, bad_col), line) in enumerate(zip(parsed, lines)):
        n = len(line.encode("utf-8"))
        if bad_col is not None:
            report.add("bad_json", n, lambda j=j, col=bad_col: at(line_of(j), col or None))
        elif not line.strip() or (isinstance(text, str) and not text.strip()):
            report.add("empty_document", n, lambda j=j: at(line_of(j)))
        elif not isinstance(text, str):
            report.add("missing_text_field", 0, lambda j=j: f"{at(line_of(j))}: no string field {field!r}")
        else:
            docs.append(text)
            doc_line.append(j)
    return docs, lambda k: at(line_of(doc_line[k]))


def _parse_line(line: str, field: str) -> tuple[Any, int | None]:
    """(text field or None, None) for a parsable or blank line; (None, column) for bad JSON."""
    if not line.strip():
        return None, None
    try:
        obj = json.loads(line)
    except ValueError as e:
        return None, getattr(e, "colno", 0)
    return (obj.get(field) if isinstance(obj, dict) else None), None


def _blank_docs(
    chunks, cfg: ReadConfig, report: BadInputReport, finder: _LineFinder
) -> Iterator[tuple[list[str], int, Locate]]:
    carry = ""
    carry_at: Callable[[], str] = lambda: finder.at(0)  # noqa: E731  (where the carried document starts)
    dropping = False  # inside a document already counted as too long
    for chunk, off in chunks:
        at = functools.partial(finder.at, off)  # at(i[, column]): line i of the chunk
        lines, line_of = _split_text_lines(chunk, at, report, cfg.max_doc_bytes)
        text = carry + "\n".join(lines) + "\n"
        where = _blank_where(text, len(carry), carry_at, at, line_of)
        parts = _BLANK_SEP.split(text)
        starts = [0] + [m.end() for m in _BLANK_SEP.finditer(text)]
        carry, carry_start = parts.pop(), starts.pop()  # may continue in the next chunk
        carry_at = functools.partial(where, carry_start)
        if dropping:  # the rest of a document already counted as too long
            if parts:
                parts.pop(0)
                starts.pop(0)
                dropping = False
            else:
                carry = ""
        docs, doc_starts = [], []
        for p, st in zip(parts, starts):
            if not p.strip():
                continue
            if len(p) > cfg.max_doc_bytes:
                report.add("too_long", len(p.encode("utf-8")), functools.partial(where, st))
                continue
            docs.append(p)
            doc_starts.append(st)
        if len(carry) > cfg.max_doc_bytes:
            report.add("too_long", len(carry.encode("utf-8")), carry_at)
            carry, dropping = "", True
        yield docs, len(chunk), lambda k, where=where, ds=doc_starts: where(ds[k])
    if carry.strip() and not dropping:
        yield [carry.strip("\n")], 0, lambda k, carry_at=carry_at: carry_at()


def _blank_where(
    text: str,
    n_carry: int,
    carry_at: Callable[[], str],
    at: Callable[..., str],
    line_of: Callable[[int], int],
) -> Callable[[int], str]:
    """Character position of a document start in `text` (carry + this chunk) -> 'file:line'."""

    def where(pos: int) -> str:
        # A document starts at a line start: the carried one, or line k of this chunk.
        return carry_at() if pos < n_carry else at(line_of(text.count("\n", n_carry, pos)))

    return where


def iter_texts(patterns: list[str], cfg: ReadConfig, max_bytes: int | None = None) -> Iterator[str]:
    """All documents of the inputs (bad input skipped), e.g. to train a tokenizer."""
    paths = expand_inputs(patterns)
    report = BadInputReport()
    seen = 0
    for unit in plan_units(paths, 1 << 62, lambda p: False):
        for docs, _ in iter_documents(unit, cfg, report):
            for d in docs:
                yield d
                seen += len(d)
                if max_bytes is not None and seen >= max_bytes:
                    return


# The input planning and the report live beside this module; their names stay importable from here too.
__all__ = [
    "BadInputError",
    "BadInputReport",
    "ReadConfig",
    "Segment",
    "Unit",
    "expand_inputs",
    "file_format",
    "is_compressed",
    "iter_documents",
    "iter_texts",
    "plan_units",
]
