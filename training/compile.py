"""``--compile``: torch.compile the repeated blocks of a model in place."""

from __future__ import annotations

from torch import nn

__all__ = ["compile_blocks"]


def compile_blocks(model: nn.Module, backend: str = "inductor") -> int:
    """torch.compile every block of every ``nn.ModuleList`` in ``model`` (BERT's ``encoder.layer``, BART's
    encoder and decoder ``layers``), in place: the parameter names, hence checkpoints and exports, do not
    change. A block that names its ``compile_targets()`` has only those compiled: SkillNet-BERT's layers
    compile their attention (projections, attention, output dense, dropout + residual + LayerNorm), which
    takes no skill routing, so one graph serves every objective and skill set; the skill FFN runs its own
    fused kernels. Shapes are dynamic from the first compile (packed batches change their row count every
    step), so a shape family (padded or packed rows) compiles once; blocks of one class share their compiled
    code. Returns the number of modules compiled."""
    chosen: list[str] = []
    compiled = 0
    for name, mod in model.named_modules():  # parents first: a block's own lists (its skills) stay inside it
        if not isinstance(mod, nn.ModuleList) or any(name.startswith(c + ".") for c in chosen):
            continue
        for i, block in enumerate(mod):
            if not isinstance(block, nn.ModuleList):
                targets = block.compile_targets() if hasattr(block, "compile_targets") else [block]
                for target in targets:
                    target.compile(backend=backend, dynamic=True)
                    compiled += 1
                chosen.append(f"{name}.{i}")
    return compiled
