"""Bad input while reading a corpus: the reasons a document or file is skipped, and the report that counts
them (or, under ``--strict``, the error that stops at the first)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

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

    def add(self, reason: str, nbytes: int, where: str | Callable[[], str]) -> None:
        if reason not in REASONS:
            raise KeyError(reason)
        if self.strict:
            loc = where() if callable(where) else where
            raise BadInputError(
                f"{loc}: {REASONS[reason]} ({reason}); rerun without --strict to skip and count"
            )
        self.counts[reason] = self.counts.get(reason, 0) + 1
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
