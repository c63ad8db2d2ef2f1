"""What the trainer consumes: one `Batch` per micro-step from a `BatchSource`."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

__all__ = ["Batch", "BatchSource"]


@dataclass
class Batch:
    """One micro-batch for this rank.

    ``task`` selects the objective / fine-tuning task (and through the model config its skills);
    it must be the same on every rank for the same micro-step (ZeRO-2 aborts otherwise).
    ``tensors`` are passed as keyword arguments: ``model(task=batch.task, **batch.tensors)``.
    ``decoder``: the batch has a decoder side (an encoder-decoder's), whose tokens are its ``labels`` that
    are not -100 and whose slots are the ``labels``' size; tokens/s and the real share count both sides.
    """

    task: str
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    decoder: bool = False

    def to(self, device: torch.device | str) -> Batch:
        return Batch(self.task, {k: v.to(device, non_blocking=True) for k, v in self.tensors.items()},
                     self.decoder)

    def num_tokens(self) -> int:
        """Non-padding tokens, for tokens/s (falls back to the size of ``input_ids``). Counted on the host
        copy a source builds, so that the count never waits for the device."""
        mask = self.tensors.get("attention_mask")
        if mask is not None:
            n = _count(mask)
        else:
            ids = self.tensors.get("input_ids")
            n = int(ids.numel()) if ids is not None else 0
        labels = self.tensors.get("labels")
        return n + (_count(labels != -100) if self.decoder and labels is not None else 0)

    def num_slots(self) -> int:
        """Token slots of the rows, padding included (what the model computes over), for the real share."""
        ids = self.tensors.get("input_ids")
        if ids is None:
            ids = self.tensors.get("attention_mask")
        n = int(ids.numel()) if ids is not None else 0
        labels = self.tensors.get("labels")
        return n + (int(labels.numel()) if self.decoder and labels is not None else 0)


def _count(mask: torch.Tensor) -> int:
    if mask.device.type == "cpu":
        return int(mask.numpy().sum())
    return int(mask.sum().item())


@runtime_checkable
class BatchSource(Protocol):
    """An endless iterator of this rank's micro-batches, resumable at the exact position.

    The trainer calls ``next(source)`` ``gradient_accumulation_steps`` times per optimizer step.
    ``state_dict()`` taken after step N and given to ``load_state_dict`` on a fresh source must make
    the next ``next()`` return exactly the batch the uninterrupted run would have produced.
    Sources are rank-aware (they receive rank / world size when built) and the task choice must be
    a pure function of (seed, step), so that it is identical on all ranks by construction.

    A source that continues its data order on another number of ranks (keeping the global batch) sets the
    attribute ``resumes_on_any_world_size = True``; the trainer refuses such a resume for any other source.
    """

    def __iter__(self) -> Iterator[Batch]: ...

    def __next__(self) -> Batch: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...
