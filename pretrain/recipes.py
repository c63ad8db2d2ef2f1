"""Named pre-training recipes, and the effective settings of a run with where each one came from.

A setting comes from, in this order:

1. a command-line flag the user gave (a flag that contradicts the DeepSpeed JSON is an error: the JSON
   is the single source for what it defines, as for batch sizes; except ``--max-steps``, which may stop
   before or after the JSON scheduler's ``total_num_steps``: the decay still ends there);
2. the DeepSpeed JSON (``optimizer`` / ``scheduler`` sections, ``gradient_clipping``);
3. the recipe (``--recipe paper``), usable with any ZeRO config;
4. the built-in default.

``pretrain/run.py`` prints the result at start, so a run never trains on defaults without a word.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skillnet.training.config import TrainConfig, ds_settings

__all__ = ["DEFAULTS", "PRETRAIN_DEFAULTS", "TRAIN_SETTINGS", "RECIPES", "Recipe", "Setting", "resolve_settings", "ds_config_settings", "describe",
           "describe_checkpoint"]

# Pre-training's training settings: the one TrainConfig with this stage's defaults (packed rows; a rerun
# in the same --output-dir continues it).
PRETRAIN_DEFAULTS = TrainConfig(output_dir="runs/pretrain", resume="auto", packing=True)
# The settings whose source the start log names (a flag > the DeepSpeed JSON > --recipe > the default).
TRAIN_SETTINGS = ("max_steps", "lr", "betas", "eps", "weight_decay", "warmup_steps", "max_grad_norm")
DEFAULTS: dict[str, Any] = {
    "preset": "tiny",
    "max_seq_len": 128,
    **{name: getattr(PRETRAIN_DEFAULTS, name) for name in TRAIN_SETTINGS},
}


@dataclass(frozen=True)
class Recipe:
    name: str
    reference: str
    settings: dict[str, Any]
    # For information only: batch geometry belongs to the DeepSpeed JSON and the launch.
    global_batch: int | None = None


RECIPES: dict[str, Recipe] = {
    "paper": Recipe(
        name="paper",
        reference="SkillNet-NLU Appendix B: BERT-base, 100k steps, max length 512, Adam (0.9, 0.98), eps 1e-6, "
        "lr warmed up over 10k steps to 3e-5 then linearly decayed; weight decay 0.01 is BERT's (not stated)",
        settings={
            "preset": "base",
            "max_seq_len": 512,
            "max_steps": 100_000,
            "lr": 3e-5,
            "betas": (0.9, 0.98),
            "eps": 1e-6,
            "weight_decay": 0.01,
            "warmup_steps": 10_000,
        },
        global_batch=10_240,
    ),
}

# Settings the JSON only gives a default for: a flag may differ from it.
_DS_DEFAULT_ONLY = frozenset({"max_steps"})


@dataclass
class Setting:
    value: Any
    source: str  # "flag" | "ds_config" | "recipe <name>" | "default"

    def to_json(self) -> dict[str, Any]:
        return {
            "value": list(self.value) if isinstance(self.value, tuple) else self.value,
            "source": self.source,
        }


@dataclass
class ResolvedSettings:
    values: dict[str, Setting] = field(default_factory=dict)
    recipe: Recipe | None = None

    def __getitem__(self, name: str) -> Any:
        return self.values[name].value

    def to_json(self) -> dict[str, Any]:
        return {k: s.to_json() for k, s in self.values.items()}


def _normalise(name: str, value: Any) -> Any:
    if name == "betas":
        return tuple(float(b) for b in value)
    return type(DEFAULTS[name])(value)


def ds_config_settings(ds: dict[str, Any] | None) -> dict[str, Any]:
    """The settings of DEFAULTS that a DeepSpeed JSON defines (training.config.DS_PATHS), with their values;
    its scheduler's decay end is the default run length."""
    found = ds_settings(ds)
    if "decay_steps" in found:
        found["max_steps"] = found.pop("decay_steps")
    return {name: value for name, value in found.items() if name in DEFAULTS}


def resolve_settings(
    flags: dict[str, Any], ds: dict[str, Any] | None, recipe: str | None, ds_source: str = "<ds_config>",
    model_from: str | None = None,
) -> ResolvedSettings:
    """Effective value and source of every setting in DEFAULTS.

    ``flags`` maps setting names to what the user gave on the command line (None = not given).
    ``model_from``: the checkpoint the model starts from (``--init-from-dense``), whose config.json gives
    the model's shape: no preset applies then, and ``preset`` is None with that checkpoint as its source.
    Raises ValueError for an unknown recipe or a flag that contradicts the DeepSpeed JSON.
    """
    if recipe is not None and recipe not in RECIPES:
        raise ValueError(f"--recipe {recipe!r}: unknown recipe; valid recipes: {', '.join(sorted(RECIPES))}")
    rec = RECIPES[recipe] if recipe else None
    from_ds = ds_config_settings(ds)
    out = ResolvedSettings(recipe=rec)
    for name, default in DEFAULTS.items():
        flag = flags.get(name)
        if name == "preset" and model_from is not None:
            unused = f"; --preset {flag} not used" if flag is not None else ""
            out.values[name] = Setting(None, f"--init-from-dense {model_from}{unused}")
        elif flag is not None:
            flag = _normalise(name, flag)
            if name in from_ds and from_ds[name] != flag and name not in _DS_DEFAULT_ONLY:
                raise ValueError(
                    f"{ds_source}: sets {name}={_fmt(from_ds[name])} but the command line asks for "
                    f"--{name} {_fmt(flag)}. The JSON is the single source for what it defines: drop the flag "
                    f"or edit the JSON."
                )
            out.values[name] = Setting(flag, "flag")
        elif name in from_ds:
            out.values[name] = Setting(from_ds[name], "ds_config")
        elif rec is not None and name in rec.settings:
            out.values[name] = Setting(rec.settings[name], f"recipe {rec.name}")
        else:
            out.values[name] = Setting(default, "default")
    return out


def describe_checkpoint(folder: str) -> str:
    """The start log's words for a model that starts from the checkpoint `folder`: its shape, as its
    config.json gives it (BERT's or BART's field names)."""
    try:
        cfg = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"checkpoint {folder}"  # unreadable here: loading the model reports it
    hidden = cfg.get("hidden_size", cfg.get("d_model"))
    layers = cfg.get("num_hidden_layers", cfg.get("encoder_layers"))
    decoder = f" + {cfg['decoder_layers']} decoder" if cfg.get("decoder_layers") is not None else ""
    return (f"checkpoint {folder} ({cfg.get('model_type')}): hidden {hidden}, {layers}{decoder} layers, "
            f"{cfg.get('max_position_embeddings')} positions, vocab {cfg.get('vocab_size')}")


def _fmt(v: Any) -> str:
    return f"({', '.join(map(str, v))})" if isinstance(v, tuple) else str(v)


def describe(
    s: ResolvedSettings,
    *,
    schedule: str,
    decay_steps: int | None,
    decay_source: str,
    sparse_updates: bool,
    micro_batch_size: int,
    grad_accum: int,
    world_size: int,
    batch_sources: tuple[str, str],
    ds_config: str | None,
    mode: str | None = None,
    memory: str | None = None,
    model: str | None = None,
) -> list[str]:
    """The start log: effective optimizer, schedule, sequence length, steps and batch, with sources;
    `mode` (what is trained: architecture, objectives) and `memory` (activation checkpointing) as their
    own lines; `model`: what the model is when no preset gives it (`describe_checkpoint`)."""

    def v(name: str, unit: str = "") -> str:
        return f"{_fmt(s[name])}{unit} [{s.values[name].source}]"

    lines = [f"[pretrain] settings [source]; DeepSpeed JSON: {ds_config or 'none (plain PyTorch)'}"]
    if s.recipe is not None:
        lines.append(f"  recipe     {s.recipe.name}: {s.recipe.reference}")
    kind = "sparse updates" if sparse_updates else "dense AdamW semantics"
    lines.append(
        f"  optimizer  MaskedAdamW ({kind}): lr {v('lr')}, betas {v('betas')}, eps {v('eps')}, "
        f"weight_decay {v('weight_decay')}, grad clip {v('max_grad_norm')}"
    )
    end = decay_steps if decay_steps is not None else s["max_steps"]
    after = "constant" if schedule == "constant" else f"linear decay to 0 at step {end} [{decay_source}]"
    lines.append(f"  schedule   linear warmup {v('warmup_steps', ' steps')}, then {after}")
    lines.append(f"  sequence   {v('max_seq_len', ' tokens')}")
    lines.append(f"  steps      {v('max_steps')}")
    glob = micro_batch_size * grad_accum * world_size
    batch = (
        f"  batch      global {glob} = {micro_batch_size} micro [{batch_sources[0]}] x {grad_accum} accumulation "
        f"[{batch_sources[1]}] x {world_size} ranks"
    )
    if s.recipe is not None and s.recipe.global_batch and s.recipe.global_batch != glob:
        batch += f" (recipe {s.recipe.name} was trained with {s.recipe.global_batch}; set it in the JSON)"
    lines.append(batch)
    if s["preset"] is None:  # a checkpoint gives the model's shape (resolve_settings' model_from)
        lines.append(f"  model      {model or 'checkpoint'} [{s.values['preset'].source}]")
    else:
        lines.append(f"  model      preset {v('preset')}")
    if mode:
        lines.append(f"  mode       {mode}")
    if memory:
        lines.append(f"  memory     {memory}")
    if s["warmup_steps"] >= s["max_steps"]:
        lines.append(
            f"  warning: warmup_steps {s['warmup_steps']} >= max_steps {s['max_steps']}: the learning rate "
            f"never reaches its peak {s['lr']}"
        )
    return lines
