"""Skill FFNs: S parallel feed-forward networks per layer, of which a task activates a few (Eq. 1-2).

A skill is the FFN's two linear layers (HF BERT's ``intermediate.dense`` and ``output.dense``); the
residual and LayerNorm are shared and come after the average. That makes the average of the k active
skills one FFN of width k*f:

    mean_k W2_k act(W1_k x + b1_k) + b2_k  ==  [W2_1 .. W2_k]/k · act([W1_1; ..; W1_k] x + [b1]) + mean_k b2_k

so the fused path concatenates the active skills' weights and runs one wide GEMM pair: the same FLOPs as
a dense FFN of width k*f. Activation dropout (BART's, between the two linear layers; 0 for BERT) is one
mask over that [N, k*f] activation, which is what dropout on each skill's own [N, f] activation gives. Inactive skills never enter the graph, so their ``.grad`` stays ``None`` and a
plain PyTorch optimizer skips them.

Skill choice is data: a `SkillRouting` (groups of rows, each with its tuple of skill ids) built once per
forward by the model's router (routers.py) and shared by all layers. A bank built with a ``gate`` (a token
gate, as the ``"topk"`` router builds) lets the gate pick its experts per token instead, and returns the gate's auxiliary
loss through the routing (``routing.aux``), so no loss lives in module state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn
from transformers.activations import ACT2FN


@dataclass(frozen=True)
class SkillGroup:
    rows: torch.Tensor | None  # batch rows of this group; None = the whole batch
    skill_ids: tuple[int, ...]
    # Learned map in training: one weight per skill of ``skill_ids + probe`` (Eq. 8's alpha*, carrying the
    # map's gradient); None = a plain average. Probe skills are off in the forward pass (weight 0) but
    # their output is needed for the map's gradient: it is computed without a graph to their weights.
    weights: torch.Tensor | None = None
    probe: tuple[int, ...] = ()


@dataclass(frozen=True)
class SkillRouting:
    """Which rows of the batch use which skills. Built once per forward (one host-side grouping)."""

    groups: tuple[SkillGroup, ...]
    inverse: torch.Tensor | None  # restores batch order after the groups are concatenated
    # Token gate: [B, T] bool, False at padding, which takes no part in routing or balancing.
    token_mask: torch.Tensor | None = None
    # Token gate on packed rows: the flat indices of the real tokens in the order of the unpacked batch
    # (sample by sample), which is the order in which experts fill their capacity; None: layout order.
    token_order: torch.Tensor | None = None
    # What the layers of this forward return beside their output (a token gate's balancing loss per
    # layer, in layer order); the model empties it when a forward starts and hands it to its router after,
    # which reduces and weights it.
    aux: list[torch.Tensor] = field(default_factory=list, compare=False)

    @property
    def single(self) -> bool:
        return len(self.groups) == 1 and self.groups[0].rows is None

    @staticmethod
    def uniform(skill_ids: Sequence[int]) -> SkillRouting:
        return SkillRouting((SkillGroup(None, _canon(skill_ids)),), None)

    @staticmethod
    def per_row(row_skill_ids: Sequence[Sequence[int]], device: torch.device | str = "cpu") -> SkillRouting:
        """Group rows by identical skill set, keeping first-appearance order (deterministic)."""
        sets = [_canon(s) for s in row_skill_ids]
        order: dict[tuple[int, ...], list[int]] = {}
        for i, s in enumerate(sets):
            order.setdefault(s, []).append(i)
        if len(order) == 1:
            return SkillRouting.uniform(sets[0])
        groups, perm = [], []
        for s, rows in order.items():
            groups.append(SkillGroup(torch.tensor(rows, dtype=torch.long, device=device), s))
            perm.extend(rows)
        inverse = torch.empty(len(perm), dtype=torch.long)
        inverse[torch.tensor(perm)] = torch.arange(len(perm))
        return SkillRouting(tuple(groups), inverse.to(device))

    @staticmethod
    def token_gate(num_skills: int, token_mask_BT: torch.Tensor | None,
                   token_order: torch.Tensor | None = None) -> SkillRouting:
        """Every FFN is a candidate; the layer's gate picks per token."""
        return SkillRouting((SkillGroup(None, tuple(range(num_skills))),), None, token_mask_BT, token_order)


def _canon(skill_ids: Sequence[int] | torch.Tensor) -> tuple[int, ...]:
    ids = skill_ids.tolist() if isinstance(skill_ids, torch.Tensor) else list(skill_ids)
    ids = tuple(sorted({int(i) for i in ids if int(i) >= 0}))  # -1 pads a ragged [B, k] id matrix
    if not ids:
        raise ValueError("a row activates no skill")
    return ids


def _multi_rank() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized() and (
        torch.distributed.get_world_size() > 1)


_GELU_APPROXIMATE = {"gelu": "none", "gelu_new": "tanh", "gelu_pytorch_tanh": "tanh"}


def _concat_skill_mlp(
    x_ND: torch.Tensor, act: nn.Module, k: int, params: list[torch.Tensor], p_drop: float = 0.0
) -> torch.Tensor:
    """Reference fusion: one wide GEMM pair over the concatenated weights (copies the weights)."""
    w1, b1, w2, b2 = (params[i * k : (i + 1) * k] for i in range(4))
    h_NKF = act(F.linear(x_ND, torch.cat(w1, 0), torch.cat(b1, 0)))
    if p_drop:
        h_NKF = F.dropout(h_NKF, p_drop)
    return torch.addmm(torch.stack(b2, 0).mean(0), h_NKF, torch.cat(w2, 1).t(), alpha=1.0 / k)


def _fused_forward(x_ND: torch.Tensor, approximate: str, p_drop: float, params: Sequence[torch.Tensor]
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The fused forward arithmetic (see `_FusedSkillMLP`); returns (y, pre-activation, activation, keep mask).
    Called directly when no gradient is needed (evaluation, `generate`): no autograd bookkeeping."""
    k = len(params) // 4
    w1, b1, w2, b2 = (params[i * k : (i + 1) * k] for i in range(4))
    n, f = x_ND.shape[0], w1[0].shape[0]
    pre_NKF = x_ND.new_empty(n, k * f)
    for i in range(k):
        torch.addmm(b1[i], x_ND, w1[i].t(), out=pre_NKF[:, i * f : (i + 1) * f])
    h_NKF = F.gelu(pre_NKF, approximate=approximate)
    keep_NKF = None
    if p_drop > 0:
        keep_NKF = torch.empty_like(h_NKF, dtype=torch.bool).bernoulli_(1.0 - p_drop)
        h_NKF.mul_(keep_NKF).mul_(1.0 / (1.0 - p_drop))  # the dropped activation feeds fc2 and dW2
    b2_mean = b2[0] if k == 1 else torch.stack(b2, 0).mean(0)
    y_ND = torch.addmm(b2_mean, h_NKF[:, :f], w2[0].t(), alpha=1.0 / k)
    for i in range(1, k):
        y_ND.addmm_(h_NKF[:, i * f : (i + 1) * f], w2[i].t(), alpha=1.0 / k)
    return y_ND, pre_NKF, h_NKF, keep_NKF


class _FusedSkillMLP(torch.autograd.Function):
    """mean_k W2_k gelu(W1_k x + b1_k) + b2_k as one FFN of width k*F, without copying any weight.

    Each skill's GEMMs read its own weight in place and write into (or read from) its column block of
    one [N, k*F] activation buffer, so the elementwise work (bias, GELU and its derivative) runs once
    over the whole width and the second GEMMs accumulate into one output. Weight gradients come out
    contiguous in the parameters' own layout, and inactive skills are not inputs at all.

    Activation dropout `p_drop` (pass 0 outside training) is one keep mask over the [N, k*F] buffer, kept
    as bool for the backward pass; with ``p_drop == 0`` no mask exists and the arithmetic is unchanged.
    """

    @staticmethod
    def forward(ctx, x_ND: torch.Tensor, approximate: str, p_drop: float, *params: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        y_ND, pre_NKF, h_NKF, keep_NKF = _fused_forward(x_ND, approximate, p_drop, params)
        k = len(params) // 4
        ctx.save_for_backward(x_ND, pre_NKF, h_NKF, keep_NKF, *params[:k], *params[2 * k : 3 * k])
        ctx.k, ctx.f, ctx.approximate, ctx.p_drop = k, params[0].shape[0], approximate, p_drop
        return y_ND

    @staticmethod
    def backward(ctx, dy_ND: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        k, f = ctx.k, ctx.f
        x_ND, pre_NKF, h_NKF, keep_NKF, *ws = ctx.saved_tensors
        w1, w2 = ws[:k], ws[k:]
        need = ctx.needs_input_grad  # (x, approximate, p_drop, w1.., b1.., w2.., b2..)
        o = 3  # index of the first weight in `need`
        blocks = [slice(i * f, (i + 1) * f) for i in range(k)]
        dy_ND = dy_ND.contiguous() * (1.0 / k)
        dw2 = [dy_ND.t().mm(h_NKF[:, b]) if need[o + 2 * k + i] else None for i, b in enumerate(blocks)]
        db2 = [dy_ND.sum(0) if need[o + 3 * k + i] else None for i in range(k)]
        dh_NKF = torch.empty_like(pre_NKF)
        for i, b in enumerate(blocks):
            torch.mm(dy_ND, w2[i], out=dh_NKF[:, b])
        if keep_NKF is not None:
            dh_NKF.mul_(keep_NKF).mul_(1.0 / (1.0 - ctx.p_drop))
        dpre_NKF = torch.ops.aten.gelu_backward(dh_NKF, pre_NKF, approximate=ctx.approximate)
        del dh_NKF
        dw1 = [dpre_NKF[:, b].t().mm(x_ND) if need[o + i] else None for i, b in enumerate(blocks)]
        db1 = [dpre_NKF[:, b].sum(0) if need[o + k + i] else None for i, b in enumerate(blocks)]
        dx = None
        if need[0]:
            dx = dpre_NKF[:, blocks[0]].mm(w1[0])
            for i in range(1, k):
                dx.addmm_(dpre_NKF[:, blocks[i]], w1[i])
        return (dx, None, None, *dw1, *db1, *dw2, *db2)


def _wide_weights(params: Sequence[torch.Tensor], dtype: torch.dtype
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The k active skills as one FFN of width k*F in ``dtype``: each weight kind concatenated straight into
    one buffer of that dtype (one kernel each), and the mean of the output biases."""
    k = len(params) // 4
    w1, b1, w2, b2 = (params[i * k : (i + 1) * k] for i in range(4))
    f, d = w1[0].shape
    dev = w1[0].device
    W1 = torch.cat(w1, 0, out=torch.empty(k * f, d, dtype=dtype, device=dev))
    B1 = torch.cat(b1, 0, out=torch.empty(k * f, dtype=dtype, device=dev))
    W2 = torch.cat(w2, 1, out=torch.empty(d, k * f, dtype=dtype, device=dev))
    B2 = (b2[0] if k == 1 else torch.stack(b2, 0).mean(0)).to(dtype)
    return W1, B1, W2, B2


def _wide_forward(xc: torch.Tensor, W1: torch.Tensor, B1: torch.Tensor, W2: torch.Tensor, B2: torch.Tensor, k: int,
                  approximate: str, p_drop: float
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Two wide GEMMs (biases and the 1/k inside them); returns (y, pre-activation, activation, keep mask)."""
    pre_NKF = torch.addmm(B1, xc, W1.t())
    h_NKF = F.gelu(pre_NKF, approximate=approximate)
    keep_NKF = None
    if p_drop > 0:
        keep_NKF = torch.empty_like(h_NKF, dtype=torch.bool).bernoulli_(1.0 - p_drop)
        h_NKF.mul_(keep_NKF).mul_(1.0 / (1.0 - p_drop))
    return torch.addmm(B2, h_NKF, W2.t(), alpha=1.0 / k), pre_NKF, h_NKF, keep_NKF


class _FusedSkillMLPCast(torch.autograd.Function):
    """The fused FFN under autocast: what `_FusedSkillMLP` computes, in the autocast dtype.

    Autocast would cast each skill's weights separately inside the concatenating path and record every
    cast, concatenation and scale in the graph: at BERT-base on a GPU the host then spends longer issuing
    those small kernels than the GPU spends on the GEMMs. Here each weight kind is concatenated straight
    into one low-precision buffer (one kernel), the two wide GEMMs carry the biases and the 1/k, and the
    backward hands every skill its fp32 gradient, as autocast's casts would.
    """

    @staticmethod
    def forward(ctx, x_ND: torch.Tensor, dtype: torch.dtype, approximate: str, p_drop: float,  # type: ignore[override]
                *params: torch.Tensor) -> torch.Tensor:
        k = len(params) // 4
        W1, B1, W2, B2 = _wide_weights(params, dtype)
        xc = x_ND.to(dtype)
        y_ND, pre_NKF, h_NKF, keep_NKF = _wide_forward(xc, W1, B1, W2, B2, k, approximate, p_drop)
        ctx.save_for_backward(xc, pre_NKF, h_NKF, keep_NKF, W1, W2)
        ctx.k, ctx.f, ctx.approximate, ctx.p_drop, ctx.x_dtype = k, params[0].shape[0], approximate, p_drop, x_ND.dtype
        ctx.p_dtypes = [p.dtype for p in params]
        return y_ND

    @staticmethod
    def backward(ctx, dy_ND: torch.Tensor) -> tuple[torch.Tensor | None, ...]:  # type: ignore[override]
        k, f = ctx.k, ctx.f
        xc, pre_NKF, h_NKF, keep_NKF, W1, W2 = ctx.saved_tensors
        need = ctx.needs_input_grad  # (x, dtype, approximate, p_drop, w1.., b1.., w2.., b2..)
        o = 4
        dy_ND = dy_ND.to(W1.dtype).mul(1.0 / k)
        n, dts = dy_ND.shape[0], ctx.p_dtypes
        dw2 = db2 = dw1 = db1 = None
        if any(need[o + 2 * k : o + 3 * k]):
            # One batched GEMM writes [k, D, F]: each skill's gradient is a contiguous block, which becomes
            # its .grad without a copy (a [D, kF] product would give strided views that autograd copies).
            h_KNF = h_NKF.view(n, k, f).transpose(0, 1)
            dw2 = torch.bmm(dy_ND.t().unsqueeze(0).expand(k, -1, -1), h_KNF).to(dts[2 * k]).unbind(0)
        if any(need[o + 3 * k :]):  # one row each (grads may be accumulated in place), in one kernel
            db2 = dy_ND.sum(0, dtype=torch.float32).to(dts[3 * k]).repeat(k, 1).unbind(0)
        dh_NKF = dy_ND.mm(W2)
        if keep_NKF is not None:
            dh_NKF.mul_(keep_NKF).mul_(1.0 / (1.0 - ctx.p_drop))
        dpre_NKF = torch.ops.aten.gelu_backward(dh_NKF, pre_NKF, approximate=ctx.approximate)
        del dh_NKF
        if any(need[o : o + k]):
            dw1 = dpre_NKF.t().mm(xc).to(dts[0]).split(f, 0)  # per skill [F, D], contiguous
        if any(need[o + k : o + 2 * k]):
            db1 = dpre_NKF.sum(0, dtype=torch.float32).to(dts[k]).split(f, 0)
        dx = dpre_NKF.mm(W1).to(ctx.x_dtype) if need[0] else None
        none = [None] * k
        return (dx, None, None, None, *(dw1 or none), *(db1 or none), *(dw2 or none), *(db2 or none))


class _Dense(nn.Module):
    """Holder that reproduces HF's ``<name>.dense`` (and optional ``LayerNorm``) parameter names."""

    def __init__(self, d_in: int, d_out: int, layer_norm_eps: float | None = None) -> None:
        super().__init__()
        self.dense = nn.Linear(d_in, d_out)
        if layer_norm_eps is not None:
            self.LayerNorm = nn.LayerNorm(d_out, eps=layer_norm_eps)


class Skill(nn.Module):
    """One skill's FFN in one layer: ``intermediate.dense`` (D->F) and ``output.dense`` (F->D)."""

    def __init__(self, hidden: int, ffn: int, per_skill_ln_eps: float | None = None) -> None:
        super().__init__()
        self.intermediate = _Dense(hidden, ffn)
        self.output = _Dense(ffn, hidden, per_skill_ln_eps)


class SkillFFN(nn.Module):
    def __init__(
        self,
        hidden_size: int,
        intermediate_size: int,
        num_skills: int,
        hidden_act: str = "gelu",
        impl: str = "fused",
        per_skill_layernorm: bool = False,
        layer_norm_eps: float = 1e-12,
        hidden_dropout_prob: float = 0.0,
        gate: nn.Module | None = None,
        activation_dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.impl = impl
        # Dropout between each skill's two linear layers (BART's activation_dropout; BERT has none).
        self.activation_dropout = activation_dropout
        # A router's token gate (x_ND, keep_N) -> combine/dispatch weights and aux loss; None: rows are routed.
        self.gate = gate
        self.per_skill_layernorm = per_skill_layernorm
        self.act = ACT2FN[hidden_act]
        # The fused kernel knows GELU's derivative; other activations take the autograd concat path.
        self.gelu_approximate = _GELU_APPROXIMATE.get(hidden_act)
        ln_eps = layer_norm_eps if per_skill_layernorm else None
        self.skills = nn.ModuleList(Skill(hidden_size, intermediate_size, ln_eps) for _ in range(num_skills))
        # Only used by the per-skill-LayerNorm variant, which applies dropout+residual+LN per skill.
        self.dropout = nn.Dropout(hidden_dropout_prob)

    def forward(
        self, x_BTD: torch.Tensor, routing: SkillRouting, residual_BTD: torch.Tensor | None = None
    ) -> torch.Tensor:
        """Average of the active skills' FFN outputs.

        Shared LayerNorm (default): returns the pre-residual average; the layer adds dropout, residual, LN.
        Per-skill LayerNorm: returns mean_k LN_k(dropout(FFN_k(x)) + residual); `residual_BTD` required.
        """
        if self.gate is not None:
            return self._gated(x_BTD, routing)
        if routing.single:
            return self._group(x_BTD, routing.groups[0], residual_BTD)
        outs = []
        for g in routing.groups:
            res = None if residual_BTD is None else residual_BTD.index_select(0, g.rows)
            outs.append(self._group(x_BTD.index_select(0, g.rows), g, res))
        return torch.cat(outs, 0).index_select(0, routing.inverse)

    def _group(self, x: torch.Tensor, g: SkillGroup, residual: torch.Tensor | None) -> torch.Tensor:
        ids = g.skill_ids
        if self.per_skill_layernorm and residual is None:
            raise ValueError("per-skill LayerNorm needs the residual input")
        if g.weights is not None:
            return self._weighted(x, g, residual)
        if self.per_skill_layernorm:
            return self._loop(x, ids, residual)
        if self.impl == "loop" or len(ids) == 1:
            return self._loop(x, ids, None)
        return self._fused(x, ids)

    def _skill_out(self, i: int, x: torch.Tensor, residual: torch.Tensor | None) -> torch.Tensor:
        s = self.skills[i]
        a = self.act(s.intermediate.dense(x))
        if self.training and self.activation_dropout:
            a = F.dropout(a, self.activation_dropout)
        h = s.output.dense(a)
        return h if residual is None else s.output.LayerNorm(self.dropout(h) + residual)

    def _weighted(self, x: torch.Tensor, g: SkillGroup, residual: torch.Tensor | None) -> torch.Tensor:
        """Eq. 8 with weights: sum_i w_i FFN_i(x) / sum_i w_i over the group's skills and probes."""
        res = residual if self.per_skill_layernorm else None
        w = g.weights.to(x.dtype)
        out = None
        for j, i in enumerate(g.skill_ids):
            h = w[j] * self._skill_out(i, x, res)
            out = h if out is None else out + h
        if g.probe:
            with torch.no_grad():
                probes = [self._skill_out(i, x.detach(), None if res is None else res.detach()) for i in g.probe]
            k = len(g.skill_ids)
            for j, h in enumerate(probes):
                out = out + w[k + j] * h
        return out / w.sum()

    def _loop(self, x: torch.Tensor, ids: tuple[int, ...], residual: torch.Tensor | None) -> torch.Tensor:
        out = None
        for i in ids:
            h = self._skill_out(i, x, residual)
            out = h if out is None else out + h
        return out / len(ids) if len(ids) > 1 else out

    def _fused(self, x: torch.Tensor, ids: tuple[int, ...]) -> torch.Tensor:
        sk = [self.skills[i] for i in ids]
        x_ND = x.reshape(-1, x.shape[-1])
        params = [
            *(s.intermediate.dense.weight for s in sk), *(s.intermediate.dense.bias for s in sk),
            *(s.output.dense.weight for s in sk), *(s.output.dense.bias for s in sk),
        ]
        p_drop = self.activation_dropout if self.training else 0.0
        autocast = torch.is_autocast_enabled(x.device.type)
        if self.gelu_approximate is not None and (autocast or x.is_cuda):
            # On a GPU two wide GEMMs over the concatenated weights (a copy of k*F*D per kind, small next to
            # the activations) beat k GEMMs per product, and their backward needs one bias reduction, not k.
            dtype = torch.get_autocast_dtype(x.device.type) if autocast else x.dtype
            if not torch.is_grad_enabled() and not self.training:
                y_ND = self._decode(x_ND, ids, params, dtype)
            else:
                with torch.autocast(x.device.type, enabled=False):
                    y_ND = _FusedSkillMLPCast.apply(x_ND, dtype, self.gelu_approximate, p_drop, *params)
        elif self.gelu_approximate is not None:
            if torch.is_grad_enabled():
                y_ND = _FusedSkillMLP.apply(x_ND, self.gelu_approximate, p_drop, *params)
            else:  # evaluation and decoding: the same arithmetic without the autograd Function's overhead
                y_ND = _fused_forward(x_ND, self.gelu_approximate, p_drop, params)[0]
        else:  # other activations: autograd on the concatenated weights
            y_ND = _concat_skill_mlp(x_ND, self.act, len(ids), params, p_drop)
        return y_ND.view(x.shape)

    def _decode(self, x_ND: torch.Tensor, ids: tuple[int, ...], params: list[torch.Tensor], dtype: torch.dtype
                ) -> torch.Tensor:
        """Inference on a GPU: the concatenated weights of the last skill set are kept between calls, as
        autocast keeps a dense layer's cast weights, so each decoding step runs two GEMMs and a GELU, like a
        dense FFN. Kept while the weights are unchanged (their storage and version); ``train()`` drops them."""
        key = (ids, dtype, tuple((p.data_ptr(), p._version) for p in params))
        cached = getattr(self, "_decode_cache", None)
        if cached is None or cached[0] != key:
            cached = (key, _wide_weights(params, dtype))
            self._decode_cache = cached
        W1, B1, W2, B2 = cached[1]
        with torch.autocast(x_ND.device.type, enabled=False):
            return _wide_forward(x_ND.to(dtype), W1, B1, W2, B2, len(ids), self.gelu_approximate, 0.0)[0]

    def train(self, mode: bool = True) -> SkillFFN:
        self._decode_cache = None
        return super().train(mode)

    def _gated(self, x: torch.Tensor, routing: SkillRouting) -> torch.Tensor:
        """Each token runs the experts its layer's gate picks, weighted by the gate; the gate's auxiliary
        loss goes into ``routing.aux``."""
        x_ND = x.reshape(-1, x.shape[-1])
        keep_N = None if routing.token_mask is None else routing.token_mask.reshape(-1)
        g = self.gate(x_ND, keep_N, routing.token_order)
        routing.aux.append(g.aux_loss)
        y_ND = torch.zeros_like(x_ND)
        # Only the chosen tokens are computed. With several ranks every expert runs, the unchosen ones on
        # zero rows, so that the autograd graph has the same shape on every rank, which data-parallel
        # gradient buckets need (an expert chosen on one rank only would desynchronise the reduce); on one
        # process an unchosen expert stays out of the graph (no gradient, as an unused skill).
        uniform = self.training and _multi_rank()
        for e in range(len(self.skills)):
            rows = g.dispatch_NE[:, e].nonzero().view(-1)
            if rows.numel() == 0 and not uniform:
                continue
            h = self._skill_out(e, x_ND.index_select(0, rows), None)
            y_ND = y_ND.index_add(0, rows, h * g.combine_NE.index_select(0, rows)[:, e, None])
        return y_ND.view(x.shape)
