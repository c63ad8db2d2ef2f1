"""The fine-tuning config file: one JSON document describing the tasks, the model, the sampler and training.

Example (paths are relative to the config file, or to its ``base_dir`` when it gives one: the run's
``finetune_config.json`` records the folder its paths were resolved against)::

    {
      "model": {"init": "runs/pretrain/export", "preset": "tiny"},
      "tasks": [
        {"name": "sentiment", "type": "classification", "train": "data/sent/train.jsonl",
         "dev": "data/sent/dev.jsonl", "test": "data/sent/test.jsonl", "skills": ["s1", "s4", "s7"]},
        {"name": "ner", "type": "ner", "spec": "data/ner/task.json", "skills": ["s2", "s7"]}
      ],
      "sampler": {"kind": "proportional", "alpha": 1.0},
      "train": {"max_steps": 1000, "batch_size": 8, "lr": 2e-5}
    }

Task types and what they map to:

========================  =================  =================  ==========================
type                      data kind (JSONL)  model head         selection metric (default)
========================  =================  =================  ==========================
classification            single or pair     classification     accuracy (+ macro_f1, f1)
regression                single or pair     regression         pearson (+ spearman)
ner                       tagging            token_crf          f1 (entity-level, + P/R, strict)
span                      span               span               f1 (CMRC 2018's, + em)
matching                  choice             matching           top1_accuracy
========================  =================  =================  ==========================

Task data: ``train``/``dev``/``test`` each name a ``.jsonl``, ``.json``, ``.csv``, ``.tsv`` or ``.parquet``
file or a local dataset folder, or (in Python) hold a ``datasets.Dataset``; ``dataset`` gives all splits at
once (a folder for ``datasets.load_dataset`` / ``load_from_disk``, or a ``datasets.DatasetDict``);
``columns`` maps schema fields to the data's column names. See docs/task_data.md.

The data kind of a classification/regression task given as files is inferred from the train records
(``pair`` if they carry ``text_pair``) unless ``kind`` or the spec says it. Metric names: ``f1`` of a
classification task is the positive-class F1 of a binary task (``positive_label``, default ``"1"``);
span ``f1``/``em`` are CMRC 2018's official ones, ``char_bag_f1``/``char_bag_em`` a bag-of-characters
variant that is not comparable with published CMRC numbers.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from skillnet.training.config import RUNTIME_FIELDS, TrainConfig

from .samplers import SamplerConfig
from .task_config import (
    ConfigError,
    TaskConfig,
    _codec,
    _from_dict,
    _int,
    _num,
    _plain,
)


@dataclass
class ModelConfig:
    init: str | None = None  # a SkillNet checkpoint / export dir (from_pretrained); None = random init
    # "bert" | "bart" for a preset (init gives its own); default: "bart" when the tasks are generation tasks
    arch: str | None = None
    preset: str = "tiny"  # model.config preset when init is None
    overrides: dict[str, Any] = field(default_factory=dict)  # config fields when init is None
    # WordPiece vocab.txt; None = the init folder's vocab.txt (every export carries its tokenizer), else the
    # default bert-base-chinese vocab
    vocab: str | None = None


@dataclass
class NewSkill:
    name: str
    # a skill of the model to copy; "generic" = its generic skill (s7 in SkillNet-NLU, general in NLG);
    # None = fresh random init
    init_from: str | None = "generic"
    description: str = ""
    tasks: list[str] = field(default_factory=list)  # tasks that activate it; empty = every task


# Fine-tuning's training settings: the one TrainConfig (training/config.py) with this stage's defaults (§4.1:
# lr 2e-5, a warmup over the first tenth: 5k of 50k steps), read from the config file's "train" section.
FINETUNE_DEFAULTS = TrainConfig(max_steps=1000, batch_size=8, lr=2e-5, warmup_ratio=0.1, eval_every=200, log_every=20,
                                packing=True)
# Older names the "train" section still takes.
TRAIN_ALIASES = {"grad_clip": "max_grad_norm"}


def train_from_dict(d: Any, where: str) -> TrainConfig:
    """The "train" section: FINETUNE_DEFAULTS with the file's values. The run's own wiring (RUNTIME_FIELDS:
    output folder, resume, DeepSpeed JSON, logging) comes from the command line, not from here."""
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(d).__name__}")
    d = dict(d)
    for old, new in TRAIN_ALIASES.items():
        if old in d:
            if new in d:
                raise ConfigError(f"{where}: {old} and {new} name the same setting; give {new}")
            d[new] = d.pop(old)
    runtime = sorted(set(d) & set(RUNTIME_FIELDS))
    if runtime:
        raise ConfigError(f"{where}: {runtime} are set by the command line (--output-dir, --resume, --ds-config, "
                          f"--no-tensorboard, --no-progress) and the top-level output_dir, not here")
    known = {f.name for f in fields(TrainConfig)} - set(RUNTIME_FIELDS)
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown option(s) {unknown}; known: {sorted(known)}")
    if "warmup_steps" in d and "warmup_ratio" not in d:
        d["warmup_ratio"] = None  # a step count replaces the stage's default ratio
    try:
        return dataclasses.replace(FINETUNE_DEFAULTS, **d)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


def _arch_names() -> tuple[str, ...]:
    from skillnet.model.spec import MODEL_FAMILIES

    return tuple(MODEL_FAMILIES)


def _presets(arch: str = "bert") -> list[str]:
    from skillnet.model.spec import model_family

    return list(model_family(arch).presets())


@dataclass
class FinetuneConfig:
    tasks: list[TaskConfig]
    method: str = "skillnet"  # see finetune/methods.py
    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    train: TrainConfig = field(default_factory=lambda: dataclasses.replace(FINETUNE_DEFAULTS))
    new_skills: list[NewSkill] = field(default_factory=list)
    freeze_old_skills: bool = False  # only new skills and task heads train (Table 5 "Update Old Skills: N")
    drop_skills: list[str] = field(default_factory=list)  # ablation (Table 6)
    skip_bad: bool = False
    output_dir: str = "runs/finetune"
    # Where relative paths are resolved: the config file's folder, unless the file records one. to_json records
    # it, so that a run's finetune_config.json finds the run's data again (export --plain reads its test split)
    # from wherever it is read; the run's identity (to_dict) leaves it out.
    base_dir: str = ""

    def __post_init__(self) -> None:
        names = [t.name for t in self.tasks]
        if not names:
            raise ValueError("the config lists no tasks")
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"duplicate task names {dup}")
        for ns in self.new_skills:
            for t in ns.tasks:
                if t not in names:
                    raise ValueError(f"new skill {ns.name!r} names unknown task {t!r}; tasks: {names}")
        for key in ("alpha", "temperature"):
            if not _num(getattr(self.sampler, key)):
                raise ValueError(f"sampler.{key} must be a number, got {getattr(self.sampler, key)!r}")
        for key in ("size_cap", "num_epochs", "steps_per_epoch"):
            if not _int(getattr(self.sampler, key)) or getattr(self.sampler, key) < 0:
                raise ValueError(f"sampler.{key} must be an integer >= 0, got {getattr(self.sampler, key)!r}")
        order = self.sampler.order
        if not isinstance(order, list):
            raise ValueError(f"sampler.order must be a list of task names, got {order!r}")
        if order:
            for t in order:
                if t not in names:
                    raise ValueError(f"sampler.order: unknown task {t!r}; tasks: {names}")
            missing = [t for t in names if t not in order]
            dup = sorted({t for t in order if order.count(t) > 1})
            if missing or dup:
                raise ValueError(f"sampler.order: must name each task once (missing {missing}, repeated {dup}); "
                                 f"tasks: {names}")
        from .methods import METHODS

        if self.method not in METHODS:
            raise ValueError(f"method: unknown method {self.method!r}; valid: {', '.join(METHODS)}")
        if not METHODS[self.method].uses_task_skills and (self.new_skills or self.drop_skills
                                                           or self.freeze_old_skills):
            raise ValueError(f"new_skills / drop_skills / freeze_old_skills apply to method 'skillnet', "
                             f"not {self.method!r}")
        if self.freeze_old_skills and not self.new_skills:
            raise ValueError("freeze_old_skills needs at least one new skill (nothing else would train "
                             "but the heads); add one with --new-skill s8")
        gen = [t.name for t in self.tasks if _codec(t.type).arch == "bart"]
        if gen and len(gen) != len(self.tasks):
            raise ValueError(f"tasks: generation tasks {gen} run on the encoder-decoder (SkillNet-BART), the others "
                             "on SkillNet-BERT: put them in separate configs")
        if self.model.arch not in (None, *_arch_names()):
            raise ValueError(f"model.arch: unknown architecture {self.model.arch!r}; valid: "
                             f"{', '.join(_arch_names())}")
        if self.model.arch is not None and (self.model.arch == "bart") != bool(gen):
            raise ValueError(f"model.arch: {self.model.arch!r} does not fit the tasks: generation tasks need 'bart', "
                             "NLU tasks 'bert'")
        if self.arch not in METHODS[self.method].archs:
            raise ValueError(f"method: {self.method!r} is not available for {self.arch.upper()} models "
                             f"(it supports {', '.join(METHODS[self.method].archs)})")

    @property
    def arch(self) -> str:
        """The architecture the tasks need: "bart" for generation tasks, else "bert" (an init folder of the
        other kind is an error, found by check_model)."""
        return "bart" if any(_codec(t.type).arch == "bart" for t in self.tasks) else "bert"

    # --- derived -------------------------------------------------------------------------------
    def task(self, name: str) -> TaskConfig:
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(f"unknown task {name!r}; tasks: {[t.name for t in self.tasks]}")

    def effective_skills(self, task: TaskConfig) -> list[str]:
        """The task's skills after adding new skills and dropping ablated ones (config only)."""
        skills = list(task.skills)
        for ns in self.new_skills:
            if (not ns.tasks or task.name in ns.tasks) and ns.name not in skills:
                skills.append(ns.name)
        skills = [s for s in skills if s not in self.drop_skills]
        if not skills:
            raise ConfigError(f"task {task.name!r} has no skill left after dropping {self.drop_skills}")
        return skills

    def check_model(self, where: str = "config") -> None:
        """Check the config against the model it will build, reading only ``config.json`` (no weights, no
        task data): skill names of tasks, new skills and ablations, ``model.*``, sequence lengths. Run
        before loading any data, so a typo costs one error line, not a data load and a traceback."""
        mc = self._model_config(where)
        known = list(mc.skill_names)
        for i, ns in enumerate(self.new_skills):
            if ns.name in known:
                raise ConfigError(f"{where}: new_skills[{i}].name: skill {ns.name!r} already exists in the model "
                                  f"(skills: {', '.join(known)})")
            if ns.init_from not in (None, "generic") and ns.init_from not in known:
                raise ConfigError(f"{where}: new_skills[{i}].init_from: unknown skill {ns.init_from!r}; the model's "
                                  f"skills: {', '.join(known)} (or null for a random init)")
            known.append(ns.name)
        for s in self.drop_skills:
            if s not in known:
                raise ConfigError(f"{where}: drop_skills: unknown skill {s!r}; the model's skills: {', '.join(known)}")
        for i, t in enumerate(self.tasks):
            for s in t.skills:
                if s not in known:
                    raise ConfigError(f"{where}: tasks[{i}].skills: unknown skill {s!r} (task {t.name!r}); the "
                                      f"model's skills: {', '.join(known)}")
            try:
                self.effective_skills(t)
            except ConfigError as e:
                raise ConfigError(f"{where}: drop_skills: {e}") from None
            if t.max_seq_len > mc.max_position_embeddings:
                raise ConfigError(f"{where}: tasks[{i}].max_seq_len: {t.max_seq_len} is longer than the model's "
                                  f"{mc.max_position_embeddings} positions")
            if t.type == "generation":
                # The prefix comes on top of the source's max_seq_len; a word piece covers at least one
                # non-space character, so this bounds its token count without a tokenizer.
                n_prefix = len("".join(t.source_prefix.split()))
                if t.max_seq_len + n_prefix > mc.max_position_embeddings:
                    raise ConfigError(
                        f"{where}: tasks[{i}]: max_seq_len {t.max_seq_len} plus the prefix {t.source_prefix!r} "
                        f"(up to {n_prefix} tokens) is longer than the model's {mc.max_position_embeddings} "
                        f"positions; lower max_seq_len to {mc.max_position_embeddings - n_prefix}")
        if self.model.vocab and not Path(self.resolve(self.model.vocab)).is_file():
            raise ConfigError(f"{where}: model.vocab: {self.resolve(self.model.vocab)} not found")
        vocab = self.vocab_path()
        if vocab is not None:
            from skillnet.common.files import InputFileError, read_text

            option = "model.vocab" if self.model.vocab else "model.init"  # the init folder's own vocab.txt
            try:
                text = read_text(vocab, option=f"{where}: {option}:")
            except InputFileError as e:
                raise ConfigError(str(e)) from None
            n = sum(1 for t in text.split("\n") if t)
            if n > mc.vocab_size:
                raise ConfigError(f"{where}: the vocab {vocab} has {n:,} entries but the model embeds only "
                                  f"{mc.vocab_size:,} ids; give model.vocab the vocab the model was trained with")

    def vocab_path(self) -> str | None:
        """The tokenizer's vocab: ``model.vocab``, else the init folder's own vocab.txt, else None (the
        default bert-base-chinese vocab)."""
        if self.model.vocab:
            return self.resolve(self.model.vocab)
        if self.model.init and (Path(self.resolve(self.model.init)) / "vocab.txt").is_file():
            return str(Path(self.resolve(self.model.init)) / "vocab.txt")
        return None

    def _model_config(self, where: str) -> Any:
        """The model config the run starts from (``model.init``'s config.json, or the preset)."""
        from skillnet.model.spec import MODEL_FAMILIES, family_of_model_type, model_family

        arch = model_family(self.arch)
        config_cls = arch.load("config")
        if not self.model.init:
            if self.model.preset not in _presets(arch.name):
                raise ConfigError(f"{where}: model.preset: unknown preset {self.model.preset!r} for "
                                  f"{arch.name.upper()}; valid: {', '.join(_presets(arch.name))}")
            unknown = sorted(set(self.model.overrides) - set(config_cls().to_dict()))
            if unknown:
                raise ConfigError(f"{where}: model.overrides: unknown model config field(s) {unknown}")
            try:
                return config_cls.preset(self.model.preset, **self.model.overrides)
            except Exception as e:  # the config's own validation (huggingface_hub's strict dataclass errors too)
                raise ConfigError(f"{where}: model.overrides: {' '.join(str(e).split())}") from None
        init = Path(self.resolve(self.model.init) or "")
        if not init.exists():
            raise ConfigError(f"{where}: model.init: {init} does not exist (a folder written by save_pretrained / "
                              "export)")
        cfg_file = init / "config.json"
        if not cfg_file.is_file():
            raise ConfigError(f"{where}: model.init: {init} has no config.json (a folder written by "
                              "save_pretrained / export)")
        try:
            d = json.loads(cfg_file.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ConfigError(f"{where}: model.init: {cfg_file}: invalid JSON ({e})") from None
        model_type = d.get("model_type") if isinstance(d, dict) else None
        found = family_of_model_type(model_type)
        if found is None:
            raise ConfigError(f"{where}: model.init: {init}: model_type {model_type!r} is not a SkillNet export "
                              f"or a dense checkpoint of a known kind ({', '.join(a.model_type + ', ' + a.dense_type for a in MODEL_FAMILIES.values())})")
        if found.name != arch.name:
            raise ConfigError(f"{where}: model.init: {init} is a {model_type!r} model, but the tasks need "
                              f"{arch.name.upper()} ({'generation' if arch.name == 'bart' else 'NLU'} tasks)")
        if model_type == arch.dense_type:  # dense: every skill becomes a copy of its FFN, default skill set
            keep = {k: d[k] for k in ("max_position_embeddings", "vocab_size") if k in d}
            return config_cls(**keep)
        try:
            mc = config_cls.from_json_file(str(cfg_file))
        except Exception as e:  # the config's own validation (huggingface_hub's strict dataclass errors too)
            raise ConfigError(f"{where}: model.init: {cfg_file}: {' '.join(str(e).split())}") from None
        from skillnet.model.routers import ROUTERS  # torch only once a model folder is read

        router = ROUTERS.get(getattr(mc, "router", "task"))
        if router is None or not router.starts_runs:
            starts = ", ".join(repr(n) for n, r in ROUTERS.items() if r.starts_runs)
            raise ConfigError(f"{where}: model.init: {init} is a {mc.router!r}-router model; every method starts "
                              f"from a SkillNet export (router {starts}) or a dense checkpoint")
        return mc

    def resolve(self, p: str | None) -> str | None:
        if p is None:
            return None
        path = Path(os.path.expanduser(p))
        return str(path if path.is_absolute() or not self.base_dir else Path(self.base_dir) / path)

    # --- (de)serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return self._plain_dict(describe=False)  # in-memory datasets stay objects: from_dict(to_dict()) is equal

    def to_json(self) -> str:
        d = self._plain_dict(describe=True)
        d["base_dir"] = str(Path(self.base_dir or ".").resolve())  # "": the working directory, as resolve()
        return json.dumps(d, ensure_ascii=False, indent=2) + "\n"

    def _plain_dict(self, describe: bool) -> dict[str, Any]:
        d = _plain(self, describe=describe)
        d.pop("base_dir")
        for name in RUNTIME_FIELDS:  # the command line's (train_from_dict refuses them)
            d["train"].pop(name)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "config", base_dir: str = "") -> FinetuneConfig:
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where}: expected a JSON object at the top level")
        d = dict(d)
        known = {f.name for f in fields(cls)}
        if d.get("base_dir") is not None:  # a recorded folder (to_json), relative to the file's own if relative
            base_dir = str(Path(base_dir) / os.path.expanduser(str(d["base_dir"])))
        d.pop("base_dir", None)
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"{where}: unknown top-level option(s) {unknown}; known: {sorted(known)}")
        if "tasks" not in d or not isinstance(d["tasks"], list):
            raise ConfigError(f"{where}: 'tasks' must be a list of task objects")
        tasks = [_from_dict(TaskConfig, t, f"{where}: tasks[{i}]") for i, t in enumerate(d.pop("tasks"))]
        model = _from_dict(ModelConfig, d.pop("model", {}), f"{where}: model")
        sampler_d = d.pop("sampler", {})
        try:
            sampler = SamplerConfig.from_dict(sampler_d)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: sampler: {e}") from None
        train = train_from_dict(d.pop("train", {}), f"{where}: train")
        new = [_from_dict(NewSkill, s, f"{where}: new_skills[{i}]") for i, s in enumerate(d.pop("new_skills", []))]
        try:
            return cls(tasks=tasks, model=model, sampler=sampler, train=train, new_skills=new,
                       base_dir=base_dir, **d)
        except (TypeError, ValueError) as e:
            raise ConfigError(f"{where}: {e}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> FinetuneConfig:
        p = Path(path)
        try:
            text = p.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise ConfigError(f"{p}: config file not found") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}:{e.lineno}: invalid JSON: {e.msg} at column {e.colno}") from None
        return cls.from_dict(d, where=str(p), base_dir=str(p.parent.resolve()))
