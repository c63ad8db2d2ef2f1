"""Dev and test examples whose input is also a training example of the same task: removed at conversion.

A model scored on an input it trained on is scored on memory, not on the task (insuranceqa's package splits
repeat 213 of its 2,000 test questions in train, with the same domain). The key of an example is its input
text fields (`KINDS`' required fields), each normalised by `normalise`, so a copy that differs only in
spacing, punctuation, full/half width or case is a duplicate too. A `choice` example is keyed on its
question alone: its candidates are negatives drawn afresh for every copy of a question, so the same
question with the same positive answers would otherwise pass as new.

A test example is removed when its key is in train or dev (dev picks the checkpoint that test reports),
a dev example when its key is in train. Counts go to task.json's `dedup` (split -> examples_in, removed).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterator
from typing import Any

from .validation import KINDS

# The input fields that identify an example where they differ from the kind's required fields (why: above).
KEY_FIELDS: dict[str, tuple[str, ...]] = {"choice": ("question",)}
# Each split is checked against the splits before it in this order.
CHECKED = {"dev": ("train",), "test": ("train", "dev")}
_NOT_WORD = re.compile(r"[\W_]+")


def normalise(text: str) -> str:
    """`text` as compared for overlap (here and by the corpus's decontamination): NFKC (full-width digits and
    Latin become ASCII), case-folded, and only its letters and digits kept, so that Chinese text, which has
    no spaces, compares character by character, and punctuation or spacing edits do not hide a copy."""
    return _NOT_WORD.sub("", unicodedata.normalize("NFKC", text).casefold())


# The schema's field that holds one text as its tokens (one character each for Chinese): read as one text.
TOKEN_FIELDS = frozenset({"tokens"})


def field_texts(rec: dict[str, Any], name: str) -> Iterator[str]:
    """The texts of field `name` of a record: a string; the tokens as one text (normalise drops the spaces a
    Latin script would put between them); each string of a list of texts (candidates) or of answer objects."""
    value = rec.get(name)
    if name in TOKEN_FIELDS and isinstance(value, list):
        yield "".join(map(str, value))
    else:
        yield from _strings(value)


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _strings(v)
    elif isinstance(value, dict):
        for k, v in value.items():
            if k != "start":  # an answer's offset
                yield from _strings(v)


def key_fields(kind: str) -> tuple[str, ...]:
    return KEY_FIELDS.get(kind, KINDS[kind][0])


def input_key(rec: dict[str, Any], kind: str, fields: tuple[str, ...] | None = None) -> str:
    """The example's identity for duplicate detection: its key fields (`fields`, default the kind's),
    normalised. A text with no letter or digit (only punctuation or emoji) keys on its raw text, so that two
    such texts are not one."""
    # each text normalised on its own and separated, so that no two texts join into a third
    return "\x01".join("\x00".join(normalise(t) or t.strip() for t in field_texts(rec, f))
                       for f in fields or key_fields(kind))


def drop_duplicates(splits: dict[str, list[dict[str, Any]]], kind: str,
                    fields: tuple[str, ...] | None = None) -> dict[str, dict[str, int]]:
    """Remove (in place) every dev/test example whose key (`fields`, default the kind's: input_key) is in a
    split it is checked against (CHECKED); return split -> {"examples_in", "removed"} for each checked split
    present. A converter whose examples share a field by construction (a question's pairs with negatives drawn
    afresh per split) keys on that field."""
    def key(rec: dict[str, Any]) -> str:
        return input_key(rec, kind, fields)

    keys = {s: {key(r) for r in recs} for s, recs in splits.items() if s in {"train", "dev"}}
    counts: dict[str, dict[str, int]] = {}
    for split, against in CHECKED.items():
        recs = splits.get(split)
        if recs is None:
            continue
        seen = set().union(*(keys.get(s, set()) for s in against))
        kept = [r for r in recs if key(r) not in seen]
        counts[split] = {"examples_in": len(recs), "removed": len(recs) - len(kept)}
        splits[split] = kept
        if split in keys:  # test is checked against dev as it stands after its own removals
            keys[split] = {key(r) for r in kept}
    return counts
