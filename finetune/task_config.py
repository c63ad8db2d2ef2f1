"""One task's entry of the fine-tuning config (`TaskConfig`: its data, type, skills, head and lengths), the
config's error type and the helpers every section of the config shares (finetune/config.py reads the rest).

A task's type-specific checks ask its codec (finetune/task_types/), which is imported on first use so that
reading a config imports torch only once a task is checked.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import TYPE_CHECKING, Any

from skillnet.data_prep.tasks.schema import datasets_class, kind_fields

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
    # span: a long context is read in windows of max_seq_len; each window starts doc_stride pieces after the
    # last (default: half a window, so every answer up to half a window long lies whole in some window), and
    # the question keeps max_question_len pieces (default: a third of max_seq_len); the answer cap is
    # head.max_answer_len (default 64 tokens). docs/finetune.md, "Span settings".
    doc_stride: int | None = None
    max_question_len: int | None = None

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
        for key in ("doc_stride", "max_question_len"):
            v = getattr(self, key)
            if v is not None and (not _int(v) or v < 1):
                raise ValueError(f"{key} must be an integer >= 1 (or null for the default), got {v!r}")
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
    def source_prefix(self) -> str:
        return f"{self.name}: " if self.prefix is None else self.prefix
