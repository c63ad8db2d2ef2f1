"""One schema for every fine-tuning task kind, its validator and its loader (this module re-exports them).

A task split is a sequence of records. On disk the project's own format is JSON Lines (one JSON object
per line); the loader also reads JSON, CSV, TSV and Parquet files, local `datasets.load_dataset` folders
and `save_to_disk` folders (through HF `datasets`), and in-memory `datasets.Dataset` objects. The fields
per kind are in `docs/task_data.md`; `KINDS` is the machine-readable version. Whatever the source,
every record goes through the same validator, and the loader names the file and line (or row, for
formats without lines) of the first bad one (`path:line: reason`, `path:row N: reason`), or, with
`skip_bad=True`, counts bad records per reason and skips them, so that nothing deeper (tokenizer,
collator, torch) ever sees malformed input.

The code lives in three modules:
- validation.py: the kinds and their fields, `validate_record`, `TaskDataError`, label lists;
- readers.py: the records of one split from any source (`open_records`, `dataset_splits`, `iter_jsonl`);
- loading.py: `load_task_file` / `load_task` (read, validate, label ids), `TaskSpec`, `LoadReport`, writers.
"""

from __future__ import annotations

from .loading import (
    LoadReport,
    TaskSpec,
    infer_pair_kind,
    load_task,
    load_task_file,
    map_columns,
    write_jsonl,
)
from .readers import (
    FILE_FORMATS,
    SPLIT_ALIASES,
    SUPPORTED_SOURCES,
    TaskSource,
    dataset_splits,
    datasets_class,
    iter_jsonl,
    open_records,
)
from .validation import (
    FLAT_KINDS,
    KINDS,
    SPLITS,
    TaskDataError,
    _Bad,  # noqa: F401 (packaged.py, public.py and generation.py raise it for records they reject)
    check_record,
    expand_label_list,
    infer_label_list,
    kind_fields,
    validate_record,
)

__all__ = [
    "FILE_FORMATS", "FLAT_KINDS", "KINDS", "SPLITS", "SPLIT_ALIASES", "SUPPORTED_SOURCES", "LoadReport",
    "TaskDataError", "TaskSource", "TaskSpec", "check_record", "dataset_splits",
    "datasets_class", "expand_label_list", "infer_label_list", "infer_pair_kind", "iter_jsonl", "kind_fields",
    "load_task", "load_task_file", "map_columns", "open_records", "validate_record", "write_jsonl",
]
