"""BERT pre-training samples (MLM / NSP) read from `data_prep` shards through `numpy.memmap`.

Sample i of an epoch is window i: every document is cut into consecutive windows of
`max_seq_len - 3` tokens (the last one shorter), so the number of samples is known without a pass over
the data, every token is used once per epoch, and sample i is a pure function of the shards.

Randomness (NSP split point and partner, MLM positions and replacements) comes from a counter-based
hash of (seed, epoch, objective, index, position), evaluated for the whole batch in numpy: no RNG state,
so any rank can build any sample and training resumes at an exact position.

    mlm: [CLS] window [SEP]            labels = original id at masked positions, -100 elsewhere
    nsp: [CLS] A [SEP] B [SEP]         A = window prefix ending at a sentence end when there is one;
                                       B = the rest of the window (label 0) or, with probability 1/2,
                                       the start of a window of another document (label 1)
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from skillnet.data_prep.shards import (
    ShardError,
    load_manifest,
    open_tokens,
    read_idx,
    read_word_starts,
    verify_shard,
)

_OBJECTIVES = {"mlm": 1, "nsp": 2}
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLD = np.uint64(0x9E3779B97F4A7C15)


class TokenizerMismatchError(ShardError):
    """The shards were built with a different tokenizer than the one the caller expects."""


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, elementwise on uint64 arrays (wrap-around multiplication is intended)."""
    x = (x ^ (x >> np.uint64(30))) * _M1
    x = (x ^ (x >> np.uint64(27))) * _M2
    return x ^ (x >> np.uint64(31))


def _uniform(key_B: np.ndarray, stream: int, pos_T: np.ndarray | None = None) -> np.ndarray:
    """Uniform [0,1) floats: [B] (pos_T None) or [B, T], a pure function of (key, stream, position)."""
    k = _mix(key_B ^ (np.array([stream], np.uint64) * _GOLD))  # array op: wraps without a scalar warning
    if pos_T is not None:
        k = _mix(k[:, None] ^ (pos_T[None, :].astype(np.uint64) * _GOLD + np.uint64(stream)))
    return (k >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


class PretrainingDataset:
    """See module docstring. `batch()` returns torch tensors padded to `max_seq_len`."""

    def __init__(
        self,
        shard_dir: str | os.PathLike,
        max_seq_len: int = 128,
        seed: int = 0,
        mlm_probability: float = 0.15,
        whole_word_mask: bool = False,
        *,
        expected_fingerprint: str | None = None,
        verify: str = "full",
    ) -> None:
        if max_seq_len < 8:
            raise ValueError(f"max_seq_len={max_seq_len} is too small (need >= 8)")
        if not 0.0 < mlm_probability < 1.0:
            raise ValueError(f"mlm_probability={mlm_probability} must be in (0, 1)")
        if verify not in ("full", "size", "none"):
            raise ValueError(f"verify={verify!r}: use 'full' (sha256), 'size' or 'none'")
        self.shard_dir = Path(shard_dir)
        self.max_seq_len, self.seed = max_seq_len, seed
        self.mlm_probability, self.whole_word_mask = mlm_probability, whole_word_mask
        self.manifest = m = load_manifest(self.shard_dir)
        tk = m["tokenizer"]
        if expected_fingerprint is not None and expected_fingerprint != tk["fingerprint"]:
            raise TokenizerMismatchError(
                f"{self.shard_dir}/manifest.json: shards were built with tokenizer {tk['fingerprint']} "
                f"({tk['vocab_file']}, vocab {tk['vocab_size']}, {tk['settings']}), but the expected tokenizer is "
                f"{expected_fingerprint}; rebuild the shards with your vocab or use the matching one"
            )
        self.tokenizer_fingerprint = tk["fingerprint"]
        self.vocab_size = int(tk["vocab_size"])
        self.pad_id, self.cls_id, self.sep_id = int(tk["pad_id"]), int(tk["cls_id"]), int(tk["sep_id"])
        self.mask_id, self.unk_id = int(tk["mask_id"]), int(tk["unk_id"])
        # Random replacement tokens avoid [PAD]/[unused*]/[UNK]/[CLS]/[SEP]/[MASK] (ids below the last special).
        self._rand_lo = max(self.pad_id, self.cls_id, self.sep_id, self.mask_id, self.unk_id) + 1
        self.target = max_seq_len - 3  # tokens of A + B (room for [CLS] A [SEP] B [SEP])
        dtype = tk["dtype"]

        self._tokens: list[np.ndarray] = []
        self._sent_end: list[np.ndarray] = []
        self._doc_start: list[np.ndarray] = []
        self._doc_len: list[np.ndarray] = []
        self._chunk_cum: list[np.ndarray] = []  # per shard: cumulative windows per document, [n_docs + 1]
        self._word_start: list[np.ndarray | None] = []
        shard_chunks, shard_docs = [0], [0]
        for rec in m["shards"]:
            if verify != "none":
                verify_shard(self.shard_dir, rec, verify)
            sent_end, doc_end = read_idx(self.shard_dir / f"{rec['name']}.idx", rec)
            sent_end = np.asarray(sent_end, dtype=np.int64)
            doc_tok_end = (
                sent_end[np.asarray(doc_end, dtype=np.int64) - 1] if len(doc_end) else np.zeros(0, np.int64)
            )
            doc_start = np.concatenate([[0], doc_tok_end[:-1]]).astype(np.int64)
            doc_len = doc_tok_end - doc_start
            n_chunks = -(-doc_len // self.target)
            self._tokens.append(open_tokens(self.shard_dir, rec, dtype))
            self._sent_end.append(sent_end)
            self._doc_start.append(doc_start)
            self._doc_len.append(doc_len)
            self._chunk_cum.append(np.concatenate([[0], np.cumsum(n_chunks)]).astype(np.int64))
            self._word_start.append(read_word_starts(self.shard_dir, rec) if whole_word_mask else None)
            shard_chunks.append(shard_chunks[-1] + int(n_chunks.sum()))
            shard_docs.append(shard_docs[-1] + len(doc_len))
        self._shard_chunk_cum = np.asarray(shard_chunks, dtype=np.int64)
        self._shard_doc_cum = np.asarray(shard_docs, dtype=np.int64)
        self.num_samples = int(self._shard_chunk_cum[-1])
        self.num_documents = int(self._shard_doc_cum[-1])
        self._cont_tbl: np.ndarray | None = None
        if whole_word_mask and any(w is None for w in self._word_start):
            self._cont_tbl = self._continuation_table()

    def __len__(self) -> int:
        return self.num_samples

    def _continuation_table(self) -> np.ndarray:
        """'##' pieces from the vocab copy in the shard dir, for whole-word masking without jieba flags."""
        from skillnet.data_prep.tokenizer import TokenizerConfig, WordPieceTokenizer

        vocab = self.shard_dir / "vocab.txt"
        if not vocab.is_file():
            raise ShardError(
                f"{vocab}: missing; whole_word_mask needs the vocab (or shards built with --whole-word)"
            )
        tok = WordPieceTokenizer(
            TokenizerConfig.from_json({**self.manifest["tokenizer"]["settings"], "vocab_file": str(vocab)})
        )
        if tok.fingerprint != self.tokenizer_fingerprint:
            raise TokenizerMismatchError(
                f"{vocab}: fingerprint {tok.fingerprint} != manifest {self.tokenizer_fingerprint}"
            )
        return tok.continuation_table()

    # ---- locating windows -----------------------------------------------------------------------------
    def _locate(self, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """global window ids -> (shard, token start, length, global doc id, first window of that doc)."""
        if len(idx) and (idx.min() < 0 or idx.max() >= self.num_samples):
            raise IndexError(f"sample index out of range [0, {self.num_samples}): {idx.min()}..{idx.max()}")
        shard = np.searchsorted(self._shard_chunk_cum, idx, side="right") - 1
        start = np.empty(len(idx), np.int64)
        length = np.empty(len(idx), np.int64)
        doc = np.empty(len(idx), np.int64)
        first = np.empty(len(idx), np.int64)
        for s in np.unique(shard):
            sel = shard == s
            local = idx[sel] - self._shard_chunk_cum[s]
            cum = self._chunk_cum[s]
            d = np.searchsorted(cum, local, side="right") - 1
            k = local - cum[d]
            start[sel] = self._doc_start[s][d] + k * self.target
            length[sel] = np.minimum(self.target, self._doc_len[s][d] - k * self.target)
            doc[sel] = self._shard_doc_cum[s] + d
            first[sel] = self._shard_chunk_cum[s] + cum[d]
        return shard, start, length, doc, first

    def _doc_windows(self, doc: np.ndarray) -> np.ndarray:
        shard = np.searchsorted(self._shard_doc_cum, doc, side="right") - 1
        out = np.empty(len(doc), np.int64)
        for s in np.unique(shard):
            sel = shard == s
            d = doc[sel] - self._shard_doc_cum[s]
            out[sel] = self._chunk_cum[s][d + 1] - self._chunk_cum[s][d]
        return out

    # ---- batches ------------------------------------------------------------------------------------------
    def batch(self, indices: Sequence[int], epoch: int, objective: str) -> dict[str, torch.Tensor]:
        if objective not in _OBJECTIVES:
            raise ValueError(f"objective {objective!r}: expected one of {sorted(_OBJECTIVES)}")
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        key = _mix(
            _mix(_mix(np.full(len(idx), self.seed, np.uint64) + _GOLD) ^ np.uint64(epoch))
            ^ np.uint64(_OBJECTIVES[objective])
        )
        key = _mix(key ^ idx.astype(np.uint64))
        if objective == "mlm":
            return self._mlm(idx, key)
        return self._nsp(idx, key)

    def _mlm(self, idx: np.ndarray, key: np.ndarray) -> dict[str, torch.Tensor]:
        B, T = len(idx), self.max_seq_len
        shard, start, length, _, _ = self._locate(idx)
        ids = np.full((B, T), self.pad_id, np.int64)
        ws = np.ones((B, T), bool)
        ids[:, 0] = self.cls_id
        for b in range(B):
            s, a, n = int(shard[b]), int(start[b]), int(length[b])
            ids[b, 1 : 1 + n] = self._tokens[s][a : a + n]
            ids[b, 1 + n] = self.sep_id
            if self.whole_word_mask:
                w = self._word_start[s]
                ws[b, 1 : 1 + n] = w[a : a + n] if w is not None else ~self._cont_tbl[ids[b, 1 : 1 + n]]
                ws[b, 1] = True  # a window may start inside a word: its first token starts a (partial) word
        pos = np.arange(T)
        attn = pos[None, :] < (length + 2)[:, None]
        cand = attn & (pos[None, :] > 0) & (pos[None, :] < (length + 1)[:, None])
        input_ids, labels = self._mask(ids, cand, ws, key)
        return {
            "input_ids": torch.from_numpy(input_ids),
            "token_type_ids": torch.zeros((B, T), dtype=torch.long),
            "attention_mask": torch.from_numpy(attn.astype(np.int64)),
            "labels": torch.from_numpy(labels),
        }

    def _mask(
        self, ids: np.ndarray, cand: np.ndarray, ws: np.ndarray, key: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        B, T = ids.shape
        pos = np.arange(T)
        u = _uniform(key, 1, pos)
        start_pos = np.broadcast_to(pos[None, :], (B, T))
        if self.whole_word_mask:  # every token of a word uses the draw of the word's first token
            start_pos = np.maximum.accumulate(np.where(ws, pos[None, :], 0), axis=1)
            u = np.take_along_axis(u, start_pos, axis=1)
        sel = cand & (u < self.mlm_probability)
        # At least one prediction per row (the whole word with the smallest draw), so a short row never
        # yields an all -100 (NaN) loss.
        none = ~sel.any(axis=1) & cand.any(axis=1)
        if none.any():
            forced = np.argmin(np.where(cand, u, np.inf), axis=1)
            forced_start = np.take_along_axis(start_pos, forced[:, None], axis=1)
            sel |= none[:, None] & cand & (start_pos == forced_start)
        r = _uniform(key, 2, pos)
        rand_ids = self._rand_lo + (_uniform(key, 3, pos) * (self.vocab_size - self._rand_lo)).astype(
            np.int64
        )
        labels = np.where(sel, ids, -100)
        out = np.where(sel & (r < 0.8), self.mask_id, ids)
        out = np.where(sel & (r >= 0.8) & (r < 0.9), rand_ids, out)
        return out, labels

    def _nsp(self, idx: np.ndarray, key: np.ndarray) -> dict[str, torch.Tensor]:
        B, T = len(idx), self.max_seq_len
        if self.num_documents < 2:
            raise ValueError(
                f"{self.shard_dir}: NSP needs at least 2 documents, the shards hold {self.num_documents}"
            )
        shard, start, length, doc, first = self._locate(idx)
        u_split, u_rand, u_other = _uniform(key, 4), _uniform(key, 5), _uniform(key, 6)
        # Split point: a sentence end strictly inside the window if any, else a random token position.
        len_a = np.empty(B, np.int64)
        for s in np.unique(shard):
            sel = np.flatnonzero(shard == s)
            se = self._sent_end[s]
            lo = np.searchsorted(se, start[sel], side="right")
            hi = np.searchsorted(se, start[sel] + length[sel], side="left")
            cnt = hi - lo
            pick = lo + np.minimum((u_split[sel] * cnt).astype(np.int64), np.maximum(cnt - 1, 0))
            at_sentence = se[np.minimum(pick, len(se) - 1)] - start[sel]
            at_token = 1 + (u_split[sel] * np.maximum(length[sel] - 1, 1)).astype(np.int64)
            len_a[sel] = np.where(cnt > 0, at_sentence, np.minimum(at_token, length[sel]))
        is_random = (u_rand < 0.5) | (len_a >= length)  # nothing left for a true B: must be random
        # Partner window uniformly among windows of *other* documents (a document's windows are contiguous).
        n_own = self._doc_windows(doc)
        other = (first + n_own + (u_other * (self.num_samples - n_own)).astype(np.int64)) % self.num_samples
        o_shard, o_start, o_len, _, _ = self._locate(other)

        ids = np.full((B, T), self.pad_id, np.int64)
        tt = np.zeros((B, T), np.int64)
        total = np.empty(B, np.int64)
        for b in range(B):
            s, a, la = int(shard[b]), int(start[b]), int(len_a[b])
            toks = self._tokens[s]
            if is_random[b]:
                nb = min(int(o_len[b]), self.target - la)
                seg_b = self._tokens[int(o_shard[b])][int(o_start[b]) : int(o_start[b]) + nb]
            else:
                nb = int(length[b]) - la
                seg_b = toks[a + la : a + la + nb]
            ids[b, 0] = self.cls_id
            ids[b, 1 : 1 + la] = toks[a : a + la]
            ids[b, 1 + la] = self.sep_id
            ids[b, 2 + la : 2 + la + nb] = seg_b
            ids[b, 2 + la + nb] = self.sep_id
            tt[b, 2 + la : 3 + la + nb] = 1
            total[b] = 3 + la + nb
        attn = np.arange(T)[None, :] < total[:, None]
        return {
            "input_ids": torch.from_numpy(ids),
            "token_type_ids": torch.from_numpy(tt),
            "attention_mask": torch.from_numpy(attn.astype(np.int64)),
            "next_sentence_label": torch.from_numpy(is_random.astype(np.int64)),
        }

    def permutation(self, epoch: int) -> np.ndarray:
        """A deterministic shuffle of [0, num_samples) for (seed, epoch), for samplers that want one."""
        return np.random.default_rng([self.seed, epoch, 0x5EED]).permutation(self.num_samples)
