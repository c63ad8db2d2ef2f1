"""The fine-tuning config file: one JSON document describing the tasks, the model, the sampler and training.

Example (paths are relative to the config file)::

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
classification            single or pair     classification     accuracy (+ macro_f1)
regression                single or pair     regression         pearson (+ spearman)
ner                       tagging            token_crf          f1 (entity-level, + P/R)
span                      span               span               f1 (character-level, + em)
matching                  choice             matching           top1_accuracy
========================  =================  =================  ==========================
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from .samplers import SamplerConfig

TASK_TYPES: dict[str, dict[str, Any]] = {
    "classification": {"head": "classification", "kinds": ("single", "pair"), "metric": "accuracy"},
    "regression": {"head": "regression", "kinds": ("single", "pair"), "metric": "pearson"},
    "ner": {"head": "token_crf", "kinds": ("tagging",), "metric": "f1"},
    "span": {"head": "span", "kinds": ("span",), "metric": "f1"},
    "matching": {"head": "matching", "kinds": ("choice",), "metric": "top1_accuracy"},
}
METRICS_OF_TYPE: dict[str, tuple[str, ...]] = {
    "classification": ("accuracy", "macro_f1"),
    "regression": ("pearson", "spearman"),
    "ner": ("f1", "precision", "recall"),
    "span": ("f1", "em"),
    "matching": ("top1_accuracy",),
}


class ConfigError(ValueError):
    """A bad fine-tuning config; the message names the file and the offending entry."""


def _from_dict(cls: type, d: Mapping[str, Any], where: str) -> Any:
    if not isinstance(d, Mapping):
        raise ConfigError(f"{where}: expected a JSON object, got {type(d).__name__}")
    known = {f.name for f in fields(cls)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise ConfigError(f"{where}: unknown option(s) {unknown}; known: {sorted(known)}")
    try:
        return cls(**dict(d))
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where}: {e}") from None


@dataclass
class TaskConfig:
    name: str
    type: str
    skills: list[str]
    train: str | None = None
    dev: str | None = None
    test: str | None = None
    spec: str | None = None  # a data_prep task.json (gives kind, label list and split files)
    kind: str | None = None  # data kind; default: from the spec, or the first kind of the type
    labels: list[str] | None = None  # class labels / entity types; default: from spec or train file
    head: dict[str, Any] = field(default_factory=dict)  # extra head settings (e.g. dropout)
    metric: str | None = None  # the dev metric used for best-checkpoint selection
    max_seq_len: int = 128
    max_train_examples: int | None = None  # cap for CPU demos
    max_eval_examples: int | None = None
    num_negatives: int = 3  # matching: negatives per positive pair seen in training

    def __post_init__(self) -> None:
        if self.type not in TASK_TYPES:
            raise ValueError(f"task {self.name!r}: unknown type {self.type!r}; valid: {', '.join(TASK_TYPES)}")
        if not self.skills:
            raise ValueError(f"task {self.name!r}: 'skills' is empty (list the skills it activates, e.g. s1 s7)")
        if self.kind is not None and self.kind not in TASK_TYPES[self.type]["kinds"]:
            raise ValueError(f"task {self.name!r}: data kind {self.kind!r} does not fit type {self.type!r} "
                             f"(expected one of {TASK_TYPES[self.type]['kinds']})")
        if self.metric is None:
            self.metric = TASK_TYPES[self.type]["metric"]
        if self.metric not in METRICS_OF_TYPE[self.type]:
            raise ValueError(f"task {self.name!r}: metric {self.metric!r} not available for type {self.type!r}; "
                             f"valid: {METRICS_OF_TYPE[self.type]}")
        if self.train is None and self.spec is None:
            raise ValueError(f"task {self.name!r}: give 'train' (and 'dev', 'test') files or a 'spec' (task.json)")
        if self.max_seq_len < 8:
            raise ValueError(f"task {self.name!r}: max_seq_len={self.max_seq_len} is too short")

    @property
    def head_type(self) -> str:
        return TASK_TYPES[self.type]["head"]


@dataclass
class ModelConfig:
    init: str | None = None  # a SkillNet checkpoint / export dir (from_pretrained); None = random init
    preset: str = "tiny"  # model.config preset when init is None
    overrides: dict[str, Any] = field(default_factory=dict)  # config fields when init is None
    vocab: str | None = None  # WordPiece vocab.txt; None = the default bert-base-chinese vocab


@dataclass
class NewSkill:
    name: str
    init_from: str | None = "s7"  # None = fresh random init
    description: str = ""
    tasks: list[str] = field(default_factory=list)  # tasks that activate it; empty = every task


@dataclass
class TrainConfig:
    max_steps: int = 1000
    batch_size: int = 8  # global batch (summed over ranks)
    eval_batch_size: int = 32
    lr: float = 2e-5
    warmup_ratio: float = 0.1  # §4.1: 5k of 50k steps
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])
    eps: float = 1e-6
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    eval_every: int = 200
    log_every: int = 20
    early_stopping_patience: int = 0  # evals without improvement of the mean dev score; 0 = off
    seed: int = 0
    # "mean": one checkpoint for all tasks, the one with the best mean dev score (the paper's claim is
    # one model for every task); "per_task": each task scored from its own best-on-dev checkpoint.
    selection: str = "mean"
    skill_map_lr: float = 1e-2  # method "learnable": the task/skill embeddings' own learning rate
    # method "task_specific": "share" = each task gets the steps it would get in the joint run (the
    # sampler's share of max_steps, so the total equals one joint run); "full" = max_steps each.
    task_specific_budget: str = "share"
    save_every: int = 0  # resumable trainer checkpoints every N steps (0 = only at the end / on SIGTERM)
    keep_last: int = 2


SELECTIONS = ("mean", "per_task")
TASK_SPECIFIC_BUDGETS = ("share", "full")


@dataclass
class FinetuneConfig:
    tasks: list[TaskConfig]
    method: str = "skillnet"  # see finetune/methods.py
    model: ModelConfig = field(default_factory=ModelConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    new_skills: list[NewSkill] = field(default_factory=list)
    freeze_old_skills: bool = False  # only new skills and task heads train (Table 5 "Update Old Skills: N")
    drop_skills: list[str] = field(default_factory=list)  # ablation (Table 6)
    skip_bad: bool = False
    output_dir: str = "runs/finetune"
    base_dir: str = ""  # where relative paths are resolved (the config file's folder); not serialised

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
        from .methods import METHODS

        if self.method not in METHODS:
            raise ValueError(f"method: unknown method {self.method!r}; valid: {', '.join(METHODS)}")
        if not METHODS[self.method].uses_task_skills and (self.new_skills or self.drop_skills
                                                           or self.freeze_old_skills):
            raise ValueError(f"new_skills / drop_skills / freeze_old_skills apply to method 'skillnet', "
                             f"not {self.method!r}")
        if self.train.selection not in SELECTIONS:
            raise ValueError(f"train.selection={self.train.selection!r}; valid: {', '.join(SELECTIONS)}")
        if self.train.task_specific_budget not in TASK_SPECIFIC_BUDGETS:
            raise ValueError(f"train.task_specific_budget={self.train.task_specific_budget!r}; "
                             f"valid: {', '.join(TASK_SPECIFIC_BUDGETS)}")
        if self.freeze_old_skills and not self.new_skills:
            raise ValueError("freeze_old_skills needs at least one new skill (nothing else would train "
                             "but the heads); add one with --new-skill s8")

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

    def resolve(self, p: str | None) -> str | None:
        if p is None:
            return None
        path = Path(os.path.expanduser(p))
        return str(path if path.is_absolute() or not self.base_dir else Path(self.base_dir) / path)

    # --- (de)serialisation ---------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("base_dir")
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, indent=2) + "\n"

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "config", base_dir: str = "") -> FinetuneConfig:
        if not isinstance(d, Mapping):
            raise ConfigError(f"{where}: expected a JSON object at the top level")
        d = dict(d)
        known = {f.name for f in fields(cls)} - {"base_dir"}
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
        train = _from_dict(TrainConfig, d.pop("train", {}), f"{where}: train")
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
