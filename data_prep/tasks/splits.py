"""Deterministic splits and slices, and writing a converted task directory.

A record's split is a function of (seed, a stable key of the record) only: re-running a converter gives
byte-identical files, adding records to a source never moves existing ones to another split, and
duplicates (same key) always land in the same split, so they cannot leak from train into test.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from .dedup import drop_duplicates
from .schema import SPLITS, TaskSpec, load_task_file, write_jsonl

T = TypeVar("T")
DEFAULT_RATIOS = (0.8, 0.1, 0.1)


def hash_unit(key: str, seed: int, salt: str = "split") -> float:
    """A uniform number in [0, 1) from (salt, seed, key), identical on every machine and Python run."""
    h = hashlib.sha1(f"{salt}\x00{seed}\x00{key}".encode()).digest()
    return int.from_bytes(h[:8], "big") / 2.0**64


def split_of(key: str, seed: int = 0, ratios: Sequence[float] = DEFAULT_RATIOS) -> str:
    if len(ratios) != 3 or any(r < 0 for r in ratios) or sum(ratios) <= 0:
        raise ValueError(f"ratios must be three non-negative numbers (train, dev, test), got {list(ratios)}")
    total = float(sum(ratios))
    u = hash_unit(key, seed)
    acc = 0.0
    for name, r in zip(SPLITS, ratios):
        acc += r / total
        if u < acc:
            return name
    return SPLITS[-1]


def assign_splits(items: Sequence[T], key: Callable[[T], str], seed: int = 0,
                  ratios: Sequence[float] = DEFAULT_RATIOS) -> dict[str, list[T]]:
    """Partition `items` into train/dev/test by hashed key; order inside a split is the input order."""
    out: dict[str, list[T]] = {s: [] for s in SPLITS}
    for it in items:
        out[split_of(key(it), seed, ratios)].append(it)
    return out


def cap(items: Sequence[T], n: int | None, key: Callable[[T], str], seed: int = 0) -> list[T]:
    """Keep at most `n` items: those with the smallest hash, in input order.

    The slice is stable (same n -> same items) and nested (a larger n keeps a superset), so CPU demos on a
    small slice and full runs see consistent data.
    """
    if n is None or len(items) <= n:
        return list(items)
    ranked = sorted(range(len(items)), key=lambda i: (hash_unit(key(items[i]), seed, "cap"), i))
    keep = set(ranked[: max(n, 0)])
    return [it for i, it in enumerate(items) if i in keep]


@dataclass
class Converted:
    """Output of a converter: records per split, the task spec and counts of what was dropped and why."""

    spec: TaskSpec
    splits: dict[str, list[dict[str, Any]]]
    stats: Counter[str] = field(default_factory=Counter)
    # split -> {"examples_in", "removed"}: dev/test examples dropped as copies of train (or dev), once done
    dedup: dict[str, dict[str, int]] | None = None
    # the fields that identify an example where the converter knows better than its kind (dedup.key_fields)
    key_fields: tuple[str, ...] | None = None

    def drop_duplicates(self) -> dict[str, dict[str, int]]:
        """Remove the dev/test examples whose input is in train (test: or dev) (dedup.py); once."""
        if self.dedup is None:
            self.dedup = drop_duplicates(self.splits, self.spec.kind, self.key_fields)
        return self.dedup

    def summary(self) -> str:
        sizes = ", ".join(f"{k}={len(v)}" for k, v in self.splits.items())
        s = f"{self.spec.name} ({self.spec.kind}): {sizes}"
        if self.spec.label_list is not None:
            s += f"; {len(self.spec.label_list)} labels"
        if self.stats:
            s += "\n  " + ", ".join(f"{k}: {v}" for k, v in sorted(self.stats.items()))
        if self.dedup:
            s += "\n  copies of a training input removed: " + ", ".join(
                f"{k} {v['removed']} of {v['examples_in']}" for k, v in self.dedup.items())
        return s


def finalize(records_by_split: dict[str, list[dict[str, Any]]], key: Callable[[dict[str, Any]], str], *,
             seed: int, max_examples: int | None, max_eval_examples: int | None) -> dict[str, list[dict[str, Any]]]:
    """Apply the size caps: `max_examples` to train, `max_eval_examples` to every other split."""
    out = {}
    for name, recs in records_by_split.items():
        n = max_examples if name == "train" else max_eval_examples
        out[name] = cap(recs, n, key, seed)
    return out


def write_task_dir(conv: Converted, out_dir: str | Path, *, verify: bool = True) -> TaskSpec:
    """Write `<out_dir>/<split>.jsonl` for each non-empty split and `<out_dir>/task.json`, less the dev/test
    copies of a training input (`Converted.drop_duplicates`, counted in task.json's `dedup`).

    With `verify`, every written file is re-read through `load_task_file` with the spec's label list, so a
    converter bug surfaces here, with file and line, not in training.
    """
    out = Path(out_dir)
    spec = conv.spec
    spec.dedup = conv.drop_duplicates()
    spec.files, spec.counts = {}, {}
    for name, recs in conv.splits.items():
        if not recs:
            continue
        fname = f"{name}.jsonl"
        spec.counts[name] = write_jsonl(out / fname, recs)
        spec.files[name] = fname
        if spec.label_list and not spec.regression:
            labels = Counter(str(r["label"]) for r in recs if isinstance(r.get("label"), str | int))
            if labels:
                spec.label_counts[name] = dict(sorted(labels.items()))
    spec.report = dict(sorted(conv.stats.items()))
    for name, fname in spec.files.items():
        if verify:
            load_task_file(out / fname, spec.kind, spec.label_list, regression=spec.regression,
                           as_dataset=False, require_labels=name != "unlabelled")
    spec.save(out / "task.json")
    return spec
