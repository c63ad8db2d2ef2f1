"""The multi-task batch source: one task's mini-batch per micro-step, identical task on every rank.

Micro-step n (counted globally, the same on all ranks) draws its task from the sampler as a pure
function of (seed, n); the task's k-th draw reads global rows ``[k*B, (k+1)*B)`` of the task's
per-pass permutation, and rank r keeps its slice of those rows. The state is three integers per task,
so resuming restores exactly the batch the uninterrupted run would have produced.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator, Mapping
from typing import Any

from skillnet.training.batch import Batch

from .samplers import TaskSampler
from .tasks import TaskData


class MultiTaskBatchSource:
    def __init__(self, tasks: Mapping[str, TaskData], sampler: TaskSampler, micro_batch_size: int,
                 rank: int = 0, world_size: int = 1, seed: int = 0, packing: bool = False) -> None:
        missing = [t for t in sampler.tasks if t not in tasks]
        if missing:
            raise ValueError(f"sampler names tasks without data: {missing}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside world size {world_size}")
        self.tasks = dict(tasks)
        self.sampler = sampler
        self.micro = int(micro_batch_size)
        self.rank = rank
        self.world = world_size
        self.seed = seed
        self.step = 0  # global micro-step
        self.draws: Counter[str] = Counter()
        # Tasks whose codec packs get rows of several examples (training/packing.py): the same examples and
        # losses, fewer padded slots. The data order and the state do not change.
        self.packing = packing

    @property
    def global_batch(self) -> int:
        return self.micro * self.world

    def task_at(self, step: int) -> str:
        return self.sampler.task_at(step)

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        task = self.sampler.task_at(self.step)
        data = self.tasks[task]
        k = self.draws[task]
        idx = data.train_indices(self.seed, k, self.global_batch)
        mine = idx[self.rank * self.micro:(self.rank + 1) * self.micro]
        # Matching negatives are drawn per (draw, rank) so ranks see different negatives.
        tensors = data.train_batch(mine, seed=self.seed, draw=k * self.world + self.rank)
        if self.packing:
            tensors = data.pack(tensors)
        self.draws[task] += 1
        self.step += 1
        self.sampler.step = self.step
        return Batch(task, tensors, decoder=data.codec.decoder)

    def packing_report(self, batches: int = 16) -> dict[str, dict[str, Any]]:
        """Per task: whether its rows pack, and the real-token share of its first ``batches`` micro-batches of
        training rows (in file order) padded and as this source would feed them. For the start log: what
        packing does to each task, measured before the first step."""
        out: dict[str, dict[str, Any]] = {}
        for name, data in self.tasks.items():
            n = data.num_train_rows()
            real = padded = packed = 0
            for at in range(0, min(n, batches * self.micro), self.micro):
                b = data.train_batch(list(range(at, min(n, at + self.micro))), seed=self.seed, draw=0)
                fed = data.pack(b) if self.packing else b
                one, two = Batch(name, b, data.codec.decoder), Batch(name, fed, data.codec.decoder)
                real += one.num_tokens()
                padded += one.num_slots()
                packed += two.num_slots()
            out[name] = {"packs": bool(self.packing and data.codec.packs), "kind": data.codec.packs,
                         "padded": real / max(padded, 1), "fed": real / max(packed, 1)}
        return out

    def realised_mix(self) -> dict[str, float]:
        n = sum(self.draws.values())
        return {t: (self.draws[t] / n if n else 0.0) for t in self.sampler.tasks}

    def target_mix(self) -> dict[str, float]:
        return self.sampler.target_mix(0, max(self.step, 1))

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "draws": dict(self.draws), "sampler": self.sampler.state_dict(),
                "seed": self.seed, "global_batch": self.global_batch}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if int(state.get("global_batch", self.global_batch)) != self.global_batch:
            raise ValueError(f"resume with global batch {self.global_batch} but the checkpoint used "
                             f"{state['global_batch']}: the data order would not continue")
        self.sampler.load_state_dict(state["sampler"])
        self.seed = int(state["seed"])
        self.step = int(state["step"])
        self.draws = Counter({k: int(v) for k, v in state["draws"].items()})
        self.sampler.step = self.step
