"""One JSONL schema for every fine-tuning task kind, its validator and its loader.

Every record is one JSON object per line. The fields per kind are in `docs/task_data.md`; `KINDS` below
is the machine-readable version. The loader checks every record and names the file and line of the first
bad one (`path:line: reason`), or, with `skip_bad=True`, counts bad records per reason and skips them, so
that nothing deeper (tokenizer, collator, torch) ever sees malformed input.
"""

from __future__ import annotations

import json
import math
import os
import re
import tempfile
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
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


class TaskDataError(ValueError):
    """A bad task file or record. `str(err)` reads `path:line: reason`."""

    def __init__(self, path: str | os.PathLike[str], line: int, reason: str) -> None:
        self.path = str(path)
        self.line = line
        self.reason = reason
        super().__init__(f"{self.path}:{line}: {reason}")


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
            answers = _get_list(obj, "answers")
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


# ----------------------------------------------------------------------------------------- loading

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
                hint = (" (this looks like a whole-file JSON document; task files are JSON Lines, one object per"
                        " line; convert public formats with `python -m skillnet.data_prep.tasks convert`)")
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


def infer_pair_kind(path: str | os.PathLike[str]) -> tuple[str, int | None]:
    """Kind of a classification/regression file given without one: ``("pair", line)`` with the line of
    the first record that has a ``text_pair``, else ``("single", None)``. Lines that are not JSON objects
    are left to the loader, which names them."""
    for line_no, obj in iter_jsonl(path):
        if isinstance(obj, dict) and obj.get("text_pair") is not None:
            return "pair", line_no
    return "single", None


def load_task_file(
    path: str | os.PathLike[str],
    kind: str,
    label_list: Sequence[str] | None = None,
    skip_bad: bool = False,
    *,
    regression: bool = False,
    require_labels: bool = True,
    max_examples: int | None = None,
    as_dataset: bool = True,
) -> tuple[Any, LoadReport]:
    """Read and validate a task JSONL file.

    Returns `(data, report)`: `data` is a `datasets.Dataset` (or a list of dicts when `as_dataset=False`)
    of normalised records; `report` is a `LoadReport` (kept / skipped per reason / label list used).

    - `label_list`: the allowed classes (single/pair) or tags (tagging; a list of entity types like
      `["PER", "LOC"]` is expanded to O/B-/I- tags). `None` infers it from the file (do that for train
      only; pass train's list when loading dev/test so an unseen label is an error).
    - `skip_bad`: count bad records per reason and skip them instead of raising `TaskDataError`.
    - `require_labels=False`: labels may be absent (files to predict on); absent labels become None/empty.
    - `max_examples`: stop after that many kept records (CPU demos).

    Classification records gain `label_id` (index into the label list), tagging records `label_ids`.
    Raises `TaskDataError` (`path:line: reason`) for the first bad record unless `skip_bad`, and always
    for a missing or empty file or a file where no record is valid.
    """
    _check_kind(kind)
    label_list = expand_label_list(kind, label_list)
    if kind in ("span", "choice", "generation") or regression:
        label_list = None  # these kinds have no closed label set
    report = LoadReport(path=str(path), kind=kind)
    records: list[dict[str, Any]] = []
    counts: Counter[str] = Counter()
    for line_no, obj in iter_jsonl(path):
        report.records_read += 1
        try:
            if isinstance(obj, _Bad):
                raise obj
            rec = validate_record(obj, kind, label_list=label_list, regression=regression,
                                  require_labels=require_labels)
        except _Bad as b:
            if not skip_bad:
                raise TaskDataError(path, line_no, f"{b.msg} [{kind} record]") from None
            counts[b.key] += 1
            report.first_error.setdefault(b.key, f"{path}:{line_no}: {b.msg}")
            continue
        rec.setdefault("id", f"{Path(path).name}:{line_no}")
        records.append(rec)
        if max_examples is not None and len(records) >= max_examples:
            break
    report.skipped = dict(counts)
    if report.records_read == 0:
        raise TaskDataError(path, 1, "file is empty: no records")
    if not records:
        raise TaskDataError(path, 1, f"no valid {kind} record in the file ({report.num_skipped} skipped: "
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
