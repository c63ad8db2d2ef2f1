"""Adding a model family is one `ModelSpec` and one registry line, outside the model package: a toy family
("skillnet-toy", with dense checkpoints of type "toy-dense") is seen by every per-family table: pre-training's
presets and objectives, fine-tuning's init folders and presets, the Auto classes `save_pretrained` names, and
the export of a pre-training checkpoint, which writes the toy's dense HF model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from skillnet.model.spec import (
    MODEL_FAMILIES,
    ModelSpec,
    family_of_model_type,
    model_family,
    register_model_family,
    resolve,
)
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel


class DenseToyConfig(PretrainedConfig):
    model_type = "toy-dense"

    def __init__(self, hidden_size: int = 4, vocab_size: int = 10, **kwargs: Any) -> None:
        self.hidden_size, self.vocab_size = hidden_size, vocab_size
        super().__init__(**kwargs)


class ToyConfig(DenseToyConfig):
    model_type = "skillnet-toy"
    presets = {"tiny": {"hidden_size": 4}, "wide": {"hidden_size": 16}}

    def __init__(self, skill_layers: Any = "all", tasks: dict[str, list[str]] | None = None, **kwargs: Any) -> None:
        self.skill_layers, self.tasks = skill_layers, tasks or {"toy_mlm": ["s1"]}
        super().__init__(**kwargs)

    @classmethod
    def preset(cls, name: str, **overrides: Any) -> ToyConfig:
        return cls(**{**cls.presets[name], **overrides})


class DenseToyModel(PreTrainedModel):
    config_class = DenseToyConfig

    def __init__(self, config: DenseToyConfig) -> None:
        super().__init__(config)
        self.proj = nn.Linear(config.hidden_size, config.hidden_size)
        self.post_init()


class ToyModel(DenseToyModel):
    config_class = ToyConfig


def toy_from_dense(path: str, model_class: type = ToyModel, **overrides: Any) -> PreTrainedModel:
    dense = DenseToyModel.from_pretrained(path)
    model = model_class(ToyConfig(hidden_size=dense.config.hidden_size, **overrides))
    model.load_state_dict(dense.state_dict())
    return model


TOY = ModelSpec(
    name="toy", title="SkillNet-Toy", model_type="skillnet-toy", dense_type="toy-dense",
    config=ToyConfig, base_model=ToyModel, pretraining_model=ToyModel, task_model=ToyModel,
    from_dense=toy_from_dense, objectives=("toy_mlm",),
    auto_classes=(("AutoConfig", "config"), ("AutoModel", "base_model")),
    task_heads=True, sparse_export=True, dense_export=(DenseToyConfig, DenseToyModel),
)


@pytest.fixture
def toy_family():
    register_model_family(TOY)  # the one registry line
    yield TOY
    del MODEL_FAMILIES["toy"]  # registered for this test only: other tests see the built-in families


def test_the_registry_finds_a_family_by_name_and_by_checkpoint_type(toy_family):
    assert model_family("toy") is TOY
    assert family_of_model_type("skillnet-toy") is TOY and family_of_model_type("toy-dense") is TOY
    with pytest.raises(ValueError, match="already family 'toy'"):
        register_model_family(ModelSpec(**{**TOY.__dict__, "name": "toy2"}))


def test_the_built_in_specs_agree_with_their_classes():
    for spec in MODEL_FAMILIES.values():
        assert spec.load("config").model_type == spec.model_type
        for part in ("base_model", "pretraining_model", "task_model"):
            assert spec.load(part).config_class is spec.load("config"), (spec.name, part)
        assert callable(spec.load("from_dense"))
        if spec.dense_export is not None:
            config_cls, model_cls = (resolve(r) for r in spec.dense_export)
            assert model_cls.config_class is config_cls and config_cls.model_type == spec.dense_type


def test_pretraining_reads_presets_and_objectives_from_the_spec(toy_family):
    from skillnet.pretrain.run import PretrainArch

    def unused(*_: Any) -> None:
        raise AssertionError

    stage = PretrainArch("toy", unused, unused, unused, unused)
    assert stage.objectives == ("toy_mlm",) and list(stage.presets()) == ["tiny", "wide"]


def test_finetuning_knows_the_family_s_presets_and_init_folders(toy_family, tmp_path: Path):
    from skillnet.finetune.build import _init_kind
    from skillnet.finetune.config import _arch_names, _presets

    assert "toy" in _arch_names() and _presets("toy") == ["tiny", "wide"]
    ToyModel(ToyConfig()).save_pretrained(str(tmp_path / "sparse"))
    DenseToyModel(DenseToyConfig()).save_pretrained(str(tmp_path / "dense"))
    assert _init_kind(str(tmp_path / "sparse"), TOY) == "skillnet"
    assert _init_kind(str(tmp_path / "dense"), TOY) == "dense"
    model = TOY.load("from_dense")(str(tmp_path / "dense"), model_class=TOY.load("task_model"))
    assert isinstance(model, ToyModel)


def test_save_pretrained_names_the_family_s_auto_classes(toy_family, tmp_path: Path):
    from skillnet.model.hub import served_classes, write_remote_code

    here = __name__
    assert served_classes("skillnet-toy") == [("AutoConfig", here, "ToyConfig"), ("AutoModel", here, "ToyModel")]
    # its code lives outside model/, so it cannot travel as remote code: a clear error, not a broken folder
    ToyModel(ToyConfig()).save_pretrained(str(tmp_path / "m"))
    with pytest.raises(ValueError, match="remote code copies this package's files only"):
        write_remote_code(tmp_path / "m", "skillnet-toy")


def test_a_dense_toy_checkpoint_exports_as_the_family_s_hf_model(toy_family, tmp_path: Path):
    from skillnet.export.hf_folder import checkpoint_kind, export, exported_as

    assert checkpoint_kind({"model_type": "skillnet-toy", "skill_layers": "all"}) == "skillnet-toy"
    assert checkpoint_kind({"model_type": "skillnet-toy", "skill_layers": []}) == "dense-toy"
    assert exported_as("dense-toy") == "HF DenseToyModel"

    torch.manual_seed(0)
    trained = ToyModel(ToyConfig(skill_layers=[]))
    step = tmp_path / "run" / "checkpoints" / "step_00000001"
    step.mkdir(parents=True)
    trained.config.to_json_file(str(step / "model_config.json"))
    torch.save({"model": trained.state_dict()}, step / "plain.pt")
    out = export(step, tmp_path / "hf")

    info = json.loads((out / "export_info.json").read_text())
    assert info["kind"] == "dense-toy" and info["exported_as"] == "HF DenseToyModel"
    assert json.loads((out / "config.json").read_text())["model_type"] == "toy-dense"
    plain = DenseToyModel.from_pretrained(str(out))
    assert torch.equal(plain.proj.weight, trained.proj.weight)
