"""The attention seam: which kernel computes self-attention over a batch of padded or packed rows.

A row either holds one sample, padded at its end (``attention_mask`` 1 then 0), or several samples packed
one after another (``segment_ids``: 1, 2, ... per sample of the row, 0 at the padding), each attending only
to itself. `AttentionMask` describes the batch once per forward; `attend` picks the kernel:

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
    """One forward's attention structure. ``additive`` is what SDPA takes (None: no masking at all);
    ``segments`` ([B, T] ints, 0 = padding) is set for packed rows."""

    additive: torch.Tensor | None
    segments: torch.Tensor | None = None
    _varlen: tuple[torch.Tensor, torch.Tensor, int] | None = field(default=None, repr=False)

    @staticmethod
    def build(attention_mask_BT: torch.Tensor | None, segment_ids_BT: torch.Tensor | None,
              dtype: torch.dtype) -> AttentionMask:
        if segment_ids_BT is not None:
            seg = segment_ids_BT
            # Token i sees token j iff both belong to the same sample; a padding query sees itself only
            # (a row of all -inf would give NaN, and its output is never read).
            same = (seg[:, :, None] == seg[:, None, :]) & (seg[:, None, :] > 0)
            eye = torch.eye(seg.shape[1], dtype=torch.bool, device=seg.device)
            same = same | (eye[None] & (seg[:, :, None] == 0))
            return AttentionMask(same[:, None], seg)
        if attention_mask_BT is None:
            return AttentionMask(None)
        # Additive: 0 where attended, dtype-min where padded (as HF BERT).
        return AttentionMask((1.0 - attention_mask_BT[:, None, None, :].to(dtype)) * torch.finfo(dtype).min)

    @property
    def packed(self) -> bool:
        return self.segments is not None

    def varlen_layout(self) -> tuple[torch.Tensor, torch.Tensor, int]:
        """(flat indices of the real tokens in sample order, cumulative sample lengths [N+1] int32, longest
        sample), computed once per forward and shared by every layer."""
        if self._varlen is None:
            assert self.segments is not None
            seg = self.segments
            B, T = seg.shape
            # A sample's key: row * (T + 1) + segment id; real tokens sorted by it are grouped per sample in
            # row order, and within a sample they stay in position order (a stable sort).
            key = (torch.arange(B, device=seg.device)[:, None] * (T + 1) + seg).flatten()
            real = seg.flatten() > 0
            idx = torch.nonzero(real).flatten()
            idx = idx[torch.sort(key[idx], stable=True).indices]
            _, counts = torch.unique_consecutive(key[idx], return_counts=True)
            cu = F.pad(torch.cumsum(counts, 0), (1, 0)).to(torch.int32)
            self._varlen = (idx, cu, int(counts.max()) if counts.numel() else 0)
        return self._varlen


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
    """Self-attention of ``[B, H, T, d]`` heads under ``mask``; returns ``[B, H, T, d]``. ``dropout_p``: the
    attention dropout of this forward (0 in evaluation)."""
    if mask is not None and mask.packed and varlen_available(q_BHTd, dropout_p):
        return _varlen(q_BHTd, k_BHTd, v_BHTd, mask)
    attn = None if mask is None else mask.additive
    return F.scaled_dot_product_attention(q_BHTd, k_BHTd, v_BHTd, attn_mask=attn, dropout_p=dropout_p)


def _varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: AttentionMask) -> torch.Tensor:
    from torch.nn.attention.varlen import varlen_attn

    B, H, T, d = q.shape
    idx, cu, longest = mask.varlen_layout()

    def tokens(t: torch.Tensor) -> torch.Tensor:  # [B, H, T, d] -> the real tokens [N, H, d]
        return t.transpose(1, 2).reshape(B * T, H, d).index_select(0, idx)

    o_NHd = varlen_attn(tokens(q), tokens(k), tokens(v), cu, cu, longest, longest)
    out = q.new_zeros(B * T, H, d).index_copy(0, idx, o_NHd)  # padding rows: 0 (never read)
    return out.view(B, T, H, d).transpose(1, 2)
