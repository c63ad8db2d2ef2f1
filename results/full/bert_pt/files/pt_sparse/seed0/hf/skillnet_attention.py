"""The attention seam: which kernel computes self-attention over a batch of padded or packed rows.

A row either holds one sample, padded at its end (``attention_mask`` 1 then 0), or several samples packed
one after another (``segment_ids``: 1, 2, ... per sample of the row, 0 at the padding), each attending only
to itself. An encoder-decoder packs both sides with the same rows and segment numbers: decoder
self-attention is causal inside a sample, and cross-attention lets the decoder's segment k see the
encoder's segment k only (`AttentionMask.packed_pair`). `AttentionMask` describes one attention of the
batch once per forward; `attend` picks the kernel:

* padded rows: SDPA with the additive key mask ``[B, 1, 1, T]`` (HF BERT's semantics).
* packed rows on the CPU, or wherever the variable-length kernel cannot run: the real tokens gathered
  into one row per sample (``[N, H, L, d]``, in up to MAX_BUCKETS groups of similar length, L each
  group's longest sample), SDPA with a key-padding mask (causal: SDPA's own), and scattered back. It
  computes about sum L_i^2 scores where a block-diagonal mask over the packed rows computes B*T^2, which
  grows with the square of the row; that block mask ``[B, 1, T, T]`` (exact; on CUDA the memory-efficient
  kernel, which takes a mask and dropout and runs on sm70 in fp16) runs instead where the samples' rows
  would not save enough scores to pay for their gathers (a few long samples per row:
  `AttentionMask.per_sample_pays`), and inside a layer compiled by ``--compile``, whose one graph per shape
  family cannot follow the groups of every batch. The choice and its layouts are made on first use and
  shared by every layer of the forward.
* packed rows on CUDA (sm80+, fp16/bf16, no attention dropout in this forward, e.g. evaluation or a config
  with ``attention_probs_dropout_prob=0``): torch's variable-length
  flash kernel over the real tokens only (``torch.nn.attention.varlen``): no FLOP is spent on padding or on
  pairs of tokens of different samples.

The model files call only `AttentionMask.build` and `attend`; no other place in them knows of CUDA.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

# Off: SDPA with a mask everywhere (for A/B measurements and for a kernel that misbehaves on some card).
USE_VARLEN = True
# Off: packed rows without the variable-length kernel always run the block-diagonal mask (A/B measurements).
USE_PER_SAMPLE = True


@dataclass(eq=False)
class AttentionMask:
    """One attention's structure in one forward. ``padding`` is padded rows' additive key mask (None: no
    masking at all); ``segments`` ([B, Tq] ints, 0 = padding) is set for packed rows, with
    ``key_segments`` ([B, Tk]) for cross-attention between two packed sides (None: the keys are the
    queries) and ``causal`` for a decoder's self-attention. Every layout is built on first use and shared
    by every layer of the forward."""

    padding: torch.Tensor | None
    segments: torch.Tensor | None = None
    key_segments: torch.Tensor | None = None
    causal: bool = False
    _block: torch.Tensor | None = field(default=None, repr=False)
    _varlen: tuple[torch.Tensor, torch.Tensor, int] | None = field(default=None, repr=False)
    _varlen_k: tuple[torch.Tensor, torch.Tensor, int] | None = field(default=None, repr=False)
    _samples: list[_SampleBucket] | None = field(default=None, repr=False)
    _per_sample: bool | None = field(default=None, repr=False)

    @staticmethod
    def build(attention_mask_BT: torch.Tensor | None, segment_ids_BT: torch.Tensor | None,
              dtype: torch.dtype) -> AttentionMask:
        if segment_ids_BT is not None:
            return AttentionMask.packed_self(segment_ids_BT)
        if attention_mask_BT is None:
            return AttentionMask(None)
        # Additive: 0 where attended, dtype-min where padded (as HF BERT).
        return AttentionMask((1.0 - attention_mask_BT[:, None, None, :].to(dtype)) * torch.finfo(dtype).min)

    @staticmethod
    def packed_self(segment_ids_BT: torch.Tensor, causal: bool = False) -> AttentionMask:
        """Self-attention inside each sample of packed rows (``causal``: a decoder's, token i sees j <= i)."""
        return AttentionMask(None, segment_ids_BT, causal=causal)

    @staticmethod
    def packed_pair(encoder_segments_BS: torch.Tensor, decoder_segments_BT: torch.Tensor
                    ) -> tuple[AttentionMask, AttentionMask, AttentionMask]:
        """The three attentions of an encoder-decoder over packed rows: (encoder self, decoder causal self,
        cross), where the decoder's sample k of a row reads the encoder's sample k of the same row."""
        cross = AttentionMask(None, decoder_segments_BT, key_segments=encoder_segments_BS)
        return (AttentionMask.packed_self(encoder_segments_BS),
                AttentionMask.packed_self(decoder_segments_BT, causal=True), cross)

    @property
    def packed(self) -> bool:
        return self.segments is not None

    @property
    def additive(self) -> torch.Tensor | None:
        """What SDPA takes over the rows as they are: padded rows' key mask, or packed rows' block-diagonal
        boolean mask ``[B, 1, Tq, Tk]``."""
        if self.segments is None:
            return self.padding
        if self._block is None:
            self._block = self.block_mask()
        return self._block

    def block_mask(self) -> torch.Tensor:
        """Packed rows' block-diagonal boolean mask ``[B, 1, Tq, Tk]``, computed afresh."""
        assert self.segments is not None
        keys = self.segments if self.key_segments is None else self.key_segments
        return _block_mask(self.segments, keys, self.causal)[:, None]

    @property
    def per_sample(self) -> bool:
        """Whether packed rows off the variable-length kernel attend on the samples' own rows rather than
        through the block mask: decided on first use, once per forward (never where the varlen kernel runs,
        nor inside a compiled layer, which computes the block mask in its graph)."""
        if self._per_sample is None:
            self._per_sample = USE_PER_SAMPLE and self.per_sample_pays()
        return self._per_sample

    def sample_scores(self) -> int:
        """The query-key pairs the samples' own rows compute."""
        return sum(b.rows * b.width * b.key_width for b in self.sample_buckets())

    def sample_buckets(self) -> list[_SampleBucket]:
        """The samples gathered one per row, in buckets of similar size (`_buckets`): the keys' row n of a
        bucket is its queries' sample n."""
        if self._samples is None:
            idx, cu, _ = self.varlen_layout()
            idx_k, cu_k, _ = self.varlen_key_layout()
            self._samples = _buckets(idx, cu, idx_k, cu_k)
        return self._samples

    def per_sample_pays(self) -> bool:
        """Whether the samples' own rows compute few enough attention scores, against the block mask over the
        rows, to pay for their gathers (PER_SAMPLE_MAX_SHARE)."""
        assert self.segments is not None
        keys = self.segments if self.key_segments is None else self.key_segments
        if self.key_segments is not None and not torch.equal(_sample_ids(self.segments, self.varlen_layout()),
                                                             _sample_ids(keys, self.varlen_key_layout())):
            return False  # the n-th query sample is not the n-th key sample: only the block mask pairs them
        return 0 < self.sample_scores() <= PER_SAMPLE_MAX_SHARE * self.segments.numel() * keys.shape[1]

    def varlen_layout(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(flat indices of the real query tokens in sample order, cumulative sample lengths [N+1] int32,
        longest sample), computed once per forward and shared by every layer."""
        if self._varlen is None:
            assert self.segments is not None
            self._varlen = _varlen_layout(self.segments)
        return self._varlen

    def varlen_key_layout(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """As `varlen_layout`, for the keys (the encoder's side of a cross-attention)."""
        if self.key_segments is None:
            return self.varlen_layout()
        if self._varlen_k is None:
            self._varlen_k = _varlen_layout(self.key_segments)
        return self._varlen_k


def _block_mask(q_seg_BT: torch.Tensor, k_seg_BS: torch.Tensor, causal: bool) -> torch.Tensor:
    """[B, T, S] bool: query i sees key j iff both belong to the same sample (and j <= i if ``causal``). A
    padding query sees its own position in self-attention, key 0 in cross-attention: a row of all -inf
    would give NaN, and a padding query's output is never read."""
    same = (q_seg_BT[:, :, None] == k_seg_BS[:, None, :]) & (k_seg_BS[:, None, :] > 0)
    T, S = q_seg_BT.shape[1], k_seg_BS.shape[1]
    if causal:
        same = same & torch.ones(T, S, dtype=torch.bool, device=q_seg_BT.device).tril()[None]
    if q_seg_BT is k_seg_BS:
        own = torch.eye(T, dtype=torch.bool, device=q_seg_BT.device)
    else:
        own = torch.zeros(T, S, dtype=torch.bool, device=q_seg_BT.device)
        own[:, 0] = True
    return same | (own[None] & (q_seg_BT[:, :, None] == 0))


def _varlen_layout(seg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int]:
    B, T = seg.shape
    # A sample's key: row * (T + 1) + segment id; real tokens sorted by it are grouped per sample in row
    # order, and within a sample they stay in position order (a stable sort). Both sides of a packed pair
    # number the same samples alike, so their k-th samples are the same sample.
    key = (torch.arange(B, device=seg.device)[:, None] * (T + 1) + seg).flatten()
    real = seg.flatten() > 0
    idx = torch.nonzero(real).flatten()
    idx = idx[torch.sort(key[idx], stable=True).indices]
    _, counts = torch.unique_consecutive(key[idx], return_counts=True)
    cu = F.pad(torch.cumsum(counts, 0), (1, 0)).to(torch.int32)
    return idx, cu, int(counts.max()) if counts.numel() else 0


# Per-sample attention groups samples whose score counts (query length x key length) lie within this factor
# of each other, in at most MAX_BUCKETS groups (one SDPA call each): in self-attention no sample of a group
# but the last computes more than twice its own scores, where one group padded to the longest would cost
# N * longest^2 (in cross-attention a group's widths are maxima over its samples' two sides, a looser bound).
BUCKET_RATIO = 2.0
MAX_BUCKETS = 4
# The samples' own rows run where they compute at most this share of the block mask's scores: gathering the
# tokens costs time too. BART denoising rows of 128 tokens hold ~1.4 samples and save ~10% of the scores, and
# ran no faster that way (bench/packing.py); rows of fine-tuning's batches save 80-95%.
PER_SAMPLE_MAX_SHARE = 0.75
# How many times a task's longest example a packed row may hold, by the kernel that will run. Positions restart
# at each sample, so no row is bound by the model's positions; off the block mask attention costs each sample's
# own scores, so a longer row costs none more: 16 lets a micro-batch of 16 generation examples fit one or two
# rows (csc + poetry_title real share 90.8% -> 99.4% against 4 times: bench/packing.py). A layer compiled by
# --compile attends through the block mask, whose cost grows with a row's square: 4 there.
PACK_ROW_FACTOR = 16
COMPILED_PACK_ROW_FACTOR = 4


def pack_row_factor(compiled: bool) -> int:
    """How many times its longest example a packed row should hold when its layers are ``compiled``."""
    return COMPILED_PACK_ROW_FACTOR if compiled else PACK_ROW_FACTOR


@dataclass(eq=False)
class _SampleBucket:
    """Some samples of packed rows laid out one per row: queries ``[rows, width]``, keys ``[rows,
    key_width]`` (the longest of the bucket's; each sample left-aligned, then filler). ``gather`` and
    ``gather_k``: for every slot, the flat index (into ``B*T``, ``B*S``) of the token it holds (filler: any
    real token's, masked or never read); ``filled``: the query slots that hold a real token;
    ``tokens``: their flat indices; ``key_mask``: ``[rows, 1, 1, key_width]`` True at the real keys."""

    gather: torch.Tensor
    gather_k: torch.Tensor
    filled: torch.Tensor
    tokens: torch.Tensor
    key_mask: torch.Tensor
    rows: int
    width: int
    key_width: int

    def gathered(self, t_BHSd: torch.Tensor, keys: bool) -> torch.Tensor:
        """``[B, H, S, d]`` -> ``[rows, H, width (key_width), d]``."""
        B, H, S, d = t_BHSd.shape
        at, width = (self.gather_k, self.key_width) if keys else (self.gather, self.width)
        flat = t_BHSd.transpose(1, 2).reshape(B * S, H, d).index_select(0, at)
        return flat.view(self.rows, width, H, d).transpose(1, 2)


def _sample_ids(seg: torch.Tensor, layout: tuple[torch.Tensor, torch.Tensor, int]) -> torch.Tensor:
    """[2, N]: the (row, segment id) of each sample of a `_varlen_layout`, in its order."""
    idx, cu, _ = layout
    first = idx[cu[:-1].long()]
    return torch.stack([first // seg.shape[1], seg.flatten()[first]])


def _slots(idx: torch.Tensor, cu: torch.Tensor, samples: torch.Tensor, counts: torch.Tensor, width: int
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat token index of every slot of ``samples`` laid out one per row ``width`` wide, [n, width] True
    where a slot holds a real token)."""
    j = torch.arange(width, device=idx.device)
    filled = j[None] < counts[samples, None]
    at = (cu[:-1].long()[samples, None] + j[None]).clamp(max=max(idx.numel() - 1, 0))
    return idx[at], filled


def _buckets(idx: torch.Tensor, cu: torch.Tensor, idx_k: torch.Tensor, cu_k: torch.Tensor
             ) -> list[_SampleBucket]:
    n_q, n_k = (cu[1:] - cu[:-1]).long(), (cu_k[1:] - cu_k[:-1]).long()
    if n_q.numel() == 0:
        return []
    counts = torch.stack([n_q, n_k]).cpu()  # one read-back: the groups are planned on the host
    scores = (counts[0] * counts[1]).double()
    group = torch.floor(torch.log(scores.max() / scores) / math.log(BUCKET_RATIO)).clamp(max=MAX_BUCKETS - 1)
    out = []
    for g in torch.unique(group).tolist():
        chosen = torch.nonzero(group == g).flatten()
        width, key_width = int(counts[0, chosen].max()), int(counts[1, chosen].max())
        samples = chosen.to(idx.device)
        gather, filled = _slots(idx, cu, samples, n_q, width)
        gather_k, real_k = _slots(idx_k, cu_k, samples, n_k, key_width)
        slot = torch.nonzero(filled.flatten()).flatten()
        out.append(_SampleBucket(gather.flatten(), gather_k.flatten(), slot, gather.flatten()[slot],
                                 real_k[:, None, None, :], len(samples), width, key_width))
    return out


def varlen_available(q: torch.Tensor, dropout_p: float) -> bool:
    """Whether `attend` can run the variable-length flash kernel for ``q``: CUDA sm80+, fp16/bf16, no
    attention dropout (the kernel has none)."""
    if not (USE_VARLEN and q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and dropout_p == 0.0):
        return False
    try:
        from torch.nn.attention.varlen import varlen_attn  # noqa: F401
    except ImportError:
        return False
    return torch.cuda.get_device_capability(q.device)[0] >= 8


def attend(q_BHTd: torch.Tensor, k_BHTd: torch.Tensor, v_BHTd: torch.Tensor, mask: AttentionMask | None,
           dropout_p: float) -> torch.Tensor:
    """Attention of ``[B, H, T, d]`` queries over ``[B, H, S, d]`` keys and values under ``mask``; returns
    ``[B, H, T, d]``. ``dropout_p``: the attention dropout of this forward (0 in evaluation)."""
    if mask is not None and mask.packed:
        if varlen_available(q_BHTd, dropout_p):
            return _varlen(q_BHTd, k_BHTd, v_BHTd, mask)
        if torch.compiler.is_compiling():
            # Inside a layer compiled by --compile: the block mask, computed in the graph. A graph that read
            # the batch's sample groups (their number and widths change with every batch) would recompile
            # for each; this one compiles once per shape family.
            return F.scaled_dot_product_attention(q_BHTd, k_BHTd, v_BHTd, attn_mask=mask.block_mask(),
                                                  dropout_p=dropout_p)
        if mask.per_sample:
            return _per_sample(q_BHTd, k_BHTd, v_BHTd, mask, dropout_p)
    attn = None if mask is None else mask.additive
    return F.scaled_dot_product_attention(q_BHTd, k_BHTd, v_BHTd, attn_mask=attn, dropout_p=dropout_p)


def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    B, H, T, d = q.shape
    idx, cu, longest = mask.varlen_layout()
    idx_k, cu_k, longest_k = mask.varlen_key_layout()

    def tokens(t: torch.Tensor, at: torch.Tensor) -> torch.Tensor:  # [B, H, S, d] -> the real tokens [N, H, d]
        return t.transpose(1, 2).reshape(B * t.shape[2], H, d).index_select(0, at)

    window = (-1, 0) if mask.causal else (-1, -1)
    o_NHd = varlen_attn(tokens(q, idx), tokens(k, idx_k), tokens(v, idx_k), cu, cu_k, longest, longest_k,
                        window_size=window)
    out = q.new_zeros(B * T, H, d).index_copy(0, idx, o_NHd)  # padding rows: 0 (never read)
    return out.view(B, T, H, d).transpose(1, 2)


def _per_sample(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask, dropout_p: float
                ) -> torch.Tensor:
    """Packed rows' attention computed on the samples' own rows (``AttentionMask.sample_buckets``): each
    sample's queries over its own keys, left-aligned, so a causal mask is SDPA's own (a sample's filler keys
    come after all its real queries) and otherwise the key-padding mask hides the filler."""
    B, H, T, d = q.shape
    buckets = mask.sample_buckets()
    real = []
    for b in buckets:
        o = F.scaled_dot_product_attention(
            b.gathered(q, False), b.gathered(k, True), b.gathered(v, True),
            attn_mask=None if mask.causal else b.key_mask, dropout_p=dropout_p, is_causal=mask.causal)
        real.append(o.transpose(1, 2).reshape(b.rows * b.width, H, d).index_select(0, b.filled))
    tokens = torch.cat([b.tokens for b in buckets])
    out = q.new_zeros(B * T, H, d).index_copy(0, tokens, torch.cat(real))  # padding rows: 0 (never read)
    return out.view(B, T, H, d).transpose(1, 2)
