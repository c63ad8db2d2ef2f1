"""Fine-tuning config: round trip, validation messages, ablation and new skills from the config alone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from skillnet.finetune.config import ConfigError, FinetuneConfig

ROOT = Path(__file__).resolve().parents[1]
TINY = ROOT / "finetune" / "configs" / "tiny.json"


def _base(**kw):
    d = {"tasks": [
        {"name": "sentiment", "type": "classification", "skills": ["s1", "s4", "s7"], "train": "a.jsonl"},
        {"name": "ner", "type": "ner", "skills": ["s2", "s7"], "train": "b.jsonl"},
        {"name": "mrc", "type": "span", "skills": ["s2", "s3", "s5", "s7"], "train": "c.jsonl"},
    ]}
    d.update(kw)
    return d


def test_tiny_config_loads_and_round_trips(tmp_path):
    cfg = FinetuneConfig.load(TINY)
    assert [t.name for t in cfg.tasks] == ["sentiment", "ner", "qa_match", "mrc"]
    assert cfg.task("ner").head_type == "token_crf" and cfg.task("ner").metric == "f1"
    assert Path(cfg.resolve(cfg.task("ner").train)).is_file()
    p = tmp_path / "c.json"
    p.write_text(cfg.to_json())
    again = FinetuneConfig.load(p)
    assert again.to_dict() == cfg.to_dict()


def test_drop_skill_removes_it_from_every_task():
    cfg = FinetuneConfig.from_dict(_base(drop_skills=["s2"]))
    assert cfg.effective_skills(cfg.task("ner")) == ["s7"]
    assert cfg.effective_skills(cfg.task("mrc")) == ["s3", "s5", "s7"]
    assert cfg.effective_skills(cfg.task("sentiment")) == ["s1", "s4", "s7"]
    with pytest.raises(ConfigError, match="no skill left"):
        cfg2 = FinetuneConfig.from_dict(_base(drop_skills=["s2", "s7"]))
        cfg2.effective_skills(cfg2.task("ner"))


def test_new_skill_joins_its_tasks():
    cfg = FinetuneConfig.from_dict(_base(new_skills=[{"name": "s8", "init_from": "s7", "tasks": ["mrc"]}],
                                         freeze_old_skills=True))
    assert cfg.effective_skills(cfg.task("mrc"))[-1] == "s8"
    assert "s8" not in cfg.effective_skills(cfg.task("ner"))
    every = FinetuneConfig.from_dict(_base(new_skills=[{"name": "s8"}]))
    assert all("s8" in every.effective_skills(t) for t in every.tasks)


@pytest.mark.parametrize("mutate,msg", [
    (lambda d: d["tasks"][0].update(type="sentiment"), r"tasks\[0\]: .*unknown type 'sentiment'"),
    (lambda d: d["tasks"][1].update(skills=[]), r"tasks\[1\]: .*'skills' is empty"),
    (lambda d: d["tasks"][0].update(metric="f1"), r"metric 'f1' not available"),
    (lambda d: d["tasks"][0].update(labelz=["a"]), r"tasks\[0\]: unknown option\(s\) \['labelz'\]"),
    (lambda d: d["tasks"][0].pop("train"), r"give 'train'"),
    (lambda d: d["tasks"].append(dict(d["tasks"][0])), r"duplicate task names \['sentiment'\]"),
    (lambda d: d.update(sampler={"kind": "zipf"}), r"sampler: unknown sampler kind"),
    (lambda d: d.update(train={"max_stepz": 3}), r"train: unknown option"),
    (lambda d: d.update(freeze_old_skills=True), r"needs at least one new skill"),
    (lambda d: d.update(new_skills=[{"name": "s8", "tasks": ["nope"]}]), r"unknown task 'nope'"),
])
def test_bad_configs_name_the_problem(mutate, msg):
    d = _base()
    mutate(d)
    with pytest.raises(ConfigError, match=msg):
        FinetuneConfig.from_dict(d, where="my.json")


def test_invalid_json_names_file_and_line(tmp_path):
    p = tmp_path / "broken.json"
    p.write_text('{\n  "tasks": [\n    {"name": "x",}\n  ]\n}\n')
    with pytest.raises(ConfigError, match=r"broken.json:3: invalid JSON"):
        FinetuneConfig.load(p)
    with pytest.raises(ConfigError, match="not found"):
        FinetuneConfig.load(tmp_path / "missing.json")


def test_real_config_is_valid():
    cfg = FinetuneConfig.load(ROOT / "finetune" / "configs" / "chinese_small.json")
    assert {t.type for t in cfg.tasks} >= {"classification", "ner", "matching"}
    json.loads(cfg.to_json())
