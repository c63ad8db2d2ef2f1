"""Task samplers for multi-task fine-tuning: which task supplies the mini-batch of a global step.

Every sampler is a pure function ``(seed, step) -> task``: the draw for a step is a counter-based
hash of ``(seed, step)`` pushed through the inverse CDF of the step's task distribution. Nothing
depends on earlier draws, so

* every rank computes the same task for the same step without communicating (ZeRO-2 requires it),
* resuming is just "start at step s": ``state_dict()`` only needs the cursor, and
* a sampler can be asked about any step (for logging the target mix, or for tests).

Samplers:

* ``proportional`` (SkillNet-NLU Eq. 3): ``q_i = p_i^a / sum_j p_j^a`` with ``p_i = |T_i| / sum |T_j|``;
  a=1 keeps the natural mix, a=0 is uniform.
* ``temperature`` (SkillNet-NLG Eq. 4): ``p_i = D_i^(1/T) / sum_j D_j^(1/T)`` with ``D_i = min(n_i, K)``.
* ``annealed`` (BERT-PALs Eq. 5-6): ``p_i ∝ N_i^a`` with ``a = 1 - 0.8 (e-1)/(E-1)``, e = 1-based epoch.
* ``round_robin``: tasks in a fixed cycle, step % N.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

_MASK64 = (1 << 64) - 1


def _splitmix64(x: int) -> int:
    # A fixed, library-independent mixer: numpy's generators could change their streams between
    # versions, which would silently change the task sequence of a resumed run.
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def uniform(seed: int, step: int) -> float:
    """A uniform number in [0, 1) that depends only on (seed, step)."""
    h = _splitmix64(_splitmix64(seed & _MASK64) ^ (step & _MASK64))
    return (h >> 11) * (1.0 / (1 << 53))


def _normalise(w: Sequence[float]) -> list[float]:
    total = float(sum(w))
    if not total > 0 or not math.isfinite(total):
        raise ValueError(f"task weights must be positive and finite, got {list(w)}")
    return [float(x) / total for x in w]


SAMPLER_KINDS = ("proportional", "temperature", "annealed", "round_robin")


@dataclass
class SamplerConfig:
    """Which sampler and its hyper-parameters (JSON-round-trippable, part of the fine-tuning config)."""

    kind: str = "proportional"
    alpha: float = 1.0  # proportional (Eq. 3)
    temperature: float = 4.0  # temperature (NLG Eq. 4); the NLG paper uses T=4
    size_cap: int = 2**21  # K in NLG Eq. 4
    num_epochs: int = 0  # annealed: E in PALs Eq. 6; 0 = derive from max_steps and the epoch length
    steps_per_epoch: int = 0  # annealed: 0 = derive from the data (sum of batches per epoch)
    order: list[str] = field(default_factory=list)  # round robin order; empty = task order of the config

    def __post_init__(self) -> None:
        if self.kind not in SAMPLER_KINDS:
            raise ValueError(f"unknown sampler kind {self.kind!r}; choose one of {', '.join(SAMPLER_KINDS)}")
        if self.kind == "temperature" and not self.temperature > 0:
            raise ValueError(f"sampler temperature must be > 0, got {self.temperature}")
        if self.kind == "temperature" and self.size_cap < 1:
            raise ValueError(f"sampler size_cap K must be >= 1, got {self.size_cap}")
        if self.kind == "annealed" and self.num_epochs < 0:
            raise ValueError(f"annealed sampler needs num_epochs >= 1 (or 0 to derive it), got {self.num_epochs}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SamplerConfig:
        known = {f for f in cls.__dataclass_fields__}
        unknown = set(d) - known
        if unknown:
            raise ValueError(f"unknown sampler option(s) {sorted(unknown)}; known: {sorted(known)}")
        return cls(**dict(d))


class TaskSampler:
    """Base class: subclasses define ``probabilities(step)``; the draw is shared.

    Iterating yields the task of ``self.step`` and advances the cursor; ``task_at(step)`` never
    touches the cursor.
    """

    kind = "base"

    def __init__(self, tasks: Sequence[str], sizes: Sequence[int], seed: int = 0) -> None:
        if not tasks:
            raise ValueError("a task sampler needs at least one task")
        if len(set(tasks)) != len(tasks):
            raise ValueError(f"duplicate task names in {list(tasks)}")
        if len(sizes) != len(tasks):
            raise ValueError(f"{len(tasks)} tasks but {len(sizes)} sizes")
        for t, n in zip(tasks, sizes):
            if n < 1:
                raise ValueError(f"task {t!r} has {n} training examples; every task needs at least one")
        self.tasks = list(tasks)
        self.sizes = [int(n) for n in sizes]
        self.seed = int(seed)
        self.step = 0

    # --- to override -------------------------------------------------------------------------
    def probabilities(self, step: int) -> list[float]:
        raise NotImplementedError

    def _params(self) -> dict[str, Any]:
        return {}

    # --- shared ------------------------------------------------------------------------------
    def index_at(self, step: int) -> int:
        probs = self.probabilities(step)
        u = uniform(self.seed, step)
        acc = 0.0
        for i, p in enumerate(probs):
            acc += p
            if u < acc:
                return i
        # Rounding can leave acc a hair below 1: the last task with non-zero mass takes the rest.
        return max(i for i, p in enumerate(probs) if p > 0)

    def task_at(self, step: int) -> str:
        return self.tasks[self.index_at(step)]

    def target_mix(self, start: int, stop: int) -> dict[str, float]:
        """Expected share of each task over steps [start, stop) (for the target-vs-realised log)."""
        if stop <= start:
            return {t: 0.0 for t in self.tasks}
        acc = np.zeros(len(self.tasks))
        # The distribution is piecewise constant (per epoch at most), so a stride keeps this cheap.
        stride = max(1, (stop - start) // 2000)
        n = 0
        for s in range(start, stop, stride):
            acc += np.asarray(self.probabilities(s))
            n += 1
        acc /= n
        return {t: float(p) for t, p in zip(self.tasks, acc)}

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        task = self.task_at(self.step)
        self.step += 1
        return task

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "seed": self.seed, "step": self.step, "tasks": list(self.tasks),
                "sizes": list(self.sizes), "params": self._params()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        mine = self.state_dict()
        for key in ("kind", "tasks", "sizes", "params"):
            if state.get(key) != mine[key]:
                raise ValueError(
                    f"sampler state does not match this run: {key} was {state.get(key)!r}, now {mine[key]!r}; "
                    "resuming with a different task mix would not continue the same sequence")
        self.seed = int(state["seed"])
        self.step = int(state["step"])


class ProportionalSampler(TaskSampler):
    """SkillNet-NLU Eq. 3: q_i ∝ p_i^alpha (alpha=1 natural mix, alpha=0 uniform)."""

    kind = "proportional"

    def __init__(self, tasks: Sequence[str], sizes: Sequence[int], alpha: float = 1.0, seed: int = 0) -> None:
        super().__init__(tasks, sizes, seed)
        self.alpha = float(alpha)
        total = sum(self.sizes)
        p = [n / total for n in self.sizes]
        self._probs = _normalise([pi**self.alpha for pi in p])

    def probabilities(self, step: int) -> list[float]:
        return list(self._probs)

    def _params(self) -> dict[str, Any]:
        return {"alpha": self.alpha}


class TemperatureSampler(TaskSampler):
    """SkillNet-NLG Eq. 4: p_i ∝ min(n_i, K)^(1/T)."""

    kind = "temperature"

    def __init__(self, tasks: Sequence[str], sizes: Sequence[int], temperature: float = 4.0,
                 size_cap: int = 2**21, seed: int = 0) -> None:
        super().__init__(tasks, sizes, seed)
        if not temperature > 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.temperature = float(temperature)
        self.size_cap = int(size_cap)
        self._probs = _normalise([min(n, self.size_cap) ** (1.0 / self.temperature) for n in self.sizes])

    def probabilities(self, step: int) -> list[float]:
        return list(self._probs)

    def _params(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "size_cap": self.size_cap}


class AnnealedSampler(TaskSampler):
    """BERT-PALs Eq. 5-6: p_i ∝ N_i^alpha(e), alpha(e) = 1 - 0.8 (e-1)/(E-1), e the 1-based epoch.

    An epoch is ``steps_per_epoch`` global steps; steps past the last epoch keep alpha(E) = 0.2.
    """

    kind = "annealed"

    def __init__(self, tasks: Sequence[str], sizes: Sequence[int], num_epochs: int, steps_per_epoch: int,
                 seed: int = 0) -> None:
        super().__init__(tasks, sizes, seed)
        if num_epochs < 1 or steps_per_epoch < 1:
            raise ValueError(f"annealed sampler needs num_epochs >= 1 and steps_per_epoch >= 1, "
                             f"got {num_epochs} and {steps_per_epoch}")
        self.num_epochs = int(num_epochs)
        self.steps_per_epoch = int(steps_per_epoch)
        self._cache: dict[int, list[float]] = {}

    def epoch_at(self, step: int) -> int:
        return min(step // self.steps_per_epoch + 1, self.num_epochs)

    def alpha_at(self, step: int) -> float:
        if self.num_epochs == 1:
            return 1.0
        e = self.epoch_at(step)
        return 1.0 - 0.8 * (e - 1) / (self.num_epochs - 1)

    def probabilities(self, step: int) -> list[float]:
        e = self.epoch_at(step)
        if e not in self._cache:
            a = self.alpha_at(step)
            self._cache[e] = _normalise([n**a for n in self.sizes])
        return list(self._cache[e])

    def _params(self) -> dict[str, Any]:
        return {"num_epochs": self.num_epochs, "steps_per_epoch": self.steps_per_epoch}

    def schedule(self) -> list[tuple[int, int, float]]:
        """(epoch, first step, alpha) for every epoch: what the plan prints."""
        return [(e, (e - 1) * self.steps_per_epoch, self.alpha_at((e - 1) * self.steps_per_epoch))
                for e in range(1, self.num_epochs + 1)]


class RoundRobinSampler(TaskSampler):
    """Tasks in a fixed cycle (PALs §4.2.1): every task equally often, whatever its size."""

    kind = "round_robin"

    def probabilities(self, step: int) -> list[float]:
        return [1.0 / len(self.tasks)] * len(self.tasks)

    def index_at(self, step: int) -> int:
        return step % len(self.tasks)


def annealing_warning(sampler: TaskSampler, max_steps: int) -> str | None:
    """Why an annealed schedule would not anneal in this run (None when it does)."""
    if not isinstance(sampler, AnnealedSampler):
        return None
    if sampler.num_epochs < 2:
        return (f"annealed sampling has E={sampler.num_epochs} epoch(s) of {sampler.steps_per_epoch} steps: alpha "
                "stays 1 (no annealing); raise max_steps or set sampler.steps_per_epoch smaller")
    reached = sampler.epoch_at(max(0, max_steps - 1))
    if reached < sampler.num_epochs:
        return (f"annealed sampling: the run ends in epoch {reached} of E={sampler.num_epochs}, so alpha only "
                f"falls to {sampler.alpha_at(max_steps - 1):.2f}, not 0.2; set sampler.num_epochs=0 to derive E")
    return None


def build_sampler(cfg: SamplerConfig, sizes: Mapping[str, int], seed: int = 0,
                  steps_per_epoch: int | None = None, max_steps: int | None = None) -> TaskSampler:
    """Build the sampler of ``cfg`` over ``sizes`` (task -> number of training examples, config order).

    Annealed sampling with ``num_epochs=0`` derives E = ceil(max_steps / steps_per_epoch), so that alpha
    reaches its final value 0.2 in the last epoch of the run."""
    tasks = list(sizes)
    if cfg.kind == "round_robin" and cfg.order:
        if sorted(cfg.order) != sorted(tasks):
            raise ValueError(f"round_robin order {cfg.order} must name each task once: {tasks}")
        tasks = list(cfg.order)
    n = [sizes[t] for t in tasks]
    if cfg.kind == "proportional":
        return ProportionalSampler(tasks, n, alpha=cfg.alpha, seed=seed)
    if cfg.kind == "temperature":
        return TemperatureSampler(tasks, n, temperature=cfg.temperature, size_cap=cfg.size_cap, seed=seed)
    if cfg.kind == "annealed":
        spe = cfg.steps_per_epoch or steps_per_epoch
        if not spe:
            raise ValueError("annealed sampler needs steps_per_epoch (in the config or derived from the data)")
        epochs = cfg.num_epochs
        if not epochs:
            if not max_steps:
                raise ValueError("annealed sampler needs num_epochs, or max_steps to derive it")
            epochs = max(1, math.ceil(max_steps / spe))
        return AnnealedSampler(tasks, n, num_epochs=epochs, steps_per_epoch=spe, seed=seed)
    if cfg.kind == "round_robin":
        return RoundRobinSampler(tasks, n, seed=seed)
    raise ValueError(f"unknown sampler kind {cfg.kind!r}")
