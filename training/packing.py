"""Packed rows: several samples share one row of ``max_seq_len`` tokens, each attending only to itself.

A source builds a micro-batch of samples as padded rows ([B, T], one sample each, ``attention_mask`` a
prefix of ones); `pack_rows` moves the same samples into fewer rows. Packing changes rows, never samples:
the same tokens, token types, labels and sample-level labels, in a layout the model reads back per sample:

    input_ids, token_type_ids, labels, ... [R, T]   the samples one after another, padding at the end
    attention_mask  [R, T]  1 on real tokens (what tokens/s counts and a token gate routes)

and the rows' `PackedLayout` (model/packed.py: segment and position ids, the samples' first tokens
``cls_positions``, the real tokens' order), carried in the batch under its field names. Sample-level tensors
([B], e.g. ``next_sentence_label``) keep their order, which ``cls_positions`` matches. Rows are filled
first-fit by decreasing length (stable, so the layout is a pure function of the batch), and a row only takes
samples of one group (``groups``: a task per sample) so that a row has one skill set. With ``unpack=True``
the layout also holds ``unpack_index``, for heads that read every token of a sample (a CRF, span logits):
the model moves the encoder's output back to one sample per row after the encoder, and the head then sees
exactly the padded batch's layout.

An encoder-decoder batch (`pack_pairs`: ``input_ids``/``attention_mask`` for the encoder, ``labels`` for
the decoder, -100 past each target) packs both sides into the same rows: sample k of a row is segment k on
both sides, so cross-attention pairs them. The decoder side carries

    decoder_input_ids       [R, Td]  each sample's labels shifted right behind the decoder start token
                                     (never the previous sample's last token)
    labels, decoder_attention_mask   as the encoder side's, over the targets

and its own `PackedLayout` under ``decoder_`` + the field names, without ``cls_positions`` (no pooled
output). The loss over ``labels`` is then the padded
batch's: the same label tokens, counted once each, under the same normaliser.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from skillnet.model.packed import PackedLayout

__all__ = ["best_pair_rows", "best_rows", "fewest_rows", "pack_pairs", "pack_rows", "pack_where_it_pays", "plan_rows", "real_token_share"]

# Values that fill a token-level tensor's padding.
_PAD_VALUES = {"labels": -100, "attention_mask": 0, "token_type_ids": 0}


def plan_rows(lengths: Sequence[int] | np.ndarray, max_len: int | Sequence[int],
              groups: Sequence[Any] | None = None) -> list[list[int]]:
    """Rows of sample indices, first-fit decreasing: each row's lengths sum to at most ``max_len``, a row
    holds samples of one group only, and the samples of a row keep their batch order. ``lengths`` may be
    [B, 2] with ``max_len`` a pair (an encoder-decoder's source and target lengths, each side's row length):
    a row then fits both sides, and samples are taken by decreasing share of the fuller side."""
    lens = np.asarray(lengths, dtype=np.int64)
    caps = np.asarray(max_len, dtype=np.int64).reshape(-1)
    sizes = lens.reshape(len(lens), -1)
    if sizes.shape[1] != len(caps):
        raise ValueError(f"{sizes.shape[1]} lengths per sample for {len(caps)} row lengths")
    if len(lens) and ((sizes > caps).any() or sizes.min() < 1):
        raise ValueError(f"sample lengths must be in [1, {max_len}], got {sizes.min()}..{sizes.max()}")
    keys = [None] * len(lens) if groups is None else list(groups)
    if len(keys) != len(lens):
        raise ValueError(f"{len(keys)} groups for {len(lens)} samples")
    # One side: by length (integers, so the order of equal lengths is the batch order); two: by the
    # fuller side's share of its row.
    order = (np.argsort(-sizes[:, 0], kind="stable") if len(caps) == 1
             else np.argsort(-(sizes / caps).max(1), kind="stable"))
    rows: list[list[int]] = []
    free: list[np.ndarray] = []
    row_key: list[Any] = []
    for i in order:
        n = sizes[i]
        for r, f in enumerate(free):
            if (f >= n).all() and row_key[r] == keys[i]:
                rows[r].append(int(i))
                free[r] = f - n
                break
        else:
            rows.append([int(i)])
            free.append(caps - n)
            row_key.append(keys[i])
    for r in rows:
        r.sort()
    rows.sort(key=lambda r: r[0])  # rows in the order of their first sample
    return rows


def fewest_rows(lengths: Sequence[int] | np.ndarray, max_len: int) -> int:
    """A lower bound on the rows any packing of these samples needs: every sample longer than half a row
    needs a row that no other such sample shares, and no row holds more than ``max_len`` tokens."""
    lens = np.asarray(lengths)
    return max(int((lens > max_len / 2).sum()), int(np.ceil(lens.sum() / max_len)))


def _lengths(batch: dict[str, torch.Tensor], key: str = "attention_mask") -> np.ndarray:
    """Each row's sample length, checking that the rows are padded prefixes (``key``: a 0/1 mask, or
    ``labels``, whose -100s are the padding)."""
    value = batch[key].numpy()
    mask = value != -100 if key == "labels" else value.astype(bool)
    lens = mask.sum(1)
    if not (mask == (np.arange(mask.shape[1])[None, :] < lens[:, None])).all():
        raise ValueError(f"packing needs padded rows: {key} must be real tokens then padding in every row")
    return lens


class _Layout:
    """Where each real token of a padded side ([B, W], lengths ``lens``) goes in packed rows of T slots."""

    def __init__(self, lens: np.ndarray, rows: list[list[int]], T: int) -> None:
        B = len(lens)
        row_of = np.empty(B, np.int64)
        offset = np.empty(B, np.int64)
        seg_of = np.empty(B, np.int64)
        for r, samples in enumerate(rows):
            at = 0
            for j, b in enumerate(samples):
                row_of[b], offset[b], seg_of[b] = r, at, j + 1
                at += int(lens[b])
        self.R, self.T, self.lens = len(rows), T, lens
        self.row_of, self.offset = row_of, offset
        # Source (b, t) of every real token, in the samples' order, and its packed flat position.
        self.src_b = np.repeat(np.arange(B), lens)
        self.src_t = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        self.dst = row_of[self.src_b] * T + offset[self.src_b] + self.src_t
        self.seg = np.zeros(self.R * T, np.int64)
        self.seg[self.dst] = seg_of[self.src_b]
        self.pos = np.zeros(self.R * T, np.int64)
        self.pos[self.dst] = self.src_t

    def scatter(self, value: torch.Tensor, fill: int) -> torch.Tensor:
        """A [B, W, ...] token tensor in the packed rows."""
        flat = value.new_full((self.R * self.T, *value.shape[2:]), fill)
        flat[torch.from_numpy(self.dst)] = value[torch.from_numpy(self.src_b), torch.from_numpy(self.src_t)]
        return flat.view(self.R, self.T, *value.shape[2:])

    def layout(self, first_tokens: bool = False, unpack_width: int | None = None) -> PackedLayout:
        return PackedLayout(
            torch.from_numpy(self.seg.reshape(self.R, self.T)), torch.from_numpy(self.pos.reshape(self.R, self.T)),
            torch.from_numpy(self.dst), torch.from_numpy(self.row_of * self.T + self.offset) if first_tokens else None,
            None if unpack_width is None else self.unpack_index(unpack_width))

    def unpack_index(self, width: int) -> torch.Tensor:
        idx = np.full(len(self.lens) * width, -1, np.int64)
        idx[self.src_b * width + self.src_t] = self.dst
        return torch.from_numpy(idx.reshape(len(self.lens), width))


def pack_rows(batch: dict[str, torch.Tensor], pad_id: int, *, groups: Sequence[Any] | None = None,
              row_len: int | None = None, rows: list[list[int]] | None = None, unpack: bool = False
              ) -> tuple[dict[str, torch.Tensor], list[list[int]]]:
    """The padded micro-batch ``batch`` ([B, T] token tensors with a prefix ``attention_mask``; [B] sample
    tensors) as packed rows (module docstring) of ``row_len`` tokens (default T: a batch padded to its
    longest sample packs into rows of the length its rows may have, e.g. a task's max_seq_len). ``rows``: a
    `plan_rows` plan already made for this batch; ``unpack``: add ``unpack_index``. Returns the packed
    tensors and the rows (sample indices)."""
    B, width = batch["attention_mask"].shape
    T = width if row_len is None else row_len  # may be shorter than the padded width: plan_rows checks the samples
    lens = _lengths(batch)
    rows = plan_rows(lens, T, groups) if rows is None else rows
    lay = _Layout(lens, rows, T)
    out: dict[str, torch.Tensor] = {}
    for key, value in batch.items():
        if value.dim() >= 2 and value.shape[:2] == (B, width):
            out[key] = lay.scatter(value, pad_id if key == "input_ids" else _PAD_VALUES.get(key, 0))
        elif value.dim() >= 1 and value.shape[0] == B:
            out[key] = value  # one value per sample, in sample order
        else:
            raise ValueError(f"pack_rows: {key!r} of shape {tuple(value.shape)} is neither [B, T, ...] nor [B, ...]")
    out.update(lay.layout(first_tokens=True, unpack_width=width if unpack else None).to_batch())
    return out, rows


def _pair_lengths(batch: dict[str, torch.Tensor]) -> np.ndarray:
    return np.stack([_lengths(batch), _lengths(batch, "labels")], axis=1)


def pack_pairs(batch: dict[str, torch.Tensor], pad_id: int, decoder_start_id: int, *,
               groups: Sequence[Any] | None = None, row_len: int | None = None,
               decoder_row_len: int | None = None, rows: list[list[int]] | None = None
               ) -> tuple[dict[str, torch.Tensor], list[list[int]]]:
    """An encoder-decoder micro-batch (``input_ids``, ``attention_mask`` [B, S]; ``labels`` [B, Tl], -100
    past each target; no other key) as packed rows of ``row_len`` source and ``decoder_row_len`` target
    slots (defaults: the batch's widths). Returns the packed tensors (module docstring) and the rows."""
    extra = set(batch) - {"input_ids", "attention_mask", "labels"}
    if extra:
        raise ValueError(f"pack_pairs: unexpected keys {sorted(extra)}")
    B, S = batch["input_ids"].shape
    Tl = batch["labels"].shape[1]
    S_row = S if row_len is None else row_len
    T_row = Tl if decoder_row_len is None else decoder_row_len
    lens = _pair_lengths(batch)
    rows = plan_rows(lens, (S_row, T_row), groups) if rows is None else rows
    enc, dec = _Layout(lens[:, 0], rows, S_row), _Layout(lens[:, 1], rows, T_row)
    labels = batch["labels"]
    # Each sample's decoder input, built before packing: its target shifted right behind the start token.
    shifted = torch.cat([labels.new_full((B, 1), decoder_start_id), labels[:, :-1]], 1).masked_fill(
        torch.cat([labels.new_zeros((B, 1), dtype=torch.bool), labels[:, :-1] == -100], 1), pad_id)
    out = {"input_ids": enc.scatter(batch["input_ids"], pad_id),
           "attention_mask": enc.scatter(batch["attention_mask"], 0), **enc.layout().to_batch(),
           "labels": dec.scatter(labels, -100), "decoder_input_ids": dec.scatter(shifted, pad_id),
           "decoder_attention_mask": dec.scatter(torch.ones_like(labels), 0), **dec.layout().to_batch("decoder_")}
    return out, rows


def _widths(width: int, longest: int, steps: int | None = None) -> list[int]:
    """Row lengths worth trying for rows at most ``longest`` long whose longest sample has ``width`` tokens:
    width, 2 width, 4 width, ... capped at ``longest`` (``steps`` of them, else until the cap)."""
    out = [min(width, longest)]
    while (out[-1] < longest) if steps is None else len(out) < steps:
        out.append(min(out[-1] * 2, longest))
    return out


# Row lengths are trimmed to the fullest row of a plan, rounded up to this multiple (tensor-core tiles).
ROW_MULTIPLE = 8


def _trimmed(used: int, cap: int) -> int:
    """The row length a plan needs: its fullest row, rounded up to ROW_MULTIPLE, at most ``cap``."""
    return min(cap, -(-used // ROW_MULTIPLE) * ROW_MULTIPLE)


def best_rows(lengths: Sequence[int] | np.ndarray, width: int, longest: int, groups: Sequence[Any] | None = None
              ) -> tuple[int, list[list[int]]]:
    """(row length, `plan_rows` plan) computing the fewest token slots for samples of these ``lengths`` padded
    to ``width``: rows planned 1, 2, 4, ... times that width long, at most ``longest``, each plan's rows then
    trimmed to its fullest row (rounded up to ROW_MULTIPLE); the shorter rows on a tie, as attention grows
    with a row's square."""
    lens = np.asarray(lengths)

    def option(cap: int) -> tuple[int, int, list[list[int]]]:
        rows = plan_rows(lens, cap, groups)
        T = _trimmed(max(int(lens[r].sum()) for r in rows), cap)
        return len(rows) * T, T, rows

    return min((option(cap) for cap in _widths(width, longest)), key=lambda x: x[:2])[1:]


def best_pair_rows(lengths: np.ndarray, widths: tuple[int, int], longest: tuple[int, int],
                   groups: Sequence[Any] | None = None) -> tuple[int, int, list[list[int]]]:
    """`best_rows` for an encoder-decoder's [B, 2] (source, target) lengths: both sides' rows planned together
    (m times each side's width, capped at its ``longest``), then each side trimmed to its fullest row.
    Returns (source row length, target row length, plan)."""
    steps = max(len(_widths(widths[0], longest[0])), len(_widths(widths[1], longest[1])))

    def option(S: int, T: int) -> tuple[int, int, int, int, list[list[int]]]:
        rows = plan_rows(lengths, (S, T), groups)
        used = [lengths[r].sum(0) for r in rows]
        s, t = _trimmed(max(int(u[0]) for u in used), S), _trimmed(max(int(u[1]) for u in used), T)
        return len(rows) * (s + t), s + t, s, t, rows

    sizes = zip(_widths(widths[0], longest[0], steps), _widths(widths[1], longest[1], steps))
    return min((option(S, T) for S, T in sizes), key=lambda x: x[:2])[2:]


def pack_where_it_pays(batch: dict[str, torch.Tensor], pad_id: int, *, groups: Sequence[Any] | None = None,
                       row_len: int | None = None, unpack: bool = False,
                       decoder_start_id: int | None = None, decoder_row_len: int | None = None
                       ) -> dict[str, torch.Tensor]:
    """`pack_rows` (or, with ``decoder_start_id``, `pack_pairs`) into the rows that compute the fewest token
    slots, where that is fewer than the padded batch's; else the padded batch as it is (rows that hold one
    sample each gain nothing from a packed layout, whose block mask costs more than a key mask).

    ``row_len`` (``decoder_row_len``) is the longest a row may be (default: the batch's width); a batch
    padded to its longest sample, as fine-tuning builds them, tries rows of 1, 2, 4, ... times that width
    up to it, each plan trimmed to its fullest row (`best_rows`). The plan decides, before any tensor is
    built."""
    B, width = batch["attention_mask"].shape
    longest = width if row_len is None else max(row_len, width)
    if decoder_start_id is None:
        T, rows = best_rows(_lengths(batch), width, longest, groups)
        if len(rows) * T >= B * width:
            return batch
        return pack_rows(batch, pad_id, groups=groups, row_len=T, rows=rows, unpack=unpack)[0]
    Tl = batch["labels"].shape[1]
    longest_l = Tl if decoder_row_len is None else max(decoder_row_len, Tl)
    S, T, rows = best_pair_rows(_pair_lengths(batch), (width, Tl), (longest, longest_l), groups)
    if len(rows) * (S + T) >= B * (width + Tl):
        return batch
    return pack_pairs(batch, pad_id, decoder_start_id, groups=groups, row_len=S, decoder_row_len=T, rows=rows)[0]


def real_token_share(batch: dict[str, torch.Tensor]) -> float:
    """Real tokens over row slots of a (padded or packed) batch."""
    mask = batch["attention_mask"]
    return float(mask.sum()) / max(mask.numel(), 1)
