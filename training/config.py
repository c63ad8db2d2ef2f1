"""Trainer settings (a JSON-round-trippable dataclass) and the DeepSpeed-JSON-vs-launch check.

The DeepSpeed JSON is the single source for what it defines (batch sizes, precision, ZeRO stage and,
when present, the optimizer / scheduler sections); command-line values that disagree with it are an
error rather than a silent override. The trainer always builds its own sparse-update optimizer and
LR schedule (see training/optim.py) from the resolved values and hands DeepSpeed a JSON without the
"optimizer" / "scheduler" sections.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

__all__ = ["TrainConfig", "DsConfigError", "load_ds_config", "resolve_ds_config", "derive_geometry",
           "single_rank_comm_off"]


class DsConfigError(ValueError):
    """A DeepSpeed JSON that does not fit the launch (message names the file and the fix)."""


@dataclass
class TrainConfig:
    output_dir: str = "runs/train"
    max_steps: int = 100
    # Optimizer / schedule (overridden by a DeepSpeed JSON "optimizer"/"scheduler" section if present).
    lr: float = 1e-4
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-6
    weight_decay: float = 0.01
    warmup_steps: int = 0
    decay_steps: int | None = None  # linear decay to 0 at this step; None = max_steps
    schedule: str = "linear"  # "linear" (warmup then linear decay) | "constant" (warmup then flat)
    max_grad_norm: float = 1.0
    sparse_updates: bool = True  # MaskedAdamW; False = dense AdamW semantics (for comparison)
    # How MaskedAdamW finds the zero gradients: "auto" (sync-free on CUDA, host counts on a CPU), "count",
    # or "device" (no host read-back anywhere; see training/optim.py)
    optim_impl: str = "auto"
    # Batch geometry; None = take it from the DeepSpeed JSON (or 8 / 1 without one).
    micro_batch_size: int | None = None
    grad_accum: int | None = None
    # Bookkeeping.
    seed: int = 0
    save_every: int = 0  # 0 = only at exit / on SIGTERM
    keep_last: int = 2
    log_every: int = 10
    eval_every: int = 0
    resume: str | None = None  # None | "auto" | path to a checkpoint directory
    ds_config: str | None = None
    tensorboard: bool = True
    progress: bool = True
    # log each skill's weight drift from the run's first weights (keeps a CPU copy of the skills on rank 0
    # and <output_dir>/skill_init.safetensors); not under ZeRO-3
    skill_drift: bool = True
    # Testing hook: raise SIGTERM in every rank after this step (exercises the real signal path).
    sigterm_at_step: int | None = None
    # ... and with sigterm_group, rank 0 signals its whole process group instead (launcher included),
    # as Slurm does; only safe when the run has its own session.
    sigterm_group: bool = False
    # On resume, follow this run's LR schedule (peak, warmup, decay end) where it differs from the one the
    # checkpoint was trained on; without it such a resume is refused (the LR would jump without a word)
    new_schedule: bool = False
    # torch.compile each repeated block (the layers of every nn.ModuleList of the model) in place, so the
    # parameter names stay; the first steps of each objective or task pay the compilation
    compile: bool = False
    # [first, last]: record these optimizer steps with torch.profiler into <output_dir>/profile/ (profile.py)
    profile_steps: list[int] | None = None
    # "auto": on one rank, ZeRO-1/2's communication options (overlap_comm, contiguous_gradients) are turned
    # off, as there is nothing to reduce: they only add a copy of every gradient, a stream switch and a
    # device synchronisation per backward (measured on one H100: 0.90 -> 1.00 of the dense step alone);
    # "json": keep the DeepSpeed JSON's values.
    zero_comm: str = "auto"
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"TrainConfig: unknown keys {unknown}; valid keys: {sorted(known)}")
        d = dict(d)
        if "betas" in d:
            d["betas"] = tuple(d["betas"])
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        return cls.from_dict(json.loads(text))


def load_ds_config(path: str | Path) -> dict[str, Any]:
    """Read a DeepSpeed JSON with an error that points at file:line:column."""
    p = Path(path)
    if not p.is_file():
        raise DsConfigError(f"DeepSpeed config not found: {p}")
    try:
        return json.loads(p.read_text())
    except json.JSONDecodeError as e:
        raise DsConfigError(f"{p}:{e.lineno}:{e.colno}: invalid JSON: {e.msg}") from None


_AUTO = (None, "auto")


def resolve_ds_config(
    ds: dict[str, Any],
    cfg: TrainConfig,
    world_size: int,
    source: str = "<ds_config>",
    global_batch: int | None = None,
) -> tuple[dict[str, Any], TrainConfig]:
    """Check batch sizes against the launch, fold optimizer/scheduler sections into the TrainConfig.

    Returns (ds_config for deepspeed.initialize, resolved TrainConfig). Raises DsConfigError with the
    arithmetic spelled out when train_batch_size != micro x accumulation x world size.

    ``global_batch``: keep this global batch (a run resumed on another number of ranks): micro-batch and
    accumulation are re-derived for ``world_size`` (see ``derive_geometry``) instead of read from the JSON.
    """
    ds = copy.deepcopy(ds)
    cfg = copy.deepcopy(cfg)
    if global_batch is not None:
        _keep_global_batch(ds, cfg, world_size, global_batch, source)
    tbs = ds.get("train_batch_size")
    mbs = ds.get("train_micro_batch_size_per_gpu")
    gas = ds.get("gradient_accumulation_steps")
    tbs = None if tbs in _AUTO else int(tbs)
    mbs = None if mbs in _AUTO else int(mbs)
    gas = None if gas in _AUTO else int(gas)

    for name, cli, js, key in (
        ("--micro-batch-size", cfg.micro_batch_size, mbs, "train_micro_batch_size_per_gpu"),
        ("--grad-accum", cfg.grad_accum, gas, "gradient_accumulation_steps"),
    ):
        if cli is not None and js is not None and cli != js:
            raise DsConfigError(
                f"{source}: {key}={js} but the command line asks for {name} {cli}. "
                f"The JSON is the single source for batch geometry: drop {name} or edit {key}."
            )
    mbs = mbs if mbs is not None else cfg.micro_batch_size
    gas = gas if gas is not None else cfg.grad_accum

    # Fill the missing one of the three as DeepSpeed would, then check the product.
    if tbs is not None and mbs is not None and gas is None:
        if tbs % (mbs * world_size):
            raise DsConfigError(
                f"{source}: train_batch_size={tbs} is not divisible by train_micro_batch_size_per_gpu({mbs}) "
                f"x world_size({world_size}); launch {tbs // mbs} ranks in total or change the JSON."
            )
        gas = tbs // (mbs * world_size)
    elif tbs is not None and gas is not None and mbs is None:
        if tbs % (gas * world_size):
            raise DsConfigError(
                f"{source}: train_batch_size={tbs} is not divisible by gradient_accumulation_steps({gas}) "
                f"x world_size({world_size})."
            )
        mbs = tbs // (gas * world_size)
    mbs = 8 if mbs is None else mbs
    gas = 1 if gas is None else gas
    expected = mbs * gas * world_size
    if tbs is not None and tbs != expected:
        hint = ""
        if tbs % (mbs * gas) == 0:
            ranks = tbs // (mbs * gas)
            nodes = f" = {ranks // 8} nodes x 8 GPUs" if ranks % 8 == 0 else ""
            hint = f" This JSON expects {ranks} ranks{nodes}."
        raise DsConfigError(
            f"{source}: train_batch_size={tbs} but train_micro_batch_size_per_gpu({mbs}) x "
            f"gradient_accumulation_steps({gas}) x world_size({world_size}) = {expected}.{hint} "
            f"Launch the matching number of ranks, or change gradient_accumulation_steps / "
            f"train_micro_batch_size_per_gpu, or remove train_batch_size to derive it."
        )
    ds["train_batch_size"] = expected
    ds["train_micro_batch_size_per_gpu"] = mbs
    ds["gradient_accumulation_steps"] = gas
    cfg.micro_batch_size, cfg.grad_accum = mbs, gas

    opt = ds.pop("optimizer", None)
    if opt is not None:
        typ = str(opt.get("type", "")).lower()
        if typ not in ("adam", "adamw"):
            raise DsConfigError(
                f"{source}: optimizer type {opt.get('type')!r} is not supported; SkillNet always uses its "
                f"sparse-update AdamW (training/optim.py) and reads lr/betas/eps/weight_decay from an "
                f"'Adam' or 'AdamW' section."
            )
        p = opt.get("params", {})
        cfg.lr = float(p.get("lr", cfg.lr))
        cfg.betas = tuple(float(b) for b in p.get("betas", cfg.betas))  # type: ignore[assignment]
        cfg.eps = float(p.get("eps", cfg.eps))
        cfg.weight_decay = float(p.get("weight_decay", cfg.weight_decay))
    sch = ds.pop("scheduler", None)
    if sch is not None:
        typ = sch.get("type")
        p = sch.get("params", {})
        if typ == "WarmupDecayLR":
            cfg.schedule = "linear"
            cfg.decay_steps = int(p["total_num_steps"])
        elif typ == "WarmupLR":
            cfg.schedule = "constant"
        else:
            raise DsConfigError(f"{source}: scheduler {typ!r} not supported (use WarmupDecayLR or WarmupLR).")
        if p.get("warmup_type", "linear") != "linear":
            raise DsConfigError(
                f"{source}: only warmup_type 'linear' is supported, got {p.get('warmup_type')!r}"
            )
        cfg.warmup_steps = int(p.get("warmup_num_steps", cfg.warmup_steps))
        if "warmup_max_lr" in p:
            cfg.lr = float(p["warmup_max_lr"])
    if "gradient_clipping" in ds:
        cfg.max_grad_norm = float(ds["gradient_clipping"])
    else:
        ds["gradient_clipping"] = cfg.max_grad_norm
    ds["zero_allow_untested_optimizer"] = True
    zero = ds.get("zero_optimization", {}) or {}
    if single_rank_comm_off(ds, cfg, world_size):
        ds["zero_optimization"] = zero = {**zero, "overlap_comm": False, "contiguous_gradients": False}
    if zero.get("offload_optimizer", {}).get("device", "none") not in ("none", None):
        # Our masked AdamW runs on the CPU copy; DeepSpeed would otherwise insist on DeepSpeedCPUAdam,
        # which has no sparse-update semantics.
        ds["zero_force_ds_cpu_optimizer"] = False
    ds.pop("skillnet", None)
    return ds, cfg


def single_rank_comm_off(ds: dict[str, Any], cfg: TrainConfig, world_size: int) -> bool:
    """Whether ``resolve_ds_config`` turns ZeRO-1/2's overlap_comm and contiguous_gradients off (see
    TrainConfig.zero_comm): one rank, no offload (whose gradient path is built around the contiguous
    buffer), and at least one of them not already off."""
    if cfg.zero_comm not in ("auto", "json"):
        raise DsConfigError(f"zero_comm must be 'auto' or 'json', got {cfg.zero_comm!r}")
    zero = ds.get("zero_optimization") or {}
    offload = any((zero.get(k) or {}).get("device", "none") not in ("none", None)
                  for k in ("offload_optimizer", "offload_param"))
    return (cfg.zero_comm == "auto" and world_size == 1 and int(zero.get("stage", 0)) in (1, 2) and not offload
            and (zero.get("overlap_comm") is not False or zero.get("contiguous_gradients") is not False))


def derive_geometry(global_batch: int, world_size: int, micro_pref: int) -> tuple[int, int]:
    """(micro-batch, accumulation) that give ``global_batch`` on ``world_size`` ranks.

    Keeps ``micro_pref`` when it divides the per-rank share, else the largest micro-batch below it that
    does (so memory per rank never grows). Raises DsConfigError when the ranks cannot share the batch.
    """
    if global_batch % world_size:
        fits = [w for w in range(1, global_batch + 1) if global_batch % w == 0 and w <= 4 * world_size]
        raise DsConfigError(
            f"the run's global batch is {global_batch} samples, which {world_size} ranks cannot share "
            f"equally; launch one of {fits} ranks (the global batch, and with it the data order, is kept "
            f"across a resume)"
        )
    per_rank = global_batch // world_size
    micro = max(d for d in range(1, min(micro_pref, per_rank) + 1) if per_rank % d == 0)
    return micro, per_rank // micro


def _keep_global_batch(ds: dict[str, Any], cfg: TrainConfig, world: int, global_batch: int, source: str) -> None:
    """Rewrite the JSON's geometry in place for ``global_batch`` on ``world`` ranks (see resolve_ds_config)."""
    tbs = ds.get("train_batch_size")
    if tbs not in _AUTO and int(tbs) != global_batch:
        raise DsConfigError(
            f"{source}: train_batch_size={tbs}, but the checkpoint being resumed was trained with a global "
            f"batch of {global_batch}; a resume keeps the global batch: remove train_batch_size or set it to "
            f"{global_batch}"
        )
    if cfg.micro_batch_size is not None and cfg.grad_accum is not None and (
        cfg.micro_batch_size * cfg.grad_accum * world == global_batch
    ):
        micro, accum = cfg.micro_batch_size, cfg.grad_accum  # already derived (prepare runs twice)
    else:
        mbs = ds.get("train_micro_batch_size_per_gpu")
        pref = cfg.micro_batch_size or (None if mbs in _AUTO else int(mbs)) or 8
        micro, accum = derive_geometry(global_batch, world, pref)
    ds["train_batch_size"] = global_batch
    ds["train_micro_batch_size_per_gpu"] = micro
    ds["gradient_accumulation_steps"] = accum
    cfg.micro_batch_size, cfg.grad_accum = micro, accum


def lr_lambda(cfg: TrainConfig) -> Callable[[int], float]:
    """Linear warmup over ``warmup_steps`` then linear decay to 0 at ``decay_steps`` (or flat).

    Step s (0-based) uses factor (s+1)/warmup during warmup so the first step does not waste a
    zero learning rate.
    """
    warm = max(0, cfg.warmup_steps)
    total = cfg.decay_steps if cfg.decay_steps is not None else cfg.max_steps
    constant = cfg.schedule == "constant"

    def f(s: int) -> float:
        if warm and s < warm:
            return (s + 1) / warm
        if constant:
            return 1.0
        return max(0.0, (total - s) / max(1, total - warm))

    return f
