import pytest
import torch
from skillnet.model import SkillNetBertConfig, SkillNetBertForMultiTask
from transformers import AutoConfig


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
    "spec,expected", [("all", [0, 1, 2, 3]), ("every_other", [1, 3]), ("top:3", [1, 2, 3]), ([0, 2], [0, 2])]
)
def test_skill_layer_specs(spec, expected):
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
