"""One schema for every fine-tuning task kind, its validator and its loader.

A task split is a sequence of records. On disk the project's own format is JSON Lines (one JSON object
per line); the loader also reads JSON, CSV, TSV and Parquet files, local `datasets.load_dataset` folders
and `save_to_disk` folders (through HF `datasets`), and in-memory `datasets.Dataset` objects. The fields
per kind are in `docs/task_data.md`; `KINDS` below is the machine-readable version. Whatever the source,
every record goes through the same validator, and the loader names the file and line (or row, for
formats without lines) of the first bad one (`path:line: reason`, `path:row N: reason`), or, with
`skip_bad=True`, counts bad records per reason and skips them, so that nothing deeper (tokenizer,
collator, torch) ever sees malformed input.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import os
import re
import tempfile
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# kind -> (required fields, fields that carry the supervision and may be absent when require_labels=False)
KINDS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "single": (("text",), ("label",)),
    "pair": (("text", "text_pair"), ("label",)),
    "tagging": (("tokens",), ("labels",)),
    "span": (("context", "question"), ("answers",)),
    "choice": (("question", "candidates"), ("positives",)),
    "generation": (("source",), ("target",)),
}
SPLITS = ("train", "dev", "test")
_BIO_RE = re.compile(r"^(?:O|[BI]-[^\s]+)$")
# Fields whose values are lists: a CSV/TSV cell holds one string, so kinds with such fields need a format
# with nested values (JSONL, JSON, Parquet, a Dataset).
_LIST_FIELDS = frozenset({"tokens", "labels", "answers", "candidates", "positives"})
FLAT_KINDS = tuple(k for k, (req, sup) in KINDS.items() if not _LIST_FIELDS & {*req, *sup})
# File extension -> format. Everything but JSONL is read by HF `datasets`.
FILE_FORMATS = {".jsonl": "jsonl", ".json": "json", ".csv": "csv", ".tsv": "tsv", ".parquet": "parquet"}
SUPPORTED_SOURCES = (", ".join(FILE_FORMATS) + ", a folder for datasets.load_dataset (data files, or one written "
                     "by save_to_disk), or in Python a datasets.Dataset")
# The names a split goes by in HF datasets (load_dataset maps dev.csv, valid.csv ... to "validation").
SPLIT_ALIASES = {"train": ("train",), "dev": ("dev", "validation", "valid", "val"), "test": ("test",)}


def kind_fields(kind: str) -> tuple[str, ...]:
    """Every field a record of `kind` may carry (`id`, the required ones, the supervision)."""
    required, sup = KINDS[kind]
    return ("id", *required, *sup)


def _loc(n: int, unit: str) -> str:
    return str(n) if unit == "line" else f"{unit} {n}"


class TaskDataError(ValueError):
    """A bad task file or record. `str(err)` reads `path:line: reason`, or `path:row N: reason` for
    sources without lines (Parquet, JSON documents, Dataset objects; rows count from 1)."""

    def __init__(self, path: str | os.PathLike[str], line: int, reason: str, *, unit: str = "line") -> None:
        self.path = str(path)
        self.line = line
        self.unit = unit  # "line" or "row"
        self.reason = reason
        super().__init__(f"{self.path}:{_loc(line, unit)}: {reason}")


class _Bad(Exception):
    """One bad record: `key` is the counting bucket, `msg` the human explanation."""

    def __init__(self, key: str, msg: str) -> None:
        super().__init__(msg)
        self.key = key
        self.msg = msg


@dataclass
class TaskSpec:
    """What a converted task directory holds; saved as `task.json` next to the split files.

    `files` maps split name -> file name relative to the directory of `task.json`.
    """

    name: str
    kind: str
    label_list: list[str] | None = None
    regression: bool = False
    files: dict[str, str] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    source: str = ""
    license: str = ""
    notes: str = ""
    report: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"unknown task kind {self.kind!r}; valid kinds: {', '.join(KINDS)}")

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> TaskSpec:
        d = json.loads(text)
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in d.items() if k in known})

    def save(self, path: str | os.PathLike[str]) -> None:
        atomic_write_text(Path(path), self.to_json())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TaskSpec:
        p = Path(path)
        if p.is_dir():
            p = p / "task.json"
        try:
            return cls.from_json(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise TaskDataError(p, 0, "task spec not found (expected the task.json written by "
                                "`python -m skillnet.data_prep.tasks convert`)") from None
        except (json.JSONDecodeError, TypeError, ValueError) as e:
            raise TaskDataError(p, 1, f"invalid task spec: {e}") from None

    def path_of(self, split: str, spec_path: str | os.PathLike[str]) -> Path:
        """Absolute path of `split`'s file given where task.json lives (file or its directory)."""
        base = Path(spec_path)
        base = base if base.is_dir() else base.parent
        if split not in self.files:
            raise KeyError(f"task {self.name!r} has no split {split!r}; it has {sorted(self.files)}")
        return base / self.files[split]


@dataclass
class LoadReport:
    """What `load_task_file` read, kept and skipped (per reason, with the first message of each reason)."""

    path: str
    kind: str
    records_read: int = 0
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    first_error: dict[str, str] = field(default_factory=dict)
    label_list: list[str] | None = None

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())

    def summary(self) -> str:
        s = f"{self.path}: {self.kept} {self.kind} records kept of {self.records_read}"
        if self.skipped:
            parts = ", ".join(f"{k}: {v}" for k, v in sorted(self.skipped.items()))
            s += f"; skipped {self.num_skipped} ({parts})"
            for k in sorted(self.first_error):
                s += f"\n  first '{k}': {self.first_error[k]}"
        return s


# ----------------------------------------------------------------------------------------- validation

def _type_name(v: Any) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null",
            int: "integer", float: "number"}.get(type(v), type(v).__name__)


def _get_str(obj: dict[str, Any], key: str, *, allow_empty: bool = False) -> str:
    if key not in obj or obj[key] is None:
        raise _Bad("missing field", f"missing field '{key}'")
    v = obj[key]
    if not isinstance(v, str):
        raise _Bad("wrong type", f"field '{key}' must be a string, got {_type_name(v)}")
    if not allow_empty and not v.strip():
        raise _Bad("empty text", f"field '{key}' is empty")
    return v


def _get_list(obj: dict[str, Any], key: str) -> list[Any]:
    if key not in obj or obj[key] is None:
        raise _Bad("missing field", f"missing field '{key}'")
    v = obj[key]
    if not isinstance(v, list):
        raise _Bad("wrong type", f"field '{key}' must be an array, got {_type_name(v)}")
    return v


def _class_label(obj: dict[str, Any], regression: bool, label_set: set[str] | None) -> str | float:
    if "label" not in obj or obj["label"] is None:
        raise _Bad("missing field", "missing field 'label'")
    v = obj["label"]
    if regression:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise _Bad("wrong type", f"regression label must be a number, got {_type_name(v)} {v!r}")
        if not math.isfinite(v):
            raise _Bad("wrong type", f"regression label must be finite, got {v!r}")
        return float(v)
    # Class labels may be written as strings or integers ("1" and 1 are the same class); floats and
    # booleans are almost always a mistake (a regression file loaded as classification).
    if isinstance(v, bool) or not isinstance(v, (str, int)):
        raise _Bad("wrong type", f"class label must be a string or integer, got {_type_name(v)} {v!r}")
    s = str(v)
    if not s.strip():
        raise _Bad("empty text", "label is empty")
    if label_set is not None and s not in label_set:
        raise _Bad("label not in label set",
                   f"label {s!r} is not in the label set {sorted(label_set)}")
    return s


def _check_bio(labels: Sequence[str]) -> None:
    prev = "O"
    for i, tag in enumerate(labels):
        if tag.startswith("I-") and prev[2:] != tag[2:]:
            raise _Bad("invalid BIO sequence", f"tag {tag!r} at position {i} follows {prev!r} "
                       "(an I- tag must continue a B-/I- tag of the same type)")
        prev = tag


def validate_record(obj: Any, kind: str, *, label_list: Sequence[str] | None = None, regression: bool = False,
                    require_labels: bool = True) -> dict[str, Any]:
    """Check one decoded JSON value against the schema of `kind`; return the normalised record.

    Raises `_Bad` (internal) on a bad record; callers outside this module use `load_task_file`, or
    `check_record`, which turns it into a ValueError.
    """
    if not isinstance(obj, dict):
        raise _Bad("wrong type", f"expected a JSON object, got {_type_name(obj)}")
    label_set = set(label_list) if label_list is not None else None
    out: dict[str, Any] = {}
    if "id" in obj and obj["id"] is not None:
        if isinstance(obj["id"], bool) or not isinstance(obj["id"], (str, int)):
            raise _Bad("wrong type", f"field 'id' must be a string or integer, got {_type_name(obj['id'])}")
        out["id"] = str(obj["id"])
    _required, sup = KINDS[kind]
    has_sup = any(k in obj and obj[k] is not None for k in sup)
    want_sup = require_labels or has_sup

    if kind in ("single", "pair"):
        out["text"] = _get_str(obj, "text")
        if kind == "pair":
            out["text_pair"] = _get_str(obj, "text_pair")
        elif obj.get("text_pair") is not None:
            # Never drop the second text of a pair without a word: a pair task read as single sentences
            # trains on half its input.
            raise _Bad("unexpected field", "field 'text_pair' in a single-sentence record (kind 'single' "
                       "ignores it); load the file as kind 'pair'")
        out["label"] = _class_label(obj, regression, label_set) if want_sup else None
    elif kind == "tagging":
        tokens = _get_list(obj, "tokens")
        if not tokens:
            raise _Bad("empty text", "field 'tokens' is empty")
        for i, t in enumerate(tokens):
            if not isinstance(t, str):
                raise _Bad("wrong type", f"tokens[{i}] must be a string, got {_type_name(t)}")
            if not t.strip():
                raise _Bad("empty text", f"tokens[{i}] is empty or whitespace")
        out["tokens"] = tokens
        if want_sup:
            labels = _get_list(obj, "labels")
            if len(labels) != len(tokens):
                raise _Bad("length mismatch", f"{len(tokens)} tokens but {len(labels)} labels")
            for i, tag in enumerate(labels):
                if not isinstance(tag, str):
                    raise _Bad("wrong type", f"labels[{i}] must be a string, got {_type_name(tag)}")
                if not _BIO_RE.match(tag):
                    raise _Bad("invalid BIO tag", f"labels[{i}] = {tag!r} is not a BIO tag (O, B-TYPE, I-TYPE)")
                if label_set is not None and tag not in label_set:
                    raise _Bad("label not in label set",
                               f"labels[{i}] = {tag!r} is not in the label set {sorted(label_set)}")
            _check_bio(labels)
            out["labels"] = labels
        else:
            out["labels"] = None
    elif kind == "span":
        context = _get_str(obj, "context")
        out["context"] = context
        out["question"] = _get_str(obj, "question")
        answers_out: list[dict[str, Any]] = []
        if want_sup:
            answers = _get_list(_squad_answers(obj), "answers")
            if not answers:
                raise _Bad("missing field", "field 'answers' is empty (need at least one answer)")
            for i, a in enumerate(answers):
                if not isinstance(a, dict):
                    raise _Bad("wrong type", f"answers[{i}] must be an object {{text, start}}, got {_type_name(a)}")
                text = a.get("text")
                start = a.get("start")
                if not isinstance(text, str) or not text:
                    raise _Bad("wrong type", f"answers[{i}].text must be a non-empty string")
                if isinstance(start, bool) or not isinstance(start, int):
                    raise _Bad("wrong type", f"answers[{i}].start must be an integer character offset")
                if start < 0 or context[start:start + len(text)] != text:
                    where = context.find(text)
                    hint = f" (it occurs at {where})" if where >= 0 else " (it does not occur in the context)"
                    raise _Bad("span not in context",
                               f"answers[{i}] {text!r} is not at character offset {start} of the context{hint}")
                answers_out.append({"text": text, "start": start})
        out["answers"] = answers_out
    elif kind == "choice":
        out["question"] = _get_str(obj, "question")
        cands = _get_list(obj, "candidates")
        if len(cands) < 2:
            raise _Bad("too few candidates", f"need at least 2 candidates, got {len(cands)}")
        for i, c in enumerate(cands):
            if not isinstance(c, str):
                raise _Bad("wrong type", f"candidates[{i}] must be a string, got {_type_name(c)}")
            if not c.strip():
                raise _Bad("empty text", f"candidates[{i}] is empty")
        out["candidates"] = cands
        pos: list[int] = []
        if want_sup:
            raw = _get_list(obj, "positives")
            if not raw:
                raise _Bad("missing field", "field 'positives' is empty (need the index of at least one correct candidate)")
            for i, p in enumerate(raw):
                if isinstance(p, bool) or not isinstance(p, int):
                    raise _Bad("wrong type", f"positives[{i}] must be an integer index, got {_type_name(p)}")
                if not 0 <= p < len(cands):
                    raise _Bad("label not in label set", f"positives[{i}] = {p} is not a candidate index (0..{len(cands) - 1})")
            if len(set(raw)) != len(raw):
                raise _Bad("wrong type", "positives contains duplicate indices")
            pos = sorted(raw)
        out["positives"] = pos
    elif kind == "generation":
        out["source"] = _get_str(obj, "source")
        out["target"] = _get_str(obj, "target") if want_sup else ""
    return out


def _squad_answers(obj: dict[str, Any]) -> dict[str, Any]:
    """HF's SQuAD / CMRC 2018 layout, ``answers = {"text": [...], "answer_start": [...]}``, as the schema's
    list of ``{text, start}``; anything else is left to the validator."""
    a = obj.get("answers")
    if not (isinstance(a, dict) and isinstance(a.get("text"), list) and isinstance(a.get("answer_start"), list)):
        return obj
    if len(a["text"]) != len(a["answer_start"]):
        raise _Bad("length mismatch", f"answers has {len(a['text'])} texts but {len(a['answer_start'])} answer_start")
    return {**obj, "answers": [{"text": t, "start": s} for t, s in zip(a["text"], a["answer_start"])]}


def check_record(obj: Any, kind: str, **kw: Any) -> dict[str, Any]:
    """Public single-record validation: the normalised record, or ValueError with the reason."""
    _check_kind(kind)
    try:
        return validate_record(obj, kind, **kw)
    except _Bad as b:
        raise ValueError(b.msg) from None


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"unknown task kind {kind!r}; valid kinds: {', '.join(KINDS)}")


def infer_label_list(kind: str, labels: Iterable[Any]) -> list[str]:
    """Label list seen in the data, in a stable order.

    Classes: integer-looking labels in numeric order, others sorted. Tagging: `O`, then `B-T`, `I-T` for
    each entity type T in sorted order (both tags even if only one was seen, so the CRF has them).
    """
    if kind == "tagging":
        types = sorted({t[2:] for seq in labels if seq for t in seq if t != "O"})
        return ["O"] + [f"{p}-{t}" for t in types for p in ("B", "I")]
    uniq = {str(x) for x in labels if x is not None}
    if all(re.fullmatch(r"-?\d+", u) for u in uniq):
        return sorted(uniq, key=int)
    return sorted(uniq)


def expand_label_list(kind: str, label_list: Sequence[str] | None) -> list[str] | None:
    """For tagging, a list of entity types (no `O`) is expanded to the full BIO tag list."""
    if label_list is None:
        return None
    label_list = [str(x) for x in label_list]
    if kind == "tagging" and "O" not in label_list:
        return ["O"] + [f"{p}-{t}" for t in label_list for p in ("B", "I")]
    return label_list


# ----------------------------------------------------------------------------------------- sources

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


def _json_stream(p: Path, display: str) -> _Stream:
    import datasets

    _check_utf8(p, display)
    with open(p, encoding="utf-8-sig") as f:
        head = f.read(4096).lstrip()
    if not head:
        raise TaskDataError(display, 1, "file is empty: no records")
    is_array = head.startswith("[")
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


# ----------------------------------------------------------------------------------------- loading

_ALL_FIELDS = sorted({f for k in KINDS for f in kind_fields(k)})
_MISSING_RE = re.compile(r"^missing field '([^']+)'")


def _check_columns(columns: Mapping[str, str] | None) -> None:
    for k, v in (columns or {}).items():
        if k not in _ALL_FIELDS:
            raise ValueError(f"columns: unknown field {k!r}; fields: {', '.join(_ALL_FIELDS)}")
        if not isinstance(v, str) or not v:
            raise ValueError(f"columns: {k!r} must map to a column name (a string), got {v!r}")


def _map_columns(obj: Any, columns: Mapping[str, str] | None) -> Any:
    """Schema field <- the source's column. A mapped field replaces a column of the field's own name."""
    if not columns or not isinstance(obj, dict):
        return obj
    out = {k: v for k, v in obj.items() if k not in columns}
    for fld, col in columns.items():
        if col in obj:
            out[fld] = obj[col]
    return out


def _from_text_cells(obj: Any, kind: str, regression: bool) -> Any:
    """CSV/TSV cells are all strings: an empty cell in an optional field (id, the supervision) is an
    absent value, and a regression label is read as a number (the validator names what is not one)."""
    if not isinstance(obj, dict):
        return obj
    out = dict(obj)
    for k in ("id", *KINDS[kind][1]):
        if out.get(k) == "":
            out[k] = None
    label = out.get("label")
    if regression and isinstance(label, str):
        with contextlib.suppress(ValueError):
            out["label"] = float(label)
    return out


def _missing_hint(msg: str, columns: Mapping[str, str] | None, stream: _Stream) -> str:
    m = _MISSING_RE.match(msg)
    if not m:
        return ""
    fld = m.group(1)
    cols = f"the {stream.what}'s columns: {', '.join(stream.columns)}" if stream.columns is not None else ""
    if columns and fld in columns:
        return f" (read from column '{columns[fld]}' by 'columns'" + (f"; {cols})" if cols else ")")
    return f" ({cols}; 'columns' maps the schema's fields to them)" if cols else ""


def infer_pair_kind(source: Any, *, columns: Mapping[str, str] | None = None, name: str | None = None,
                    split: str | None = None) -> tuple[str, str | None]:
    """Kind of a classification/regression split given without one: ``("pair", where)`` with the place
    (``path:line`` or ``path:row N``) of the first record that has a ``text_pair``, else
    ``("single", None)``. Records that are not objects are left to the loader, which names them."""
    stream = open_records(source, name=name, split=split)
    if stream.columns is not None and (columns or {}).get("text_pair", "text_pair") not in stream.columns:
        return "single", None  # a table without the column: no need to read its rows
    for n, obj in stream.items:
        obj = _map_columns(obj, columns)
        if isinstance(obj, dict) and obj.get("text_pair") is not None:
            return "pair", f"{stream.name}:{_loc(*stream.where(n))}"
    return "single", None


def load_task_file(
    source: Any,
    kind: str,
    label_list: Sequence[str] | None = None,
    skip_bad: bool = False,
    *,
    regression: bool = False,
    require_labels: bool = True,
    max_examples: int | None = None,
    as_dataset: bool = True,
    columns: Mapping[str, str] | None = None,
    name: str | None = None,
    split: str | None = None,
) -> tuple[Any, LoadReport]:
    """Read and validate one split of a task.

    `source`: a `.jsonl` file (the project's format, read line by line), a `.json` (a list of records, or
    JSON lines), `.csv`, `.tsv` or `.parquet` file, a local folder for `datasets.load_dataset` or one
    written by `save_to_disk` (with several splits, `split` names the one to read: train, dev or test,
    which also matches validation), a `datasets.Dataset`, or a `TaskSource` from `dataset_splits`. CSV and
    TSV hold text columns only: kinds `single`, `pair` and `generation` (`FLAT_KINDS`).

    Returns `(data, report)`: `data` is a `datasets.Dataset` (or a list of dicts when `as_dataset=False`)
    of normalised records; `report` is a `LoadReport` (kept / skipped per reason / label list used).

    - `label_list`: the allowed classes (single/pair) or tags (tagging; a list of entity types like
      `["PER", "LOC"]` is expanded to O/B-/I- tags). `None` takes the names of a `ClassLabel` column, else
      infers it from the records (do that for train only; pass train's list when loading dev/test so an
      unseen label is an error).
    - `skip_bad`: count bad records per reason and skip them instead of raising `TaskDataError`.
    - `require_labels=False`: labels may be absent (files to predict on); absent labels become None/empty.
    - `max_examples`: stop after that many kept records (CPU demos).
    - `columns`: schema field -> the source's column (`{"text": "sentence"}`), applied before validation.
    - `name`: what messages call the source (default: the path; `<datasets.Dataset>` for an object).

    Classification records gain `label_id` (index into the label list), tagging records `label_ids`.
    Raises `TaskDataError` (`path:line: reason`, or `path:row N: reason` where rows have no line) for the
    first bad record unless `skip_bad`, and always for a missing, unreadable or empty source, an
    unsupported file type, or a source where no record is valid.
    """
    _check_kind(kind)
    _check_columns(columns)
    label_list = expand_label_list(kind, label_list)
    if kind in ("span", "choice", "generation") or regression:
        label_list = None  # these kinds have no closed label set
    stream = open_records(source, kind=kind, name=name, split=split)
    path = stream.name
    if label_list is None and not regression and kind in ("single", "pair", "tagging"):
        field_ = "labels" if kind == "tagging" else "label"
        names = stream.class_names.get((columns or {}).get(field_, field_))
        if names:  # a ClassLabel column: its names, in its order, even for classes this split lacks
            label_list = expand_label_list(kind, names)
    report = LoadReport(path=path, kind=kind)
    records: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    for n, obj in stream.items:
        report.records_read += 1
        try:
            if isinstance(obj, _Bad):
                raise obj
            obj = _map_columns(obj, columns)
            if stream.text_only:
                obj = _from_text_cells(obj, kind, regression)
            rec = validate_record(obj, kind, label_list=label_list, regression=regression,
                                  require_labels=require_labels)
        except _Bad as b:
            msg = b.msg + _missing_hint(b.msg, columns, stream)
            num, unit = stream.where(n)
            if not skip_bad:
                raise TaskDataError(path, num, f"{msg} [{kind} record]", unit=unit) from None
            counts[b.key] += 1
            report.first_error.setdefault(b.key, f"{path}:{_loc(num, unit)}: {msg}")
            continue
        rec.setdefault("id", f"{stream.id_prefix}:{_loc(n, stream.unit)}")
        records.append(rec)
        if max_examples is not None and len(records) >= max_examples:
            break
    report.skipped = dict(counts)
    if report.records_read == 0:
        raise TaskDataError(path, 1, f"{stream.what} is empty: no records")
    if not records:
        raise TaskDataError(path, 1, f"no valid {kind} record in the {stream.what} ({report.num_skipped} skipped: "
                            + ", ".join(f"{k}: {v}" for k, v in sorted(counts.items())) + ")")
    if kind in ("single", "pair") and not regression:
        if label_list is None:
            label_list = infer_label_list(kind, (r["label"] for r in records))
        index = {lab: i for i, lab in enumerate(label_list)}
        for r in records:
            r["label_id"] = index[r["label"]] if r["label"] is not None else -1
    elif kind == "tagging":
        if label_list is None:
            label_list = infer_label_list(kind, (r["labels"] for r in records))
        index = {lab: i for i, lab in enumerate(label_list)}
        for r in records:
            r["label_ids"] = [index[t] for t in r["labels"]] if r["labels"] is not None else None
    report.kept = len(records)
    report.label_list = list(label_list) if label_list is not None else None
    # Same column order for every record so Arrow sees one schema.
    order = ["id"] + [k for k in records[0] if k != "id"]
    records = [{k: r.get(k) for k in order} for r in records]
    if not as_dataset:
        return records, report
    import datasets  # lazy: importing datasets costs ~1 s

    return datasets.Dataset.from_list(records), report


def load_task(spec_path: str | os.PathLike[str], split: str, *, skip_bad: bool = False,
              label_list: Sequence[str] | None = None, **kw: Any) -> tuple[Any, LoadReport]:
    """Load one split of a converted task directory (its `task.json` gives kind and label list)."""
    spec = TaskSpec.load(spec_path)
    labels = label_list if label_list is not None else spec.label_list
    return load_task_file(spec.path_of(split, spec_path), spec.kind, labels, skip_bad,
                          regression=spec.regression, **kw)


# ----------------------------------------------------------------------------------------- writing

def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_jsonl(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> int:
    """Write records atomically (temp file + rename): a crash never leaves a half-written task file."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    n = 0
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
                n += 1
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return n
