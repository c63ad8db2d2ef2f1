"""A linear-chain CRF with pytorch-crf's parameters and likelihood, for environments without `torchcrf`.

`heads.TokenCRFHead` uses ``torchcrf.CRF`` where it is installed (training in this project). An export is
loaded with plain transformers, where `torchcrf` usually is not: this module stands in for it there, with
the same parameter names (``start_transitions``, ``end_transitions``, ``transitions``, so the saved
weights load) and the same ``forward(emissions, tags, mask, reduction)`` log-likelihood. Decoding never
goes through it: the head runs its own constrained Viterbi.
"""

from __future__ import annotations

import torch
from torch import nn


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
        if self.batch_first:
            emissions, tags, mask = emissions.transpose(0, 1), tags.transpose(0, 1), mask.transpose(0, 1)
        mask = mask.bool()
        T, B = tags.shape
        rows = torch.arange(B, device=tags.device)
        # Score of the gold path.
        gold = self.start_transitions[tags[0]] + emissions[0, rows, tags[0]]
        for i in range(1, T):
            step = self.transitions[tags[i - 1], tags[i]] + emissions[i, rows, tags[i]]
            gold = gold + step * mask[i].to(step.dtype)
        last = tags[mask.long().sum(0) - 1, rows]
        gold = gold + self.end_transitions[last]
        # Log-partition over every path.
        score = self.start_transitions + emissions[0]
        for i in range(1, T):
            nxt = torch.logsumexp(score[:, :, None] + self.transitions + emissions[i][:, None, :], dim=1)
            score = torch.where(mask[i][:, None], nxt, score)
        llh = gold - torch.logsumexp(score + self.end_transitions, dim=1)
        if reduction == "none":
            return llh
        if reduction == "sum":
            return llh.sum()
        if reduction == "mean":
            return llh.mean()
        if reduction == "token_mean":
            return llh.sum() / mask.float().sum()
        raise ValueError(f"invalid reduction: {reduction}")
