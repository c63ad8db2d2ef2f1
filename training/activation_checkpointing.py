"""Activation checkpointing of a run: whether it is on, from where, and turning it on in a model.

It is on when the command line says ``--gradient-checkpointing`` or the DeepSpeed JSON has an
``activation_checkpointing`` section (the JSON is the single source for what it defines, as for the batch
sizes). The model checkpoints each transformer layer with torch's non-reentrant checkpoint, through HF's
``activation_checkpointing_enable`` (the model code never imports DeepSpeed). Of the JSON section's options
only ``cpu_checkpointing`` has a counterpart there (HF's ``offload``: the kept layer inputs wait in host
memory); the others configure DeepSpeed's own checkpoint function for model-parallel ranks, which a
SkillNet model does not run, so a JSON that turns one of them on is refused rather than ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from .config import DsConfigError

__all__ = ["ActivationCheckpointing", "resolve_activation_checkpointing", "enable_activation_checkpointing"]

SECTION = "activation_checkpointing"
# Options of DeepSpeed's own checkpoint function (deepspeed.checkpointing) with no meaning for torch's.
_DEEPSPEED_ONLY = ("partition_activations", "contiguous_memory_optimization", "synchronize_checkpoint_boundary",
                   "profile")


@dataclass(frozen=True)
class ActivationCheckpointing:
    enabled: bool = False
    offload: bool = False  # the JSON's cpu_checkpointing
    source: str = "default"  # "flag" | "ds_config" | "config" | "default"

    def describe(self) -> str:
        if not self.enabled:
            return f"activation checkpointing off [{self.source}]"
        where = ""
        if self.offload:
            where = (", kept inputs offloaded to host memory" if torch.accelerator.is_available()
                     else " (cpu_checkpointing: nothing to offload without an accelerator)")
        return f"activation checkpointing on: every layer recomputed in the backward pass{where} [{self.source}]"

    def to_json(self) -> dict[str, Any]:
        return {"value": self.enabled, "offload": self.offload, "source": self.source}


def resolve_activation_checkpointing(flag: bool | None, ds: dict[str, Any] | None,
                                     ds_source: str = "<ds_config>", flag_source: str = "flag"
                                     ) -> ActivationCheckpointing:
    """On when ``flag`` is true or the DeepSpeed JSON ``ds`` has the section. Raises DsConfigError for an
    option of the section that only DeepSpeed's own checkpoint function implements."""
    section = (ds or {}).get(SECTION)
    if section is None:
        return ActivationCheckpointing(bool(flag), False, flag_source if flag else "default")
    if not isinstance(section, dict):
        raise DsConfigError(f"{ds_source}: '{SECTION}' must be an object, got {section!r}")
    on = [k for k in _DEEPSPEED_ONLY if section.get(k)]
    if on:
        raise DsConfigError(
            f"{ds_source}: {SECTION}.{', '.join(on)} configure DeepSpeed's own checkpoint function (model-parallel "
            f"ranks), which SkillNet does not use: each layer is checkpointed with torch.utils.checkpoint. Remove "
            f"them; cpu_checkpointing is the option that applies."
        )
    return ActivationCheckpointing(True, bool(section.get("cpu_checkpointing", False)), "ds_config")


def enable_activation_checkpointing(model: torch.nn.Module, setting: ActivationCheckpointing) -> None:
    """Checkpoint every layer of ``model`` (a SkillNet-BERT or -BART PreTrainedModel) as ``setting`` says."""
    if not setting.enabled:
        return
    # Without an accelerator the activations already live in host memory: nothing to offload (and HF's
    # offload pins memory, which needs one).
    offload = setting.offload and torch.accelerator.is_available()
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False}, offload=offload)
