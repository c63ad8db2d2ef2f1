"""Adding a router is one class and one registry line, outside the model package: a toy router ("the
first skill of the task's set") trains through the fine-tuning CLI, and the run's parameter counts are
the router's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from skillnet.finetune.cli import main as finetune_main
from skillnet.model.registry import ROUTERS, Router, register_router

from tests.test_finetune_e2e import tiny_config


class FirstSkill(Router):
    """Each task runs only the first skill of its set (lowest id), whatever else the config lists."""

    def skill_ids(self, task: str) -> list[int]:
        return self.config.skill_ids(task)[:1]


@pytest.fixture
def first_skill_router():
    register_router("first_skill")(FirstSkill)  # the one registry line
    yield
    del ROUTERS["first_skill"]  # registered for this test only: other tests see the built-in routers


def _save_init(path: Path) -> dict[str, torch.Tensor]:
    from skillnet.model.config import SkillNetBertConfig
    from skillnet.model.heads import SkillNetBertForMultiTask

    torch.manual_seed(321)
    m = SkillNetBertForMultiTask(SkillNetBertConfig.preset("tiny"))
    m.save_pretrained(str(path))
    return {k: v.clone() for k, v in m.state_dict().items()}


def test_a_router_defined_outside_the_model_package_trains_through_the_cli(tmp_path, first_skill_router):
    init = _save_init(tmp_path / "init")
    out = tmp_path / "run"
    d = tiny_config(out, model={"init": str(tmp_path / "init")})
    d["tasks"] = d["tasks"][:2]  # sentiment: s1 s4 s7 -> s1; ner: s2 s7 -> s2
    (tmp_path / "cfg.json").write_text(json.dumps(d))
    assert finetune_main(["--config", str(tmp_path / "cfg.json"), "--method", "first_skill",
                         "--no-tensorboard"]) == 0

    final = load_file(str(out / "export" / "model.safetensors"))
    assert json.loads((out / "export" / "config.json").read_text())["router"] == "first_skill"

    def moved(skill: int) -> bool:
        keys = [k for k in init if f".skill_ffn.skills.{skill}." in k]
        return any(not torch.equal(init[k], final[k]) for k in keys)

    # s1 (0) and s2 (1) are the first skills of the two tasks and train; the config's other skills of the
    # tasks (s4 = 3, s7 = 6, the generic skill every task lists) never run under this router
    assert moved(0) and moved(1)
    assert not moved(3) and not moved(6)

    # activated parameters per task: shared layers, one skill FFN (the router's count), the task's head
    params = json.loads((out / "results.json").read_text())["params"]
    skill = params["skills"]["s1"]
    assert params["skills"]["s7"] == skill
    for task in ("sentiment", "ner"):
        head = sum(v.numel() for k, v in final.items() if k.startswith(f"heads.{task}."))
        assert params["tasks"][task]["activated"] == params["shared"] + skill + head
    print("activated parameters per task:", {t: v["activated"] for t, v in params["tasks"].items()})
