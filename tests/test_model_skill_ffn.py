import random

import pytest
import torch
from skillnet.model import SkillNetBertConfig, SkillNetBertModel
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
