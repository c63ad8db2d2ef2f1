"""MaskedAdamW: sparse-update semantics on a toy model with several "skill" layers."""

from __future__ import annotations

import copy

import pytest
import torch
from skillnet.training.optim import MaskedAdamW, build_param_groups
from torch import nn


class ToySkills(nn.Module):
    def __init__(self, n_skills: int = 4, d: int = 8) -> None:
        super().__init__()
        self.emb = nn.Embedding(16, d)
        self.skills = nn.ModuleList(nn.Linear(d, d) for _ in range(n_skills))
        self.norm = nn.LayerNorm(d)
        self.out = nn.Linear(d, 1)

    def forward(self, ids: torch.Tensor, skills: list[int]) -> torch.Tensor:
        h = self.emb(ids)
        h = torch.stack([torch.tanh(self.skills[i](h)) for i in skills]).mean(0)
        return self.out(self.norm(h)).pow(2).mean()


def _step(
    model: nn.Module, opt: torch.optim.Optimizer, ids: torch.Tensor, skills: list[int], zero_fill: bool
) -> None:
    opt.zero_grad(set_to_none=True)
    model(ids, skills).backward()
    if zero_fill:  # what ZeRO-1/2 do: unused parameters get a zero gradient instead of None
        for p in model.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
    opt.step()


def _snapshot(model: nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    snap = {}
    for name, p in model.named_parameters():
        snap[name] = p.detach().clone()
        for k, v in opt.state.get(p, {}).items():
            if torch.is_tensor(v):
                snap[f"{name}:{k}"] = v.clone()
    return snap


@pytest.mark.parametrize("zero_fill", [False, True])
def test_inactive_skill_params_and_moments_unchanged(zero_fill: bool) -> None:
    torch.manual_seed(0)
    model = ToySkills()
    opt = MaskedAdamW(build_param_groups(model, 0.1), lr=1e-2)
    ids = torch.randint(0, 16, (4, 5))
    for s in ([0, 1], [2, 3], [0, 2]):  # every skill gets non-zero moments first
        _step(model, opt, ids, s, zero_fill)
    before = _snapshot(model, opt)
    _step(model, opt, ids, [0, 1], zero_fill)
    after = _snapshot(model, opt)
    for key in before:
        inactive = key.startswith(("skills.2.", "skills.3."))
        if inactive:
            assert torch.equal(before[key], after[key]), f"{key} moved although skill was inactive"
        elif key.startswith(("skills.0.", "skills.1.")) and ":" not in key:
            assert not torch.equal(before[key], after[key]), f"{key} did not move although active"


def test_dense_adamw_would_move_inactive_skills() -> None:
    """Control: with zero-filled grads (ZeRO), torch AdamW moves inactive skills; this is what we fix."""
    torch.manual_seed(0)
    model = ToySkills()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    ids = torch.randint(0, 16, (4, 5))
    _step(model, opt, ids, [2, 3], zero_fill=True)
    w = model.skills[2].weight.detach().clone()
    _step(model, opt, ids, [0, 1], zero_fill=True)
    assert not torch.equal(w, model.skills[2].weight)


def test_none_and_zero_grads_give_identical_results() -> None:
    """Plain PyTorch (None grads) and ZeRO (zero-filled grads) follow the same trajectory."""
    torch.manual_seed(0)
    a = ToySkills()
    b = copy.deepcopy(a)
    oa = MaskedAdamW(build_param_groups(a, 0.01), lr=1e-2)
    ob = MaskedAdamW(build_param_groups(b, 0.01), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for step in range(6):
        ids = torch.randint(0, 16, (4, 5), generator=g)
        skills = [[0, 1], [1, 2], [3]][step % 3]
        _step(a, oa, ids, skills, zero_fill=False)
        _step(b, ob, ids, skills, zero_fill=True)
    for (n, pa), pb in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(pa, pb), n


def test_flat_partition_matches_per_parameter_update() -> None:
    """ZeRO steps one flat fp32 partition: element-wise masking makes that equal to per-tensor steps.

    Equal up to float rounding: an element may be updated by the fused kernel in one layout and by the
    masked path in the other (both compute AdamW, in a different operation order).
    """
    torch.manual_seed(0)
    params = [torch.randn(5, 3), torch.randn(7), torch.randn(2, 2)]
    grads_seq = []
    for t in range(4):
        gs = [torch.randn_like(p) for p in params]
        gs[t % 3] = torch.zeros_like(params[t % 3])  # one "skill" inactive per step
        gs[1][:3] = 0.0  # and some rows absent (lazy embedding rows)
        grads_seq.append(gs)
    sep = [nn.Parameter(p.clone()) for p in params]
    flat = nn.Parameter(torch.cat([p.flatten() for p in params]))
    o1 = MaskedAdamW(sep, lr=1e-2, weight_decay=0.1)
    o2 = MaskedAdamW([flat], lr=1e-2, weight_decay=0.1)
    for gs in grads_seq:
        for p, g in zip(sep, gs):
            p.grad = g.clone()
        flat.grad = torch.cat([g.flatten() for g in gs])
        o1.step()
        o2.step()
    torch.testing.assert_close(
        torch.cat([p.detach().flatten() for p in sep]), flat.detach(), rtol=1e-6, atol=1e-6
    )


def test_matches_torch_adamw_when_every_gradient_is_nonzero() -> None:
    torch.manual_seed(0)
    a = nn.Linear(6, 4)
    b = copy.deepcopy(a)
    oa = MaskedAdamW(a.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    ob = torch.optim.AdamW(b.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01)
    x = torch.randn(8, 6)
    for _ in range(5):
        for m, o in ((a, oa), (b, ob)):
            o.zero_grad()
            m(x).pow(2).sum().backward()
            o.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def test_lazy_embedding_rows() -> None:
    """Documented consequence: rows of tokens absent from a step stay untouched."""
    torch.manual_seed(0)
    emb = nn.Embedding(10, 4)
    opt = MaskedAdamW(emb.parameters(), lr=1e-1, weight_decay=0.1)
    emb(torch.arange(10)).sum().backward()
    opt.step()
    opt.zero_grad()
    row9 = emb.weight[9].detach().clone()
    emb(torch.tensor([0, 1, 2])).pow(2).sum().backward()
    opt.step()
    assert torch.equal(row9, emb.weight[9])
    assert opt.param_groups[0]["step"] == 2


def test_state_dict_round_trip_keeps_global_step() -> None:
    m = nn.Linear(3, 3)
    opt = MaskedAdamW(m.parameters(), lr=1e-3)
    m(torch.ones(2, 3)).sum().backward()
    opt.step()
    sd = opt.state_dict()
    opt2 = MaskedAdamW(m.parameters(), lr=1e-3)
    opt2.load_state_dict(sd)
    assert opt2.param_groups[0]["step"] == 1
    with pytest.raises(ValueError, match="betas"):
        MaskedAdamW(m.parameters(), betas=(1.0, 0.9))


def test_chunked_paths_leave_zero_regions_untouched_in_a_large_flat_tensor() -> None:
    """A flat buffer like a ZeRO partition: a dense block, a skipped block and a sparse (mixed) block."""
    torch.manual_seed(0)
    n = 3 * 20000
    p = nn.Parameter(torch.randn(n))
    opt = MaskedAdamW([p], lr=1e-2, weight_decay=0.1, chunk_size=4096)
    p.grad = torch.randn(n)
    opt.step()  # every element has moments now
    before = p.detach().clone(), opt.state[p]["exp_avg"].clone(), opt.state[p]["exp_avg_sq"].clone()
    g = torch.randn(n)
    g[20000:40000] = 0.0  # inactive block
    g[40000:] *= (torch.rand(20000) < 0.1).float()  # sparse rows
    p.grad = g
    opt.step()
    after = p.detach(), opt.state[p]["exp_avg"], opt.state[p]["exp_avg_sq"]
    untouched = g.eq(0)
    for b, a in zip(before, after):
        assert torch.equal(b[untouched], a[untouched])
        assert not torch.equal(b[~untouched], a[~untouched])
    # The updated elements follow AdamW (compare with the reference element-wise formula).
    ref = nn.Parameter(before[0].clone())
    ref_opt = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.1)
    ref_opt.state[ref] = {
        "step": torch.tensor(1.0),
        "exp_avg": before[1].clone(),
        "exp_avg_sq": before[2].clone(),
    }
    ref.grad = g
    ref_opt.step()
    torch.testing.assert_close(after[0][~untouched], ref.detach()[~untouched], rtol=1e-5, atol=1e-6)
