"""A linear-chain CRF likelihood with pytorch-crf's parameters and semantics, in O(log T) sequential steps.

pytorch-crf's ``CRF.forward`` walks the sentence one position at a time, twice (the gold path's score and
the forward algorithm), in a Python loop of small ops over the batch's longest row. On CPU that loop costs
as much as a few encoder layers of a small model, and it does not shrink when packed rows shrink the
encoder's work. `crf_log_likelihood` gives the same log-likelihood (a test holds it to pytorch-crf's) with
the gold score as one gather and the log-partition as a tree product of the per-step transition matrices in
the log semiring: log2(T) batched steps instead of T.

`CRF` holds pytorch-crf's parameters under its names (``start_transitions``, ``end_transitions``,
``transitions``, drawn in its order) so that saved weights load either way; an export loaded with plain
transformers, where `torchcrf` usually is not installed, uses it. Decoding never goes through it: the head
runs its own constrained Viterbi.
"""

from __future__ import annotations

import torch
from torch import nn

# The log semiring's "zero" where a step is masked out (the identity matrix's off-diagonal): a finite
# stand-in for log 0, so no intermediate is ever -inf and no backward can meet inf - inf, whatever a torch
# version's logsumexp does with rows of only -inf. exp() of it is exactly 0 beside any real path score, and
# its sums over the tree's levels (at most T of it) stay far inside fp32's range.
_ZERO = -1e9

# A memory bound, not a speed one: elements of the tree's first [B, T/2, L, L, L] level above which the
# sequential forward algorithm runs instead. 2^24 fp32 elements is 64 MB for that level; the backward keeps
# every level's input (about twice the first) and logsumexp makes temporaries of the same size, so the peak
# is 3-4 times that. The tree does L times the loop's arithmetic in log2(T) steps instead of T: on CPU it
# wins for NER-sized tag sets (7 tags: 5.3 ms against 12.5 ms at 8 x 128 words), not for hundreds of tags.
TREE_MAX_ELEMENTS = 1 << 24


def _log_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``out[..., i, j] = logsumexp_k a[..., i, k] + b[..., k, j]``."""
    return torch.logsumexp(a[..., :, :, None] + b[..., None, :, :], dim=-2)


def _log_partition_tree(alpha_BL: torch.Tensor, step_BSLL: torch.Tensor) -> torch.Tensor:
    """``alpha`` times the product of the step matrices, reduced pairwise (log2(S) batched steps)."""
    m = step_BSLL
    while m.shape[1] > 1:
        if m.shape[1] % 2:
            eye = torch.full_like(m[:, :1], _ZERO)
            eye.diagonal(dim1=-2, dim2=-1).zero_()
            m = torch.cat([m, eye], 1)
        m = _log_matmul(m[:, 0::2], m[:, 1::2])
    return torch.logsumexp(alpha_BL[:, :, None] + m[:, 0], dim=1)


def _log_partition_loop(alpha_BL: torch.Tensor, step_BSLL: torch.Tensor) -> torch.Tensor:
    for s in range(step_BSLL.shape[1]):
        alpha_BL = torch.logsumexp(alpha_BL[:, :, None] + step_BSLL[:, s], dim=1)
    return alpha_BL


def crf_log_likelihood(emissions_BTL: torch.Tensor, tags_BT: torch.Tensor, mask_BT: torch.Tensor,
                       start_transitions: torch.Tensor, transitions: torch.Tensor, end_transitions: torch.Tensor,
                       reduction: str = "sum") -> torch.Tensor:
    """pytorch-crf's ``CRF(batch_first=True).forward(emissions, tags, mask, reduction)``, in fp32 (float64
    inputs stay float64).

    ``mask_BT`` is a prefix mask whose first position is on in every row (not checked here, on the hot path:
    `CRF.forward` checks it, the NER head builds it); ``transitions[from, to]``.
    Reductions as pytorch-crf's: ``none``, ``sum``, ``mean`` (over rows), ``token_mean`` (over masked-in
    positions)."""
    if reduction not in ("none", "sum", "mean", "token_mean"):
        raise ValueError(f"invalid reduction: {reduction}")
    mask_BT = mask_BT.bool()
    n_B = mask_BT.sum(1)
    T = int(n_B.max())  # with prefix masks, positions past the longest row's end change nothing
    dt = torch.promote_types(emissions_BTL.dtype, torch.float32)  # fp16/bf16 scored in fp32, float64 kept
    em = emissions_BTL[:, :T].to(dt)
    tags, mask = tags_BT[:, :T], mask_BT[:, :T]
    start, trans, end = start_transitions.to(dt), transitions.to(dt), end_transitions.to(dt)
    B, _, L = em.shape
    rows = torch.arange(B, device=em.device)
    # The gold path's score: its emissions, its moves between kept positions, its start and its end.
    on = mask.to(em.dtype)
    gold = (em.gather(2, tags[..., None]).squeeze(2) * on).sum(1)
    gold = gold + (trans[tags[:, :-1], tags[:, 1:]] * on[:, 1:]).sum(1)
    gold = gold + start[tags[:, 0]] + end[tags[rows, n_B - 1]]
    # Step t's matrix [from, to]: move then emit; a masked-out step is the identity.
    eye = torch.full((L, L), _ZERO, device=em.device, dtype=dt).fill_diagonal_(0.0)
    step = torch.where(mask[:, 1:, None, None], trans + em[:, 1:, None, :], eye)
    alpha = start + em[:, 0]
    if T == 1:
        final = alpha
    elif B * (T // 2) * L ** 3 <= TREE_MAX_ELEMENTS:
        final = _log_partition_tree(alpha, step)
    else:
        final = _log_partition_loop(alpha, step)
    llh = gold - torch.logsumexp(final + end, dim=1)
    if reduction == "none":
        return llh
    if reduction == "sum":
        return llh.sum()
    if reduction == "mean":
        return llh.mean()
    return llh.sum() / on.sum()


class CRF(nn.Module):
    def __init__(self, num_tags: int, batch_first: bool = False) -> None:
        super().__init__()
        if num_tags <= 0:
            raise ValueError(f"invalid number of tags: {num_tags}")
        self.num_tags = num_tags
        self.batch_first = batch_first
        self.start_transitions = nn.Parameter(torch.empty(num_tags).uniform_(-0.1, 0.1))
        self.end_transitions = nn.Parameter(torch.empty(num_tags).uniform_(-0.1, 0.1))
        self.transitions = nn.Parameter(torch.empty(num_tags, num_tags).uniform_(-0.1, 0.1))

    def forward(self, emissions: torch.Tensor, tags: torch.Tensor, mask: torch.Tensor | None = None,
                reduction: str = "sum") -> torch.Tensor:
        """Log-likelihood of `tags`; `mask` is a prefix mask whose first step is on in every row."""
        if mask is None:
            mask = torch.ones_like(tags, dtype=torch.bool)
        if not self.batch_first:
            emissions, tags, mask = emissions.transpose(0, 1), tags.transpose(0, 1), mask.transpose(0, 1)
        mask = mask.bool()
        # pytorch-crf's own checks: the likelihood is only defined for prefix masks
        if not mask[:, 0].all():
            raise ValueError("mask of the first timestep must all be on")
        if (mask[:, 1:] & ~mask[:, :-1]).any():
            raise ValueError("mask must be a prefix mask: no position on after one that is off")
        return crf_log_likelihood(emissions, tags, mask, self.start_transitions, self.transitions,
                                  self.end_transitions, reduction)
