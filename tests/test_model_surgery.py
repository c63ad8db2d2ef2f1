import pytest
import torch
from skillnet.model import (
    DEFAULT_TASKS,
    SkillNetBertConfig,
    SkillNetBertForMultiTask,
    SkillNetBertForPreTraining,
    SkillNetBertModel,
    activated_parameters,
    add_skill,
    count_parameters,
    export_skill,
    freeze_skills,
    import_skill,
    skill_parameters,
    trainable_activated_parameters,
)
from transformers import AutoModel, AutoModelForPreTraining

HEADS = {"cmed": {"type": "matching"}, "sentiment": {"type": "classification", "num_labels": 2}}


def _model(**kw) -> SkillNetBertForMultiTask:
    torch.manual_seed(0)
    tasks = {**DEFAULT_TASKS, "cmed": ["s1", "s3", "s5"]}
    return SkillNetBertForMultiTask(
        SkillNetBertConfig.preset("tiny", tasks=tasks, task_heads=dict(HEADS), **kw)
    )


def test_add_skill_s8_from_s7_and_activate_it():
    m = _model()
    k = add_skill(m, "s8", init_from="s7", description="medical texts", tasks=["cmed"])
    assert k == 7 and m.config.skill_names[-1] == "s8"
    assert m.config.task_skill_names("cmed") == ["s1", "s3", "s5", "s8", "s7"]
    for s7, s8 in zip(m.bert.skill_modules("s7"), m.bert.skill_modules("s8")):
        for a, b in zip(s7.parameters(), s8.parameters()):
            assert torch.equal(a, b) and a.data_ptr() != b.data_ptr()
    x = torch.randint(1, 50, (2, 3, 5))
    m(task="cmed", input_ids=x, labels=torch.tensor([0, 2])).loss.backward()
    assert all(p.grad is not None for p in skill_parameters(m)["s8"])
    assert all(p.grad is None for p in skill_parameters(m)["s4"])


def test_freeze_and_trainable_counts():
    m = _model()
    add_skill(m, "s8", tasks=["cmed"])
    old = [s for s in m.config.skill_names if s != "s8"]
    freeze_skills(m, old)
    per_skill = count_parameters(m)["skills"]["s1"]
    # cmed = s1 s3 s5 s8 s7: the four old skills are frozen, s8 trains.
    assert trainable_activated_parameters(m, "cmed") == activated_parameters(m, "cmed") - 4 * per_skill
    freeze_skills(m, old, frozen=False)
    assert trainable_activated_parameters(m, "cmed") == activated_parameters(m, "cmed")
    with pytest.raises(KeyError, match="valid skills"):
        freeze_skills(m, ["s99"])


def test_activated_counts_by_hand():
    m = _model()
    c = m.config
    d, f, L = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    per_skill = L * (d * f + f + f * d + d)
    counts = count_parameters(m)
    assert counts["skills"] == {f"s{i}": per_skill for i in range(1, 8)}
    head = d * 2 + 2
    assert counts["heads"]["sentiment"] == head
    assert activated_parameters(m, "sentiment") == counts["shared"] + 3 * per_skill + head
    assert counts["total"] == counts["shared"] + 7 * per_skill + sum(counts["heads"].values())


def test_export_import_skill_round_trip(tmp_path):
    a = _model()
    add_skill(a, "s8", tasks=["cmed"])
    with torch.no_grad():
        for p in skill_parameters(a)["s8"]:
            p.add_(1.0)
    out = export_skill(a, "s8", tmp_path / "s8")
    manifest = (out / "manifest.json").read_text()
    assert '"tasks": [\n    "cmed"' in manifest and "copy of s7" in manifest
    b = _model()
    import_skill(b, out)
    assert b.config.task_skill_names("cmed")[-2:] == ["s8", "s7"]
    for pa, pb in zip(skill_parameters(a)["s8"], skill_parameters(b)["s8"]):
        assert torch.equal(pa, pb)
    with pytest.raises(ValueError, match="already exists"):
        import_skill(b, out)
    other = SkillNetBertForMultiTask(SkillNetBertConfig.preset("tiny", intermediate_size=96))
    with pytest.raises(ValueError, match="intermediate_size"):
        import_skill(other, out)


def test_save_load_with_new_skill_and_auto_classes(tmp_path):
    m = _model()
    add_skill(m, "s8", tasks=["cmed"])
    m.save_pretrained(tmp_path / "mt")
    n = SkillNetBertForMultiTask.from_pretrained(tmp_path / "mt")
    assert n.config.skill_names[-1] == "s8" and "s8" in n.config.tasks["cmed"]
    for (k, a), (_, b) in zip(m.state_dict().items(), n.state_dict().items()):
        assert torch.equal(a, b), k
    assert isinstance(AutoModel.from_pretrained(tmp_path / "mt"), SkillNetBertModel)
    p = SkillNetBertForPreTraining(SkillNetBertConfig.preset("tiny"))
    p.save_pretrained(tmp_path / "pt")
    q = AutoModelForPreTraining.from_pretrained(tmp_path / "pt")
    assert isinstance(q, SkillNetBertForPreTraining)
    assert q.cls.predictions.decoder.weight is q.bert.embeddings.word_embeddings.weight
    assert (tmp_path / "pt" / "model.safetensors").exists()
