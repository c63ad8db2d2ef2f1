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

import copy
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from skillnet.data_prep.tasks.schema import datasets_class, kind_fields

from .samplers import SamplerConfig

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict

GEN_LANGS = ("zh", "en")


def _codec(task_type: str) -> Any:
    """The codec of a task type (finetune/task_types/): its data kinds, metrics, head and head options. Imported
    here, not at the top, so that reading a config does not import torch until a task is checked."""
    from .task_types import codec_for

    return codec_for(task_type)


def _task_types() -> list[str]:
    from .task_types import task_types

    return task_types()


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


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


def _describe_data_object(v: Any) -> dict[str, Any]:
    """What a config file records of an in-memory dataset: enough to see what ran, and a marker that
    `TaskConfig` refuses with a clear message when the file is loaded again."""
    if datasets_class(v) == "DatasetDict":
        return {"in_memory": "datasets.DatasetDict", "num_rows": {k: d.num_rows for k, d in v.items()}}
    return {"in_memory": f"datasets.{datasets_class(v)}", "num_rows": getattr(v, "num_rows", None),
            "columns": list(getattr(v, "column_names", None) or [])}


def _plain(v: Any, describe: bool = False) -> Any:
    """asdict() that leaves datasets objects as they are (a deep copy of a Dataset is pointless), or with
    `describe`, replaces them by `_describe_data_object` (for JSON)."""
    if datasets_class(v):  # before the dict case: a DatasetDict is a dict
        return _describe_data_object(v) if describe else v
    if is_dataclass(v) and not isinstance(v, type):
        return {f.name: _plain(getattr(v, f.name), describe) for f in fields(v)}
    if isinstance(v, list):
        return [_plain(x, describe) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x, describe) for k, x in v.items()}
    return copy.deepcopy(v)


@dataclass
class TaskConfig:
    name: str
    type: str
    skills: list[str]
    # each split: a file (.jsonl .json .csv .tsv .parquet) or dataset folder, relative to the config file;
    # in Python also a datasets.Dataset
    train: str | Dataset | None = None
    dev: str | Dataset | None = None
    test: str | Dataset | None = None
    spec: str | None = None  # a data_prep task.json (gives kind, label list and split files)
    # all splits at once: a local datasets.load_dataset / save_to_disk folder, or in Python a
    # datasets.DatasetDict; its train, validation (or dev) and test splits; train/dev/test override
    dataset: str | DatasetDict | None = None
    columns: dict[str, str] = field(default_factory=dict)  # schema field -> the data's column, e.g. {"text": "sentence"}
    kind: str | None = None  # data kind; default: from the spec, else inferred from the train records
    labels: list[str] | None = None  # class labels / entity types; default: from spec or train file
    positive_label: str | None = None  # binary classification: the class whose F1 is "f1"; default "1"
    head: dict[str, Any] = field(default_factory=dict)  # extra head settings (e.g. dropout)
    metric: str | None = None  # the dev metric used for best-checkpoint selection
    max_seq_len: int = 128
    max_train_examples: int | None = None  # cap for CPU demos
    max_eval_examples: int | None = None
    # dev only (default: max_eval_examples): dev is scored at every evaluation, test once, so a large
    # test set that resolves small differences need not slow every evaluation down
    max_dev_examples: int | None = None
    num_negatives: int = 3  # matching: negatives per positive pair seen in training
    # generation: max_seq_len bounds the source (prefix included), max_target_len the target and decoding
    max_target_len: int = 64
    prefix: str | None = None  # prepended to every source; default "<task name>: " (SkillNet-NLG's prefix)
    num_beams: int = 4  # beam search in evaluation and prediction (Appendix C.1: 4)
    lang: str = "zh"  # metric tokenisation: "zh" = per character (Latin runs as words), "en" = words

    def __post_init__(self) -> None:
        if self.type not in _task_types():
            raise ValueError(f"task {self.name!r}: unknown type {self.type!r}; valid: {', '.join(_task_types())}")
        codec = _codec(self.type)
        if not isinstance(self.skills, list) or not all(isinstance(x, str) and x for x in self.skills):
            raise ValueError(f"skills: must be a list of skill names (e.g. [\"s1\", \"s7\"]), got {self.skills!r}")
        if not self.skills:
            raise ValueError(f"task {self.name!r}: 'skills' is empty (list the skills it activates, e.g. s1 s7)")
        if self.kind is not None and self.kind not in codec.kinds:
            raise ValueError(f"task {self.name!r}: data kind {self.kind!r} does not fit type {self.type!r} "
                             f"(expected one of {codec.kinds})")
        if self.metric is None:
            self.metric = codec.metric
        if self.metric not in codec.metrics:
            raise ValueError(f"task {self.name!r}: metric {self.metric!r} not available for type {self.type!r}; "
                             f"valid: {codec.metrics}")
        self._check_sources()
        self._check_columns()
        if not _int(self.max_seq_len) or self.max_seq_len < 8:
            raise ValueError(f"task {self.name!r}: max_seq_len={self.max_seq_len!r} is too short (at least 8)")
        for key in ("max_train_examples", "max_eval_examples", "max_dev_examples"):
            v = getattr(self, key)
            if v is not None and (not _int(v) or v < 1):
                raise ValueError(f"{key} must be an integer >= 1 (or null for all), got {v!r}")
        if not _int(self.num_negatives) or self.num_negatives < 1:
            raise ValueError(f"num_negatives must be an integer >= 1, got {self.num_negatives!r}")
        for key in ("max_target_len", "num_beams"):
            v = getattr(self, key)
            if not _int(v) or v < 1:
                raise ValueError(f"{key} must be an integer >= 1, got {v!r}")
        if self.lang not in GEN_LANGS:
            raise ValueError(f"lang must be one of {GEN_LANGS}, got {self.lang!r}")
        if self.prefix is not None and not isinstance(self.prefix, str):
            raise ValueError(f"prefix must be a string, got {self.prefix!r}")
        self._check_head()
        codec.check_config(self)  # type-specific checks (classification: positive_label against labels)

    def _check_sources(self) -> None:
        for key in ("train", "dev", "test", "dataset"):
            v = getattr(self, key)
            if isinstance(v, os.PathLike):
                v = os.fspath(v)
                setattr(self, key, v)
            cls = datasets_class(v)
            whole = key == "dataset"
            if v is None or (isinstance(v, str) and v) or cls == ("DatasetDict" if whole else "Dataset"):
                continue
            if isinstance(v, dict) and "in_memory" in v:
                raise ValueError(f"{key}: {v} describes an in-memory {v['in_memory']} of an earlier run (a config "
                                 "file keeps only its size); a file cannot hold one: save it ("
                                 + ("dd.save_to_disk('data'), and give the folder" if whole else
                                    "ds.to_parquet('train.parquet'), and give the file") + ")")
            if cls == "DatasetDict":
                raise ValueError(f"{key}: a datasets.DatasetDict holds several splits; give it as 'dataset' (or one "
                                 f"split here: dd[{key!r}])")
            if cls == "Dataset":
                raise ValueError("dataset: a datasets.Dataset is one split; give it as 'train', 'dev' or 'test'")
            want = ("a dataset folder or a datasets.DatasetDict" if whole
                    else "a file or folder path, or a datasets.Dataset")
            raise ValueError(f"{key}: expected {want}, got {type(v).__name__} {v!r}"[:300])
        if self.spec is not None and self.dataset is not None:
            raise ValueError(f"task {self.name!r}: give either 'spec' or 'dataset', not both")
        if self.train is None and self.spec is None and self.dataset is None:
            raise ValueError(f"task {self.name!r}: give 'train' (and 'dev', 'test') files, a 'dataset' folder or "
                             "a 'spec' (task.json)")

    def _check_columns(self) -> None:
        if not isinstance(self.columns, dict):
            raise ValueError(f"columns: expected a JSON object mapping schema fields to column names, got "
                             f"{self.columns!r}")
        kinds = [self.kind] if self.kind is not None else _codec(self.type).kinds
        known = sorted({f for k in kinds for f in kind_fields(k)})
        what = f"kind {self.kind!r}" if self.kind is not None else f"a {self.type} task"
        for k, v in self.columns.items():
            if k not in known:
                raise ValueError(f"columns: unknown field {k!r} for {what}; fields: {', '.join(known)}")
            if not isinstance(v, str) or not v:
                raise ValueError(f"columns: {k!r} must map to a column name (a string), got {v!r}")

    def _check_head(self) -> None:
        if not isinstance(self.head, dict):
            raise ValueError(f"head: expected a JSON object of head settings, got {self.head!r}")
        options = _codec(self.type).head_options
        unknown = sorted(set(self.head) - set(options))
        if unknown:
            raise ValueError(f"head: unknown option(s) {unknown} for a {self.type} task; known: {sorted(options)}")
        for k, v in self.head.items():
            what, ok = options[k]
            if not ok(v):
                raise ValueError(f"head: {k} must be {what}, got {v!r}")

    @property
    def head_type(self) -> str | None:
        return _codec(self.type).head

    @property
    def source_prefix(self) -> str:
        return f"{self.name}: " if self.prefix is None else self.prefix


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
    # Generation: a checkpoint whose dev outputs on a generation task are less than this percent distinct
    # (one text for many inputs) is selected only while no checkpoint of the run reaches it; 0 = off.
    select_min_distinct: float = 0.0
    skill_map_lr: float = 1e-2  # method "learnable": the task/skill embeddings' own learning rate
    # method "task_specific": "share" = each task gets the steps it would get in the joint run (the
    # sampler's share of max_steps, so the total equals one joint run); "full" = max_steps each.
    task_specific_budget: str = "share"
    # Also score the task type's non-neural baseline fit on train (TF-IDF + logistic regression, TF-IDF
    # similarity) beside each task's results; off by default: a fit on a large train split takes seconds.
    lexical_baselines: bool = False
    label_smoothing: float = 0.0  # generation: cross-entropy label smoothing (0 = plain CE)
    save_every: int = 0  # resumable trainer checkpoints every N steps (0 = only at the end / on SIGTERM)
    keep_last: int = 2
    # Recompute each layer in the backward pass instead of keeping its activations (same gradients, less
    # memory); also on when the DeepSpeed JSON has an activation_checkpointing section.
    gradient_checkpointing: bool = False

    def __post_init__(self) -> None:
        for key, lo in (("max_steps", 1), ("batch_size", 1), ("eval_batch_size", 1), ("eval_every", 0),
                        ("log_every", 0), ("early_stopping_patience", 0), ("save_every", 0), ("keep_last", 1)):
            v = getattr(self, key)
            if not _int(v) or v < lo:
                raise ValueError(f"{key} must be >= {lo}, got {v!r}")
        if not _int(self.seed):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if not _num(self.eps) or not self.eps > 0:
            raise ValueError(f"eps must be a number > 0, got {self.eps!r}")
        for key in ("lr", "skill_map_lr", "weight_decay", "grad_clip"):  # lr 0: a frozen control run
            v = getattr(self, key)
            if not _num(v) or v < 0:
                raise ValueError(f"{key} must be a number >= 0, got {v!r}")
        if not _num(self.label_smoothing) or not 0 <= self.label_smoothing < 1:
            raise ValueError(f"label_smoothing must be in [0, 1), got {self.label_smoothing!r}")
        if not _num(self.select_min_distinct) or not 0 <= self.select_min_distinct <= 100:
            raise ValueError(f"select_min_distinct must be a percent in [0, 100], got {self.select_min_distinct!r}")
        if not _num(self.warmup_ratio) or not 0 <= self.warmup_ratio <= 1:
            raise ValueError(f"warmup_ratio must be in [0, 1], got {self.warmup_ratio!r}")
        if (not isinstance(self.betas, list) or len(self.betas) != 2
                or not all(_num(b) and 0 <= b < 1 for b in self.betas)):
            raise ValueError(f"betas must be two numbers in [0, 1), got {self.betas!r}")


SELECTIONS = ("mean", "per_task")
ARCH_NAMES = ("bert", "bart")


def _presets(arch: str = "bert") -> list[str]:
    from .archs import ARCHS

    return list(ARCHS[arch].presets())


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
        if self.train.selection not in SELECTIONS:
            raise ValueError(f"train.selection={self.train.selection!r}; valid: {', '.join(SELECTIONS)}")
        if self.train.task_specific_budget not in TASK_SPECIFIC_BUDGETS:
            raise ValueError(f"train.task_specific_budget={self.train.task_specific_budget!r}; "
                             f"valid: {', '.join(TASK_SPECIFIC_BUDGETS)}")
        if self.freeze_old_skills and not self.new_skills:
            raise ValueError("freeze_old_skills needs at least one new skill (nothing else would train "
                             "but the heads); add one with --new-skill s8")
        gen = [t.name for t in self.tasks if _codec(t.type).arch == "bart"]
        if gen and len(gen) != len(self.tasks):
            raise ValueError(f"tasks: generation tasks {gen} run on the encoder-decoder (SkillNet-BART), the others "
                             "on SkillNet-BERT: put them in separate configs")
        if self.model.arch not in (None, *ARCH_NAMES):
            raise ValueError(f"model.arch: unknown architecture {self.model.arch!r}; valid: {', '.join(ARCH_NAMES)}")
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
            n = sum(1 for t in Path(vocab).read_text(encoding="utf-8").split("\n") if t)
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
        from .archs import ARCHS, arch_of_model_type

        arch = ARCHS[self.arch]
        config_cls = arch.config_cls()
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
        found = arch_of_model_type(model_type)
        if found is None:
            raise ConfigError(f"{where}: model.init: {init}: model_type {model_type!r} is not a SkillNet export "
                              f"or a dense checkpoint of a known kind ({', '.join(a.skillnet_type + ', ' + a.dense_type for a in ARCHS.values())})")
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
        d = _plain(self)  # in-memory datasets stay objects: from_dict(to_dict()) is the same config
        d.pop("base_dir")
        return d

    def to_json(self) -> str:
        d = _plain(self, describe=True)
        d.pop("base_dir")
        return json.dumps(d, ensure_ascii=False, indent=2) + "\n"

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
