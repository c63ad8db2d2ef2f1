"""Loading a task split: any source (readers.py), every record validated (validation.py), label lists
inferred or checked, bad records named or counted; the task directory's `task.json`, and atomic writers.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

from skillnet.common.files import atomic_write, atomic_write_text

from .readers import _Stream, open_records
from .validation import (
    KINDS,
    TaskDataError,
    _Bad,
    _check_kind,
    _loc,
    expand_label_list,
    infer_label_list,
    kind_fields,
    validate_record,
)

__all__ = [
    "LoadReport", "TaskSpec", "infer_pair_kind", "load_task", "load_task_file", "map_columns", "write_jsonl",
]


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
    # split -> statistics of its records' tokenised lengths (lengths.length_stats), for choosing max_seq_len
    lengths: dict[str, dict[str, int]] = field(default_factory=dict)
    # split -> {"examples_in", "removed"}: dev/test examples removed as copies of a training input (dedup.py)
    dedup: dict[str, dict[str, int]] = field(default_factory=dict)
    # split -> label -> examples, for a labelled classification task: what always-yes or majority scores can be
    # read without the examples (a report rebuilt from committed results holds no task text)
    label_counts: dict[str, dict[str, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_kind(self.kind)

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


_ALL_FIELDS = sorted({f for k in KINDS for f in kind_fields(k)})
_MISSING_RE = re.compile(r"^missing field '([^']+)'")


def _check_columns(columns: Mapping[str, str] | None) -> None:
    for k, v in (columns or {}).items():
        if k not in _ALL_FIELDS:
            raise ValueError(f"columns: unknown field {k!r}; fields: {', '.join(_ALL_FIELDS)}")
        if not isinstance(v, str) or not v:
            raise ValueError(f"columns: {k!r} must map to a column name (a string), got {v!r}")


def map_columns(obj: Any, columns: Mapping[str, str] | None) -> Any:
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
        obj = map_columns(obj, columns)
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
            obj = map_columns(obj, columns)
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
    if kind == "tagging" or (kind in ("single", "pair") and not regression):
        field_ = "labels" if kind == "tagging" else "label"
        if label_list is None:
            label_list = infer_label_list(kind, (r[field_] for r in records))
        index = {lab: i for i, lab in enumerate(label_list)}
        for r in records:
            if kind == "tagging":
                r["label_ids"] = [index[t] for t in r["labels"]] if r["labels"] is not None else None
            else:
                r["label_id"] = index[r["label"]] if r["label"] is not None else -1
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


def write_jsonl(path: str | os.PathLike[str], records: Iterable[dict[str, Any]]) -> int:
    """Write records atomically (common/files.py): a crash never leaves a half-written task file."""

    def write(f: IO[str]) -> int:
        n = 0
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")
            n += 1
        return n

    return atomic_write(path, write)
