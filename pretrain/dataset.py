"""BERT pre-training samples (MLM / NSP) read from `data_prep` shards through `numpy.memmap`.

Sample i of an epoch is anchored at window i: every document is cut into consecutive windows of
`max_seq_len - 3` tokens (the last one shorter), so the number of samples is known without a pass over
the data and sample i is a pure function of the shards.

Randomness (target lengths, split points, partners, MLM positions and replacements) comes from a
counter-based hash of (seed, epoch, objective, index, position), evaluated for the whole batch in numpy:
no RNG state, so any rank can build any sample and training resumes at an exact position.

    mlm: [CLS] window [SEP]      labels = original id at masked positions, -100 elsewhere
    nsp: [CLS] A [SEP] B [SEP]   built as BERT's create_pretraining_data does, so that nothing but the
                                 content tells a true next B from a random one:
      1. target length T = max_seq_len - 3, or with probability `short_seq_prob` uniform in [2, T];
      2. split point p = a sentence boundary inside a document (drawn among those in window i);
      3. A = whole sentences ending at p (at least one), within a drawn share of T;
      4. B starts at a sentence boundary and fills T - len(A) tokens or stops at its document's end:
         at p in the same document (label 0) or, with probability 1/2, at a split point of another
         document drawn the same way as p (label 1).
    Both kinds of B therefore start at a sentence boundary and take their length from the same rule.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from skillnet.data_prep.shards import (
    ShardError,
    check_index,
    check_token_ids,
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


def _sample_keys(seed: int, epoch: int, objective_id: int, idx: np.ndarray) -> np.ndarray:
    """[B] uint64 keys of samples `idx`: a pure function of (seed, epoch, objective, index)."""
    key = _mix(_mix(_mix(np.full(len(idx), seed, np.uint64) + _GOLD) ^ np.uint64(epoch)) ^ np.uint64(objective_id))
    return _mix(key ^ idx.astype(np.uint64))


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
        short_seq_prob: float = 0.1,
        expected_fingerprint: str | None = None,
        verify: str = "full",
    ) -> None:
        if max_seq_len < 8:
            raise ValueError(f"max_seq_len={max_seq_len} is too small (need >= 8)")
        if not 0.0 < mlm_probability < 1.0:
            raise ValueError(f"mlm_probability={mlm_probability} must be in (0, 1)")
        if not 0.0 <= short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob={short_seq_prob} must be in [0, 1]")
        if verify not in ("full", "size", "none"):
            raise ValueError(f"verify={verify!r}: use 'full' (sha256), 'size' or 'none'")
        self.shard_dir = Path(shard_dir)
        self.max_seq_len, self.seed = max_seq_len, seed
        self.mlm_probability, self.whole_word_mask = mlm_probability, whole_word_mask
        self.short_seq_prob = short_seq_prob
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
        self._doc_start: list[np.ndarray] = []
        self._doc_len: list[np.ndarray] = []
        self._chunk_cum: list[np.ndarray] = []  # per shard: cumulative windows per document, [n_docs + 1]
        self._word_start: list[np.ndarray | None] = []
        sent_ends: list[np.ndarray] = []  # per shard, in corpus-wide token positions
        doc_sent_ends: list[
            np.ndarray
        ] = []  # per shard, corpus-wide index of each document's last sentence + 1
        shard_chunks, shard_docs, shard_tokens, shard_sents = [0], [0], [0], [0]
        for rec in m["shards"]:
            if verify != "none":
                verify_shard(self.shard_dir, rec, verify, tk)
            idx_path = self.shard_dir / f"{rec['name']}.idx"
            sent_end, doc_end = read_idx(idx_path, rec)
            if verify == "size":  # "full" checked it; here it costs little: the index is read anyway
                check_index(idx_path, sent_end, doc_end, int(rec["num_tokens"]))
            sent_end = np.asarray(sent_end, dtype=np.int64)
            doc_end = np.asarray(doc_end, dtype=np.int64)
            doc_tok_end = sent_end[doc_end - 1] if len(doc_end) else np.zeros(0, np.int64)
            doc_start = np.concatenate([[0], doc_tok_end[:-1]]).astype(np.int64)
            doc_len = doc_tok_end - doc_start
            n_chunks = -(-doc_len // self.target)
            self._tokens.append(open_tokens(self.shard_dir, rec, dtype))
            self._doc_start.append(doc_start)
            self._doc_len.append(doc_len)
            self._chunk_cum.append(np.concatenate([[0], np.cumsum(n_chunks)]).astype(np.int64))
            self._word_start.append(read_word_starts(self.shard_dir, rec) if whole_word_mask else None)
            sent_ends.append(sent_end + shard_tokens[-1])
            doc_sent_ends.append(doc_end + shard_sents[-1])
            shard_chunks.append(shard_chunks[-1] + int(n_chunks.sum()))
            shard_docs.append(shard_docs[-1] + len(doc_len))
            shard_tokens.append(shard_tokens[-1] + int(rec["num_tokens"]))
            shard_sents.append(shard_sents[-1] + len(sent_end))
        self._shard_chunk_cum = np.asarray(shard_chunks, dtype=np.int64)
        self._shard_doc_cum = np.asarray(shard_docs, dtype=np.int64)
        self._shard_tok_cum = np.asarray(shard_tokens, dtype=np.int64)
        self.num_samples = int(self._shard_chunk_cum[-1])
        self.num_documents = int(self._shard_doc_cum[-1])
        self._index_documents(sent_ends, doc_sent_ends)
        self._cont_tbl: np.ndarray | None = None
        if whole_word_mask and any(w is None for w in self._word_start):
            self._cont_tbl = self._continuation_table()

    def _index_documents(self, sent_ends: list[np.ndarray], doc_sent_ends: list[np.ndarray]) -> None:
        """Corpus-wide sentence ends and per-document arrays for building NSP pairs.

        Only the sentence ends are per sentence (as before); everything else is per document. A split
        point is a sentence end strictly inside a document: where an A may end and a B may start.
        """
        empty = np.zeros(0, np.int64)
        self._sent_end = np.concatenate(sent_ends) if sent_ends else empty
        doc_sent_end = np.concatenate(doc_sent_ends) if doc_sent_ends else empty
        self._doc_first_sent = np.concatenate([[0], doc_sent_end[:-1]]).astype(np.int64)
        self._doc_end = self._sent_end[doc_sent_end - 1] if len(doc_sent_end) else empty
        self._doc_begin = np.concatenate([[0], self._doc_end[:-1]]).astype(np.int64)
        windows = [cum[:-1] + off for cum, off in zip(self._chunk_cum, self._shard_chunk_cum)]
        self._doc_first_window = np.concatenate(windows) if windows else empty
        self._doc_windows = np.diff(np.append(self._doc_first_window, self.num_samples))
        # Documents of two or more sentences can give a true next B; for each document the next such
        # one (wrapping around) is where a window without a split point takes its split point.
        nsp_docs = np.flatnonzero(doc_sent_end - self._doc_first_sent >= 2)
        self.num_nsp_documents = len(nsp_docs)
        nxt = np.searchsorted(nsp_docs, np.arange(self.num_documents), side="right")
        self._next_nsp_doc = nsp_docs[nxt % len(nsp_docs)] if len(nsp_docs) else empty

    def check_objective(self, objective: str) -> None:
        """Raise ValueError (one line naming the shards) if the corpus cannot give samples for objective."""
        if objective == "nsp" and self.num_nsp_documents < 2:
            raise ValueError(
                f"{self.shard_dir}: NSP needs at least 2 documents of 2 or more sentences (sentences end at "
                f"。！？!?.…), the shards hold {self.num_nsp_documents} of {self.num_documents}; "
                f"train MLM only (--objectives mlm) or add documents"
            )

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

    # ---- batches ------------------------------------------------------------------------------------------
    def batch(self, indices: Sequence[int], epoch: int, objective: str) -> dict[str, torch.Tensor]:
        if objective not in _OBJECTIVES:
            raise ValueError(f"objective {objective!r}: expected one of {sorted(_OBJECTIVES)}")
        idx = np.asarray(indices, dtype=np.int64).reshape(-1)
        key = _sample_keys(self.seed, epoch, _OBJECTIVES[objective], idx)
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
        self._check_ids(ids, lambda b, t: int(self._shard_tok_cum[shard[b]] + start[b]) + t - 1)
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

    def _check_ids(self, ids_BT: np.ndarray, corpus_pos: Callable[[int, int], int]) -> None:
        """One max per batch: a token id >= vocab_size (a shard edited after it was verified, or read
        with verify="size"/"none") is a ShardError naming the shard, not an IndexError in the embedding."""
        if ids_BT.size == 0 or int(ids_BT.max()) < self.vocab_size:
            return
        b, t = (int(x) for x in np.argwhere(ids_BT >= self.vocab_size)[0])
        s = int(np.searchsorted(self._shard_tok_cum, corpus_pos(b, t), side="right")) - 1
        path = self.shard_dir / f"{self.manifest['shards'][s]['name']}.bin"
        check_token_ids(path, int(ids_BT.max()), self.vocab_size, self.manifest["tokenizer"]["dtype"])
        raise ShardError(f"{path}: token id {int(ids_BT[b, t])} >= vocab size {self.vocab_size}")

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

    def _split_point(
        self, doc: np.ndarray, start: np.ndarray, length: np.ndarray, u: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(index into _sent_end, document) of a split point drawn uniformly among those of `doc` in the
        window (start, start + length]; a window without one takes the next split point of the corpus."""
        end = start + length
        lo = np.searchsorted(self._sent_end, start, side="right")
        hi = np.searchsorted(self._sent_end, end, side="right")
        cnt = hi - lo - (end == self._doc_end[doc])  # a document's end is no split point
        pick = lo + np.minimum((u * cnt).astype(np.int64), np.maximum(cnt - 1, 0))
        # Fallback: the end of the sentence running past the window if it lies inside the document,
        # else the end of the first sentence of the next document that has two or more sentences.
        after = np.minimum(hi, len(self._sent_end) - 1)
        in_doc = (hi < len(self._sent_end)) & (self._sent_end[after] < self._doc_end[doc])
        nxt = self._next_nsp_doc[doc]
        fallback = np.where(in_doc, after, self._doc_first_sent[nxt])
        return np.where(cnt > 0, pick, fallback), np.where((cnt > 0) | in_doc, doc, nxt)

    def _sentence_start_at_or_after(self, pos: np.ndarray) -> np.ndarray:
        """First sentence start >= pos (pos must not exceed the start of the corpus' last sentence)."""
        return np.where(pos <= 0, 0, self._sent_end[np.searchsorted(self._sent_end, pos, side="left")])

    def _read(self, start: int, n: int) -> np.ndarray:
        """Tokens [start, start+n) in corpus-wide positions (a segment never spans two shards)."""
        s = int(np.searchsorted(self._shard_tok_cum, start, side="right")) - 1
        a = start - int(self._shard_tok_cum[s])
        return self._tokens[s][a : a + n]

    def _nsp(self, idx: np.ndarray, key: np.ndarray) -> dict[str, torch.Tensor]:
        B, T = len(idx), self.max_seq_len
        self.check_objective("nsp")
        shard, start, length, doc, _ = self._locate(idx)
        u = {k: _uniform(key, k) for k in range(4, 11)}
        # 1. Target length of A + B: the full budget or, with short_seq_prob, uniform in [2, budget].
        short = u[4] < self.short_seq_prob
        target = np.where(short, 2 + (u[5] * (self.target - 1)).astype(np.int64), self.target)
        # 2. Split point p (end of A), drawn among the sentence boundaries in window i.
        k, doc = self._split_point(doc, self._shard_tok_cum[shard] + start, length, u[6])
        p = self._sent_end[k]
        # 3. A: the sentence ending at p plus the whole sentences before it that fit a drawn share of the
        #    target, not before the document start; only its last target - 1 tokens if longer.
        sentence_start = np.where(k > 0, self._sent_end[np.maximum(k - 1, 0)], 0)
        share = 1 + (u[7] * (target - 1)).astype(np.int64)
        bound = np.maximum(self._doc_begin[doc], p - share)
        a0 = np.minimum(self._sentence_start_at_or_after(bound), sentence_start)
        a0 = np.maximum(a0, p - (target - 1))
        len_a = p - a0
        # 4. B starts at a split point and fills the rest of the target or stops at its document's end:
        #    at p (true next) or, with probability 1/2, at a split point of another document drawn the
        #    same way as p, from a window of that document (random next).
        is_random = u[8] < 0.5
        n_own = self._doc_windows[doc]
        other = (
            self._doc_first_window[doc] + n_own + (u[9] * (self.num_samples - n_own)).astype(np.int64)
        ) % self.num_samples
        o_shard, o_start, o_len, o_doc, _ = self._locate(other)
        ko, o_doc = self._split_point(o_doc, self._shard_tok_cum[o_shard] + o_start, o_len, u[10])
        same = o_doc == doc  # only when the partner window had no split point and fell back to ours
        o_doc = np.where(same, self._next_nsp_doc[doc], o_doc)
        ko = np.where(same, self._doc_first_sent[o_doc], ko)
        b0 = np.where(is_random, self._sent_end[ko], p)
        b_doc = np.where(is_random, o_doc, doc)
        len_b = np.minimum(target - len_a, self._doc_end[b_doc] - b0)

        ids = np.full((B, T), self.pad_id, np.int64)
        tt = np.zeros((B, T), np.int64)
        for b in range(B):
            la, lb = int(len_a[b]), int(len_b[b])
            ids[b, 0] = self.cls_id
            ids[b, 1 : 1 + la] = self._read(int(a0[b]), la)
            ids[b, 1 + la] = self.sep_id
            ids[b, 2 + la : 2 + la + lb] = self._read(int(b0[b]), lb)
            ids[b, 2 + la + lb] = self.sep_id
            tt[b, 2 + la : 3 + la + lb] = 1
        self._check_ids(
            ids, lambda b, t: int(a0[b]) + t - 1 if t <= len_a[b] else int(b0[b]) + t - 2 - int(len_a[b])
        )
        attn = np.arange(T)[None, :] < (3 + len_a + len_b)[:, None]
        return {
            "input_ids": torch.from_numpy(ids),
            "token_type_ids": torch.from_numpy(tt),
            "attention_mask": torch.from_numpy(attn.astype(np.int64)),
            "next_sentence_label": torch.from_numpy(is_random.astype(np.int64)),
        }

    def permutation(self, epoch: int) -> np.ndarray:
        """A deterministic shuffle of [0, num_samples) for (seed, epoch), for samplers that want one."""
        return np.random.default_rng([self.seed, epoch, 0x5EED]).permutation(self.num_samples)
