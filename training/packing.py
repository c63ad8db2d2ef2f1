"""Packed rows: several samples share one row of ``max_seq_len`` tokens, each attending only to itself.

A source builds a micro-batch of samples as padded rows ([B, T], one sample each, ``attention_mask`` a
prefix of ones); `pack_rows` moves the same samples into fewer rows. Packing changes rows, never samples:
the same tokens, token types, labels and sample-level labels, in a layout the model reads back per sample:

    input_ids, token_type_ids, labels, ... [R, T]   the samples one after another, padding at the end
    attention_mask  [R, T]  1 on real tokens (what tokens/s counts and a token gate routes)
    segment_ids     [R, T]  1, 2, ... for the samples of a row, 0 on padding (attention stays inside one)
    position_ids    [R, T]  each token's position in its own sample (0 at its [CLS])
    cls_positions   [B]     flat index (into R*T) of each sample's first token, in the samples' order
    token_order     [N]     flat indices of the N real tokens in the samples' order (a token gate's order)

Sample-level tensors ([B], e.g. ``next_sentence_label``) keep their order, which ``cls_positions`` matches.
Rows are filled first-fit by decreasing length (stable, so the layout is a pure function of the batch),
and a row only takes samples of one group (``groups``: a task per sample) so that a row has one skill set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["fewest_rows", "pack_rows", "pack_where_it_pays", "plan_rows", "real_token_share"]

# Values that fill a token-level tensor's padding.
_PAD_VALUES = {"labels": -100, "attention_mask": 0, "token_type_ids": 0}


def plan_rows(lengths: Sequence[int] | np.ndarray, max_len: int,
              groups: Sequence[Any] | None = None) -> list[list[int]]:
    """Rows of sample indices, first-fit decreasing: each row's lengths sum to at most ``max_len``, a row
    holds samples of one group only, and the samples of a row keep their batch order."""
    lens = np.asarray(lengths, dtype=np.int64)
    if len(lens) and (lens.max() > max_len or lens.min() < 1):
        raise ValueError(f"sample lengths must be in [1, {max_len}], got {lens.min()}..{lens.max()}")
    keys = [None] * len(lens) if groups is None else list(groups)
    if len(keys) != len(lens):
        raise ValueError(f"{len(keys)} groups for {len(lens)} samples")
    rows: list[list[int]] = []
    free: list[int] = []
    row_key: list[Any] = []
    for i in np.argsort(-lens, kind="stable"):
        n = int(lens[i])
        for r, f in enumerate(free):
            if f >= n and row_key[r] == keys[i]:
                rows[r].append(int(i))
                free[r] -= n
                break
        else:
            rows.append([int(i)])
            free.append(max_len - n)
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


def _lengths(batch: dict[str, torch.Tensor]) -> np.ndarray:
    """Each row's sample length, checking that the rows are padded prefixes."""
    mask = batch["attention_mask"].numpy().astype(bool)
    lens = mask.sum(1)
    if not (mask == (np.arange(mask.shape[1])[None, :] < lens[:, None])).all():
        raise ValueError("pack_rows needs padded rows: attention_mask must be ones then zeros in every row")
    return lens


def pack_rows(batch: dict[str, torch.Tensor], pad_id: int, *, groups: Sequence[Any] | None = None,
              row_len: int | None = None, rows: list[list[int]] | None = None
              ) -> tuple[dict[str, torch.Tensor], list[list[int]]]:
    """The padded micro-batch ``batch`` ([B, T] token tensors with a prefix ``attention_mask``; [B] sample
    tensors) as packed rows (module docstring) of ``row_len`` tokens (default T: a batch padded to its
    longest sample packs into rows of the length its rows may have, e.g. a task's max_seq_len). ``rows``: a
    `plan_rows` plan already made for this batch. Returns the packed tensors and the rows (sample indices)."""
    B, width = batch["attention_mask"].shape
    T = width if row_len is None else row_len
    if width > T:
        raise ValueError(f"row_len={row_len} is shorter than the batch's rows ({width} tokens)")
    lens = _lengths(batch)
    rows = plan_rows(lens, T, groups) if rows is None else rows
    R = len(rows)
    # Where each sample goes: row, offset in it.
    row_of = np.empty(B, np.int64)
    offset = np.empty(B, np.int64)
    seg_of = np.empty(B, np.int64)
    for r, samples in enumerate(rows):
        at = 0
        for j, b in enumerate(samples):
            row_of[b], offset[b], seg_of[b] = r, at, j + 1
            at += int(lens[b])
    # Source (b, t) of every real token, in the samples' order, and its packed flat position.
    src_b = np.repeat(np.arange(B), lens)
    src_t = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
    dst = row_of[src_b] * T + offset[src_b] + src_t
    out: dict[str, torch.Tensor] = {}
    for key, value in batch.items():
        if value.dim() >= 2 and value.shape[:2] == (B, width):
            fill = pad_id if key == "input_ids" else _PAD_VALUES.get(key, 0)
            flat = value.new_full((R * T, *value.shape[2:]), fill)
            flat[torch.from_numpy(dst)] = value[torch.from_numpy(src_b), torch.from_numpy(src_t)]
            out[key] = flat.view(R, T, *value.shape[2:])
        elif value.dim() >= 1 and value.shape[0] == B:
            out[key] = value  # one value per sample, in sample order
        else:
            raise ValueError(f"pack_rows: {key!r} of shape {tuple(value.shape)} is neither [B, T, ...] nor [B, ...]")
    seg = np.zeros(R * T, np.int64)
    seg[dst] = seg_of[src_b]
    pos = np.zeros(R * T, np.int64)
    pos[dst] = src_t
    out["segment_ids"] = torch.from_numpy(seg.reshape(R, T))
    out["position_ids"] = torch.from_numpy(pos.reshape(R, T))
    out["cls_positions"] = torch.from_numpy(row_of * T + offset)
    out["token_order"] = torch.from_numpy(dst)
    return out, rows


def pack_where_it_pays(batch: dict[str, torch.Tensor], pad_id: int, *, groups: Sequence[Any] | None = None,
                       row_len: int | None = None) -> dict[str, torch.Tensor]:
    """`pack_rows` when it computes fewer token slots than the padded batch; else the padded batch as it is
    (rows that hold one sample each gain nothing from a packed layout, whose block mask costs more than a
    key mask). The plan decides, before any tensor is built."""
    B, width = batch["attention_mask"].shape
    T = width if row_len is None else row_len
    rows = plan_rows(_lengths(batch), T, groups)
    if len(rows) * T >= B * width:
        return batch
    return pack_rows(batch, pad_id, groups=groups, row_len=row_len, rows=rows)[0]


def real_token_share(batch: dict[str, torch.Tensor]) -> float:
    """Real tokens over row slots of a (padded or packed) batch."""
    mask = batch["attention_mask"]
    return float(mask.sum()) / max(mask.numel(), 1)
