"""Tokenised lengths of task records: how many tokens each record needs to be read whole, their statistics
(stored in task.json by a conversion), the share a given ``max_seq_len`` would cut, and a length that fits.

The counts follow the fine-tuning encodings (finetune/task_types/): ``[CLS] text [SEP]``, ``[CLS] a [SEP] b
[SEP]``; a tagging word with no piece still takes one; a span record counts its whole context in one window
(longer contexts are read through windows, which costs time rather than content); a choice group counts its
longest (question, candidate) pair; a generation record its source. They are measured with the tokenizer
given (converters use bert-base-chinese: one token per Chinese character, so a compact vocab, a subset of
it, gives the same counts for Chinese text).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

# Fine-tuning's own floor on max_seq_len, and its value when a task config gives none (finetune/config.py).
MIN_SEQ_LEN = 8
DEFAULT_MAX_SEQ_LEN = 128
# A share of cut examples above this is worth a warning: the model then misses part of what the labels
# were made from for more than one example in ten.
WARN_CUT_SHARE = 0.10


def _counts(tok: Any, texts: Sequence[str]) -> list[int]:
    """Token count of each text. Each distinct text is tokenised once (matching groups share their answers
    many times over), through the tokenizer's CJK fast path where it has one."""
    if not texts:
        return []
    distinct = list(dict.fromkeys(texts))
    flat = getattr(tok, "encode_batch_flat", None)
    counts = flat(distinct)[1].tolist() if flat else [len(ids) for ids in tok.encode_batch(distinct)]
    n = dict(zip(distinct, counts))
    return [n[t] for t in texts]


def record_lengths(kind: str, records: Sequence[dict[str, Any]], tok: Any) -> list[int]:
    """Tokens (special tokens included) each record of `kind` needs so that nothing of it is cut."""
    if kind in ("single", "generation"):
        return [n + 2 for n in _counts(tok, [r["text" if kind == "single" else "source"] for r in records])]
    if kind in ("pair", "span"):
        fa, fb = ("text", "text_pair") if kind == "pair" else ("question", "context")
        a, b = _counts(tok, [r[fa] for r in records]), _counts(tok, [r[fb] for r in records])
        return [x + y + 3 for x, y in zip(a, b)]
    if kind == "tagging":
        words = [w for r in records for w in r["tokens"]]
        per_word = iter(max(1, n) for n in _counts(tok, words))
        return [sum(next(per_word) for _ in r["tokens"]) + 2 for r in records]
    if kind == "choice":
        q = _counts(tok, [r["question"] for r in records])
        cands = iter(_counts(tok, [c for r in records for c in r["candidates"]]))
        return [qn + max((next(cands) for _ in r["candidates"]), default=0) + 3 for qn, r in zip(q, records)]
    raise ValueError(f"unknown task kind {kind!r}")


def length_stats(lengths: Sequence[int]) -> dict[str, int]:
    """n, p50, p90, p95, p99 and max of `lengths` (percentiles rounded up: a length that holds that share)."""
    if not lengths:
        return {"n": 0}
    a = np.asarray(lengths)
    out = {"n": len(a)}
    for q in (50, 90, 95, 99):
        out[f"p{q}"] = int(math.ceil(np.percentile(a, q)))
    out["max"] = int(a.max())
    return out


def cut_share(lengths: Sequence[int], max_seq_len: int) -> float:
    """Share of records longer than `max_seq_len` (those the encoding would cut)."""
    return sum(n > max_seq_len for n in lengths) / len(lengths) if lengths else 0.0


def fitting_length(stats: dict[str, int], positions: int, multiple: int = 8) -> int:
    """A max_seq_len for data with these `stats`: its 95th percentile (the long tail would make every batch
    that meets it slower while adding little), rounded up to a multiple of `multiple`, at most the model's
    `positions` and at least fine-tuning's minimum."""
    p95 = int(stats.get("p95") or MIN_SEQ_LEN)
    return max(MIN_SEQ_LEN, min(positions, -(-p95 // multiple) * multiple))


def cut_warning(name: str, lengths_by_split: dict[str, list[int]], max_seq_len: int) -> str | None:
    """One line when more than WARN_CUT_SHARE of a split's records are longer than `max_seq_len` (train's
    share first, else the worst split's), else None."""
    shares = {s: cut_share(v, max_seq_len) for s, v in lengths_by_split.items() if v}
    bad = {s: v for s, v in shares.items() if v > WARN_CUT_SHARE}
    if not bad:
        return None
    split = "train" if "train" in bad else max(bad, key=lambda s: bad[s])
    n = len(lengths_by_split[split])
    fit = length_stats(lengths_by_split[split])["p95"]
    others = ", ".join(f"{s} {100 * v:.0f}%" for s, v in bad.items() if s != split)
    return (f"warning: {name}: {100 * bad[split]:.0f}% of {split} examples ({round(bad[split] * n):,} of {n:,}) "
            f"are longer than max_seq_len {max_seq_len} tokens and would be cut"
            + (f" ({others})" if others else "")
            + f"; 95% fit in {fit} (give the task that max_seq_len, or --max-seq-len to check another)")


def span_window_line(name: str, records_by_split: dict[str, list[dict[str, Any]]], tok: Any,
                     max_seq_len: int) -> str | None:
    """A span task's line instead of `cut_warning`: its contexts are read in windows of `max_seq_len`
    (model/span_qa.py's, with the default stride and question cut), nothing is cut; per split, how many
    examples span several windows and how many answers lie whole in no window (training skips those).
    A ``warning:`` when train loses answers, else a note; None without records."""
    from skillnet.model.span_qa import window_counts

    parts, lost = [], 0
    for split, recs in records_by_split.items():
        if not recs:
            continue
        q = _counts(tok, [r["question"] for r in recs])
        offs = [e.offsets for e in tok.backend.encode_batch([r["context"] for r in recs], add_special_tokens=False)]
        ans = [(r["answers"][0]["start"], r["answers"][0]["start"] + len(r["answers"][0]["text"]))
               if r.get("answers") else None for r in recs]
        c = window_counts(q, offs, ans, max_seq_len)
        lost += c["answer_in_no_window"] if split == "train" else 0
        parts.append(f"{split} {c['several_windows']:,} of {c['examples']:,} in several windows, "
                     f"{c['answer_in_no_window']:,} answers in none")
    if not parts:
        return None
    return (f"{'warning' if lost else 'note'}: {name}: span contexts are read in windows of max_seq_len {max_seq_len} "
            f"tokens, not cut: {'; '.join(parts)}"
            + ("; training skips examples whose answer lies in no window: a longer max_seq_len keeps them" if lost
               else ""))

