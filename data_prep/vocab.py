"""A compact vocabulary: the entries of a base WordPiece vocab that a corpus and its task files use.

bert-base-chinese has 21,128 entries; the packaged Chinese text and tasks use a few thousand. At the widths
a CPU trains, the LM head and its softmax over unused entries take most of a step, so the CPU profiles
train with the entries that occur instead. The compact vocab keeps the base vocab's first entries up to
and including the special tokens ([PAD], [unused*], [UNK], [CLS], [SEP], [MASK] at their base ids, so
configs that name special ids stay valid), then every entry the inputs use, in base order.

Because WordPiece matches the longest piece greedily, a vocab that keeps every piece a text was split
into splits that text exactly the same way: on the inputs it is built from, the compact vocab gives the
same pieces as the base. Text it was not built from (a test split) may hold characters it lacks, which
become [UNK]: the coverage report counts them per source.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from skillnet.common.files import atomic_write_text

from .shards import atomic_write_json
from .tokenizer import SPECIAL_TOKENS, TokenizerConfig, WordPieceTokenizer, load_tokenizer

BATCH = 2000


def texts_of(path: Path) -> Iterator[str]:
    """The text of a file: every string value of each JSON line of ``.jsonl``/``.json`` files (task
    data: sources, targets, questions, ...), else each line."""
    with open(path, encoding="utf-8", errors="replace") as f:
        if path.suffix in (".jsonl", ".json"):
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    yield from _strings(json.loads(line))
                except json.JSONDecodeError:
                    yield line
        else:
            for line in f:
                if line.strip():
                    yield line.rstrip("\n")


def _strings(v: object) -> Iterator[str]:
    if isinstance(v, str):
        yield v
    elif isinstance(v, dict):
        for x in v.values():
            yield from _strings(x)
    elif isinstance(v, list):
        for x in v:
            yield from _strings(x)


def _batches(paths: Sequence[Path]) -> Iterator[list[str]]:
    for p in paths:
        batch: list[str] = []
        for t in texts_of(p):
            batch.append(t)
            if len(batch) == BATCH:
                yield batch
                batch = []
        if batch:
            yield batch


@dataclass
class Coverage:
    """Characters of one source, and how many of them the vocab turns into [UNK]."""

    source: str
    chars: int = 0
    unk_chars: int = 0

    @property
    def unk_share(self) -> float:
        return self.unk_chars / self.chars if self.chars else 0.0


@dataclass
class VocabReport:
    base_size: int
    size: int
    min_count: int
    built_from: list[Coverage] = field(default_factory=list)
    checked: list[Coverage] = field(default_factory=list)

    def to_json(self) -> dict:
        def rows(cs: list[Coverage]) -> list[dict]:
            return [{"source": c.source, "chars": c.chars, "unk_chars": c.unk_chars,
                     "unk_share": round(c.unk_share, 6)} for c in cs]

        return {"base_size": self.base_size, "size": self.size, "min_count": self.min_count,
                "built_from": rows(self.built_from), "checked": rows(self.checked)}


def coverage(tok: WordPieceTokenizer, path: Path) -> Coverage:
    """Non-space characters of ``path`` and those inside [UNK] pieces."""
    cov = Coverage(str(path))
    for batch in _batches([path]):
        for text, (ids, offsets) in zip(batch, tok.encode_batch_offsets(batch)):
            cov.chars += sum(1 for ch in text if not ch.isspace())
            cov.unk_chars += sum(e - s for i, (s, e) in zip(ids, offsets) if i == tok.unk_id)
    return cov


def build_compact_vocab(inputs: Sequence[str | os.PathLike], out: str | os.PathLike,
                        check: Sequence[str | os.PathLike] = (), base_vocab: str | os.PathLike | None = None,
                        min_count: int = 1, lowercase: bool = True) -> VocabReport:
    """Write ``out/vocab.txt`` holding the base vocab's special block plus every entry ``inputs`` use at
    least ``min_count`` times; return the coverage of the inputs and of the ``check`` files."""
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1, got {min_count}")
    paths = [Path(p) for p in inputs]
    missing = [str(p) for p in [*paths, *map(Path, check)] if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"no such file: {', '.join(missing)}")
    base = load_tokenizer(base_vocab, lowercase=lowercase, option="--base")
    counts: Counter[int] = Counter()
    for batch in _batches(paths):
        for ids in base.encode_batch(batch):
            counts.update(ids)
    head = max(base.vocab.index(t) for t in SPECIAL_TOKENS) + 1
    keep = list(range(head)) + sorted(i for i, n in counts.items() if n >= min_count and i >= head)
    out_dir = Path(out)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / "vocab.txt", "".join(base.vocab[i] + "\n" for i in keep))
    tok = WordPieceTokenizer(TokenizerConfig(vocab_file=str(out_dir / "vocab.txt"), lowercase=lowercase))
    report = VocabReport(base_size=base.vocab_size, size=tok.vocab_size, min_count=min_count,
                         built_from=[coverage(tok, p) for p in paths], checked=[coverage(tok, Path(p)) for p in check])
    atomic_write_json(out_dir / "vocab_report.json", report.to_json())
    return report


def format_report(r: VocabReport) -> str:
    lines = [f"vocab: {r.size:,} entries (base {r.base_size:,}; kept the special block and every entry used "
             f">= {r.min_count} time(s))", f"{'source':<70} {'chars':>11} {'[UNK] chars':>12} {'share':>8}"]
    for title, rows in (("built from", r.built_from), ("checked", r.checked)):
        if rows:
            lines.append(f"-- {title}")
        for c in rows:
            src = c.source if len(c.source) <= 70 else "..." + c.source[-67:]
            lines.append(f"{src:<70} {c.chars:>11,} {c.unk_chars:>12,} {c.unk_share:>8.4%}")
    return "\n".join(lines)
