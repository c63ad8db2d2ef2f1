"""Task extras: what a task adds beside the shared layers, the second method seam.

A `TaskExtras` module holds one sub-module per task (only that task's rows use it): task heads are one
kind, projected attention layers another. The backbone builds the extras its config asks for
from `EXTRAS` (the registry name is the module's attribute name, so checkpoints keep their parameter
names), gives every layer the extras' hook, and counts (counts.py) charge each task with its own
extras' parameters. Adding a kind of extra is one subclass and one `register_extras` line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

# (layer index, the layer's input [B, T, D]) -> what the extra adds inside the layer's FFN residual, or None
LayerHook = Callable[[int, torch.Tensor], "torch.Tensor | None"]

# name -> (config -> the module, or None when the config does not ask for it)
EXTRAS: dict[str, Callable[[Any], nn.Module | None]] = {}


def register_extras(name: str) -> Callable[[type], type]:
    """Class decorator for a `TaskExtras` module with a ``from_config(config)`` class method; the backbone
    holds it as attribute `name`."""

    def add(cls: type) -> type:
        EXTRAS[name] = cls.from_config
        return cls

    return add


class TaskExtras:
    """Mixed into an ``nn.Module`` that holds per-task parameters."""

    # Why a task with these extras has no stock transformers form (export/flatten.py refuses it with this).
    plain_refusal = "it adds per-task modules beside the shared layers, which a stock BERT has no place for"

    def task_modules(self) -> dict[str, nn.Module]:
        """{task: the module only that task's rows use}."""
        raise NotImplementedError

    def add_task(self, task: str, *args: Any) -> nn.Module:
        """Build (freshly initialised) the new task's module and return it."""
        raise NotImplementedError

    def layer_hook(self, task: str | Sequence[str] | None, mask_B11T: torch.Tensor | None,
                   device: torch.device | str) -> LayerHook | None:
        """What each layer of a forward of `task` (one per row, or None) adds; None: nothing."""
        return None


def build_extras(config: Any) -> dict[str, nn.Module]:
    out = {}
    for name, build in EXTRAS.items():
        module = build(config)
        if module is not None:
            out[name] = module
    return out


def combine_hooks(hooks: Sequence[LayerHook]) -> LayerHook | None:
    """One hook adding up what every extra adds (None when no extra adds anything)."""
    if not hooks:
        return None
    if len(hooks) == 1:
        return hooks[0]

    def hook(layer: int, h_BTD: torch.Tensor) -> torch.Tensor | None:
        out = None
        for f in hooks:
            y = f(layer, h_BTD)
            if y is not None:
                out = y if out is None else out + y
        return out

    return hook


def task_owners(model: nn.Module) -> dict[int, str]:
    """id(parameter) -> the task whose extras hold it, over every `TaskExtras` module of `model`."""
    owners: dict[int, str] = {}
    for m in model.modules():
        if isinstance(m, TaskExtras):
            for task, sub in m.task_modules().items():
                for p in sub.parameters():
                    owners[id(p)] = task
    return owners
