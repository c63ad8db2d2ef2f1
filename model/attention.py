"""The attention seam: which kernel computes self-attention over a batch of padded or packed rows.

A row either holds one sample, padded at its end (``attention_mask`` 1 then 0), or several samples packed
one after another (``segment_ids``: 1, 2, ... per sample of the row, 0 at the padding), each attending only
to itself. An encoder-decoder packs both sides with the same rows and segment numbers: decoder
self-attention is causal inside a sample, and cross-attention lets the decoder's segment k see the
encoder's segment k only (`AttentionMask.packed_pair`). `AttentionMask` describes one attention of the
batch once per forward; `attend` picks the kernel:

* padded rows: SDPA with the additive key mask ``[B, 1, 1, T]`` (HF BERT's semantics).
* packed rows on the CPU, or wherever the variable-length kernel cannot run: SDPA with a block-diagonal
  boolean mask ``[B, 1, T, T]`` (exact; on CUDA it is the memory-efficient kernel, which takes a mask and
  dropout and runs on sm70 in fp16).
* packed rows on CUDA (sm80+, fp16/bf16, no attention dropout in this forward, e.g. evaluation or a config
  with ``attention_probs_dropout_prob=0``): torch's variable-length
  flash kernel over the real tokens only (``torch.nn.attention.varlen``): no FLOP is spent on padding or on
  pairs of tokens of different samples.

The model files call only `AttentionMask.build` and `attend`; no other place in them knows of CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

# Off: SDPA with a mask everywhere (for A/B measurements and for a kernel that misbehaves on some card).
USE_VARLEN = True


@dataclass(eq=False)
class AttentionMask:
    """One attention's structure in one forward. ``additive`` is what SDPA takes (None: no masking at all);
    ``segments`` ([B, Tq] ints, 0 = padding) is set for packed rows, with ``key_segments`` ([B, Tk]) for
    cross-attention between two packed sides (None: the keys are the queries) and ``causal`` for a
    decoder's self-attention."""

    additive: torch.Tensor | None
    segments: torch.Tensor | None = None
    key_segments: torch.Tensor | None = None
    causal: bool = False
    _varlen: tuple[torch.Tensor, torch.Tensor, int] | None = field(default=None, repr=False)
    _varlen_k: tuple[torch.Tensor, torch.Tensor, int] | None = field(default=None, repr=False)

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
        return AttentionMask(_block_mask(segment_ids_BT, segment_ids_BT, causal)[:, None], segment_ids_BT,
                             causal=causal)

    @staticmethod
    def packed_pair(encoder_segments_BS: torch.Tensor, decoder_segments_BT: torch.Tensor
                    ) -> tuple[AttentionMask, AttentionMask, AttentionMask]:
        """The three attentions of an encoder-decoder over packed rows: (encoder self, decoder causal self,
        cross), where the decoder's sample k of a row reads the encoder's sample k of the same row."""
        cross = AttentionMask(_block_mask(decoder_segments_BT, encoder_segments_BS, False)[:, None],
                              decoder_segments_BT, key_segments=encoder_segments_BS)
        return (AttentionMask.packed_self(encoder_segments_BS),
                AttentionMask.packed_self(decoder_segments_BT, causal=True), cross)

    @property
    def packed(self) -> bool:
        return self.segments is not None

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
    if mask is not None and mask.packed and varlen_available(q_BHTd, dropout_p):
        return _varlen(q_BHTd, k_BHTd, v_BHTd, mask)
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
