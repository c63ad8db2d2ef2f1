"""Sparse-update AdamW: elements whose gradient is exactly zero are left untouched.

Why this exists: SkillNet activates a subset of skill FFNs per step. In plain PyTorch an unused
parameter has ``grad is None`` and ``torch.optim.AdamW`` skips it. DeepSpeed ZeRO-1/2 instead
flattens all parameters into one partition per rank, zero-fills the gradients of unused
parameters and steps the whole partition, so Adam momentum (and decoupled weight decay) keeps
moving skills that did not take part in the step. ``MaskedAdamW`` makes the update element-wise
lazy: where ``grad == 0`` exactly, the parameter, ``exp_avg`` and ``exp_avg_sq`` stay bit-identical.
That gives the same semantics for a standalone tensor (plain PyTorch, ``None`` grads skipped) and
for a slice of a ZeRO flat partition, so pre-training and fine-tuning share one mechanism.

Semantic consequences (documented in docs/pretrain.md):
  * lazy Adam: embedding rows of tokens absent from a step also stay untouched (as TF's LazyAdam);
  * an element whose true gradient underflows to exactly 0.0 (e.g. a dead ReLU unit) is frozen
    for that step instead of coasting on its momentum;
  * bias correction uses the optimizer's global step count (one per ``step()`` call, stored in the
    param group), not a per-element count: a per-element counter would cost another full fp32 state
    tensor, and the global count is what keeps plain and ZeRO runs identical.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["MaskedAdamW", "build_param_groups"]


class MaskedAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay) that skips elements with an exactly-zero gradient.

    Arguments follow ``torch.optim.AdamW``. ``masked=False`` gives a standard dense AdamW with the
    same global-step bias correction (useful as a control in tests and benchmarks).
    """

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        masked: bool = True,
        chunk_size: int = 1 << 14,
    ) -> None:
        if lr < 0.0:
            raise ValueError(f"MaskedAdamW: invalid learning rate {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"MaskedAdamW: betas must be in [0, 1), got {betas}")
        if eps < 0.0:
            raise ValueError(f"MaskedAdamW: invalid eps {eps}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, masked=masked, step=0)
        super().__init__(params, defaults)
        self.chunk_size = chunk_size

    @torch.no_grad()
    def step(self, closure: Callable[[], torch.Tensor] | None = None) -> torch.Tensor | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            group["step"] = int(group.get("step", 0)) + 1
            t = group["step"]
            beta1, beta2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            bc2_sqrt = math.sqrt(1.0 - beta2**t)
            step_size = lr / (1.0 - beta1**t)
            dense: tuple[list[torch.Tensor], ...] = ([], [], [], [])  # fused-kernel views: p, g, m, v
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise RuntimeError("MaskedAdamW does not support sparse gradients")
                if grad.dtype != p.dtype:
                    grad = grad.to(p.dtype)
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                m, v = state["exp_avg"], state["exp_avg_sq"]
                if not group["masked"]:
                    _add_dense(dense, p, grad, m, v)
                    continue
                if not (
                    p.is_contiguous() and grad.is_contiguous() and m.is_contiguous() and v.is_contiguous()
                ):
                    _masked_update(p, grad, m, v, beta1, beta2, step_size, bc2_sqrt, eps, lr * wd)
                    continue
                # Classify fixed-size chunks of the flat tensor: all-zero chunks (inactive skills, also inside
                # a ZeRO flat partition) are skipped, all-nonzero chunks go to the fused AdamW kernel, and
                # only mixed chunks (e.g. embedding rows of absent tokens) pay for element-wise masking.
                p1, g1, m1, v1 = p.view(-1), grad.view(-1), m.view(-1), v.view(-1)
                n_nz = int(torch.count_nonzero(g1))  # one cheap pass settles the common all/nothing cases
                if n_nz == g1.numel():
                    _add_dense(dense, p, grad, m, v)
                    continue
                if n_nz == 0:
                    continue
                nz = g1.ne(0)
                for kind, a, b in _chunk_runs(nz, self.chunk_size):
                    if kind == "dense":
                        _add_dense(dense, p1[a:b], g1[a:b], m1[a:b], v1[a:b])
                    elif kind == "mixed":
                        _masked_update(
                            p1[a:b],
                            g1[a:b],
                            m1[a:b],
                            v1[a:b],
                            beta1,
                            beta2,
                            step_size,
                            bc2_sqrt,
                            eps,
                            lr * wd,
                            mask=nz[a:b].to(p.dtype),
                        )
            if dense[0]:
                _fused_or_reference(dense, t, lr, beta1, beta2, wd, eps)
        return loss

    @torch.no_grad()
    def init_state(self) -> None:
        """Create the moments of every parameter now instead of at its first step.

        DeepSpeed ZeRO-1/2 steps one param group at a time and links its per-parameter views of the
        optimizer state (``safe_get_full_optimizer_state``, universal checkpoints) right after the first
        group's first step, when later groups would still have no state. Call after
        ``deepspeed.initialize`` (the groups then hold the flat fp32 partitions).
        """
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state[p]
                if len(state) == 0:
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)

    # ZeRO's checkpoint loader restores param_groups from the saved state, which carries "step".
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group.setdefault("step", 0)
            group.setdefault("masked", True)


def _chunk_runs(nz: torch.Tensor, chunk: int) -> list[tuple[str, int, int]]:
    """Runs of consecutive chunks of one kind ("zero" | "dense" | "mixed") as (kind, start, end)."""
    n = nz.numel()
    full = n // chunk
    counts: list[int] = (
        torch.count_nonzero(nz[: full * chunk].view(full, chunk), dim=1).tolist() if full else []
    )
    bounds = [(i * chunk, (i + 1) * chunk) for i in range(full)]
    if n > full * chunk:
        counts.append(int(nz[full * chunk :].sum()))
        bounds.append((full * chunk, n))
    runs: list[tuple[str, int, int]] = []
    for c, (a, b) in zip(counts, bounds):
        kind = "zero" if c == 0 else ("dense" if c == b - a else "mixed")
        if runs and runs[-1][0] == kind:
            runs[-1] = (kind, runs[-1][1], b)
        else:
            runs.append((kind, a, b))
    return runs


def _add_dense(lists: tuple[list[torch.Tensor], ...], *tensors: torch.Tensor) -> None:
    for lst, x in zip(lists, tensors):
        lst.append(x)


_HAS_FUSED = hasattr(torch, "_fused_adamw_")


def _fused_or_reference(
    lists: tuple[list[torch.Tensor], ...],
    t: int,
    lr: float,
    beta1: float,
    beta2: float,
    wd: float,
    eps: float,
) -> None:
    """Standard AdamW on every element of the views (torch's fused kernel when available)."""
    ps, gs, ms, vs = lists
    if _HAS_FUSED and all(x.device.type == ps[0].device.type and x.dtype == ps[0].dtype for x in ps):
        try:
            step_t = torch.tensor(float(t), device=ps[0].device)
            torch._fused_adamw_(
                ps,
                gs,
                ms,
                vs,
                [],
                [step_t] * len(ps),
                lr=lr,
                beta1=beta1,
                beta2=beta2,
                weight_decay=wd,
                eps=eps,
                amsgrad=False,
                maximize=False,
            )
            return
        except (RuntimeError, NotImplementedError):
            pass  # dtype/device the fused kernel does not cover: element-wise below
    bc2_sqrt = math.sqrt(1.0 - beta2**t)
    step_size = lr / (1.0 - beta1**t)
    for p, g, m, v in zip(ps, gs, ms, vs):
        m.lerp_(g, 1.0 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1.0 - beta2)
        if wd != 0.0:
            p.mul_(1.0 - lr * wd)
        p.addcdiv_(m, (v.sqrt() / bc2_sqrt).add_(eps), value=-step_size)


def _masked_update(
    p: torch.Tensor,
    grad: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    beta1: float,
    beta2: float,
    step_size: float,
    bc2_sqrt: float,
    eps: float,
    lr_wd: float,
    mask: torch.Tensor | None = None,
) -> None:
    # mask is 1.0 where the element took part in the step. lerp/addcmul with a weight of exactly 0.0
    # return their input unchanged, so untouched elements stay bit-identical.
    if mask is None:
        mask = grad.ne(0).to(p.dtype)
    m.lerp_(grad, mask * (1.0 - beta1))
    v.lerp_(grad * grad, mask * (1.0 - beta2))
    if lr_wd != 0.0:
        p.addcmul_(p, mask, value=-lr_wd)
    denom = (v.sqrt() / bc2_sqrt).add_(eps)
    p.addcdiv_(m * mask, denom, value=-step_size)


def build_param_groups(
    model: torch.nn.Module, weight_decay: float, own_lr: dict[str, float] | None = None
) -> list[dict[str, Any]]:
    """Two groups as in BERT: no weight decay on biases and LayerNorm weights.

    own_lr: {name fragment: lr}: parameters whose name contains the fragment get a group of their own
    with that peak learning rate and no weight decay (e.g. a learned task-skill map, which needs a far
    larger step than the encoder to move within a fine-tuning run). The schedule scales it like the rest.
    """
    decay, no_decay = [], []
    own: dict[str, list[torch.nn.Parameter]] = {frag: [] for frag in own_lr or {}}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        frag = next((f for f in own if f in name), None)
        if frag is not None:
            own[frag].append(p)
        elif p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name or name.endswith(".bias"):
            no_decay.append(p)
        else:
            decay.append(p)
    groups = []
    if decay:
        groups.append({"params": decay, "weight_decay": weight_decay})
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    for frag, params in own.items():
        if params:
            groups.append({"params": params, "weight_decay": 0.0, "lr": own_lr[frag]})
    return groups
