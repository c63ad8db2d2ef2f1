"""One training config for both stages: pre-training and fine-tuning read the same `TrainConfig`, their flags
are generated from its fields (one help text, one check each), and the DeepSpeed JSON's keys are mapped once."""

from __future__ import annotations

import ast
import json
from dataclasses import fields
from pathlib import Path

import pytest
from skillnet.finetune import cli as finetune_cli
from skillnet.finetune.config import FINETUNE_DEFAULTS, ConfigError, FinetuneConfig
from skillnet.pretrain import options as pretrain_options
from skillnet.pretrain.recipes import PRETRAIN_DEFAULTS, ds_config_settings
from skillnet.training.config import (
    DS_PATHS,
    RUNTIME_FIELDS,
    DsConfigError,
    TrainConfig,
    check_train_flags,
    ds_settings,
    resolve_ds_config,
)
from skillnet.training.launch import prepare

REPO = Path(__file__).resolve().parents[1]
LIBRARY = ("common", "data_prep", "export", "finetune", "model", "pretrain", "training", "experiments")
FIELDS = {f.name: f for f in fields(TrainConfig)}


def _config(train: dict) -> dict:
    return {"tasks": [{"name": "t", "type": "classification", "train": "t.jsonl", "skills": ["s1", "s7"]}],
            "train": train}


def test_there_is_one_train_config_and_both_stages_use_it() -> None:
    defined = [str(p.relative_to(REPO)) for pkg in LIBRARY for p in (REPO / pkg).rglob("*.py")
               if any(isinstance(n, ast.ClassDef) and n.name == "TrainConfig" for n in ast.walk(ast.parse(p.read_text())))]
    assert defined == ["training/config.py"]
    assert type(FinetuneConfig.from_dict(_config({})).train) is TrainConfig
    assert type(PRETRAIN_DEFAULTS) is TrainConfig and type(FINETUNE_DEFAULTS) is TrainConfig


@pytest.mark.parametrize("parser, names", [(pretrain_options.build_parser(), pretrain_options.FLAGS),
                                           (finetune_cli.build_parser(), finetune_cli.FLAGS)],
                         ids=["pretrain", "finetune"])
def test_each_training_flag_is_generated_from_its_field(parser, names) -> None:
    """A flag written by hand for a TrainConfig field would carry its own help and checks: every option whose
    dest is a field (bar the run's wiring, which each command words itself) must be the generated one."""
    actions = {a.dest: a for a in parser._actions}
    assert set(names) <= set(actions)
    for dest, action in actions.items():
        if dest in FIELDS and dest not in ("output_dir", "resume", "ds_config"):
            assert dest in names, f"--{dest} is a TrainConfig field but not generated"
            assert action.help.startswith(FIELDS[dest].metadata["help"]), dest
            assert action.default is None, f"{dest}: a flag not given must leave the stage's value"


def test_a_flag_and_the_config_file_share_one_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ConfigError, match=r"x.json: train: keep_last must be >= 0, got -1"):
        FinetuneConfig.from_dict(_config({"keep_last": -1}), where="x.json")
    cfg = tmp_path / "c.json"
    cfg.write_text(json.dumps(_config({})), encoding="utf-8")
    for parser, argv, names in ((finetune_cli.build_parser(), ["--config", str(cfg)], finetune_cli.FLAGS),
                                (pretrain_options.build_parser(), [], pretrain_options.FLAGS)):
        with pytest.raises(SystemExit) as e:
            check_train_flags(parser, parser.parse_args([*argv, "--keep-last", "-1"]), names)
        assert e.value.code == 2
        assert "--keep-last -1: must be >= 0" in capsys.readouterr().err


def test_train_section_aliases_warmup_and_runtime_fields() -> None:
    assert FinetuneConfig.from_dict(_config({"grad_clip": 0.5})).train.max_grad_norm == 0.5
    with pytest.raises(ConfigError, match="grad_clip and max_grad_norm name the same setting"):
        FinetuneConfig.from_dict(_config({"grad_clip": 0.5, "max_grad_norm": 1.0}))
    with pytest.raises(ConfigError, match=r"\['output_dir'\] are set by the command line"):
        FinetuneConfig.from_dict(_config({"output_dir": "x"}))
    t = FinetuneConfig.from_dict(_config({"warmup_steps": 30, "max_steps": 100})).train
    assert (t.warmup_ratio, t.resolved_warmup()) == (None, 30)
    assert FinetuneConfig.from_dict(_config({"max_steps": 100})).train.resolved_warmup() == 10  # the 0.1 default
    with pytest.raises(ConfigError, match="both set; give one"):
        FinetuneConfig.from_dict(_config({"warmup_steps": 30, "warmup_ratio": 0.2}))
    # what a run writes reads back as the same config, without the command line's wiring
    cfg = FinetuneConfig.from_dict(_config({"warmup_steps": 30, "compile": True}))
    written = json.loads(cfg.to_json())["train"]
    assert not set(RUNTIME_FIELDS) & set(written)
    assert FinetuneConfig.from_dict({**_config({}), "train": written}).train == cfg.train


def test_one_process_batch_geometry_from_batch_size(tmp_path: Path) -> None:
    def geometry(**kw: int) -> tuple[int, int]:
        cfg, _ = prepare(TrainConfig(output_dir=str(tmp_path), **kw))
        return cfg.micro_batch_size, cfg.grad_accum

    assert geometry() == (8, 1)
    assert geometry(batch_size=12) == (12, 1)
    assert geometry(batch_size=12, micro_batch_size=4) == (4, 3)
    assert geometry(batch_size=12, grad_accum=2) == (6, 2)
    with pytest.raises(DsConfigError, match="not a multiple of micro_batch_size 5"):
        geometry(batch_size=12, micro_batch_size=5)
    with pytest.raises(DsConfigError, match="micro_batch_size 4 x grad_accum 2 = 8"):
        geometry(batch_size=12, micro_batch_size=4, grad_accum=2)


def test_the_deepspeed_keys_are_mapped_once() -> None:
    """The trainer's resolution and pre-training's settings report read one map (DS_PATHS): what the report
    says the JSON sets is what the trainer trains with."""
    ds = {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.7,
          "optimizer": {"type": "AdamW", "params": {"lr": 5e-4, "betas": [0.8, 0.9], "eps": 1e-8, "weight_decay": 0.1}},
          "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 7, "total_num_steps": 90,
                                                           "warmup_max_lr": 3e-4}}}
    found = ds_settings(ds)
    assert set(found) == set(DS_PATHS)
    _, cfg = resolve_ds_config(ds, TrainConfig(), 1)
    assert {name: getattr(cfg, name) for name in DS_PATHS} == found
    assert found["lr"] == 3e-4  # the scheduler's peak wins over the optimizer's lr
    report = ds_config_settings(ds)
    assert report["max_steps"] == found["decay_steps"]  # the decay end is the run length's default
    assert all(report[k] == v for k, v in found.items() if k != "decay_steps")


def test_each_bool_setting_takes_both_spellings_in_both_stages(tmp_path: Path) -> None:
    """`--packing` and `--no-packing` in pre-training and fine-tuning: the command line turns a setting either way,
    over the stage's default and over the config file's value (issue 50: fine-tuning refused --no-packing)."""
    bools = [f.name for f in fields(TrainConfig) if f.type in ("bool", bool) and not f.metadata.get("flag")]
    stages = [(pretrain_options.build_parser(), [], pretrain_options.FLAGS)]
    for packing in (True, False):
        cfg = tmp_path / f"c_{packing}.json"
        cfg.write_text(json.dumps(_config({"packing": packing})), encoding="utf-8")
        stages.append((finetune_cli.build_parser(), ["--config", str(cfg)], finetune_cli.FLAGS))
    for parser, argv, names in stages:
        for name in (n for n in bools if n in names):
            dash = name.replace("_", "-")
            assert getattr(parser.parse_args([*argv, f"--{dash}"]), name) is True, dash
            assert getattr(parser.parse_args([*argv, f"--no-{dash}"]), name) is False, dash
            assert getattr(parser.parse_args([*argv, f"--no_{name}"]), name) is False, name
            assert getattr(parser.parse_args(argv), name) is None, f"{dash}: not given must leave the stage's value"
    assert {"packing", "compile", "gradient_checkpointing"} <= {n for n in bools if n in finetune_cli.FLAGS}
    for packing in (True, False):
        file = FinetuneConfig.load(str(tmp_path / f"c_{packing}.json"))
        for flag, want in (("--packing", True), ("--no-packing", False), (None, packing)):
            args = finetune_cli.build_parser().parse_args(["--config", "c", *([flag] if flag else [])])
            assert finetune_cli.apply_overrides(file, args).train.packing is want, (packing, flag)
    # A switch named for the other state keeps its one spelling.
    pre = pretrain_options.build_parser()
    assert pre.parse_args(["--dense-updates"]).sparse_updates is False and pre.parse_args([]).sparse_updates is None
