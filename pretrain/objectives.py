"""Which objective a step trains, and which samples each rank reads: both pure functions of the step.

SkillNet-NLU §3.5: MLM activates {s2, s7}, NSP activates {s1, s3, s7}; the two are sampled with equal
chance and the objective is the sum of both losses. Every rank must train the same objective in the
same step (ZeRO-2 aborts when ranks activate different skills), so the draw is a pure function
``(seed, step) -> objective`` with no state that could drift between ranks.
"""

from __future__ import annotations

import hashlib
import itertools
import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np
import torch
from skillnet.training.batch import Batch
from skillnet.training.packing import pack_where_it_pays

__all__ = ["ObjectiveSampler", "PretrainBatchSource", "PretrainingDatasetLike"]

MODES = ("sample", "both")


def _uniform(seed: int, step: int) -> float:
    """A uniform draw in [0, 1) from (seed, step) alone: identical on every rank and every run."""
    h = hashlib.blake2b(struct.pack("<qq", seed, step), digest_size=8).digest()
    return (int.from_bytes(h, "little") >> 11) / float(1 << 53)


@dataclass
class ObjectiveSampler:
    """``choice(step, micro)`` -> objective name.

    mode "sample" (paper): one objective per optimizer step, drawn with probabilities ``weights``
    (equal by default). mode "both": every optimizer step accumulates one micro-batch of each objective
    (micro-batch k trains ``objectives[k % n]``), so every step optimises the sum of the losses.
    """

    seed: int = 0
    objectives: tuple[str, ...] = ("mlm", "nsp")
    weights: tuple[float, ...] | None = None
    mode: str = "sample"

    def __post_init__(self) -> None:
        self.objectives = tuple(self.objectives)
        if self.mode not in MODES:
            raise ValueError(f"objective mode must be one of {MODES}, got {self.mode!r}")
        if self.weights is not None:
            self.weights = tuple(float(w) for w in self.weights)
            if (
                len(self.weights) != len(self.objectives)
                or any(w < 0 for w in self.weights)
                or sum(self.weights) <= 0
            ):
                raise ValueError(f"weights {self.weights} do not fit objectives {self.objectives}")

    def choice(self, step: int, micro: int = 0) -> str:
        if self.mode == "both":
            return self.objectives[micro % len(self.objectives)]
        w = self.weights or (1.0,) * len(self.objectives)
        u = _uniform(self.seed, step) * sum(w)
        acc = 0.0
        for name, wi in zip(self.objectives, w):
            acc += wi
            if u < acc:
                return name
        return self.objectives[-1]

    def state_dict(self) -> dict[str, Any]:
        return asdict(self)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Nothing evolves (the draw is pure); restoring the settings keeps a resumed run on the same draws.
        self.seed = int(state["seed"])
        self.objectives = tuple(state["objectives"])
        self.weights = None if state.get("weights") is None else tuple(state["weights"])
        self.mode = state.get("mode", "sample")


class PretrainingDatasetLike(Protocol):
    num_samples: int
    pad_id: int

    def batch(self, indices: Sequence[int], epoch: int, objective: str) -> dict[str, Any]: ...


class PretrainBatchSource:
    """Endless MLM/NSP micro-batches for one rank; resumable at the exact position.

    Global sample positions are laid out per optimizer step: step s reads positions
    ``[s*G, (s+1)*G)`` of its epoch's permutation, G = micro x accum x world; inside a step, micro-batch k
    of rank r reads ``k*world*micro + r*micro + [0, micro)``. An epoch is ``num_samples // G`` steps
    (the remainder is dropped, so a batch never straddles two epochs); each epoch uses a fresh
    permutation seeded by (seed, epoch). State = the number of micro-batches consumed.

    ``workers`` > 0 builds the batches ahead in that many processes (a torch DataLoader over micro-batch
    numbers, ``prefetch`` batches queued per worker, in pinned memory with ``pin_memory``), so the GPU
    never waits for the host. A batch is a pure function of its number, so the batches, their order and
    the resumable state are those of ``workers=0``; a prefetched batch the run never took is not counted.

    ``packing`` puts the micro-batch's samples into as few rows as fit (training/packing.py): the same
    samples, in fewer rows, each attending only to itself. It changes rows, not samples, so the data order,
    the state and a resume on another number of ranks are those of unpacked batches.
    """

    def __init__(
        self,
        dataset: PretrainingDatasetLike,
        sampler: ObjectiveSampler,
        micro_batch_size: int,
        grad_accum: int,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        workers: int = 0,
        prefetch: int = 4,
        pin_memory: bool = False,
        packing: bool = False,
    ) -> None:
        if workers < 0 or prefetch < 1:
            raise ValueError(f"workers must be >= 0 and prefetch >= 1, got {workers} and {prefetch}")
        self.dataset = dataset
        self.sampler = sampler
        self.micro_batch_size = micro_batch_size
        self.grad_accum = grad_accum
        self.rank = rank
        self.world_size = world_size
        self.seed = seed
        self.global_batch = micro_batch_size * grad_accum * world_size
        n = int(dataset.num_samples)
        if n < self.global_batch:
            raise ValueError(
                f"the corpus has {n} samples, fewer than one global batch ({micro_batch_size} micro x "
                f"{grad_accum} accum x {world_size} ranks = {self.global_batch}); build more shards or shrink the batch"
            )
        if sampler.mode == "both" and grad_accum % len(sampler.objectives):
            raise ValueError(
                f"objective mode 'both' needs grad_accum to be a multiple of {len(sampler.objectives)} "
                f"(one micro-batch per objective), got {grad_accum}; a run resumed on another number of ranks "
                f"re-derives it from the global batch: pick --micro-batch-size so that global batch / "
                f"(micro-batch x ranks) is such a multiple"
            )
        self.steps_per_epoch = n // self.global_batch
        self.micro = 0
        # Step s reads the same samples for any split of the global batch (see load_state_dict), so a run
        # may resume on another number of ranks (training/reshard.py).
        self.resumes_on_any_world_size = True
        # Called with (step, micro index in step, epoch, dataset indices) before each batch: a sample audit.
        self.on_batch: Callable[[int, int, int, list[int]], None] | None = None
        self._perm_epoch = -1
        self._perm: np.ndarray | None = None
        self.workers, self.prefetch, self.pin_memory = workers, prefetch, pin_memory
        self.packing = packing
        # An encoder-decoder's dataset (BART denoising) names its decoder's start token: its batches have a
        # decoder side, packed beside the encoder's behind that token.
        self.decoder_start_id: int | None = getattr(dataset, "decoder_start_id", None)
        self._ahead: Iterator[tuple[str, dict[str, Any]]] | None = None  # the workers' batches from self.micro

    def __iter__(self) -> Iterator[Batch]:
        return self

    def build(self, micro: int) -> tuple[str, dict[str, Any]]:
        """(objective, tensors) of this rank's micro-batch number ``micro``: a pure function of it."""
        step, k, epoch, indices = self.position(micro)
        objective = self.sampler.choice(step, k)
        tensors = self.dataset.batch(indices, epoch, objective)
        if self.packing:
            # An encoder-decoder's samples (BART denoising) pack both sides, each decoder input behind the
            # start token the model was built with (the shards' [SEP]).
            tensors = pack_where_it_pays(tensors, self.dataset.pad_id, decoder_start_id=self.decoder_start_id)
        labels = tensors.get("labels")
        if objective == "mlm" and isinstance(labels, torch.Tensor):
            # The predicted positions, found here on the host (in a worker): the model gathers them without
            # waiting for the device (see SkillNetBertForPreTraining.forward).
            tensors["mlm_positions"] = labels.reshape(-1).ne(-100).nonzero().view(-1)
        return objective, tensors

    def _prefetched(self) -> Iterator[tuple[str, dict[str, Any]]]:
        if self._ahead is None:
            loader = torch.utils.data.DataLoader(
                _MicroBatches(self), batch_size=None, sampler=itertools.count(self.micro),
                num_workers=self.workers, prefetch_factor=self.prefetch, pin_memory=self.pin_memory,
                persistent_workers=False, worker_init_fn=_ignore_stop_signals,
            )
            self._ahead = iter(loader)
        return self._ahead

    def close(self) -> None:
        """Stop the prefetching workers (they restart where the run is on the next batch)."""
        ahead, self._ahead = self._ahead, None
        shutdown = getattr(ahead, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(int(self.dataset.num_samples))
            self._perm_epoch = epoch
        assert self._perm is not None
        return self._perm

    def position(self, micro: int) -> tuple[int, int, int, list[int]]:
        """(step, micro index in step, epoch, dataset indices) of this rank's micro-batch number ``micro``."""
        step, k = divmod(micro, self.grad_accum)
        epoch, s_in_epoch = divmod(step, self.steps_per_epoch)
        start = s_in_epoch * self.global_batch + (k * self.world_size + self.rank) * self.micro_batch_size
        perm = self._permutation(epoch)
        return step, k, epoch, [int(i) for i in perm[start : start + self.micro_batch_size]]

    def __next__(self) -> Batch:
        if self.on_batch is not None:
            self.on_batch(*self.position(self.micro))
        if self.workers:
            objective, tensors = next(self._prefetched())
        else:
            objective, tensors = self.build(self.micro)
        self.micro += 1
        return Batch(objective, dict(tensors), decoder=self.decoder_start_id is not None)

    def state_dict(self) -> dict[str, Any]:
        return {
            "micro": self.micro,
            "step": self.micro // self.grad_accum,
            "global_batch": self.global_batch,
            "sampler": self.sampler.state_dict(),
            "geometry": [self.micro_batch_size, self.grad_accum, self.world_size, self.seed],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state`` stopped. Another (micro, accum, world) is fine when the global batch and
        the seed are the same (a run resumed on another number of ranks): step s reads the same samples
        whatever the geometry, so the run continues at the next global step."""
        geom = list(state.get("geometry", []))
        mine = [self.micro_batch_size, self.grad_accum, self.world_size, self.seed]
        if not geom or geom == mine:
            self.micro = int(state["micro"])
        else:
            old_micro, old_accum, old_world, old_seed = (int(x) for x in geom)
            old_batch = old_micro * old_accum * old_world
            if old_batch != self.global_batch or old_seed != self.seed or int(state["micro"]) % old_accum:
                raise ValueError(
                    f"checkpoint data position was written with (micro, accum, world, seed)={geom} (global batch "
                    f"{old_batch}), this run has {mine} (global batch {self.global_batch}); an exact resume needs "
                    f"the same global batch and seed (the batch geometry may change only in how it splits them)"
                )
            self.micro = int(state["micro"]) // old_accum * self.grad_accum
        self.sampler.load_state_dict(state["sampler"])
        self.close()  # batches prefetched from the old position are not this run's next ones


def _ignore_stop_signals(worker_id: int) -> None:
    """A worker ignores SIGTERM/SIGINT: a scheduler that signals the whole process group (Slurm preemption,
    Ctrl-C) must reach the trainer, which checkpoints and then stops the workers; a worker that died of the
    signal first would make the next batch raise instead."""
    import signal

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


class _MicroBatches(torch.utils.data.Dataset):
    """Micro-batch number -> (objective, tensors), for the DataLoader workers of ``PretrainBatchSource``."""

    def __init__(self, source: PretrainBatchSource) -> None:
        self.source = source

    def __getitem__(self, micro: int) -> tuple[str, dict[str, Any]]:
        return self.source.build(micro)
