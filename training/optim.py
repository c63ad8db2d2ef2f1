"""Sparse-update AdamW: elements whose gradient is exactly zero are left untouched.

Why this exists: SkillNet activates a subset of skill FFNs per step. In plain PyTorch an unused
parameter has ``grad is None`` and ``torch.optim.AdamW`` skips it. DeepSpeed ZeRO-1/2 instead
flattens all parameters into one partition per rank, zero-fills the gradients of unused
parameters and steps the whole partition, so Adam momentum (and decoupled weight decay) keeps
moving skills that did not take part in the step. ``MaskedAdamW`` makes the update element-wise
lazy: where ``grad == 0`` exactly, the parameter, ``exp_avg`` and ``exp_avg_sq`` stay bit-identical.
That gives the same semantics for a standalone tensor (plain PyTorch, ``None`` grads skipped) and
for a slice of a ZeRO flat partition, so pre-training and fine-tuning share one mechanism.

Semantic consequences (documented in docs/training.md):
  * lazy Adam: embedding rows of tokens absent from a step also stay untouched (as TF's LazyAdam);
  * an element whose true gradient underflows to exactly 0.0 (e.g. a dead ReLU unit) is frozen
    for that step instead of coasting on its momentum;
  * bias correction uses the global step count, not a per-element count (which would cost another
    full fp32 state tensor). Each parameter tensor counts the ``step()`` calls that listed it in its
    group (``state["step"]``, an int, as torch's Adam keeps it), with or without a gradient. Every
    layout lists a tensor once per optimizer step, so that count is the global step everywhere: plain
    PyTorch lists every parameter in each call; ZeRO-1/2 call ``step()`` once per param group, which
    holds one flat partition; ZeRO-3 calls it once per sub-group, with that sub-group's flat tensor as
    the only entry of its group and every other group emptied. (A count per param group, bumped on
    every call, counted ZeRO-3 steps once per sub-group.) ``group["step"]`` mirrors the count for
    logs and DeepSpeed's ZeRO-1/2 checkpoints.

Speed (bench/optim.py): one ``count_nonzero`` pass per tensor (per 1M-element slab of a large one)
settles the common cases: all-nonzero -> torch's fused AdamW kernel, all-zero -> skipped. Only a slab
with both is bisected (``count_nonzero`` of halves) down to ``chunk_size`` chunks, and only the nonzero
elements of a chunk with both are gathered, stepped by the same fused kernel and scattered back. Every
updated element of a contiguous tensor therefore goes through the same AdamW kernel, whatever the
layout. The check is the cost on CPU: ``count_nonzero`` reads each gradient once, which takes ~45% of
the time of the fused step itself.

On a GPU that count is a host read-back, which waits for every kernel queued before it (on an H100 the
bisection of an NSP step's embedding gradient cost 35x a fused AdamW). So ``impl`` picks how the zeros are
found: ``"count"`` is the path above (a host read costs nothing on a CPU); ``"device"`` never reads back:
each checked tensor is updated in one masked pass on its device, a Triton kernel on CUDA (it reads the
parameter and moments only where the gradient is nonzero and writes only there) or, without Triton, the
element-wise torch reference. ``"auto"`` (default) takes ``"device"`` for CUDA tensors and ``"count"``
otherwise. ``step(found_inf=t)`` (device impl) skips the whole update where ``t`` is nonzero without a
read-back: weights and moments stay bit-identical, the step counts go on (as under torch's GradScaler).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

try:  # the GPU kernel of the sync-free path; CPU-only installs have no Triton and use the torch reference
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None

__all__ = ["MaskedAdamW", "build_param_groups", "IMPLS"]

IMPLS = ("auto", "count", "device")

_Pending = tuple[int, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]

# A tensor longer than this many chunks is counted slab by slab: a ZeRO flat partition (hundreds of
# millions of elements, inactive skills in between) then splits only the slabs holding both kinds.
SLAB_CHUNKS = 64


class MaskedAdamW(torch.optim.Optimizer):
    """AdamW (decoupled weight decay) that skips elements with an exactly-zero gradient.

    Arguments follow ``torch.optim.AdamW``. ``masked=False`` gives a standard dense AdamW with the
    same global-step bias correction (useful as a control in tests and benchmarks). ``chunk_size``:
    granularity (elements) at which a tensor with both zero and nonzero gradients is split (``"count"``).
    ``impl``: ``"auto"``, ``"count"`` or ``"device"`` (module docstring).
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
        impl: str = "auto",
    ) -> None:
        if lr < 0.0:
            raise ValueError(f"MaskedAdamW: invalid learning rate {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"MaskedAdamW: betas must be in [0, 1), got {betas}")
        if eps < 0.0:
            raise ValueError(f"MaskedAdamW: invalid eps {eps}")
        if chunk_size < 1:
            raise ValueError(f"MaskedAdamW: chunk_size must be >= 1, got {chunk_size}")
        if impl not in IMPLS:
            raise ValueError(f"MaskedAdamW: impl must be one of {IMPLS}, got {impl!r}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay, masked=masked, step=0,
                        check_zeros=True)
        super().__init__(params, defaults)
        self.chunk_size = chunk_size
        self.impl = impl
        # A device-side guard for callers that cannot pass found_inf to step() (DeepSpeed calls it): returns a
        # float tensor, nonzero to skip the step (sync-free path only); the caller counts the skips.
        self.found_inf_fn: Callable[[], torch.Tensor | None] | None = None

    def sync_free(self, device: torch.device) -> bool:
        """Whether steps on ``device`` take the read-back-free path (and so accept ``found_inf``)."""
        return self.impl == "device" or (self.impl == "auto" and device.type == "cuda")

    def check_zeros_everywhere(self) -> None:
        """Check every group for exact-zero gradients: what ZeRO's flat partitions need, since they
        zero-fill the gradients of parameters a step did not use (plain PyTorch leaves those None)."""
        for g in self.param_groups:
            g["check_zeros"] = True

    @torch.no_grad()
    def step(  # type: ignore[override]
        self, closure: Callable[[], torch.Tensor] | None = None, found_inf: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """One AdamW step. ``found_inf``: a float tensor on the parameters' device, nonzero to leave every
        weight and moment as it is (sync-free path only; the count path would have to read it back)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if found_inf is None and self.found_inf_fn is not None:
            found_inf = self.found_inf_fn()
        for group in self.param_groups:
            if group["params"]:  # ZeRO-3 empties every group but the one whose sub-group it steps
                self._step_group(group, found_inf)
        return loss

    def _step_group(self, group: dict[str, Any], found_inf: torch.Tensor | None = None) -> None:
        beta1, beta2 = group["betas"]
        lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
        masked = group["masked"]
        slab = self.chunk_size * SLAB_CHUNKS
        work = _Work(found_inf=found_inf)
        pending: list[_Pending] = []  # (step, param, grad, exp_avg, exp_avg_sq) awaiting their counts
        counts: list[torch.Tensor] = []  # count_nonzero of each slab of each pending tensor, in order
        group_t = 0
        for p in group["params"]:
            state = self.state[p]
            t = state["step"] = int(state.get("step", 0)) + 1  # counted with or without a gradient
            group_t = max(group_t, t)
            grad = p.grad
            if grad is None:
                continue
            if grad.is_sparse:
                raise RuntimeError("MaskedAdamW does not support sparse gradients")
            if grad.dtype != p.dtype:
                grad = grad.to(p.dtype)
            if "exp_avg" not in state:
                _init_moments(state, p)
            m, v = state["exp_avg"], state["exp_avg_sq"]
            if not (p.is_contiguous() and m.is_contiguous() and v.is_contiguous()):
                # Rare (a transposed parameter): the element-wise reference, masked or not.
                step_size, bc2_sqrt = lr / (1.0 - beta1**t), _bc2_sqrt(beta2, t)
                mask = None if masked else torch.ones_like(p)
                _masked_update(p, grad, m, v, beta1, beta2, step_size, bc2_sqrt, eps, lr * wd, mask, found_inf)
                continue
            grad = grad.contiguous()
            if not masked or not group.get("check_zeros", True):
                work.add(t, p, grad, m, v)
                continue
            n = grad.numel()
            if n == 0:
                continue
            if self.sync_free(p.device):
                _masked_step_device(p, grad, m, v, t, lr, beta1, beta2, eps, wd, found_inf)
                continue
            if found_inf is not None:
                raise ValueError("MaskedAdamW: found_inf needs the sync-free path (impl='device', or a CUDA tensor)")
            if n <= slab:
                counts.append(torch.count_nonzero(grad))
            else:
                g1 = grad.view(-1)
                counts.extend(torch.count_nonzero(g1[a : a + slab]) for a in range(0, n, slab))
            pending.append((t, p, grad, m, v))
        group["step"] = group_t
        if pending:
            self._add_counted(work, pending, torch.stack(counts).tolist())  # one host read (GPU: one sync)
        work.run(lr, beta1, beta2, wd, eps)

    def _add_counted(self, work: _Work, pending: list[_Pending], counts: list[int]) -> None:
        """Hand the nonzero parts of the pending tensors to ``work``, given each slab's nonzero count."""
        slab = self.chunk_size * SLAB_CHUNKS
        n_nonzero = iter(counts)
        for t, p, grad, m, v in pending:
            n = grad.numel()
            dense: list[tuple[int, int]] = []
            picked: list[torch.Tensor] = []
            g1 = grad.view(-1)
            for a in range(0, n, slab):
                b, c = min(a + slab, n), next(n_nonzero)
                if c == b - a:
                    _extend(dense, a, b)
                elif c:
                    self._split(g1, a, b, c, dense, picked)
            if dense == [(0, n)]:
                work.add(t, p, grad, m, v)  # the common case: whole tensors, no views
                continue
            p1, m1, v1 = p.view(-1), m.view(-1), v.view(-1)
            for a, b in dense:
                work.add(t, p1[a:b], g1[a:b], m1[a:b], v1[a:b])
            if picked:
                work.add_gathered(t, p1, g1, m1, v1, torch.cat(picked) if len(picked) > 1 else picked[0])

    def _split(
        self,
        g1: torch.Tensor,
        a: int,
        b: int,
        n_nonzero: int,
        dense: list[tuple[int, int]],
        picked: list[torch.Tensor],
    ) -> None:
        """Split ``g1[a:b]`` (``n_nonzero`` nonzero elements, some zeros) into dense spans and nonzero indices.

        Bisection with ``count_nonzero`` (no temporary tensor): a zero/nonzero boundary costs
        ~log2(span / chunk) counts over a geometrically shrinking span; a chunk that still has both is
        left to ``nonzero``.
        """
        if b - a <= self.chunk_size:
            picked.append(g1[a:b].nonzero().squeeze(1).add_(a))
            return
        mid = a + max(1, (b - a) // (2 * self.chunk_size)) * self.chunk_size
        left = int(torch.count_nonzero(g1[a:mid]))
        for lo, hi, c in ((a, mid, left), (mid, b, n_nonzero - left)):
            if c == hi - lo:
                _extend(dense, lo, hi)
            elif c:
                self._split(g1, lo, hi, c, dense, picked)

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
                if "exp_avg" not in state:
                    _init_moments(state, p)

    # ZeRO's checkpoint loader restores param_groups from the saved state, which carries "step".
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        for group in self.param_groups:
            group.setdefault("step", 0)
            group.setdefault("masked", True)
            # Checkpoints written before the count moved to the tensors: the group's count was global.
            for p in group["params"]:
                state = self.state[p]
                if "step" not in state:
                    state["step"] = int(group["step"])
                else:
                    state["step"] = int(state["step"])  # a tensor if another Adam wrote it


def _init_moments(state: dict[str, Any], p: torch.Tensor) -> None:
    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def _extend(spans: list[tuple[int, int]], a: int, b: int) -> None:
    """Append [a, b) to sorted disjoint spans, merging with the last one when they touch."""
    if spans and spans[-1][1] == a:
        spans[-1] = (spans[-1][0], b)
    else:
        spans.append((a, b))


def _bc2_sqrt(beta2: float, t: int) -> float:
    return math.sqrt(1.0 - beta2**t)


@dataclass
class _Work:
    """One group's AdamW operands, bucketed by (device, dtype, step) for one fused-kernel call each."""

    found_inf: torch.Tensor | None = None
    buckets: dict[tuple[torch.device, torch.dtype, int], tuple[list[torch.Tensor], ...]] = field(
        default_factory=dict
    )
    # Gathered copies to write back after the update: (flat param, exp_avg, exp_avg_sq, index, copies).
    scatter: list[tuple[torch.Tensor, ...]] = field(default_factory=list)

    def add(self, t: int, p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> None:
        lists = self.buckets.setdefault((p.device, p.dtype, t), ([], [], [], []))
        for lst, x in zip(lists, (p, g, m, v)):
            lst.append(x)

    def add_gathered(
        self,
        t: int,
        p1: torch.Tensor,
        g1: torch.Tensor,
        m1: torch.Tensor,
        v1: torch.Tensor,
        idx: torch.Tensor,
    ) -> None:
        ps, ms, vs = p1.index_select(0, idx), m1.index_select(0, idx), v1.index_select(0, idx)
        self.add(t, ps, g1.index_select(0, idx), ms, vs)
        self.scatter.append((p1, m1, v1, idx, ps, ms, vs))

    def run(self, lr: float, beta1: float, beta2: float, wd: float, eps: float) -> None:
        for (device, _, t), lists in self.buckets.items():
            _fused_or_reference(lists, t, device, lr, beta1, beta2, wd, eps, self.found_inf)
        for p1, m1, v1, idx, ps, ms, vs in self.scatter:
            p1.index_copy_(0, idx, ps)
            m1.index_copy_(0, idx, ms)
            v1.index_copy_(0, idx, vs)


_HAS_FUSED = hasattr(torch, "_fused_adamw_")


def _fused_or_reference(
    lists: tuple[list[torch.Tensor], ...],
    t: int,
    device: torch.device,
    lr: float,
    beta1: float,
    beta2: float,
    wd: float,
    eps: float,
    found_inf: torch.Tensor | None = None,
) -> None:
    """Standard AdamW on every element of the tensors (torch's fused kernel when available).

    All tensors share device, dtype and step count ``t``; a nonzero ``found_inf`` leaves them all as they are.
    """
    ps, gs, ms, vs = lists
    if _HAS_FUSED:
        try:
            # One per call, shared by every tensor. torch.full launches a fill: torch.tensor(t, device=...)
            # would copy from pageable host memory, which waits for the stream (a hidden sync per step).
            step_t = torch.full((), float(t), device=device)
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
                found_inf=found_inf,
            )
            return
        except (RuntimeError, NotImplementedError):
            pass  # dtype/device the fused kernel does not cover: element-wise below
    bc2_sqrt = _bc2_sqrt(beta2, t)
    step_size = lr / (1.0 - beta1**t)
    if found_inf is not None:
        for p, g, m, v in zip(ps, gs, ms, vs):
            _masked_update(p, g, m, v, beta1, beta2, step_size, bc2_sqrt, eps, lr * wd, torch.ones_like(p), found_inf)
        return
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
    found_inf: torch.Tensor | None = None,
) -> None:
    """Element-wise AdamW for tensors of any layout; ``mask`` (1.0 = update) defaults to ``grad != 0``;
    a nonzero ``found_inf`` zeroes it (no read-back)."""
    # lerp/addcmul with a weight of exactly 0.0 return their input unchanged, so untouched elements
    # stay bit-identical.
    if mask is None:
        mask = grad.ne(0).to(p.dtype)
    if found_inf is not None:
        mask = mask * found_inf.eq(0).to(p.dtype)
        grad = torch.where(mask.bool(), grad, 0.0)  # a weight of 0 times an inf/NaN gradient is still NaN
    m.lerp_(grad, mask * (1.0 - beta1))
    v.lerp_(grad * grad, mask * (1.0 - beta2))
    if lr_wd != 0.0:
        p.addcmul_(p, mask, value=-lr_wd)
    denom = (v.sqrt() / bc2_sqrt).add_(eps)
    p.addcdiv_(m * mask, denom, value=-step_size)


def _masked_step_device(
    p: torch.Tensor,
    grad: torch.Tensor,
    m: torch.Tensor,
    v: torch.Tensor,
    t: int,
    lr: float,
    beta1: float,
    beta2: float,
    eps: float,
    wd: float,
    found_inf: torch.Tensor | None,
) -> None:
    """One masked AdamW pass over a contiguous tensor, without reading anything back to the host."""
    step_size, bc2_sqrt = lr / (1.0 - beta1**t), _bc2_sqrt(beta2, t)
    if p.is_cuda and triton is not None:
        n = p.numel()
        grid = (triton.cdiv(n, _BLOCK),)
        flag = found_inf if found_inf is not None else grad  # unread when HAS_INF is False
        _masked_adamw_kernel[grid](
            p, grad, m, v, flag, n, beta1, beta2, step_size, bc2_sqrt, eps, lr * wd,
            HAS_INF=found_inf is not None, BLOCK=_BLOCK,
        )
        return
    _masked_update(p, grad, m, v, beta1, beta2, step_size, bc2_sqrt, eps, lr * wd, None, found_inf)


_BLOCK = 2048

if triton is not None:

    @triton.jit
    def _masked_adamw_kernel(
        p_ptr, g_ptr, m_ptr, v_ptr, inf_ptr, n, beta1, beta2, step_size, bc2_sqrt, eps, lr_wd,
        HAS_INF: tl.constexpr, BLOCK: tl.constexpr,
    ):
        # The arithmetic and its order are those of torch's fused AdamW (decay, moments, then the step); an
        # element whose gradient is exactly 0 is neither read nor written beyond the gradient itself.
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        live = offs < n
        if HAS_INF:  # a skipped step: no element is live (a mask, not an early return, for every Triton)
            live = tl.where(tl.load(inf_ptr) == 0.0, live, False)
        g = tl.load(g_ptr + offs, mask=live, other=0.0).to(tl.float32)
        upd = live & (g != 0.0)
        p_raw = tl.load(p_ptr + offs, mask=upd, other=0.0)
        p = p_raw.to(tl.float32)
        m = tl.load(m_ptr + offs, mask=upd, other=0.0).to(tl.float32)
        v = tl.load(v_ptr + offs, mask=upd, other=0.0).to(tl.float32)
        p = p - lr_wd * p
        m = beta1 * m + (1.0 - beta1) * g
        v = beta2 * v + (1.0 - beta2) * g * g
        denom = tl.div_rn(tl.sqrt_rn(v), bc2_sqrt) + eps
        p = p - tl.div_rn(step_size * m, denom)
        tl.store(p_ptr + offs, p.to(p_raw.dtype), mask=upd)
        tl.store(m_ptr + offs, m.to(m_ptr.dtype.element_ty), mask=upd)
        tl.store(v_ptr + offs, v.to(v_ptr.dtype.element_ty), mask=upd)


def build_param_groups(
    model: torch.nn.Module, weight_decay: float, own_lr: dict[str, float] | None = None,
    check: tuple[str, ...] = (),
) -> list[dict[str, Any]]:
    """Groups as in BERT (no weight decay on biases and LayerNorm weights), split by the exact-zero check.

    Zero checks (``check_zeros``): in plain PyTorch a parameter a step did not use has no gradient at all
    and is skipped for free, so the per-element check for exact zeros (which costs ~45% of a fused AdamW
    step on CPU) is needed only for tensors that can be in the graph with zeros in their gradient:
    embedding tables (tokens, positions, token types absent from the batch: lazy Adam), the own-lr groups
    (a learned task-skill map's rows of tasks not in the batch), and parameters whose name contains a
    fragment of `check` (e.g. MoE experts, whose tokens may all miss the loss). Under ZeRO the trainer
    turns the check on for every group (flat partitions zero-fill unused parameters), so plain and ZeRO
    runs skip the same elements.

    own_lr: {name fragment: lr}: parameters whose name contains the fragment get a group of their own
    with that peak learning rate and no weight decay (e.g. a learned task-skill map, which needs a far
    larger step than the encoder to move within a fine-tuning run). The schedule scales it like the rest.
    """
    tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    buckets: dict[tuple[bool, bool], list[torch.nn.Parameter]] = {}  # (decay, checked) -> params
    own: dict[str, list[torch.nn.Parameter]] = {frag: [] for frag in own_lr or {}}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        frag = next((f for f in own if f in name), None)
        if frag is not None:
            own[frag].append(p)
            continue
        decay = not (p.ndim < 2 or "LayerNorm" in name or "layer_norm" in name or name.endswith(".bias"))
        checked = id(p) in tables or any(f in name for f in check)
        buckets.setdefault((decay, checked), []).append(p)
    groups = [{"params": ps, "weight_decay": weight_decay if decay else 0.0, "check_zeros": checked}
              for (decay, checked), ps in sorted(buckets.items(), key=lambda kv: (not kv[0][0], kv[0][1]))]
    for frag, params in own.items():
        if params:
            groups.append({"params": params, "weight_decay": 0.0, "lr": own_lr[frag], "check_zeros": True})
    return groups
