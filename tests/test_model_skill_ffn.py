import random

import pytest
import torch
from skillnet.model import SkillNetBertConfig, SkillNetBertModel
from skillnet.model.routers import TokenGate
from skillnet.model.skill_ffn import SkillFFN, SkillRouting

D, F, S = 32, 48, 7


def _pair(seed: int = 0, per_skill_ln: bool = False) -> tuple[SkillFFN, SkillFFN]:
    torch.manual_seed(seed)
    fused = SkillFFN(D, F, S, impl="fused", per_skill_layernorm=per_skill_ln)
    loop = SkillFFN(D, F, S, impl="loop", per_skill_layernorm=per_skill_ln)
    loop.load_state_dict(fused.state_dict())
    return fused, loop


def _grads(m: SkillFFN) -> dict[str, torch.Tensor | None]:
    return {n: (None if p.grad is None else p.grad.clone()) for n, p in m.named_parameters()}


def _random_sets(rng: random.Random, n: int) -> list[list[int]]:
    return [sorted(rng.sample(range(S), rng.randint(1, 4))) for _ in range(n)]


@pytest.mark.parametrize("seed", range(5))
def test_fused_equals_loop_outputs_and_grads(seed):
    rng = random.Random(seed)
    fused, loop = _pair(seed)
    x = torch.randn(3, 5, D, dtype=torch.float32)
    ids = _random_sets(rng, 1)[0]
    outs = []
    for m in (fused, loop):
        xi = x.clone().requires_grad_(True)
        y = m(xi, SkillRouting.uniform(ids))
        (y * torch.linspace(-1, 1, y.numel()).view_as(y)).sum().backward()
        outs.append((y.detach(), xi.grad, _grads(m)))
    (yf, gxf, gf), (yl, gxl, gl) = outs
    torch.testing.assert_close(yf, yl, atol=1e-5, rtol=0)
    torch.testing.assert_close(gxf, gxl, atol=1e-5, rtol=0)
    for n in gf:
        k = int(n.split(".")[1])
        if k in ids:
            torch.testing.assert_close(gf[n], gl[n], atol=1e-5, rtol=0)
        else:
            assert gf[n] is None and gl[n] is None, f"inactive skill param {n} got a gradient"


@pytest.mark.parametrize("impl", ["fused", "loop"])
def test_mixed_task_batch_equals_each_task_alone(impl):
    rng = random.Random(1)
    torch.manual_seed(1)
    m = SkillFFN(D, F, S, impl=impl)
    rows = _random_sets(rng, 3) * 2 + [[6]]
    rng.shuffle(rows)
    x = torch.randn(len(rows), 4, D)
    y_mixed = m(x, SkillRouting.per_row(rows))
    for i, ids in enumerate(rows):
        y_alone = m(x[i : i + 1], SkillRouting.uniform(ids))
        torch.testing.assert_close(y_mixed[i : i + 1], y_alone, atol=1e-6, rtol=0)


def test_mixed_batch_fused_vs_loop_grads():
    rng = random.Random(2)
    fused, loop = _pair(2)
    rows = _random_sets(rng, 6)
    x = torch.randn(len(rows), 3, D)
    for m in (fused, loop):
        m(x, SkillRouting.per_row(rows)).pow(2).sum().backward()
    active = {i for r in rows for i in r}
    for (n, pf), (_, pl) in zip(fused.named_parameters(), loop.named_parameters()):
        if int(n.split(".")[1]) in active:
            torch.testing.assert_close(pf.grad, pl.grad, atol=1e-5, rtol=0)
        else:
            assert pf.grad is None and pl.grad is None


def test_per_skill_layernorm_option_matches_reference():
    fused, _ = _pair(3, per_skill_ln=True)
    x = torch.randn(2, 3, D)
    ids = (0, 2, 5)
    y = fused(x, SkillRouting.uniform(ids), residual_BTD=x)
    ref = sum(
        fused.skills[i].output.LayerNorm(
            fused.skills[i].output.dense(torch.nn.functional.gelu(fused.skills[i].intermediate.dense(x))) + x
        )
        for i in ids
    ) / len(ids)
    torch.testing.assert_close(y, ref, atol=1e-6, rtol=0)


@pytest.mark.parametrize("impl", ["fused", "loop"])
def test_inactive_skills_do_not_move_under_adamw(impl):
    cfg = SkillNetBertConfig.preset("tiny", ffn_impl=impl, hidden_dropout_prob=0.0)
    model = SkillNetBertModel(cfg)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    x = torch.randint(1, 100, (2, 6))
    for task in ["mlm", "ner", "mlm"]:  # s2, s7 only
        opt.zero_grad()
        model(x, task=task).last_hidden_state.pow(2).mean().backward()
        opt.step()
    active = {f"skills.{i}." for i in cfg.skill_ids("mlm")}
    for n, p in model.named_parameters():
        if ".skills." in n and not any(a in n for a in active):
            assert p.grad is None, n
            assert torch.equal(p, before[n]), f"inactive {n} moved"
        elif ".skills." in n:
            assert not torch.equal(p, before[n]), f"active {n} did not move"


@pytest.mark.parametrize("act", ["relu", "gelu_new"])
def test_fused_other_activations_match_loop(act):
    torch.manual_seed(4)
    fused = SkillFFN(D, F, S, hidden_act=act, impl="fused")
    loop = SkillFFN(D, F, S, hidden_act=act, impl="loop")
    loop.load_state_dict(fused.state_dict())
    x = torch.randn(2, 5, D)
    for m in (fused, loop):
        m(x, SkillRouting.uniform([1, 3, 6])).pow(2).sum().backward()
    torch.testing.assert_close(fused(x, SkillRouting.uniform([1, 3, 6])), loop(x, SkillRouting.uniform([1, 3, 6])))
    for (n, pf), (_, pl) in zip(fused.named_parameters(), loop.named_parameters()):
        if pl.grad is not None:
            torch.testing.assert_close(pf.grad, pl.grad, atol=1e-5, rtol=0, msg=n)


def test_fused_skips_grads_of_frozen_skills():
    fused, _ = _pair(5)
    for p in fused.skills[2].parameters():
        p.requires_grad_(False)
    x = torch.randn(2, 3, D, requires_grad=True)
    fused(x, SkillRouting.uniform([0, 2, 6])).sum().backward()
    assert all(p.grad is None for p in fused.skills[2].parameters())
    assert all(p.grad is not None for p in fused.skills[0].parameters()) and x.grad is not None


# ---- activation dropout (BART's dropout between fc1 and fc2) -----------------------------------------------
def _all_paths(p: float) -> dict[str, SkillFFN]:
    """Every SkillFFN path with activation dropout `p`, all with the same weights."""
    torch.manual_seed(6)
    ref = SkillFFN(D, F, S)
    paths = {
        "fused": SkillFFN(D, F, S, impl="fused", activation_dropout=p),
        "fused_concat": SkillFFN(D, F, S, hidden_act="relu", impl="fused", activation_dropout=p),
        "loop": SkillFFN(D, F, S, impl="loop", activation_dropout=p),
        "per_skill_ln": SkillFFN(D, F, S, per_skill_layernorm=True, layer_norm_eps=1e-5, activation_dropout=p),
        "moe": SkillFFN(D, F, S, gate=TokenGate(D, S, 2, 100.0, 2.0), activation_dropout=p),
    }
    for m in paths.values():
        m.load_state_dict(ref.state_dict(), strict=False)
    return paths


def _run(m: SkillFFN, x: torch.Tensor, ids: list[int]) -> torch.Tensor:
    routing = SkillRouting.token_gate(S, None) if m.gate is not None else SkillRouting.uniform(ids)
    return m(x, routing, residual_BTD=x if m.per_skill_layernorm else None)


def test_activation_dropout_is_off_in_eval_and_at_zero_and_on_in_training_in_every_path():
    x = torch.randn(3, 5, D)
    ids = [0, 2, 5]
    off, on = _all_paths(0.0), _all_paths(0.4)
    for name in off:
        for m in (off[name], on[name]):
            m.eval()
        torch.testing.assert_close(_run(on[name], x, ids), _run(off[name], x, ids), atol=0, rtol=0, msg=name)
        for m in (off[name], on[name]):
            m.train()
        torch.manual_seed(0)
        dense = _run(off[name], x, ids)
        torch.manual_seed(0)
        assert torch.equal(_run(off[name], x, ids), dense), f"{name}: p=0 must be deterministic in training"
        assert not torch.equal(_run(on[name], x, ids), dense), f"{name}: p>0 had no effect in training"
    # eval: the fused kernel with dropout configured still equals the loop reference
    on["fused"].eval()
    on["loop"].eval()
    torch.testing.assert_close(_run(on["fused"], x, ids), _run(on["loop"], x, ids), atol=1e-5, rtol=0)


@pytest.mark.parametrize("ids", [[1, 4], [0, 3, 6]])
def test_fused_kernel_dropout_forward_and_backward_match_autograd_with_the_same_mask(ids):
    """The kernel draws one keep mask over its [N, k*F] activation buffer; replaying the same draw, the
    autograd reference (gelu -> mask / (1 - p) -> fc2, averaged) gives the same output and gradients."""
    p = 0.3
    torch.manual_seed(7)
    m = SkillFFN(D, F, S, impl="fused", activation_dropout=p).train()
    x = torch.randn(2, 5, D, requires_grad=True)
    torch.manual_seed(11)
    y = m(x, SkillRouting.uniform(ids))
    w = torch.linspace(-1, 1, y.numel()).view_as(y)
    (y * w).sum().backward()
    got = (y.detach(), x.grad.clone(), {n: q.grad.clone() for n, q in m.named_parameters() if q.grad is not None})

    m.zero_grad(set_to_none=True)
    x2 = x.detach().clone().requires_grad_(True)
    sk = [m.skills[i] for i in ids]
    n_tok, kf = 10, F * len(ids)
    torch.manual_seed(11)
    keep = torch.empty(n_tok, kf, dtype=torch.bool).bernoulli_(1 - p)  # the kernel's one draw
    w1 = torch.cat([s.intermediate.dense.weight for s in sk], 0)
    b1 = torch.cat([s.intermediate.dense.bias for s in sk], 0)
    w2 = torch.cat([s.output.dense.weight for s in sk], 1)
    b2 = torch.stack([s.output.dense.bias for s in sk], 0).mean(0)
    h = torch.nn.functional.gelu(x2.reshape(n_tok, D) @ w1.t() + b1) * keep / (1 - p)
    ref = (h @ w2.t() / len(ids) + b2).view_as(y)
    (ref * w).sum().backward()
    torch.testing.assert_close(got[0], ref.detach(), atol=1e-5, rtol=0)
    torch.testing.assert_close(got[1], x2.grad, atol=1e-5, rtol=0)
    for n, q in m.named_parameters():
        if q.grad is not None:
            torch.testing.assert_close(got[2][n], q.grad, atol=1e-5, rtol=0, msg=n)
    assert set(got[2]) == {n for n, q in m.named_parameters() if q.grad is not None}


def test_fused_path_without_grad_is_bit_identical_to_the_autograd_one():
    torch.manual_seed(0)
    m = SkillFFN(32, 64, 5, impl="fused").eval()
    x = torch.randn(3, 7, 32)
    route = SkillRouting.uniform([0, 2, 4])
    y_grad = m(x, route)
    with torch.no_grad():
        y_nograd = m(x, route)
    assert torch.equal(y_grad.detach(), y_nograd)


@pytest.mark.parametrize("k", [2, 3])
def test_fused_path_under_autocast_matches_the_loop(k: int) -> None:
    """Under autocast the fused path concatenates each weight kind straight into the autocast dtype; its
    output and every gradient match the loop's (which autocast casts per skill), the gradients come back
    fp32 and contiguous in each parameter's own layout, and inactive skills get none."""
    torch.manual_seed(0)
    fused, loop = SkillFFN(32, 64, 7, impl="fused"), SkillFFN(32, 64, 7, impl="loop")
    loop.load_state_dict(fused.state_dict())
    route = SkillRouting.uniform(list(range(7 - k, 7)))
    x = torch.randn(2, 8, 32)
    res = []
    for m in (fused, loop):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = m(xi, route)
        assert y.dtype == torch.bfloat16
        y.float().square().mean().backward()
        res.append((y.float(), xi.grad, [(n, p.grad) for n, p in m.named_parameters() if p.grad is not None]))
    torch.testing.assert_close(res[0][0], res[1][0], atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(res[0][1], res[1][1], atol=1e-4, rtol=1e-2)
    assert [n for n, _ in res[0][2]] == [n for n, _ in res[1][2]] and len(res[0][2]) == 4 * k
    for (_, a), (_, b) in zip(res[0][2], res[1][2]):
        assert a.dtype == torch.float32 and a.is_contiguous()
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-2)


def test_decoding_keeps_the_wide_weights_until_they_change() -> None:
    """Inference under autocast (generation on a GPU) concatenates the active skills' weights once and keeps
    them, as autocast keeps a dense layer's cast weights: the output equals the training path's, a changed
    weight or another skill set recomputes them, and train() drops them."""
    torch.manual_seed(0)
    m = SkillFFN(32, 64, 7, impl="fused").eval()
    x = torch.randn(2, 5, 32)

    def run(route: SkillRouting, grad: bool) -> torch.Tensor:
        with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.bfloat16):
            return m(x, route).detach()

    a = SkillRouting.uniform([1, 4, 6])
    first = run(a, grad=False)
    kept = m._decode_cache
    assert kept is not None
    assert torch.equal(first, run(a, grad=True)) and torch.equal(run(a, grad=False), first)
    assert m._decode_cache is kept  # the second call reused the weights
    with torch.no_grad():
        m.skills[4].output.dense.weight.mul_(2.0)
    changed = run(a, grad=False)
    assert not torch.equal(changed, first) and torch.equal(changed, run(a, grad=True))
    b = SkillRouting.uniform([0, 2])
    assert torch.equal(run(b, grad=False), run(b, grad=True))
    m.train()
    assert m._decode_cache is None
