"""Readers: the records of one split from any supported source, numbered, not yet validated.

JSON Lines is read line by line here; JSON, CSV, TSV and Parquet files, local `datasets.load_dataset`
folders and `save_to_disk` folders go through HF `datasets`, as do in-memory `datasets.Dataset` objects.
Every failure of a reader becomes one `TaskDataError` naming the file and line (or row) where it can.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import os
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .validation import _LIST_FIELDS, FLAT_KINDS, TaskDataError, _Bad, kind_fields

__all__ = [
    "FILE_FORMATS", "SPLIT_ALIASES", "SUPPORTED_SOURCES", "TaskSource", "dataset_splits", "datasets_class",
    "iter_jsonl", "open_records",
]

# File extension -> format. Everything but JSONL is read by HF `datasets`.
FILE_FORMATS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet"}
SUPPORTED_SOURCES = (", ".join(FILE_FORMATS) + ", a folder for datasets.load_dataset (data files, or one written "
                     "by save_to_disk), or in Python a datasets.Dataset")
# The names a split goes by in HF datasets (load_dataset maps dev.csv, valid.csv ... to "validation").
SPLIT_ALIASES = {"train": ("train",), "dev": ("dev", "validation", "valid", "val"), "test": ("test",)}


def iter_jsonl(path: str | os.PathLike[str]) -> Iterator[tuple[int, Any | _Bad]]:
    """Yield (line number, decoded object or _Bad) for each non-blank line. Raises TaskDataError for
    a missing/unreadable file."""
    p = Path(path)
    if not p.exists():
        raise TaskDataError(p, 0, "file not found")
    if p.is_dir():
        raise TaskDataError(p, 0, "is a directory, expected a JSONL file (one JSON object per line)")
    with open(p, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            if line_no == 1 and raw.startswith(b"\xef\xbb\xbf"):
                raw = raw[3:]
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                yield line_no, _Bad("invalid UTF-8", f"invalid UTF-8 at byte {e.start} of the line")
                continue
            if not line.strip():
                continue
            hint = ""
            if line_no == 1 and line.lstrip().startswith(("[", "{\n", "{\r")):
                hint = (" (this looks like a whole-file JSON document; a .jsonl file holds one JSON object per"
                        " line: name a JSON document .json to read it as one)")
            try:
                # Without its line ending: else a line cut short fails at "column 1" of the line after.
                obj = json.loads(line.rstrip("\r\n"))
            except json.JSONDecodeError as e:
                yield line_no, _Bad("invalid JSON", f"invalid JSON: {e.msg} at column {e.colno}{hint}")
                continue
            if hint and isinstance(obj, list):
                yield line_no, _Bad("wrong type", f"expected a JSON object, got a JSON array{hint}")
                continue
            yield line_no, obj


@dataclass
class TaskSource:
    """One split already read by `datasets` (a split of a folder or of a DatasetDict), with the name its
    messages use. `text_only`: it came from CSV/TSV, so every value is a string."""

    data: Any  # datasets.Dataset
    name: str
    text_only: bool = False


@dataclass
class _Stream:
    """The records of one split, whatever the source, each with its number: a line of the file
    (`unit="line"`) or its 1-based row (`unit="row"`). `line_map`, when given, maps rows to lines on the
    first message that needs it (CSV: worked out and checked only then)."""

    name: str
    items: Iterable[tuple[int, Any]]
    unit: str = "line"
    what: str = "file"  # "file" or "dataset", for messages
    id_prefix: str = ""
    columns: list[str] | None = None
    class_names: dict[str, list[str]] = field(default_factory=dict)
    text_only: bool = False
    line_map: Callable[[], list[int] | None] | None = None
    _lines: list[int] | None = None
    _mapped: bool = False

    def where(self, n: int) -> tuple[int, str]:
        if self.unit == "row" and self.line_map is not None:
            if not self._mapped:
                self._lines, self._mapped = self.line_map(), True
            if self._lines is not None and 0 < n <= len(self._lines):
                return self._lines[n - 1], "line"
        return n, self.unit


def datasets_class(obj: Any) -> str | None:
    """`Dataset`, `DatasetDict`, ... for objects of the `datasets` library (without importing it)."""
    return type(obj).__name__ if (type(obj).__module__ or "").startswith("datasets") else None


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    # datasets logs "Failed to read file ..." at ERROR before raising; the caller turns the exception into
    # one `path:line: reason`, so the log line would only repeat it in a worse form.
    lg = logging.getLogger("datasets")
    level = lg.level
    lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        lg.setLevel(level)


def _root_cause(e: BaseException) -> BaseException:
    while e.__cause__ is not None or e.__context__ is not None:
        e = e.__cause__ or e.__context__  # type: ignore[assignment]
    return e


def _first_bad_utf8(p: Path) -> TaskDataError | None:
    with open(p, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as e:
                return TaskDataError(p, line_no, f"invalid UTF-8 at byte {e.start} of the line")
    return None


def _hf_call(display: str, p: Path | None, what: str, fn: Callable[[], Any],
             diagnose: Callable[[], TaskDataError | None] | None = None) -> Any:
    """Run a `datasets` reader; any failure becomes one TaskDataError, at the line when we can find it."""
    try:
        with _quiet_datasets():
            return fn()
    except TaskDataError:
        raise
    except Exception as e:  # datasets wraps pandas/pyarrow errors in its own; the root cause says what
        cause = _root_cause(e)
        found = None
        if p is not None and isinstance(cause, UnicodeDecodeError):
            found = _first_bad_utf8(p)
        if found is None and diagnose is not None:
            found = diagnose()
        if found is not None:
            raise TaskDataError(display, found.line, found.reason, unit=found.unit) from None
        raise TaskDataError(display, 0, f"datasets could not read it as {what}: "
                            f"{' '.join(str(cause).split()) or type(cause).__name__}") from None


def _class_names(features: Mapping[str, Any]) -> dict[str, list[str]]:
    """Columns stored as `ClassLabel` ints (or lists of them, as NER tags): their names."""
    import datasets

    out: dict[str, list[str]] = {}
    for col, feat in features.items():
        inner = getattr(feat, "feature", None)  # Sequence / List of ...
        if isinstance(feat, datasets.ClassLabel):
            out[col] = list(feat.names)
        elif isinstance(inner, datasets.ClassLabel):
            out[col] = list(inner.names)
    return out


def _name_of(v: Any, names: list[str]) -> Any:
    if isinstance(v, int) and not isinstance(v, bool):
        if 0 <= v < len(names):
            return names[v]
        if v == -1:  # HF's "no label" (e.g. GLUE test sets)
            return None
    return v


def _arrow_stream(ds: Any, display: str, *, id_prefix: str | None = None, text_only: bool = False,
                  what: str = "file", line_map: Callable[[], list[int] | None] | None = None) -> _Stream:
    import datasets

    if isinstance(ds, datasets.IterableDataset):
        raise TaskDataError(display, 0, "an IterableDataset (streaming) is not supported: load it without "
                            "streaming=True, or materialise it (datasets.Dataset.from_generator)")
    ds = ds.with_format(None)  # plain Python values, whatever format the caller set (torch, numpy...)
    names = _class_names(ds.features)

    def batches() -> Iterator[dict[str, list[Any]]]:
        try:
            # batched: ~100x faster than iterating rows one by one
            yield from ds.iter(batch_size=1024)
        except UnicodeDecodeError as e:  # text files are checked before; this is a string column's bytes
            raise TaskDataError(display, 0, f"invalid UTF-8 in the data ({e.reason})") from None

    def items() -> Iterator[tuple[int, Any]]:
        n = 0
        for batch in batches():
            cols = list(batch)
            for values in zip(*batch.values()):
                n += 1
                row = dict(zip(cols, values))
                for col, nm in names.items():
                    v = row.get(col)
                    row[col] = [_name_of(x, nm) for x in v] if isinstance(v, list) else _name_of(v, nm)
                yield n, row

    return _Stream(display, items(), unit="row", what=what, id_prefix=id_prefix or display,
                   columns=list(ds.column_names), class_names=names, text_only=text_only, line_map=line_map)


def _check_flat(display: str, label: str, kind: str | None) -> None:
    if kind is not None and kind not in FLAT_KINDS:
        fields = ", ".join(f for f in kind_fields(kind) if f in _LIST_FIELDS)
        raise TaskDataError(display, 0, f"a {label} holds text columns only; kind '{kind}' has list fields "
                            f"({fields}): use JSONL, JSON or Parquet (or a datasets.Dataset)")


def _csv_dialect(fmt: str) -> tuple[str, int]:
    # TSV is read the classic way (GLUE, CLUE): no quoting, a cell holds no tab and no newline, and a quote
    # character is text. CSV is RFC 4180: quoted cells may hold commas, quotes and newlines.
    return ("\t", csv.QUOTE_NONE) if fmt == "tsv" else (",", csv.QUOTE_MINIMAL)


def _csv_records(p: Path, sep: str, quoting: int) -> Iterator[tuple[int, list[str]]]:
    """(first line, cells) of every non-blank record, the header included, as pandas splits them."""
    with open(p, encoding="utf-8-sig", newline="") as f:
        reader = csv.reader(f, delimiter=sep, quoting=quoting)
        prev = 0
        for rec in reader:
            start, prev = prev + 1, reader.line_num
            if rec and not (len(rec) == 1 and not rec[0].strip()):  # pandas skips blank lines
                yield start, rec


def _csv_header(p: Path, display: str, sep: str, quoting: int) -> list[str]:
    try:
        recs = _csv_records(p, sep, quoting)
        header = next(recs, None)
        first = next(recs, None)
    except UnicodeDecodeError:
        bad = _first_bad_utf8(p)
        raise (bad or TaskDataError(display, 0, "invalid UTF-8")) from None
    if header is None or first is None:
        raise TaskDataError(display, 1, "file is empty: no records" + ("" if header is None else " (only a header)"))
    cols = header[1]
    dup = sorted({c for c in cols if cols.count(c) > 1})
    if dup:
        raise TaskDataError(display, header[0], f"duplicate column name(s) {dup} in the header")
    return cols


def _csv_ragged(p: Path, sep: str, quoting: int) -> TaskDataError | None:
    recs = _csv_records(p, sep, quoting)
    _, header = next(recs)
    for line, rec in recs:
        if len(rec) > len(header):
            return TaskDataError(p, line, f"expected {len(header)} fields (as the header), found {len(rec)}")
    return None


def _csv_line_map(p: Path, sep: str, quoting: int, ds: Any) -> list[int] | None:
    """The line each row starts on, or None unless the csv module splits the file exactly as pandas did
    (same rows, same cells): then `file:line` is right, else messages fall back to `row N`."""
    recs = list(_csv_records(p, sep, quoting))[1:]
    if len(recs) != len(ds):
        return None
    cols = ds.column_names
    for (_, rec), row in zip(recs, ds.with_format(None)):
        if rec + [""] * (len(cols) - len(rec)) != [row[c] for c in cols]:
            return None
    return [line for line, _ in recs]


def _check_utf8(p: Path, display: str) -> None:
    # pyarrow reads JSON without decoding its strings (a bad byte would surface in the middle of training
    # data iteration), and pandas names no line: one pass over the bytes names it first.
    bad = _first_bad_utf8(p)
    if bad is not None:
        raise TaskDataError(display, bad.line, bad.reason)


def _csv_stream(p: Path, display: str, fmt: str, kind: str | None) -> _Stream:
    import datasets

    _check_flat(display, f"{fmt.upper()} file", kind)
    _check_utf8(p, display)
    sep, quoting = _csv_dialect(fmt)
    cols = _csv_header(p, display, sep, quoting)
    # Every value a string, as written: pandas would otherwise turn "1" into 1.0 in a column with an empty
    # cell, "NA" and "null" into missing values, and a text of digits into an integer.
    features = datasets.Features({c: datasets.Value("string") for c in cols})
    ds = _hf_call(display, p, fmt.upper(), lambda: datasets.load_dataset(
        "csv", data_files=str(p), split="train", sep=sep, quoting=quoting, features=features, na_filter=False,
        index_col=False), diagnose=lambda: _csv_ragged(p, sep, quoting))
    return _arrow_stream(ds, display, id_prefix=p.name, text_only=True,
                         line_map=lambda: _csv_line_map(p, sep, quoting, ds))


def _json_lines_map(p: Path, n: int) -> list[int] | None:
    with open(p, "rb") as f:
        lines = [i for i, raw in enumerate(f, start=1) if raw.strip()]
    return lines if len(lines) == n else None


def _json_syntax_error(p: Path, display: str, is_array: bool) -> TaskDataError | None:
    try:
        text = p.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        return _first_bad_utf8(p)
    docs = [(0, text)] if is_array else [(i, x) for i, x in enumerate(text.splitlines()) if x.strip()]
    for offset, doc in docs:
        try:
            json.loads(doc)
        except json.JSONDecodeError as e:
            return TaskDataError(display, offset + e.lineno, f"invalid JSON: {e.msg} at column {e.colno}")
    return None


# The start of a SQuAD-style file: {"version": ..., "data": [{... "paragraphs": [...]}]} (version optional).
_NESTED_SQUAD = re.compile(r'\{\s*(?:"version"\s*:\s*"[^"]*"\s*,\s*)?"data"\s*:\s*\[')


def _json_stream(p: Path, display: str) -> _Stream:
    import datasets

    _check_utf8(p, display)
    with open(p, encoding="utf-8-sig") as f:
        head = f.read(4096).lstrip()
    if not head:
        raise TaskDataError(display, 1, "file is empty: no records")
    is_array = head.startswith("[")
    if _NESTED_SQUAD.match(head) and '"paragraphs"' in head:
        # a nested dataset file, not records: its converter writes the records (and keeps their ids)
        raise TaskDataError(display, 1, "SQuAD / CMRC 2018 JSON ({data: [{paragraphs: [{context, qas}]}]}), not "
                            "records: convert it first: python -m skillnet.data_prep.tasks convert cmrc2018 "
                            f"--input train={p.name} --out DIR (add dev=, test= files), then give the task "
                            "\"spec\": \"DIR/task.json\"")
    if is_array and head[1:].lstrip()[:1] not in ("{", "]", ""):
        raise TaskDataError(display, 1, "expected a JSON array of objects (one per record)")
    ds = _hf_call(display, p, "JSON", lambda: datasets.load_dataset("json", data_files=str(p), split="train"),
                  diagnose=lambda: _json_syntax_error(p, display, is_array))
    # A JSON-lines file (HF's to_json writes them as .json) has one record per non-blank line.
    return _arrow_stream(ds, display, id_prefix=p.name,
                         line_map=None if is_array else lambda: _json_lines_map(p, len(ds)))


def _hf_folder(p: Path, display: str, kind: str | None) -> dict[str, TaskSource]:
    """The splits of a local folder read by `datasets` (or of a loading script, where datasets still runs
    them): `save_to_disk` folders through `load_from_disk`, other folders through `load_dataset`, which
    finds the data files and their splits (train.csv, validation.parquet, data/test-*.json ...)."""
    import datasets

    def parts_of(obj: Any, text_only: bool = False) -> dict[str, TaskSource]:
        if isinstance(obj, datasets.Dataset):
            return {"train": TaskSource(obj, display, text_only)}
        return {str(k): TaskSource(v, f"{display}[{k}]", text_only) for k, v in obj.items()}

    if p.is_file():  # a loading script
        major = int(datasets.__version__.split(".")[0])
        if major >= 4:
            raise TaskDataError(display, 0, f"the installed datasets {datasets.__version__} no longer runs loading "
                                "scripts (removed in datasets 4.0): write the data as .parquet, .json or .csv "
                                "files, or a folder of them, and give that")
        return parts_of(_hf_call(display, None, "a loading script",
                                 lambda: datasets.load_dataset(str(p), trust_remote_code=True)))
    if (p / "state.json").is_file() or (p / "dataset_dict.json").is_file():
        return parts_of(_hf_call(display, None, "a save_to_disk folder", lambda: datasets.load_from_disk(str(p))))
    builder = _hf_call(display, None, "a dataset folder", lambda: datasets.load_dataset_builder(str(p)))
    if builder.name != "csv":
        return parts_of(_hf_call(display, None, f"a {builder.name} folder", lambda: datasets.load_dataset(str(p))))
    # CSV/TSV files: every value a string, as for one CSV file
    _check_flat(display, "folder of CSV/TSV files", kind)
    sep = builder.config.sep or ","
    quoting = csv.QUOTE_NONE if sep == "\t" else csv.QUOTE_MINIMAL
    first = Path(next(iter(next(iter(builder.config.data_files.values())))))
    kw: dict[str, Any] = {"quoting": quoting, "na_filter": False, "index_col": False}
    if builder.config.features is None:
        cols = _csv_header(first, str(first), sep, quoting)
        kw["features"] = datasets.Features({c: datasets.Value("string") for c in cols})
    return parts_of(_hf_call(display, None, "a folder of CSV files", lambda: datasets.load_dataset(str(p), **kw)),
                    text_only=True)


def _pick_split(parts: dict[str, TaskSource], split: str | None, display: str) -> TaskSource:
    if len(parts) == 1:
        return next(iter(parts.values()))
    if split is None:
        raise TaskDataError(display, 0, f"holds splits {', '.join(parts)}: name one (split=...), or give the folder "
                            "as the task's 'dataset', whose train, validation (or dev) and test splits fill the task's")
    for name in SPLIT_ALIASES.get(split, (split,)):
        if name in parts:
            return parts[name]
    raise TaskDataError(display, 0, f"no split '{split}' (it has splits {', '.join(parts)})")


def dataset_splits(source: Any, *, name: str | None = None, kind: str | None = None) -> dict[str, TaskSource]:
    """The train/dev/test splits of a whole dataset: a local folder (`datasets.load_dataset` or
    `load_from_disk`) or a `datasets.DatasetDict`. HF split names map to ours (`validation` -> dev);
    other splits are ignored."""
    cls = datasets_class(source)
    if cls == "DatasetDict":
        display = name or "<datasets.DatasetDict>"
        parts = {str(k): TaskSource(v, f"{display}[{k}]") for k, v in source.items()}
    elif cls is not None:
        raise TaskDataError(name or f"<datasets.{cls}>", 0, f"expected a datasets.DatasetDict or a folder, got a "
                            f"datasets.{cls} (a Dataset is one split: give it as 'train', 'dev' or 'test')")
    else:
        p = Path(source)
        display = name or str(source)
        if not p.exists():
            raise TaskDataError(display, 0, "not found (expected a dataset folder)")
        if not (p.is_dir() or p.suffix == ".py"):
            raise TaskDataError(display, 0, "is a file; a whole dataset is a folder (one file is one split: give it "
                                "as 'train', 'dev' or 'test')")
        parts = _hf_folder(p, display, kind)
    out: dict[str, TaskSource] = {}
    for split, aliases in SPLIT_ALIASES.items():
        found = next((a for a in aliases if a in parts), None)
        if found is not None:
            out[split] = parts[found]
    if not out:
        raise TaskDataError(display, 0, f"no train, validation (or dev) or test split; it has {', '.join(parts)}")
    return out


def open_records(source: Any, *, kind: str | None = None, name: str | None = None,
                 split: str | None = None) -> _Stream:
    """The records of one split from any supported source (see `load_task_file`), not yet validated."""
    if isinstance(source, TaskSource):
        if source.text_only:
            _check_flat(source.name, "CSV/TSV source", kind)
        return _arrow_stream(source.data, source.name, text_only=source.text_only)
    cls = datasets_class(source)
    if cls in ("Dataset", "IterableDataset"):
        return _arrow_stream(source, name or "<datasets.Dataset>", what="dataset")
    if cls is not None:
        display = name or f"<datasets.{cls}>"
        if cls == "DatasetDict":
            parts = {str(k): TaskSource(v, f"{display}[{k}]") for k, v in source.items()}
            return open_records(_pick_split(parts, split, display), kind=kind)
        raise TaskDataError(display, 0, f"a datasets.{cls} is not a task split (expected a datasets.Dataset)")
    if not isinstance(source, (str, os.PathLike)):
        raise TypeError(f"expected a path or a datasets.Dataset, got {type(source).__name__}")
    p = Path(source)
    display = name or str(source)
    if not p.exists():
        raise TaskDataError(display, 0, "file not found")
    if p.is_dir() or p.suffix == ".py":
        return open_records(_pick_split(_hf_folder(p, display, kind), split, display), kind=kind)
    ext = p.suffix.lower()
    fmt = FILE_FORMATS.get(ext)
    if fmt is None:
        what = f"'{ext}'" if ext else "(no extension)"
        raise TaskDataError(display, 0, f"unsupported file type {what}; supported: {SUPPORTED_SOURCES}")
    if fmt == "jsonl":
        return _Stream(display, iter_jsonl(p), id_prefix=p.name)
    if fmt in ("csv", "tsv"):
        return _csv_stream(p, display, fmt, kind)
    if fmt == "json":
        return _json_stream(p, display)
    import datasets

    return _arrow_stream(_hf_call(display, p, "Parquet", lambda: datasets.load_dataset(
        "parquet", data_files=str(p), split="train")), display, id_prefix=p.name)
