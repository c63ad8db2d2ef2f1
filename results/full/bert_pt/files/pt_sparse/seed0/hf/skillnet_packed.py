"""The layout of packed rows as one type: what training/packing.py builds and the model reads (defined here, below
both: training/ imports model/). A batch travels as a dict of tensors, the layout in it under its field names (a
decoder side's behind ``decoder_``); the model takes it out once, at its entry (`PackedLayout.take`), and passes
the typed value on: to the embeddings, the attention seam, the pooler, a token gate, the heads, BART's stacks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import MutableMapping
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["PackedLayout"]


@dataclass(frozen=True)
class PackedLayout:
    """One side of a packed batch: R rows of T slots holding B samples, N real tokens in all."""

    # [R, T]: 1, 2, ... for the samples of a row, 0 on padding (attention stays inside one sample)
    segment_ids: torch.Tensor
    # [R, T]: each token's position in its own sample (0 at its first token)
    position_ids: torch.Tensor
    # [N]: flat indices (into R*T) of the real tokens in the samples' order, the order a token gate fills its
    # experts' capacity in (None: the rows' order)
    token_order: torch.Tensor | None = None
    # [B]: flat index of each sample's first token, in the samples' order (an encoder's pooled output)
    cls_positions: torch.Tensor | None = None
    # [B, W]: flat index of token t of sample b, -1 past its length (a head that reads every token reads the
    # samples back one per row)
    unpack_index: torch.Tensor | None = None

    def to_batch(self, prefix: str = "") -> dict[str, torch.Tensor]:
        """The batch entries that carry this layout (its set fields, names behind ``prefix``)."""
        return {prefix + f.name: v for f in dataclasses.fields(self) if (v := getattr(self, f.name)) is not None}

    @classmethod
    def take(cls, batch: MutableMapping[str, Any], prefix: str = "") -> PackedLayout | None:
        """The layout a batch carries, removed from it; None for padded rows (no ``segment_ids``)."""
        found = {f.name: batch.pop(prefix + f.name) for f in dataclasses.fields(cls) if prefix + f.name in batch}
        if found.get("segment_ids") is None:
            return None
        if found.get("position_ids") is None:
            raise ValueError(f"packed rows need {prefix}position_ids beside {prefix}segment_ids: pack with "
                             "training.packing")
        return cls(**found)
