"""The paper's multi-task baselines: dense joint fine-tuning and a top-2 MoE (§4.1)."""

import torch
from skillnet.model import (
    PRESETS,
    SkillNetBertConfig,
    SkillNetBertForMultiTask,
    activated_parameters,
    count_parameters,
)
from skillnet.model.registry import ROUTERS
from skillnet.model.routers import TokenGate
from skillnet.model.skill_ffn import SkillFFN, SkillRouting

HEADS = {"sentiment": {"type": "classification", "num_labels": 2}}


def test_dense_joint_is_one_shared_ffn():
    dense = ROUTERS["dense"].derive(SkillNetBertConfig(**PRESETS["tiny"])).changes
    m = SkillNetBertForMultiTask(SkillNetBertConfig(**PRESETS["tiny"], task_heads=HEADS, **dense))
    assert list(count_parameters(m)["skills"]) == ["shared"]
    assert m.config.task_skill_names("ner") == ["shared"]


def test_top2_gate_mixes_the_two_best_experts_per_token_within_capacity():
    torch.manual_seed(0)
    ffn = SkillFFN(16, 24, 7, gate=TokenGate(16, 7, 2, 100.0, 100.0))  # no token over capacity
    x = torch.randn(2, 3, 16)
    routing = SkillRouting.token_gate(7, None)
    y = ffn(x, routing)
    x_N = x.reshape(-1, 16)
    p = ffn.gate.logits(x_N).softmax(-1)
    for n in range(x_N.shape[0]):
        w, idx = p[n].topk(2)
        w = w / w.sum()
        ref = sum(
            wi
            * ffn.skills[i].output.dense(torch.nn.functional.gelu(ffn.skills[i].intermediate.dense(x_N[n])))
            for wi, i in zip(w, idx.tolist())
        )
        torch.testing.assert_close(y.reshape(-1, 16)[n], ref, atol=1e-5, rtol=0)
    assert len(routing.aux) == 1 and routing.aux[0].item() > 0  # the layer's loss comes back with the routing


def test_moe_model_trains_gate_and_counts_two_experts():
    torch.manual_seed(0)
    m = SkillNetBertForMultiTask(SkillNetBertConfig(**PRESETS["tiny"], task_heads=HEADS, router="topk", moe_top_k=2))
    out = m(task="sentiment", input_ids=torch.randint(1, 99, (3, 7)), labels=torch.tensor([0, 1, 0]))
    out.loss.backward()
    assert m.bert.encoder.layer[0].skill_ffn.gate.weight.grad.abs().sum() > 0
    c = count_parameters(m)
    assert (
        activated_parameters(m, "sentiment") == c["shared"] + 2 * c["skills"]["s1"] + c["heads"]["sentiment"]
    )
