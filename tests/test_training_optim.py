"""MaskedAdamW: sparse-update semantics on a toy model with several "skill" layers."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

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
    if zero_fill:
        opt.check_zeros_everywhere()  # as the trainer does under ZeRO
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
    ob.check_zeros_everywhere()  # b stands for ZeRO (zero-filled gradients), as the trainer sets it up
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


@pytest.mark.parametrize("chunk_size", [4096, 64])
def test_chunked_paths_leave_zero_regions_untouched_in_a_large_flat_tensor(chunk_size: int) -> None:
    """A flat buffer like a ZeRO partition: a dense block, a skipped block and a sparse (mixed) block.

    chunk_size 4096: one slab (64 chunks) covers the tensor, split by bisection. chunk_size 64: slabs of
    4096 elements; whole dense and zero slabs, and slabs straddling a block boundary (20000, 40000).
    """
    torch.manual_seed(0)
    n = 3 * 20000
    p = nn.Parameter(torch.randn(n))
    opt = MaskedAdamW([p], lr=1e-2, weight_decay=0.1, chunk_size=chunk_size)
    p.grad = torch.randn(n)
    opt.step()  # every element has moments now
    before = p.detach().clone(), opt.state[p]["exp_avg"].clone(), opt.state[p]["exp_avg_sq"].clone()
    g = torch.randn(n)
    g[20000:40000] = 0.0  # inactive block
    g[40000:] *= (torch.rand(20000) < 0.1).float()  # sparse rows
    g[40001] = -0.0  # a negative zero is a zero too
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


def _call_pattern_run(pattern: str, steps: int = 4) -> tuple[MaskedAdamW, list[nn.Parameter]]:
    """Step flat fp32 tensors the way DeepSpeed calls its client optimizer.

    Two param groups (decay / no decay), each split into sub-groups (flat tensors). "plain": one call
    per step with every tensor listed; "zero12": one call per param group with only that group visible
    (stage 1/2 swap ``optimizer.param_groups``); "zero3": one call per sub-group with that sub-group as
    the only entry of its group and every other group emptied (stage 3's ``_optimizer_step``).
    """
    torch.manual_seed(0)
    sub = [[nn.Parameter(torch.randn(300)), nn.Parameter(torch.randn(200))], [nn.Parameter(torch.randn(50))]]
    opt = MaskedAdamW(
        [{"params": list(sub[0]), "weight_decay": 0.1}, {"params": list(sub[1]), "weight_decay": 0.0}],
        lr=1e-2,
    )
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        for gi, tensors in enumerate(sub):
            for i, p in enumerate(tensors):
                p.grad = torch.randn(p.shape, generator=g)
                if (step + i + gi) % 3 == 0:
                    p.grad[: p.numel() // 2] = 0.0  # an inactive skill's slice of the partition
        if pattern == "plain":
            opt.step()
        elif pattern == "zero12":
            groups = opt.param_groups
            for group in groups:
                opt.param_groups = [group]
                opt.step()
            opt.param_groups = groups
        else:
            for group in opt.param_groups:
                group["params"] = []
            for gi, tensors in enumerate(sub):
                for p in tensors:
                    opt.param_groups[gi]["params"] = [p]
                    opt.step()
                    opt.param_groups[gi]["params"] = []
            for gi, tensors in enumerate(sub):
                opt.param_groups[gi]["params"] = list(tensors)
    return opt, [p for tensors in sub for p in tensors]


@pytest.mark.parametrize("pattern", ["zero12", "zero3"])
def test_deepspeed_call_patterns_count_one_adam_step_per_optimizer_step(pattern: str) -> None:
    """ZeRO-3 calls step() once per sub-group; the count must stay the global step."""
    ref, ref_params = _call_pattern_run("plain")
    opt, params = _call_pattern_run(pattern)
    assert [g["step"] for g in opt.param_groups] == [4, 4]
    assert [opt.state[p]["step"] for p in params] == [4, 4, 4]
    for p, q in zip(ref_params, params):
        assert torch.equal(p, q)  # the same kernel on the same tensors: bit-identical
        assert torch.equal(ref.state[p]["exp_avg_sq"], opt.state[q]["exp_avg_sq"])


def test_a_parameter_without_gradient_still_counts_the_global_step() -> None:
    """Bias correction uses the global step: a skill first used at step 3 is corrected with t=3."""
    torch.manual_seed(0)
    used, late = nn.Parameter(torch.randn(4)), nn.Parameter(torch.randn(4))
    ref = nn.Parameter(late.detach().clone())
    opt = MaskedAdamW([used, late], lr=1e-2)
    for step in range(3):
        used.grad = torch.randn(4)
        late.grad = torch.randn(4) if step == 2 else None
        opt.step()
    assert opt.state[used]["step"] == opt.state[late]["step"] == opt.param_groups[0]["step"] == 3
    # torch's AdamW from zero moments at its 3rd step (it increments "step" before the update).
    ref_opt = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.0, eps=1e-8)
    ref_opt.state[ref] = {"step": torch.tensor(2.0), "exp_avg": torch.zeros(4), "exp_avg_sq": torch.zeros(4)}
    ref.grad = late.grad.clone()
    ref_opt.step()
    torch.testing.assert_close(late.detach(), ref.detach(), rtol=1e-6, atol=1e-7)


def test_checkpoint_without_per_tensor_counts_resumes_from_the_group_count() -> None:
    """Checkpoints written before the count moved to the tensors carry only the group's (global) count."""
    torch.manual_seed(0)
    a = nn.Linear(5, 3)
    b = copy.deepcopy(a)
    oa = MaskedAdamW(a.parameters(), lr=1e-2)
    x = torch.randn(4, 5)
    for _ in range(3):
        oa.zero_grad()
        a(x).pow(2).sum().backward()
        oa.step()
    sd = copy.deepcopy(oa.state_dict())
    for st in sd["state"].values():
        del st["step"]
    ob = MaskedAdamW(b.parameters(), lr=1e-2)
    b.load_state_dict(a.state_dict())
    ob.load_state_dict(sd)
    assert [ob.state[p]["step"] for p in b.parameters()] == [3, 3]
    for m, o in ((a, oa), (b, ob)):
        o.zero_grad()
        m(x).pow(2).sum().backward()
        o.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)


@pytest.mark.parametrize("masked", [True, False])
def test_non_contiguous_parameter(masked: bool) -> None:
    """A transposed parameter takes the element-wise path: same AdamW, zeros untouched when masked."""
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(6, 4).t())
    assert not p.is_contiguous()
    ref = nn.Parameter(p.detach().clone())
    opt = MaskedAdamW([p], lr=1e-2, weight_decay=0.1, masked=masked)
    ref_opt = torch.optim.AdamW([ref], lr=1e-2, weight_decay=0.1, eps=1e-8)
    for step in range(3):
        g = torch.randn(4, 6)
        if step == 2:
            g[1] = 0.0
            g[2, 0] = -0.0  # a negative zero is a zero too
        before = p.detach().clone()
        p.grad, ref.grad = g.clone(), g.clone()
        opt.step()
        ref_opt.step()
        if masked and step == 2:
            zero = g.eq(0)
            assert torch.equal(p.detach()[zero], before[zero])
            torch.testing.assert_close(p.detach()[~zero], ref.detach()[~zero], rtol=1e-5, atol=1e-6)
        else:
            torch.testing.assert_close(p.detach(), ref.detach(), rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # measured 20 s
def test_bench_prints_both_ratios_as_the_last_line() -> None:
    """bench/optim.py runs, agrees with fused AdamW where gradients are nonzero, and
    prints its JSON last. No timing assertion: the ratios are the bench's output, not a test."""
    repo = Path(__file__).resolve().parents[1]
    r = subprocess.run(
        [
            sys.executable,
            "bench/optim.py",
            "--preset",
            "tiny",
            "--batch",
            "2",
            "--seq",
            "16",
            "--reps",
            "1",
            "--json",
        ],
        cwd=repo,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("masked_over_fused", "masked_over_fused_flat", "masked_ms", "fused_ms"):
        assert isinstance(res[key], float) and res[key] > 0, key
    assert res["same_update"] is True
    assert "masked_over_fused" in r.stdout.splitlines()[-2]  # the readable table precedes the JSON


def test_empty_parameter_among_others() -> None:
    """A zero-element parameter (e.g. an empty head) has nothing to count and must not shift the others."""
    torch.manual_seed(0)
    params = [nn.Parameter(torch.randn(5)), nn.Parameter(torch.empty(0)), nn.Parameter(torch.randn(3))]
    ref = [nn.Parameter(p.detach().clone()) for p in params]
    opt = MaskedAdamW(params, lr=1e-2)
    ref_opt = torch.optim.AdamW(ref, lr=1e-2, weight_decay=0.0, eps=1e-8)
    for p, q in zip(params, ref):
        p.grad = torch.randn(p.shape)
        q.grad = p.grad.clone()
    params[2].grad[0] = 0.0
    frozen = params[2].detach()[0].clone()
    opt.step()
    ref_opt.step()
    torch.testing.assert_close(params[0].detach(), ref[0].detach(), rtol=1e-6, atol=1e-7)
    assert torch.equal(params[2].detach()[0], frozen)
    torch.testing.assert_close(params[2].detach()[1:], ref[2].detach()[1:], rtol=1e-6, atol=1e-7)
    assert opt.state[params[1]]["step"] == 1


def test_plain_groups_check_zeros_only_in_embedding_tables_and_own_lr_groups() -> None:
    """Plain PyTorch: unused parameters have no gradient, so only tables with untouched rows (embeddings,
    a learned map) pay for the exact-zero check; an embedding row absent from the batch stays put."""
    torch.manual_seed(0)
    model = ToySkills()
    groups = build_param_groups(model, 0.1)
    checked = {id(p) for g in groups if g["check_zeros"] for p in g["params"]}
    tables = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    assert tables and checked == tables
    opt = MaskedAdamW(groups, lr=1e-2)
    ids = torch.randint(0, 8, (4, 5))  # rows 8..15 of the table are absent
    _step(model, opt, ids, [0, 1], zero_fill=False)
    emb = next(m for m in model.modules() if isinstance(m, torch.nn.Embedding)).weight
    before = emb.detach().clone()
    _step(model, opt, ids, [0, 1], zero_fill=False)
    assert torch.equal(before[8:], emb.detach()[8:]) and not torch.equal(before[:8], emb.detach()[:8])


@pytest.mark.parametrize("zero_fill", [False, True])
def test_the_sync_free_path_keeps_the_semantics(zero_fill: bool) -> None:
    """impl="device" (the GPU path, here its torch reference) skips the same elements bit for bit and
    updates the others as the count path does; found_inf leaves every weight and moment as it was."""
    torch.manual_seed(0)
    models = [ToySkills(), None]
    models[1] = copy.deepcopy(models[0])
    opts = [MaskedAdamW(build_param_groups(m, 0.1), lr=1e-2, impl=impl) for m, impl in zip(models, ("count", "device"))]
    for o in opts:
        if zero_fill:
            o.check_zeros_everywhere()
    ids = torch.tensor([[1, 2, 3]])
    for skills in ([0, 1], [2], [0, 3]):
        before = _snapshot(models[1], opts[1])
        for m, o in zip(models, opts):
            _step(m, o, ids, skills, zero_fill)
        after = _snapshot(models[1], opts[1])
        for name in before:
            if name.startswith("skills.") and int(name.split(".")[1]) not in skills:
                assert torch.equal(before[name], after[name]), name
            if name.startswith("emb.weight") and name in before:
                rows = [i for i in range(16) if i not in (1, 2, 3)]
                assert torch.equal(before[name][rows], after[name][rows]), name  # lazy rows
        for pa, pb in zip(models[0].parameters(), models[1].parameters()):
            torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)
    snap = _snapshot(models[1], opts[1])
    models[1](ids, [0, 1]).backward()
    opts[1].step(found_inf=torch.ones(()))
    assert all(torch.equal(v, _snapshot(models[1], opts[1])[k]) for k, v in snap.items())


def test_found_inf_needs_the_sync_free_path() -> None:
    p = nn.Parameter(torch.ones(4))
    p.grad = torch.ones(4)
    opt = MaskedAdamW([{"params": [p], "check_zeros": True}], impl="count")
    with pytest.raises(ValueError, match="found_inf needs the sync-free path"):
        opt.step(found_inf=torch.zeros(()))
    with pytest.raises(ValueError, match="impl must be one of"):
        MaskedAdamW([p], impl="fast")
