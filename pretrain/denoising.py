"""BART denoising samples (text infilling, optional sentence permutation) read from `data_prep` shards.

Sample i is window i of `PretrainingDataset` (every document cut into windows of `max_seq_len - 3`
tokens), so the number of samples, the index and the shard reading are those of MLM/NSP. The noise follows
BART's text infilling (Lewis et al. 2020, §2.2; fairseq's ``DenoisingDataset`` with ``replace_length=1``
and no random-token replacement):

  1. sentence permutation (``permute_sentences``): the window's pieces between the sentence ends inside
     it (the first and the last may be partial sentences) in a random order;
  2. text infilling: a budget of ``floor(n * mask_ratio + u)`` of the n tokens (stochastic rounding, so
     ``n * mask_ratio`` on average) is split into spans with lengths ~ Poisson(``poisson_lambda``), drawn
     until they cover the budget, the last one cut to fit. A span of length 0 inserts a [MASK] at a
     random position; every other span is replaced by one [MASK]. Spans are placed uniformly at random
     without overlapping or touching, so each [MASK] stands for exactly one span and exactly the budget
     is masked (fairseq lets spans overlap and merge, which masks fewer tokens than its budget).

    input_ids = [CLS] noised text [SEP]     attention_mask 1 on it, [PAD] after
    labels    = [CLS] text [SEP]            -100 after

The model derives its decoder inputs from the labels (HF ``shift_tokens_right``: ``[SEP] [CLS] text``):
decoder start [SEP] and labels "[CLS] y [SEP]", as the public SkillNet-NLG code and as fine-tuning. With
packing (the default of pre-training) a micro-batch's samples share rows on both sides
(training/packing.py `pack_pairs`), each decoder input built per sample behind its own [SEP].

All randomness comes from the counter-based hash of `pretrain.dataset` over (seed, epoch, "denoise",
index, position): any rank builds any sample, and training resumes at an exact position.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .dataset import PretrainingDataset, _sample_keys, _uniform

__all__ = ["DENOISE", "DenoisingDataset", "DenoisingExample", "infill", "permute_pieces", "poisson_cdf"]

DENOISE = "denoise"
_OBJECTIVE_ID = 3  # after mlm=1, nsp=2 of pretrain.dataset: its own stream of draws
# Streams of the per-sample hash.
_ROUND, _LENGTH, _PLACE, _INSERT, _PERMUTE = 20, 21, 22, 23, 24


def poisson_cdf(lam: float, tail: float = 1e-12) -> np.ndarray:
    """P(X <= k) for k = 0, 1, ... until the tail is below `tail`: inverse-CDF sampling is then
    ``np.searchsorted(cdf, u, side="right")`` for u uniform in [0, 1)."""
    pmf, cdf, k = math.exp(-lam), [], 0
    acc = 0.0
    while True:
        acc += pmf
        cdf.append(acc)
        if 1.0 - acc < tail or k > 10 * lam + 100:
            break
        k += 1
        pmf *= lam / k
    return np.asarray(cdf)


@dataclass
class DenoisingExample:
    """One sample with the facts the tensors hide (for tests and inspection)."""

    text: np.ndarray  # [n] the window's tokens: the target between [CLS] and [SEP]
    permuted: np.ndarray  # [n] after sentence permutation (`text` itself without it)
    source: np.ndarray  # noised `permuted`: the encoder input between [CLS] and [SEP]
    spans: np.ndarray  # [k, 2] (start, length) in `permuted`, by start; lengths in the order drawn
    insertions: int  # [MASK]s inserted by spans of length 0
    drawn: np.ndarray  # the span lengths as drawn, zeros included, the last one cut to the budget


def permute_pieces(x: np.ndarray, cuts: np.ndarray, u_piece: np.ndarray) -> np.ndarray:
    """`x` cut before each position in `cuts` (sorted, in 1..len(x)-1), the pieces ordered by their draws
    ``u_piece[piece id]``."""
    piece = np.zeros(len(x), np.int64)
    piece[cuts] = 1
    piece = np.cumsum(piece)
    return x[np.lexsort((np.arange(len(x)), u_piece[piece]))]


def infill(
    x: np.ndarray,
    budget: int,
    lengths: np.ndarray,
    u_place: np.ndarray,
    u_insert: np.ndarray,
    mask_id: int,
    max_len: int,
) -> tuple[np.ndarray, np.ndarray, int, np.ndarray]:
    """Text infilling of `x`: (noised tokens, [k, 2] spans (start, length), insertions, lengths drawn).

    `lengths`: span lengths as drawn (Poisson), used in order until they cover `budget` tokens, the last
    one cut to fit; zeros are insertions. `u_place` (>= len(x) + 1 draws) places the spans, `u_insert`
    (>= max_len draws) the inserted [MASK]s; insertions that would make the output longer than
    `max_len` are dropped.
    """
    n = len(x)
    if budget <= 0:
        return x.copy(), np.zeros((0, 2), np.int64), 0, np.zeros(0, np.int64)
    cum = np.cumsum(lengths)
    last = min(int(np.searchsorted(cum, budget, side="left")), len(lengths) - 1)
    drawn = lengths[: last + 1].astype(np.int64)
    drawn[last] = budget - (int(cum[last - 1]) if last else 0)
    span_len = drawn[drawn > 0]
    inserts = int((drawn == 0).sum())
    # Spans that do not touch need k - 1 unmasked separators; only mask ratios above ~0.5 on short windows
    # can lack them, and then the last spans are dropped.
    while len(span_len) and n - int(span_len.sum()) < len(span_len) - 1:
        span_len = span_len[:-1]
    k = len(span_len)
    # A uniform placement: k of the n - sum + 1 slots of the text with each span shrunk to one slot and
    # the separators removed; span j then starts at slot c_j + the lengths of the spans before it.
    slots = n - int(span_len.sum()) + 1 if k else 0
    chosen = np.sort(np.argsort(u_place[:slots], kind="stable")[:k])
    starts = chosen + np.concatenate([[0], np.cumsum(span_len)[:-1]]).astype(np.int64)
    edge = np.zeros(n + 1, np.int64)
    np.add.at(edge, starts, 1)
    np.add.at(edge, starts + span_len, -1)
    masked = np.cumsum(edge)[:n] > 0
    first = np.zeros(n, bool)
    first[starts] = True
    body = np.where(first, mask_id, x)[~masked | first]
    z = max(0, min(inserts, max_len - len(body)))
    if z:
        m = len(body) + z
        at = np.zeros(m, bool)
        at[np.argsort(u_insert[:m], kind="stable")[:z]] = True
        out = np.empty(m, body.dtype)
        out[at] = mask_id
        out[~at] = body
        body = out
    return body, np.stack([starts, span_len], axis=1).astype(np.int64), z, drawn


class DenoisingDataset(PretrainingDataset):
    """See module docstring. `batch(indices, epoch, "denoise")` returns torch tensors padded to max_seq_len."""

    objectives = (DENOISE,)

    def __init__(
        self,
        shard_dir: str | os.PathLike,
        max_seq_len: int = 128,
        seed: int = 0,
        mask_ratio: float = 0.3,
        poisson_lambda: float = 3.0,
        permute_sentences: bool = False,
        *,
        expected_fingerprint: str | None = None,
        verify: str = "full",
    ) -> None:
        if not 0.0 <= mask_ratio < 1.0:
            raise ValueError(f"mask_ratio={mask_ratio} must be in [0, 1)")
        if not poisson_lambda > 0.0:
            raise ValueError(f"poisson_lambda={poisson_lambda} must be > 0")
        super().__init__(
            shard_dir, max_seq_len, seed, expected_fingerprint=expected_fingerprint, verify=verify
        )
        self.mask_ratio, self.poisson_lambda = mask_ratio, poisson_lambda
        self.permute_sentences = permute_sentences
        self._cdf = poisson_cdf(poisson_lambda)

    @property
    def decoder_start_id(self) -> int:
        """The decoder's first input of every sample (the model's ``decoder_start_token_id``): [SEP]."""
        return self.sep_id

    def check_objective(self, objective: str) -> None:
        if objective != DENOISE:
            raise ValueError(f"objective {objective!r}: BART pre-training trains {DENOISE!r} only")

    def examples(self, indices: Sequence[int], epoch: int) -> list[DenoisingExample]:
        """The samples `indices` of `epoch`, each a pure function of (seed, epoch, index)."""
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        T = self.max_seq_len
        key = _sample_keys(self.seed, epoch, _OBJECTIVE_ID, idx)
        pos = np.arange(T)
        u_round = _uniform(key, _ROUND)
        lengths = np.searchsorted(self._cdf, _uniform(key, _LENGTH, pos), side="right")
        u_place, u_insert = _uniform(key, _PLACE, pos), _uniform(key, _INSERT, pos)
        u_piece = _uniform(key, _PERMUTE, pos)
        shard, start, length, _, _ = self._locate(idx)
        begin = self._shard_tok_cum[shard] + start
        out = []
        for b in range(len(idx)):
            s, a, n = int(shard[b]), int(start[b]), int(length[b])
            text = np.asarray(self._tokens[s][a : a + n], dtype=np.int64)
            permuted = text
            if self.permute_sentences:
                lo = np.searchsorted(self._sent_end, begin[b], side="right")
                hi = np.searchsorted(self._sent_end, begin[b] + n, side="left")
                permuted = permute_pieces(text, self._sent_end[lo:hi] - begin[b], u_piece[b])
            budget = min(n, int(math.floor(n * self.mask_ratio + u_round[b])))
            noised = infill(permuted, budget, lengths[b], u_place[b], u_insert[b], self.mask_id, T - 2)
            out.append(DenoisingExample(text, permuted, *noised))
        return out

    def batch(self, indices: Sequence[int], epoch: int, objective: str = DENOISE) -> dict[str, torch.Tensor]:
        self.check_objective(objective)
        examples = self.examples(indices, epoch)
        B, T = len(examples), self.max_seq_len
        ids = np.full((B, T), self.pad_id, np.int64)
        labels = np.full((B, T), -100, np.int64)
        attn = np.zeros((B, T), np.int64)
        for b, ex in enumerate(examples):
            n, m = len(ex.text), len(ex.source)
            ids[b, 0], ids[b, 1 : 1 + m], ids[b, 1 + m] = self.cls_id, ex.source, self.sep_id
            attn[b, : m + 2] = 1
            labels[b, 0], labels[b, 1 : 1 + n], labels[b, 1 + n] = self.cls_id, ex.text, self.sep_id
        if len(examples):
            shard, start, _, _, _ = self._locate(np.asarray(indices, dtype=np.int64).reshape(-1))
            begin = self._shard_tok_cum[shard] + start
            self._check_ids(np.maximum(labels, 0), lambda b, t: int(begin[b]) + t - 1)
        return {
            "input_ids": torch.from_numpy(ids),
            "attention_mask": torch.from_numpy(attn),
            "labels": torch.from_numpy(labels),
        }
