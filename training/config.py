"""Trainer settings (a JSON-round-trippable dataclass) and the DeepSpeed-JSON-vs-launch check.

The DeepSpeed JSON is the single source for what it defines (batch sizes, precision, ZeRO stage and,
when present, the optimizer / scheduler sections); command-line values that disagree with it are an
error rather than a silent override. The trainer always builds its own sparse-update optimizer and
LR schedule (see training/optim.py) from the resolved values and hands DeepSpeed a JSON without the
"optimizer" / "scheduler" sections.
"""

from __future__ import annotations

import argparse
import copy
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from skillnet.common.outputs import Rule, at_least, in_range, non_negative, positive

__all__ = ["TrainConfig", "RUNTIME_FIELDS", "DS_PATHS", "add_train_flags", "check_train_flags", "train_overrides",
           "ds_settings", "DsConfigError", "load_ds_config", "resolve_ds_config", "derive_geometry",
           "single_rank_comm_off"]


class DsConfigError(ValueError):
    """A DeepSpeed JSON that does not fit the launch (message names the file and the fix)."""


def setting(default: Any = None, help: str = "", *, rule: Rule | None = None, flag: str | None = None,
            choices: tuple[str, ...] | None = None, metavar: str | tuple[str, ...] | None = None,
            factory: Callable[[], Any] | None = None) -> Any:
    """A TrainConfig field with what its command-line flag and its checks are made of (``add_train_flags``,
    ``TrainConfig.__post_init__``): one place for a setting's name, default, help text and valid values."""
    meta = {"help": help, "rule": rule, "flag": flag, "choices": choices, "metavar": metavar}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def parse_steps_window(text: str) -> list[int]:
    """``"20:25"`` -> ``[20, 25]`` (optimizer steps 20 to 25, both included)."""
    try:
        first, last = (int(x) for x in text.split(":"))
    except ValueError:
        raise ValueError(f"takes FIRST:LAST (e.g. 20:25), got {text!r}") from None
    if first < 1 or last < first:
        raise ValueError(f"{text}: needs 1 <= FIRST <= LAST")
    return [first, last]


@dataclass
class TrainConfig:
    """Every training setting of both stages (pre-training and fine-tuning), under one name each.

    A stage starts from its own defaults (``dataclasses.replace`` of these, e.g. fine-tuning's lower peak
    LR) and exposes the settings it uses as flags generated from the fields (``add_train_flags``); the
    fine-tuning config file's ``train`` section is this dataclass. The last group is read by fine-tuning
    only; pre-training leaves it at its defaults.
    """

    # -- the run: set by the command that starts it, not by a config file (RUNTIME_FIELDS)
    output_dir: str = "runs/train"
    resume: str | None = None  # None | "auto" | path to a checkpoint directory
    ds_config: str | None = None
    tensorboard: bool = setting(True, "write TensorBoard event files")
    progress: bool = setting(True, "show a tqdm progress bar (turn it off for CI logs)")
    # -- length, optimizer and LR schedule (a DeepSpeed JSON's optimizer/scheduler sections set them: DS_PATHS)
    max_steps: int = setting(100, "optimizer steps", rule=at_least(1))
    lr: float = setting(1e-4, "peak learning rate (0: a frozen control run)", rule=non_negative())
    betas: tuple[float, float] = setting((0.9, 0.98), "Adam betas", rule=in_range(0, 1, hi_open=True),
                                         metavar=("B1", "B2"))
    eps: float = setting(1e-6, "Adam epsilon", rule=positive())
    weight_decay: float = setting(0.01, "AdamW's decoupled weight decay", rule=non_negative())
    warmup_steps: int = setting(0, "linear warmup steps", rule=non_negative())
    warmup_ratio: float | None = setting(None, "linear warmup over this share of max_steps (instead of "
                                         "warmup_steps)", rule=in_range(0, 1))
    decay_steps: int | None = setting(None, "the linear decay reaches 0 at this step (default: max_steps)",
                                      rule=at_least(1))
    schedule: str = setting("linear", "after the warmup: linear decay to 0, or constant",
                            choices=("linear", "constant"))
    max_grad_norm: float = setting(1.0, "gradient clipping: bound of the global gradient norm (0: off)",
                                   rule=non_negative())
    sparse_updates: bool = setting(True, "sparse updates: a skill a step did not use keeps its weights and Adam "
                                   "moments (off: plain AdamW semantics, it moves with momentum and decay)",
                                   flag="--dense-updates")
    # How MaskedAdamW finds the zero gradients: sync-free on CUDA, host counts on a CPU (training/optim.py)
    optim_impl: str = setting("auto", "how the sparse-update optimizer finds untouched parameters: auto "
                              "(sync-free on CUDA, host counts on a CPU), count, or device",
                              choices=("auto", "count", "device"))
    new_schedule: bool = setting(False, "on resume, follow this run's LR schedule where it differs from the "
                                 "checkpoint's (e.g. a larger max_steps moves the decay's end) and print it; "
                                 "without it such a resume is refused (the LR would jump)")
    # -- batch geometry; None = the DeepSpeed JSON's (micro-batch 8, accumulation 1 without one)
    batch_size: int | None = setting(None, "global batch: micro-batch x accumulation x ranks (without a "
                                     "DeepSpeed JSON: the micro-batch of the one process)", rule=at_least(1))
    micro_batch_size: int | None = setting(None, "per rank (default: the DeepSpeed JSON's, else 8)",
                                           rule=at_least(1))
    grad_accum: int | None = setting(None, "gradient accumulation steps (default: the DeepSpeed JSON's, else 1)",
                                     rule=at_least(1))
    # -- bookkeeping and speed
    seed: int = setting(0, "initial weights, sampling draws and the data order", rule=non_negative())
    save_every: int = setting(0, "checkpoint every N steps (always at the end and on SIGTERM)",
                              rule=non_negative())
    keep_last: int = setting(2, "complete checkpoints kept; older ones are deleted (0: keep all)",
                             rule=non_negative())
    log_every: int = setting(10, "log averaged metrics every N steps (0: never)", rule=non_negative())
    eval_every: int = setting(0, "evaluate every N steps (0: only at the end)", rule=non_negative())
    # Keeps a CPU copy of the skills on rank 0 and <output_dir>/skill_init.safetensors; not under ZeRO-3.
    skill_drift: bool = setting(True, "log each skill's weight drift from the run's first weights")
    compile: bool = setting(False, "torch.compile each layer's attention (in place: checkpoint names unchanged); "
                            "the first steps of each objective or task pay the compilation")
    profile_steps: list[int] | None = setting(None, "record optimizer steps FIRST..LAST with torch.profiler into "
                                              "<output_dir>/profile/ (a Perfetto trace and a summary per rank), "
                                              "e.g. 20:25, after warm-up", metavar="FIRST:LAST")
    # On one rank ZeRO-1/2's communication options only add a copy of every gradient, a stream switch and a
    # device synchronisation per backward (measured on one H100: 0.90 -> 1.00 of the dense step alone).
    zero_comm: str = setting("auto", "auto: on one rank, ZeRO-1/2's overlap_comm and contiguous_gradients are "
                             "turned off (nothing to reduce across ranks); json: keep the DeepSpeed JSON's values",
                             choices=("auto", "json"))
    gradient_checkpointing: bool = setting(False, "activation checkpointing: keep only each layer's input and "
                                           "recompute the layer in the backward pass (less activation memory, "
                                           "about one more forward pass; same gradients); also on when the "
                                           "DeepSpeed JSON has an activation_checkpointing section")
    packing: bool = setting(False, "pack several samples into each row, each attending only to itself with its "
                            "own positions (the same samples and losses, without computing padding)")
    # -- fine-tuning only
    eval_batch_size: int = setting(32, "examples per evaluation batch", rule=at_least(1))
    early_stopping_patience: int = setting(0, "stop after N evaluations without improvement of the mean dev "
                                           "score (0: off)", rule=non_negative(), flag="--early-stopping")
    # "mean": one checkpoint for all tasks (the paper's claim is one model for every task); "per_task": each
    # task scored from its own best-on-dev checkpoint.
    selection: str = setting("mean", "the checkpoint scored on test: mean (one for all tasks, best mean dev "
                             "score) or per_task (each task's best on dev)", choices=("mean", "per_task"))
    select_min_distinct: float = setting(0.0, "generation: a checkpoint whose dev outputs are less than this "
                                         "percent distinct is selected only while none of the run reaches it "
                                         "(0: off)", rule=in_range(0, 100), metavar="PCT")
    skill_map_lr: float = setting(1e-2, "method learnable: the task and skill embeddings' own learning rate",
                                  rule=non_negative())
    # "share": each task gets its sampler share of max_steps (all task models together cost one joint run)
    task_specific_budget: str = setting("share", "method task_specific: steps per task model: share (its share "
                                        "of max_steps) or full (max_steps each)", choices=("share", "full"))
    lexical_baselines: bool = setting(False, "also score each task type's non-neural baseline fit on train "
                                      "(TF-IDF + logistic regression, TF-IDF similarity)")
    label_smoothing: float = setting(0.0, "generation: cross-entropy label smoothing (0: plain)",
                                     rule=in_range(0, 1, hi_open=True))
    # Issue 49: a task whose loss sits on a smaller scale (NER's CRF, per word) gets a smaller shared-encoder
    # gradient, which the shared AdamW and clip starve; "ema" evens the tasks' norms (training/task_balance.py).
    task_grad_norm: str = setting("off", "per-task gradient normalisation: off, or ema (each task's loss is scaled "
                                  "before backward so that its gradient norm, an EMA over its own steps, meets the "
                                  "mean over tasks; logged as <task>/grad_scale; needs grad_accum 1)",
                                  choices=("off", "ema"))
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.betas, list):  # from JSON
            self.betas = tuple(self.betas)  # type: ignore[assignment]
        for f in fields(self):
            _check_value(f, getattr(self, f.name))
        if self.warmup_ratio is not None and self.warmup_steps:
            raise ValueError(f"warmup_steps ({self.warmup_steps}) and warmup_ratio ({self.warmup_ratio}) both set; "
                             f"give one")
        if self.task_grad_norm != "off":
            # the accumulation given, or the one batch_size / micro_batch_size imply (a DeepSpeed JSON's is
            # checked when the trainer starts)
            accum = self.grad_accum
            if accum is None and self.batch_size and self.micro_batch_size:
                accum = self.batch_size // self.micro_batch_size
            if accum not in (None, 1):
                raise ValueError(f"task_grad_norm {self.task_grad_norm} needs grad_accum 1 (a step's gradient norm is "
                                 f"then one task's), got {accum}")

    def resolved_warmup(self) -> int:
        """Warm-up steps: ``warmup_steps``, or ``warmup_ratio`` of ``max_steps``."""
        if self.warmup_ratio is None:
            return self.warmup_steps
        return int(round(self.warmup_ratio * self.max_steps))

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TrainConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"TrainConfig: unknown keys {unknown}; valid keys: {sorted(known)}")
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> TrainConfig:
        return cls.from_dict(json.loads(text))


# Set by the command that starts a run (its output folder, resume and launch options), not by a config file.
RUNTIME_FIELDS = ("output_dir", "resume", "ds_config", "tensorboard", "progress")


def _kind(f: Any) -> str:
    """The value kind of a TrainConfig field from its annotation (a string under postponed evaluation)."""
    t = str(f.type)
    for kind in ("bool", "int", "float", "str", "tuple", "list", "dict"):
        if t.startswith(kind):
            return kind
    raise TypeError(f"TrainConfig.{f.name}: no value kind for {t!r}")


def _check_value(f: Any, v: Any) -> None:
    """ValueError naming the setting when ``v`` is not a valid value of field ``f``."""
    kind, rule, choices = _kind(f), f.metadata.get("rule"), f.metadata.get("choices")
    if v is None and "None" in str(f.type):
        return
    if kind == "bool" and not isinstance(v, bool):
        raise ValueError(f"{f.name} must be true or false, got {v!r}")
    if kind in ("int", "float"):
        ok = isinstance(v, int | float) and not isinstance(v, bool) and (kind == "float" or isinstance(v, int))
        what = "an integer" if kind == "int" else "a number"
        cond = f" {rule.text.removeprefix('must be ')}" if rule else ""
        if not ok:
            raise ValueError(f"{f.name} must be {what}{cond}, got {v!r}")
        if rule and not rule.check(v):
            raise ValueError(f"{f.name} {rule.text}, got {v!r}")
    if kind == "tuple" and (len(v) != 2 or not all(isinstance(b, int | float) and not isinstance(b, bool)
                                                    and (rule is None or rule.check(b)) for b in v)):
        raise ValueError(f"{f.name} must be two numbers{' ' + rule.text.removeprefix('must be ') if rule else ''}, "
                         f"got {list(v)!r}")
    if kind == "str" and choices and v not in choices:
        raise ValueError(f"{f.name}={v!r}; valid: {', '.join(choices)}")
    if f.name == "profile_steps" and (not isinstance(v, list | tuple) or len(v) != 2 or not 1 <= v[0] <= v[1]):
        raise ValueError(f"profile_steps must be [first, last] with 1 <= first <= last, got {v!r}")


def _flag(f: Any) -> str:
    """The option a user types for field ``f``: its own name (``--dense-updates``), else the field's; a bool
    field also answers to ``--no-<name>`` (``add_train_flags``)."""
    if f.metadata.get("flag"):
        return f.metadata["flag"]
    return f"--{f.name.replace('_', '-')}"


def add_train_flags(group: Any, names: Sequence[str], defaults: TrainConfig,
                    notes: dict[str, str] | None = None, source: str | None = None) -> None:
    """Add a flag for each TrainConfig field in ``names`` to the argparse ``group``: its help, checks and
    metavar come from the field, the default shown from the stage's ``defaults``. A flag not given leaves
    None in its dest (the field's name), so ``train_overrides`` takes only what the user typed; a bool
    flag switches the stage's default (``--compile``, ``--no-tensorboard``, ``--dense-updates``). ``source``:
    where a flag not given takes its value from first (a config file's section), named in the help.

    A bool field gets both spellings, ``--packing`` and ``--no-packing``, so the command line can turn it
    either way whatever the stage's default or the config file says; a field with a name of its own
    (``--dense-updates`` for ``sparse_updates``) keeps that one switch."""
    by_name = {f.name: f for f in fields(TrainConfig)}
    for name in names:
        f = by_name[name]
        default = getattr(defaults, name)
        help_ = f.metadata["help"]
        kind = _kind(f)
        note = f"; {notes[name]}" if notes and name in notes else ""
        if kind == "bool":
            own = f.metadata.get("flag")  # a switch named for the other state (--dense-updates) only turns it over
            state = ("on; this flag turns it off" if default else "off") if own else ("on" if default else "off")
            if source:
                state = f"{source}.{name}, else {state}"
            action: dict[str, Any] = ({"action": "store_const", "const": not default} if own
                                      else {"action": argparse.BooleanOptionalAction})
            group.add_argument(_flag(f), dest=name, default=None, help=f"{help_} (default: {state}{note})", **action)
            continue
        shown = ":".join(map(str, default)) if name == "profile_steps" and default else (
            " ".join(map(str, default)) if isinstance(default, tuple) else default)
        if source:
            shown = f"{source}.{name}, else {'off' if shown is None else shown}"
        said = f" (default: {shown}{note})" if shown is not None else f" ({note[2:]})" if note else ""
        kw: dict[str, Any] = {"dest": name, "default": None, "help": f"{help_}{said}",
                              "metavar": f.metadata.get("metavar")}
        if f.metadata.get("choices"):
            kw["choices"] = f.metadata["choices"]
        if kind == "tuple":
            kw.update(type=float, nargs=2)
        elif name == "profile_steps":
            kw["type"] = _arg_type(parse_steps_window)
        elif kind in ("int", "float"):
            kw["type"] = int if kind == "int" else float
        group.add_argument(_flag(f), **kw)


def _arg_type(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return convert


def check_train_flags(parser: Any, args: Any, names: Sequence[str]) -> None:
    """``parser.error`` (one line) for a given flag whose value breaks its field's rule."""
    by_name = {f.name: f for f in fields(TrainConfig)}
    for name in names:
        v, f = getattr(args, name, None), by_name[name]
        rule = f.metadata.get("rule")
        for x in (v if isinstance(v, list | tuple) else [v]):
            if rule is not None and isinstance(x, int | float) and not isinstance(x, bool) and not rule.check(x):
                parser.error(f"{_flag(f)} {x}: {rule.text}")


def train_overrides(args: Any, names: Sequence[str]) -> dict[str, Any]:
    """The TrainConfig fields among ``names`` that the command line gave (``add_train_flags``' dests)."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


# Where a DeepSpeed JSON sets a TrainConfig field (the first path present wins). resolve_ds_config folds
# them into the config; pre-training's settings report reads them to name each value's source.
DS_PATHS: dict[str, tuple[tuple[str, ...], ...]] = {
    "lr": (("scheduler", "params", "warmup_max_lr"), ("optimizer", "params", "lr")),
    "betas": (("optimizer", "params", "betas"),),
    "eps": (("optimizer", "params", "eps"),),
    "weight_decay": (("optimizer", "params", "weight_decay"),),
    "warmup_steps": (("scheduler", "params", "warmup_num_steps"),),
    "decay_steps": (("scheduler", "params", "total_num_steps"),),
    "max_grad_norm": (("gradient_clipping",),),
}


def ds_settings(ds: dict[str, Any] | None) -> dict[str, Any]:
    """The TrainConfig values a DeepSpeed JSON sets (DS_PATHS; "auto" sets nothing)."""
    out: dict[str, Any] = {}
    kinds = {f.name: _kind(f) for f in fields(TrainConfig)}
    for name, paths in DS_PATHS.items():
        for path in paths:
            node: Any = ds or {}
            for key in path:
                node = node.get(key) if isinstance(node, dict) else None
            if node is not None and node != "auto":
                kind = kinds[name]
                out[name] = (tuple(float(b) for b in node) if kind == "tuple"
                             else int(node) if kind == "int" else float(node))
                break
    return out


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
    cfg = resolve_warmup(copy.deepcopy(cfg))
    if global_batch is not None:
        _keep_global_batch(ds, cfg, world_size, global_batch, source)
    tbs, mbs, gas = (None if ds.get(k) in _AUTO else int(ds[k])
                     for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"))

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
    if opt is not None and str(opt.get("type", "")).lower() not in ("adam", "adamw"):
        raise DsConfigError(
            f"{source}: optimizer type {opt.get('type')!r} is not supported; SkillNet always uses its "
            f"sparse-update AdamW (training/optim.py) and reads lr/betas/eps/weight_decay from an "
            f"'Adam' or 'AdamW' section."
        )
    sch = ds.pop("scheduler", None)
    if sch is not None:
        typ, p = sch.get("type"), sch.get("params", {})
        if typ not in ("WarmupDecayLR", "WarmupLR"):
            raise DsConfigError(f"{source}: scheduler {typ!r} not supported (use WarmupDecayLR or WarmupLR).")
        if typ == "WarmupDecayLR" and p.get("total_num_steps") in _AUTO:
            raise DsConfigError(f"{source}: scheduler WarmupDecayLR needs params.total_num_steps (the step at "
                                f"which the decay reaches 0)")
        if p.get("warmup_type", "linear") != "linear":
            raise DsConfigError(
                f"{source}: only warmup_type 'linear' is supported, got {p.get('warmup_type')!r}"
            )
        cfg.schedule = "linear" if typ == "WarmupDecayLR" else "constant"
    found = ds_settings({"optimizer": opt, "scheduler": sch, "gradient_clipping": ds.get("gradient_clipping")})
    if sch is not None and sch.get("type") == "WarmupLR":
        found.pop("decay_steps", None)  # a constant schedule has no decay end
    for name, value in found.items():
        setattr(cfg, name, value)
    if "warmup_steps" in found:
        cfg.warmup_ratio = None  # the JSON is the single source for what it defines
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


def resolve_warmup(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with ``warmup_ratio`` turned into ``warmup_steps`` of its ``max_steps`` (in place): what the
    trainer, its schedule and a resume's schedule check read."""
    if cfg.warmup_ratio is not None:
        cfg.warmup_steps, cfg.warmup_ratio = cfg.resolved_warmup(), None
    return cfg


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
    warm = max(0, cfg.resolved_warmup())
    total = cfg.decay_steps if cfg.decay_steps is not None else cfg.max_steps
    constant = cfg.schedule == "constant"

    def f(s: int) -> float:
        if warm and s < warm:
            return (s + 1) / warm
        if constant:
            return 1.0
        return max(0.0, (total - s) / max(1, total - warm))

    return f
