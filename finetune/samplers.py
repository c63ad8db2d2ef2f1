"""Task samplers for multi-task fine-tuning: which task supplies the mini-batch of a global step.

Every sampler is a pure function ``(seed, step) -> task``: nothing depends on earlier draws, so

* every rank computes the same task for the same step without communicating (ZeRO-2 requires it),
* resuming is just "start at step s": ``state_dict()`` only needs the cursor, and
* a sampler can be asked about any step (for logging the target mix, or for tests).

How a step's task is drawn (``SamplerConfig.draw``):

* ``stratified`` (the default): over the run's horizon (``max_steps`` updates of ``grad_accum``
  micro-steps each) every task gets exactly its largest-remainder-rounded count of updates x share
  (``unit_counts``), in an order that is a pseudo-random permutation fixed by ``(seed, horizon)``.
  So a joint run trains each task for exactly the count a task-specific model trains it for (the same
  function), on every seed: rows of a comparison differ in method, not in the luck of the draw. A mix
  that changes by epoch (annealed) is stratified per epoch segment. The schedule is built once, on the
  first ask, and holds one byte per micro-step (100 KB for 100k steps; ~20 ms and a transient 18 bytes
  per micro-step to build); steps past the horizon fall back to i.i.d. draws.
* ``iid``: a counter-based hash of ``(seed, step)`` pushed through the inverse CDF of the step's task
  distribution; the realised counts vary around the expectation (the behaviour before stratification).

Samplers:

* ``proportional`` (SkillNet-NLU Eq. 3): ``q_i = p_i^a / sum_j p_j^a`` with ``p_i = |T_i| / sum |T_j|``;
  a=1 keeps the natural mix, a=0 is uniform.
* ``temperature`` (SkillNet-NLG Eq. 4): ``p_i = D_i^(1/T) / sum_j D_j^(1/T)`` with ``D_i = min(n_i, K)``.
* ``annealed`` (BERT-PALs Eq. 5-6): ``p_i ∝ N_i^a`` with ``a = 1 - 0.8 (e-1)/(E-1)``, e = 1-based epoch.
* ``round_robin``: tasks in a fixed cycle, step % N (stratified with ``grad_accum`` > 1: one task per
  update, so that each task's count is whole updates).
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


def _splitmix64_array(x: np.ndarray) -> np.ndarray:
    # The same mixer over a uint64 array (numpy wraps uint64 arithmetic modulo 2^64, as the scalar masks do).
    x = x + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


# Keeps the stratified permutation's keys apart from uniform()'s stream of the same (seed, step).
_SCHEDULE_SALT = 0x5EED5C4ED


def largest_remainder(total: int, shares: Sequence[float]) -> list[int]:
    """``total`` split in whole parts as close to ``total * share`` as possible (Hamilton's method): each
    part is the floor, the ones left over go to the largest remainders, ties to the earlier task."""
    exact = [total * p for p in shares]
    parts = [math.floor(x) for x in exact]
    left = total - sum(parts)
    for i in sorted(range(len(exact)), key=lambda i: -(exact[i] - parts[i]))[:left]:
        parts[i] += 1
    return parts


def _normalise(w: Sequence[float]) -> list[float]:
    total = float(sum(w))
    if not total > 0 or not math.isfinite(total):
        raise ValueError(f"task weights must be positive and finite, got {list(w)}")
    return [float(x) / total for x in w]


SAMPLER_KINDS = ("proportional", "temperature", "annealed", "round_robin")
SAMPLER_DRAWS = ("stratified", "iid")


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
    # stratified: each task exactly its rounded share of the run's updates (equal realised budgets across
    # a comparison's rows); iid: independent draws per step, counts vary around the share
    draw: str = "stratified"

    def __post_init__(self) -> None:
        if self.kind not in SAMPLER_KINDS:
            raise ValueError(f"unknown sampler kind {self.kind!r}; choose one of {', '.join(SAMPLER_KINDS)}")
        if self.draw not in SAMPLER_DRAWS:
            raise ValueError(f"unknown sampler draw {self.draw!r}; choose one of {', '.join(SAMPLER_DRAWS)}")
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
        # stratified draws (stratify()): horizon in updates, micro-steps per update, the built schedule
        self.horizon = 0
        self.unit = 1
        self._schedule: np.ndarray | None = None

    # --- to override -------------------------------------------------------------------------
    def probabilities(self, step: int) -> list[float]:
        raise NotImplementedError

    def _params(self) -> dict[str, Any]:
        return {}

    def segments(self, units: int) -> list[tuple[int, int, list[float]]]:
        """(first update, end update, task distribution) of each stretch of ``units`` updates whose mix is
        fixed: what stratification keeps exact. One stretch unless the mix changes during the run."""
        return [(0, units, self.probabilities(0))]

    def _stratified_index(self, step: int) -> int:
        if self._schedule is None:
            self._schedule = self._build_schedule()
        return int(self._schedule[step])

    # --- shared ------------------------------------------------------------------------------
    def stratify(self, horizon: int, unit: int = 1) -> TaskSampler:
        """Draw stratified over ``horizon`` updates of ``unit`` micro-steps (the trainer's gradient
        accumulation): each task's micro-steps are whole updates, ``unit_counts()`` of them."""
        if horizon < 1 or unit < 1:
            raise ValueError(f"a stratified sampler needs horizon >= 1 and unit >= 1, got {horizon} and {unit}")
        self.horizon, self.unit, self._schedule = int(horizon), int(unit), None
        return self

    def unit_counts(self, units: int | None = None) -> dict[str, int]:
        """Updates on each task over the first ``units`` updates (default: the stratified horizon): its
        largest-remainder share per stretch of fixed mix. A stratified run realises exactly these; a
        task-specific model trains exactly these (the same function, so every row matches)."""
        units = self.horizon if units is None else units
        total = [0] * len(self.tasks)
        for u0, u1, probs in self.segments(units):
            for i, c in enumerate(largest_remainder(u1 - u0, probs)):
                total[i] += c
        return dict(zip(self.tasks, total))

    def _build_schedule(self) -> np.ndarray:
        # One byte per micro-step for up to 255 tasks: the whole run's order, kept for task_at's lookups.
        dtype = np.uint8 if len(self.tasks) < 256 else np.uint16
        out = np.empty(self.horizon * self.unit, dtype=dtype)
        salt = _splitmix64((self.seed ^ _SCHEDULE_SALT) & _MASK64)
        for u0, u1, probs in self.segments(self.horizon):
            lo, hi = u0 * self.unit, u1 * self.unit
            counts = [c * self.unit for c in largest_remainder(u1 - u0, probs)]
            labels = np.repeat(np.arange(len(self.tasks), dtype=dtype), counts)
            # Sorting the positions by a hash of (seed, position) is a permutation that depends on the seed
            # and the positions only (not on numpy's generator streams, which may change between versions).
            keys = _splitmix64_array(np.arange(lo, hi, dtype=np.uint64) ^ np.uint64(salt))
            out[lo:hi][np.argsort(keys, kind="stable")] = labels
        return out

    def index_at(self, step: int) -> int:
        if self.horizon and 0 <= step < self.horizon * self.unit:
            return self._stratified_index(step)
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
        params = self._params()
        if self.horizon:  # another horizon is another schedule: a resume must not switch to it mid-run
            params = {**params, "draw": "stratified", "horizon": self.horizon, "unit": self.unit}
        return {"kind": self.kind, "seed": self.seed, "step": self.step, "tasks": list(self.tasks),
                "sizes": list(self.sizes), "params": params}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        mine = self.state_dict()
        old = state.get("params") or {}
        if (old.get("horizon"), old.get("unit")) != (mine["params"].get("horizon"), mine["params"].get("unit")):
            raise ValueError(
                f"sampler state does not match this run: its stratified schedule covers {old.get('horizon') or 'no'} "
                f"updates of {old.get('unit') or 1} micro-step(s), this run {mine['params'].get('horizon') or 'no'} of "
                f"{mine['params'].get('unit') or 1}; keep train.max_steps and the accumulation of the checkpoint "
                "(or start a run with sampler.draw iid, whose draws do not depend on them)")
        for key in ("kind", "tasks", "sizes", "params"):
            if state.get(key) != mine[key]:
                raise ValueError(
                    f"sampler state does not match this run: {key} was {state.get(key)!r}, now {mine[key]!r}; "
                    "resuming with a different task mix would not continue the same sequence")
        if int(state["seed"]) != self.seed:
            self._schedule = None
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

    def segments(self, units: int) -> list[tuple[int, int, list[float]]]:
        # Epochs are counted in micro-steps; an update belongs to the epoch of its first micro-step, so each
        # epoch's stretch is whole updates.
        starts = [min(units, -(-(e - 1) * self.steps_per_epoch // self.unit)) for e in range(1, self.num_epochs + 1)]
        ends = [*starts[1:], units]
        return [(a, b, self.probabilities((e - 1) * self.steps_per_epoch))
                for e, (a, b) in enumerate(zip(starts, ends), 1) if b > a]

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
        if self.horizon and 0 <= step < self.horizon * self.unit:
            # whole updates per task, so each task's count is unit_counts() (equal shares, ties to the first)
            return (step // self.unit) % len(self.tasks)
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
                  steps_per_epoch: int | None = None, max_steps: int | None = None,
                  grad_accum: int = 1) -> TaskSampler:
    """Build the sampler of ``cfg`` over ``sizes`` (task -> number of training examples, config order).

    ``max_steps`` updates of ``grad_accum`` micro-steps (each micro-step draws a task) are the run's
    horizon: stratified draws (``cfg.draw``) need it. Annealed sampling with ``num_epochs=0`` derives
    E = ceil(max_steps * grad_accum / steps_per_epoch), so that alpha reaches its final value 0.2 in the
    last epoch of the run."""
    sampler = _build(cfg, sizes, seed, steps_per_epoch, None if max_steps is None else max_steps * grad_accum)
    if cfg.draw == "stratified" and max_steps:  # without a horizon (a sampler asked about the mix) draws are i.i.d.
        sampler.stratify(max_steps, grad_accum)
    return sampler


def _build(cfg: SamplerConfig, sizes: Mapping[str, int], seed: int, steps_per_epoch: int | None,
           micro_steps: int | None) -> TaskSampler:
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
            if not micro_steps:
                raise ValueError("annealed sampler needs num_epochs, or max_steps to derive it")
            epochs = max(1, math.ceil(micro_steps / spe))
        return AnnealedSampler(tasks, n, num_epochs=epochs, steps_per_epoch=spe, seed=seed)
    if cfg.kind == "round_robin":
        return RoundRobinSampler(tasks, n, seed=seed)
    raise ValueError(f"unknown sampler kind {cfg.kind!r}")
