"""The methods' model parts (issue: every method of the papers): the MoE token gate with capacity, the learned
task-skill map, and projected attention layers. Hand-computed values where a formula is the spec."""

from __future__ import annotations

import math

import pytest
import torch
from skillnet.model import PRESETS, SkillNetBertConfig, SkillNetBertForMultiTask, count_parameters
from skillnet.model.learned_map import LearnedSkillMap
from skillnet.model.routers import TokenGate, top_k_gating
from skillnet.model.skill_ffn import SkillFFN, SkillRouting
from skillnet.training.optim import MaskedAdamW

HEADS = {"a": {"type": "classification", "num_labels": 2}, "b": {"type": "classification", "num_labels": 3}}
TASKS = {"a": ["s1", "s4", "s7"], "b": ["s2", "s3", "s7"]}


def _model(**kw) -> SkillNetBertForMultiTask:
    torch.manual_seed(0)
    cfg = SkillNetBertConfig.preset("tiny", task_heads=HEADS, tasks=dict(TASKS), hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0, **kw)
    return SkillNetBertForMultiTask(cfg)


def _batch(B: int = 4, T: int = 9, pad_from: int | None = 5) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 200, (B, T), generator=g)
    mask = torch.ones_like(ids)
    if pad_from is not None:
        mask[0, pad_from:] = 0
        ids[0, pad_from:] = 0
    return {"input_ids": ids, "attention_mask": mask}


def _gate_outputs(model: torch.nn.Module) -> list:
    """Every token gate's output, in call order, from forward hooks on the gates."""
    seen: list = []
    for mod in model.modules():
        if isinstance(mod, TokenGate):
            mod.register_forward_hook(lambda _m, _i, out: seen.append(out))
    return seen


# ------------------------------------------------------------------------------------------------- MoE
def test_balancing_loss_matches_a_hand_computed_value():
    # 4 tokens, 3 experts; token 3 is padding and must not count anywhere.
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0], [1.0, 0.0, 2.0], [9.0, 0.0, 0.0]])
    keep = torch.tensor([True, True, True, False])
    g = top_k_gating(logits, k=2, capacity_factor=10.0, keep_N=keep)
    p = logits[:3].softmax(-1)
    mean_prob = p.mean(0)
    frac_top1 = torch.tensor([1.0, 1.0, 1.0]) / 3  # first choices: experts 0, 1, 2
    want = 3 * float((mean_prob * frac_top1).sum())  # fairseq: E^2 * mean_e(me * ce)
    assert float(g.aux_loss) == pytest.approx(want, rel=1e-6)
    assert not g.dispatch_NE[3].any() and float(g.combine_NE[3].abs().sum()) == 0.0
    # top-2 weights renormalised over the two kept experts
    w = p[0, [0, 1]] / p[0, [0, 1]].sum()
    torch.testing.assert_close(g.combine_NE[0, [0, 1]], w)


def test_capacity_drops_exactly_the_assignments_over_capacity_first_choices_first():
    # 6 tokens all prefer expert 0, then expert 1; E=3, k=2, factor 0.5 -> capacity ceil(0.5*2*6/3) = 2.
    logits = torch.tensor([[3.0, 2.0, 0.0]] * 6)
    g = top_k_gating(logits, k=2, capacity_factor=0.5)
    assert g.capacity == 2
    expect = torch.zeros(6, 3, dtype=torch.bool)
    expect[0, 0] = expect[1, 0] = True  # first choices fill expert 0 in token order
    expect[0, 1] = expect[1, 1] = True  # second choices of tokens 0, 1 fill expert 1
    assert torch.equal(g.dispatch_NE, expect)
    assert g.dropped == 12 - 4
    assert float(g.combine_NE[2:].abs().sum()) == 0.0  # dropped everywhere: zero from the FFN
    # capacity ceil(1*2*3/3) = 2: token 2 loses its first choice (expert 0 is full) but keeps its second,
    # which then gets the whole gate
    g2 = top_k_gating(torch.tensor([[3.0, 2.0, 0.0], [3.0, 2.0, 0.0], [3.0, 0.0, 2.0]]), k=2, capacity_factor=1.0)
    assert g2.capacity == 2 and g2.dispatch_NE[2].tolist() == [False, False, True]
    assert float(g2.combine_NE[2, 2]) == pytest.approx(1.0)


def test_dropped_tokens_ride_the_residual_and_unchosen_experts_learn_nothing():
    torch.manual_seed(0)
    ffn = SkillFFN(16, 24, 4, gate=TokenGate(16, 4, 2, 0.25, 0.25))
    x = torch.randn(2, 5, 16)
    y = ffn(x, SkillRouting.token_gate(4, None))
    g = top_k_gating(ffn.gate.logits(x.reshape(-1, 16)), 2, 0.25)
    dropped = ~g.dispatch_NE.any(-1)
    assert dropped.any()
    assert float(y.detach().reshape(-1, 16)[dropped].abs().sum()) == 0.0
    y.pow(2).sum().backward()
    chosen = g.dispatch_NE.any(0)
    for e, s in enumerate(ffn.skills):
        gw = s.intermediate.dense.weight.grad
        if chosen[e]:
            assert gw is not None and gw.abs().sum() > 0
        else:  # ran on zero rows: the same graph on every rank, an exactly-zero gradient
            assert gw is None or not gw.any()


def test_moe_loss_includes_the_per_layer_balancing_loss_and_ignores_padding():
    m = _model(router="topk", moe_aux_loss_coef=0.5, moe_capacity_factor=100.0)
    b = _batch()
    gates = _gate_outputs(m)
    out = m(task="a", labels=torch.tensor([0, 1, 0, 1]), **b)
    layers = [g.aux_loss for g in gates]
    assert len(layers) == 2 and all(x is not None for x in layers)
    m.config.moe_aux_loss_coef = 0.0
    out0 = m(task="a", labels=torch.tensor([0, 1, 0, 1]), **b)
    assert float(out.loss - out0.loss) == pytest.approx(0.5 * float(torch.stack(layers).mean()), rel=1e-5)
    assert out.metrics["aux_moe_balance"] == pytest.approx(float(torch.stack(layers).mean()), rel=1e-5)
    # padding takes no part: changing the padded tokens' ids changes neither the loss nor the real rows
    b2 = {k: v.clone() for k, v in b.items()}
    b2["input_ids"][0, 5:] = 77
    out2 = m(task="a", labels=torch.tensor([0, 1, 0, 1]), **b2)
    assert float(out2.loss) == pytest.approx(float(out0.loss), abs=1e-6)


def test_moe_eval_uses_its_own_capacity():
    m = _model(router="topk", moe_capacity_factor=0.1, moe_eval_capacity_factor=4.0)
    b = _batch(pad_from=None)
    gates = _gate_outputs(m)
    m.train()
    m.bert(**b, task="a")
    train_cap = gates[0].capacity
    m.eval()
    m.bert(**b, task="a")
    ev = gates[2]  # layer 0 of the second forward
    N, E = b["input_ids"].numel(), 7
    assert train_cap == math.ceil(0.1 * 2 * N / E) and ev.capacity == math.ceil(4.0 * 2 * N / E)
    assert ev.dropped == 0


# ------------------------------------------------------------------------------------------ learned map
def test_orthogonality_loss_matches_a_hand_computed_case():
    lm = LearnedSkillMap(["a"], 3, 2, generic=2, threshold=0.35, estimator="ste", sharpness=10.0)
    with torch.no_grad():
        lm.skill_embed.copy_(torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 2.0]]))
    # E E^T off-diagonal: (1,2)=1, (1,3)=0, (2,3)=2 -> squares 1, 0, 4, each twice -> 10 / (3*2)
    assert float(lm.orthogonality_loss()) == pytest.approx(10 / 6)


def test_alpha_follows_eq3():
    lm = LearnedSkillMap(["a", "b"], 3, 4, generic=None, threshold=0.35, estimator="ste", sharpness=10.0)
    with torch.no_grad():
        lm.proj_weight.normal_()
        lm.proj_bias.normal_()
    alpha = lm.alpha()
    for j in range(2):
        for i in range(3):
            want = torch.sigmoid((lm.proj_weight[i, j] @ lm.task_embed[j] + lm.proj_bias[i, j]) @ lm.skill_embed[i])
            assert float(alpha[j, i]) == pytest.approx(float(want), rel=1e-5)


def test_eq6_with_the_papers_sharpness_passes_no_gradient_but_ste_does():
    for estimator, sharp, moves in (("eq6", 1e9, False), ("ste", 10.0, True)):
        lm = LearnedSkillMap(["a", "b"], 7, 64, generic=6, threshold=0.35, estimator=estimator, sharpness=sharp)
        w = lm.weights(lm.alpha())
        (w * torch.randn_like(w)).sum().backward()
        grads = [p.grad for p in (lm.task_embed, lm.skill_embed, lm.proj_weight)]
        has = any(g is not None and g.abs().sum() > 0 for g in grads)
        assert has == moves, estimator
        assert torch.equal(w.detach()[:, 6], torch.ones(2))  # the generic skill is always on
        assert set(w.detach().unique().tolist()) <= {0.0, 1.0}  # both are hard maps in the forward pass


@pytest.mark.slow  # measured 47 s
def test_learned_map_moves_under_ste_and_prediction_uses_the_trained_map(tmp_path):
    m = _model(router="learned", learned_threshold=0.5)
    lm = m.bert.skill_map
    init = lm.hard_map().clone()
    opt = torch.optim.Adam(lm.parameters(), lr=0.2)
    b = _batch(pad_from=None)
    for _ in range(25):
        for task, y in (("a", torch.tensor([0, 1, 0, 1])), ("b", torch.tensor([2, 1, 0, 2]))):
            opt.zero_grad()
            m(task=task, labels=y, **b).loss.backward()
            opt.step()
    assert not torch.equal(lm.hard_map(), init), "the learned map did not move under the straight-through estimator"
    m.eval()
    learned = m.bert.router.task_skills(m.bert)  # the learned map's skill names per task (hard threshold)
    m.save_pretrained(str(tmp_path / "m"))  # writes the learned map into the saved config.tasks
    back = SkillNetBertForMultiTask.from_pretrained(str(tmp_path / "m")).eval()
    assert back.bert.router.task_skills(back.bert) == learned
    assert {t: back.config.tasks[t] for t in learned} == learned
    with torch.no_grad():
        torch.testing.assert_close(back(task="a", **b).logits, m(task="a", **b).logits)


def test_learned_map_step_keeps_skills_it_did_not_use_and_probes_untouched():
    m = _model(router="learned")
    m.train()
    routing = m.bert.skill_map.routing("a", "cpu")
    g = routing.groups[0]
    assert g.probe and set(g.skill_ids).isdisjoint(g.probe)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    opt = MaskedAdamW([p for p in m.parameters()], lr=1e-2)
    m(task="a", labels=torch.tensor([0, 1, 0, 1]), **_batch()).loss.backward()
    opt.step()
    after = m.state_dict()
    for k in before:
        skill = k.split(".skill_ffn.skills.")[1].split(".")[0] if ".skill_ffn.skills." in k else None
        if skill is not None and int(skill) not in g.skill_ids:
            assert torch.equal(before[k], after[k]), f"{k}: a probe or unused skill moved"
        if k.startswith("heads.b."):
            assert torch.equal(before[k], after[k]), k
    assert not torch.equal(before["bert.skill_map.task_embed"], after["bert.skill_map.task_embed"])


# ------------------------------------------------------------------------------------------------- PALs
def pals_parameter_count(hidden: int, dim: int, num_layers: int) -> int:
    """Parameters one task's PALs add (PALs §3: V^E and V^D shared across layers, an attention per layer)."""
    return (hidden * dim + dim) + (dim * hidden + hidden) + num_layers * 3 * (dim * dim + dim)


def test_pals_add_exactly_the_formula_parameter_count():
    d_m = SkillNetBertConfig.pals_dim_for(64)
    base = count_parameters(_model())["total"]
    with_pals = count_parameters(_model(pals_dim=d_m))["total"]
    L, d = PRESETS["tiny"]["num_hidden_layers"], PRESETS["tiny"]["hidden_size"]
    assert with_pals - base == len(HEADS) * pals_parameter_count(d, d_m, L)
    assert SkillNetBertConfig.pals_dim_for(768) == 204  # the paper's d_m at BERT-base


def test_a_task_step_gives_no_gradient_to_another_tasks_pals():
    m = _model(pals_dim=24)
    m(task="a", labels=torch.tensor([0, 1, 0, 1]), **_batch()).loss.backward()
    for name, p in m.named_parameters():
        if ".pals.tasks.b." in name:
            assert p.grad is None, name
        if ".pals.tasks.a." in name:
            assert p.grad is not None and p.grad.abs().sum() > 0, name
    # V^E and V^D are shared by all layers: one module per task, not per layer
    a = m.bert.pals.tasks["a"]
    assert len(a.layers) == 2 and a.down.weight.shape == (24, 64) and a.up.weight.shape == (64, 24)


def test_pals_mixed_task_batch_equals_per_task_batches():
    m = _model(pals_dim=24).eval()
    b = _batch(pad_from=None)
    with torch.no_grad():
        mixed = m.bert(task=["a", "b", "a", "b"], **b).last_hidden_state
        a = m.bert(task="a", **b).last_hidden_state
        bb = m.bert(task="b", **b).last_hidden_state
    torch.testing.assert_close(mixed[[0, 2]], a[[0, 2]], atol=1e-5, rtol=0)
    torch.testing.assert_close(mixed[[1, 3]], bb[[1, 3]], atol=1e-5, rtol=0)
