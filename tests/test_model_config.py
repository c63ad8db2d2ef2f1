import pytest
import torch
from skillnet.model import SkillNetBartConfig, SkillNetBertConfig, SkillNetBertForMultiTask
from skillnet.model.registry import ROUTERS, build_router
from transformers import AutoConfig, BertConfig


def test_defaults_follow_table2_and_pretraining_objectives():
    c = SkillNetBertConfig.preset("tiny")
    assert c.skill_names == [f"s{i}" for i in range(1, 8)]
    assert c.task_skill_names("mrc") == ["s2", "s3", "s5", "s7"]
    assert c.skill_ids("mlm") == [1, 6]
    assert c.skill_ids("nsp") == [0, 2, 6]
    assert c.skill_ids("similarity") == [0, 2, 5, 6]


def test_round_trip_through_save_pretrained(tmp_path):
    c = SkillNetBertConfig.preset(
        "tiny", skill_layers="top:1", task_heads={"sentiment": {"type": "classification", "num_labels": 2}}
    )
    c.add_skill("s8", "medical texts")
    c.set_task("cmed", ["s1", "s3", "s5", "s8"], {"type": "matching"})
    c.save_pretrained(tmp_path)
    d = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(d, SkillNetBertConfig)
    assert d.skills == c.skills and d.tasks == c.tasks and d.task_heads == c.task_heads
    assert d.skill_layer_ids() == [1] and d.hidden_size == 64


def test_unknown_names_list_the_valid_ones():
    c = SkillNetBertConfig.preset("tiny")
    with pytest.raises(KeyError, match="valid tasks: .*sentiment"):
        c.skill_ids("sentimnet")
    with pytest.raises(KeyError, match="valid skills: s1, s2"):
        SkillNetBertConfig.preset("tiny", tasks={"x": ["s9"]})
    with pytest.raises(KeyError, match="valid presets"):
        SkillNetBertConfig.preset("huge")
    with pytest.raises(ValueError, match="skill_layers"):
        SkillNetBertConfig.preset("tiny", skill_layers="top:9")


@pytest.mark.parametrize(
    "spec,expected", [("all", [0, 1, 2, 3]), ("every_other", [0, 2]), ("top:3", [1, 2, 3]), ([0, 2], [0, 2])]
)
def test_skill_layer_specs(spec, expected):
    # "every_other" = layers 0, 2, 4, ... as the public SkillNet-NLG code (i % 2 == 0), the same as BART
    c = SkillNetBertConfig.preset("tiny", num_hidden_layers=4, skill_layers=spec)
    assert c.skill_layer_ids() == expected
    m = SkillNetBertForMultiTask(c)
    assert [layer.has_skills for layer in m.bert.encoder.layer] == [i in expected for i in range(4)]


def test_drop_skill_for_ablation():
    c = SkillNetBertConfig.preset("tiny")
    c.drop_skill("s3")
    assert all("s3" not in v for v in c.tasks.values())
    c.drop_skill("s7")
    assert c.generic_skill is None and c.task_skill_names("ner") == ["s2"]
    with pytest.raises(ValueError, match="no skill"):
        c.drop_skill("s2")  # mlm and ner would be left with nothing


def test_routing_rejects_out_of_range_ids():
    m = SkillNetBertForMultiTask(SkillNetBertConfig.preset("tiny"))
    with pytest.raises(ValueError, match="out of range"):
        m.bert(torch.zeros(1, 4, dtype=torch.long), skill_ids=[0, 9])
    with pytest.raises(ValueError, match="exactly one"):
        m.bert(torch.zeros(1, 4, dtype=torch.long))


def test_every_other_means_the_same_layers_for_bert_and_bart():
    bert = SkillNetBertConfig.preset("tiny", num_hidden_layers=5, skill_layers="every_other")
    bart = SkillNetBartConfig.preset("tiny", encoder_layers=5, decoder_layers=5, skill_layers="every_other")
    assert bert.skill_layer_ids() == bart.encoder_skill_layer_ids() == bart.decoder_skill_layer_ids() == [0, 2, 4]


def test_config_from_a_dense_bert_dict_is_a_skillnet_config(tmp_path):
    dense = BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128)
    c = SkillNetBertConfig(**dense.to_dict())
    assert c.model_type == "skillnet-bert" and c.hidden_size == 64
    c.save_pretrained(tmp_path)
    assert isinstance(AutoConfig.from_pretrained(tmp_path), SkillNetBertConfig)


def test_bert_and_bart_share_one_skill_layout_implementation():
    """Queries, edits and their validation live once, in SkillLayoutMixin (no twin in either config)."""
    from skillnet.model.skill_layout import SkillLayoutMixin

    shared = ("skill_ids", "task_skill_names", "skill_index", "add_skill", "drop_skill", "validate_skill_layout",
              "validate_router", "preset")
    for cls in (SkillNetBertConfig, SkillNetBartConfig):
        for name in shared:
            assert name not in vars(cls), f"{cls.__name__} redefines {name}"
            assert getattr(cls, name) is not None and hasattr(SkillLayoutMixin, name)
    # set_task: BART's is the mixin's; BERT's adds the head on top of it
    assert "set_task" not in vars(SkillNetBartConfig)
    c = SkillNetBertConfig.preset("tiny")
    with pytest.raises(KeyError, match="unknown skill 's9' in task 'x'; valid skills: s1"):
        c.set_task("x", ["s9"], {"type": "classification", "num_labels": 2})
    assert "x" not in c.task_heads and "x" not in c.tasks
    with pytest.raises(ValueError, match="head type 'tagging'"):
        c.set_task("x", ["s1"], {"type": "tagging"})
    assert "x" not in c.tasks


@pytest.mark.parametrize("cls", [SkillNetBertConfig, SkillNetBartConfig])
def test_router_fields_are_validated_the_same_way(cls):
    with pytest.raises(ValueError, match=r"moe_top_k=9 must be in 1\.\."):
        cls.preset("tiny", router="topk", moe_top_k=9)
    with pytest.raises(ValueError, match="moe_capacity_factor and moe_eval_capacity_factor must be > 0"):
        cls.preset("tiny", router="topk", moe_eval_capacity_factor=0.0)
    with pytest.raises(ValueError, match="router='gate'; valid"):
        cls.preset("tiny", router="gate")
    # the token gate's experts are plain FFNs: SkillFFN's MoE path has no per-skill residual + LayerNorm,
    # so that combination would silently drop the residual and the layer's LayerNorm
    with pytest.raises(ValueError, match="router='topk' needs skill_layernorm='shared'"):
        cls.preset("tiny", router="topk", skill_layernorm="per_skill")
    c = cls(**cls.presets["tiny"], **ROUTERS["topk"].derive(cls(**cls.presets["tiny"])).changes)
    assert (c.router, c.moe_top_k, c.moe_aux_loss_coef, c.moe_capacity_factor) == ("topk", 2, 0.01, 1.0)
    # BERT keeps 2.0 in evaluation; BART defaults to no limit (None: every token fits, experts / top_k)
    want_eval = 2.0 if cls is SkillNetBertConfig else None
    assert c.moe_eval_capacity_factor == want_eval
    assert build_router(c).capacity_factors() == (1.0, 2.0 if want_eval else c.num_skills / 2)
    assert build_router(cls.preset("tiny", router="topk", moe_eval_capacity_factor=None)).capacity_factors()[1] == (
        c.num_skills / 2)
    d = cls(**cls.presets["tiny"], **ROUTERS["dense"].derive(cls(**cls.presets["tiny"])).changes)
    assert d.skill_names == ["shared"] and d.generic_skill is None
    assert all(d.task_skill_names(t) == ["shared"] for t in d.tasks)


def test_learned_router_is_bert_only():
    assert SkillNetBertConfig.preset("tiny", router="learned").router == "learned"
    with pytest.raises(ValueError, match=r"router='learned' is not available for skillnet-bart"):
        SkillNetBartConfig.preset("tiny", router="learned")
