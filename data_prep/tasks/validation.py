"""The task schema: the fields of each task kind, and the validator every record goes through.

`KINDS` is the machine-readable version of the fields per kind in `docs/task_data.md`. `validate_record`
checks one decoded record and returns it normalised, or raises `_Bad` (the counting bucket and the
message); the loader (loading.py) turns that into `TaskDataError` (`path:line: reason`) or a skip.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = [
    "FLAT_KINDS", "KINDS", "SPLITS", "TaskDataError", "check_record", "expand_label_list", "infer_label_list",
    "kind_fields", "validate_record",
]

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
