"""Label a JSONL file with an exported fine-tuned SkillNet model (any of its tasks, mixed in one file).

    python -m skillnet.finetune.predict --model runs/ft/export --input in.jsonl --output out.jsonl
    python -m skillnet.finetune.predict --model runs/ft/best/ner --task ner --input sentences.jsonl --output tagged.jsonl

Each input line is a record of the task's kind (docs/task_data.md), labels optional, in the task's own format
(the columns its ``columns`` mapped in fine-tuning, as training read them) or with the schema's field names,
plus ``"task"`` naming the task. A record without one gets ``--task``, else the model's only task, else its
default task (config.json ``default_task``); the command says which. The output has the input records in the
same order with a ``"task"`` and a ``"prediction"`` field:

* classification: the label; regression: a number;
* ner: ``{"tags": [...], "entities": [{"type", "start", "end", "text"}]}`` (word offsets, end exclusive);
* span: the answer text;
* matching: ``{"best": index, "scores": [...]}`` over the record's candidates;
* generation: the generated text (beam search with the task's ``num_beams`` and ``max_target_len``).

A bad record stops with ``file:line: reason`` (or is counted and skipped with ``--skip-bad``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skillnet.common.cli import Parser
from skillnet.common.files import atomic_write
from skillnet.data_prep.tasks.schema import TaskDataError, check_record, iter_jsonl, map_columns
from skillnet.export.card import FINETUNE_META as META_FILE
from skillnet.export.card import read_json, run_dir_of
from skillnet.finetune.tasks import TaskData


def columns_hint(td: TaskData) -> str:
    """What a bad record's message adds: how the task reads its fields (its `columns`, or none)."""
    if td.cfg.columns:
        return f"task {td.name!r} reads its fields through 'columns' {json.dumps(td.cfg.columns, ensure_ascii=False)}"
    return (f"task {td.name!r} maps no 'columns': its records use the schema's field names "
            f"({', '.join(td.codec.kinds)} records, docs/task_data.md)")


def _with_hint(e: TaskDataError, td: TaskData) -> TaskDataError:
    if e.line <= 0 or "columns" in e.reason:  # a file-level error, or one that names the columns already
        return e
    return TaskDataError(e.path, e.line, f"{e.reason} ({columns_hint(td)})", unit=e.unit)


class Predictor:
    """An exported model plus the task metadata to encode inputs and decode outputs."""

    def __init__(self, model_dir: str | os.PathLike[str], device: str = "cpu") -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from skillnet.data_prep.tokenizer import load_tokenizer
        from skillnet.model.spec import family_of_model_type
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()

        d = Path(model_dir)
        meta_path = d / META_FILE
        if not meta_path.is_file():
            raise FileNotFoundError(f"{d} is not a fine-tuned export: {META_FILE} missing "
                                    "(use the export/ or best/<task>/ folder written by finetune.run)")
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        vocab = d / meta.get("vocab", "vocab.txt")
        self.tok = load_tokenizer(vocab if vocab.is_file() else None, lowercase=meta.get("lowercase", True))
        model_type = json.loads((d / "config.json").read_text(encoding="utf-8")).get("model_type")
        family = family_of_model_type(model_type)
        if family is None or model_type != family.model_type:
            raise FileNotFoundError(f"{d}: model_type {model_type!r} is not a fine-tuned SkillNet export")
        self.model = family.load("task_model").from_pretrained(str(d)).to(device).eval()
        self.folder = d
        run = run_dir_of(d)
        # exports written before finetune_tasks.json kept each task's columns: the run's config has them
        run_tasks = {t.get("name"): t for t in ((read_json(run / "finetune_config.json") or {}).get("tasks") or [])
                     if isinstance(t, dict)} if run else {}
        self.tasks = {n: TaskData.for_inference(n, {"columns": (run_tasks.get(n) or {}).get("columns"), **m}, self.tok)
                      for n, m in meta["tasks"].items()}
        default = json.loads((d / "config.json").read_text(encoding="utf-8")).get("default_task")
        # (task, why) for a record without a "task" field: the only task, else the config's default task
        self.default_task: tuple[str, str] | None = (
            (next(iter(self.tasks)), "the model's only task") if len(self.tasks) == 1 else
            (default, "the model's default task, config.json default_task") if default in self.tasks else None)

    def check(self, obj: Any, task: str) -> dict[str, Any]:
        """The record `obj` of `task` normalised, or ValueError: read through the task's `columns` when it
        holds any of them (as fine-tuning read the task's files), else by the schema's field names."""
        d = self.tasks[task]
        cols = d.cfg.columns
        if cols and isinstance(obj, dict) and any(c in obj for c in cols.values()):
            obj = map_columns(obj, cols)
        return check_record(obj, d.kind, label_list=None, regression=d.regression, require_labels=False)

    def task_records(self, task: str, test: str | None = None) -> tuple[list[dict[str, Any]], str | None, str]:
        """Records of `task` for ``export --plain`` to measure on, read as fine-tuning read the task's splits
        (its kind, labels and `columns`): the file `test`, else the run's test split, else its dev split, each
        where the run found it (paths relative to the run's config file). Returns (records, what they were read
        from, None when nothing was found; and where they came from, or why there are none). A bad record
        raises TaskDataError (file, line, and how the task reads its fields)."""
        td = self.tasks[task]
        if test is not None:
            return self._read(td, test, test, "test"), test, "--test"
        run = run_dir_of(self.folder)
        if run is None:
            return [], None, (f"no fine-tuning run holds the export {self.folder.name}/ (no finetune_config.json in "
                              "its parent or grandparent folder): it was moved or copied without its run")
        import dataclasses

        from skillnet.finetune.config import FinetuneConfig

        try:
            ft = FinetuneConfig.load(run / "finetune_config.json")
            tcfg = next((t for t in ft.tasks if t.name == task), None)
            if tcfg is None:
                return [], None, f"task {task!r} was not fine-tuned by the run {run} (its model.init brought it)"
            # the sources as the run resolved them (spec, dataset, train/dev/test relative to its config)
            where = TaskData(dataclasses.replace(tcfg, kind=td.kind, labels=td.label_list), ft, self.tok,
                             load_splits=())
        except ValueError as e:  # ConfigError, TaskDataError (a spec that is gone): nothing to measure on
            return [], None, f"the run's config {run / 'finetune_config.json'} cannot be read again: {e}"
        missing = []
        for split in ("test", "dev"):
            src = where.sources.get(split)
            if isinstance(src, str) and not Path(src).exists():
                missing.append(f"{split} {src}")
            elif src is not None:
                return self._read(td, src, where.files[split], split), where.files[split], f"the run's {split} split"
        if missing:
            return [], None, f"the run's {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not there"
        return [], None, f"the run's config gives task {task!r} no test or dev split"

    @staticmethod
    def _read(td: TaskData, source: Any, name: str, split: str) -> list[dict[str, Any]]:
        try:
            return td.read(source, name, split, require_labels=False)[0]
        except TaskDataError as e:
            raise _with_hint(e, td) from None

    def predict(self, task: str, recs: list[dict[str, Any]], batch_size: int = 32) -> list[Any]:
        d = self.tasks[task]
        preds = d.predict_records(self.model, recs, batch_size)
        return [d.codec.present(r, p) for r, p in zip(recs, preds)]


def task_source(folder: Path) -> tuple[Any, Predictor] | None:
    """(model, Predictor) of a fine-tuned export, None for a folder without fine-tuned tasks: the task
    loader of ``export --plain`` (export/plain.py ``TaskLoader``)."""
    if not (Path(folder) / META_FILE).is_file():
        return None
    pred = Predictor(folder)
    return pred.model, pred

def build_parser() -> argparse.ArgumentParser:
    p = Parser("skillnet.finetune.predict", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--model", required=True, help="an export/ or best/<task>/ folder written by finetune.run")
    p.add_argument("--input", required=True, help="JSONL records, in the task's own format (its 'columns') or the schema's; each "
                   "names its task in 'task', else --task (or the model's only or default task) applies")
    p.add_argument("--output", required=True,
                   help="JSONL with a 'prediction' field added (written atomically); an existing file is replaced "
                        "only if it holds predictions, or with --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace --output whatever it holds (never --input)")
    p.add_argument("--task", help="task of every record that has no 'task' field (default: the model's only task, "
                   "else its default task, config.json default_task)")
    p.add_argument("--batch-size", type=int, default=32, help="records per forward pass (>= 1)")
    p.add_argument("--skip-bad", action="store_true", help="count and skip bad records instead of stopping")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    return p


def other_tasks_reading(pred: Predictor, obj: Any, task: str | None) -> list[str]:
    """The model's tasks other than `task` whose format (kind and ``columns``) reads `obj` without error."""
    if not isinstance(obj, dict):
        return []
    out = []
    for t in pred.tasks:
        if t == task:
            continue
        try:
            pred.check(obj, t)
        except ValueError:
            continue
        out.append(t)
    return out


def predict_file(pred: Predictor, inp: str, out: str, default_task: str | None = None, batch_size: int = 32,
                 skip_bad: bool = False, progress: bool = True) -> dict[str, Any]:
    """Label `inp` into `out`; returns counts {"written", "skipped", "per_task"}, and with records that name no
    task, "without_task": {"task", "why", "records"}."""
    from tqdm import tqdm

    rows: list[tuple[int, dict[str, Any], str, dict[str, Any]]] = []  # (line, raw, task, record)
    skipped: dict[str, int] = {}
    implicit = (default_task, "--task") if default_task is not None else pred.default_task
    without_task = 0
    for line_no, obj in iter_jsonl(inp):
        task = None
        try:
            if not isinstance(obj, dict):
                raise ValueError(getattr(obj, "msg", f"expected a JSON object, got {type(obj).__name__}"))
            if "task" not in obj and implicit is None:
                raise ValueError(f"no 'task' field and no --task given (the model has tasks {sorted(pred.tasks)} "
                                 "and no default task)")
            task = obj["task"] if "task" in obj else implicit[0]
            without_task += "task" not in obj
            if task not in pred.tasks:
                raise ValueError(f"unknown task {task!r}; the model knows {sorted(pred.tasks)}")
            rows.append((line_no, obj, task, pred.check(obj, task)))
        except ValueError as e:
            msg = str(e) + (f" ({columns_hint(pred.tasks[task])})" if task in pred.tasks else "")
            fits = other_tasks_reading(pred, obj, task) if isinstance(obj, dict) and "task" not in obj else []
            if fits:  # the record is in another task's format: the task was picked for it, not given
                msg += f"; it reads as a record of task {fits[0]!r}: pass --task {fits[0]}"
            if not skip_bad:
                raise TaskDataError(inp, line_no, msg) from None
            skipped[str(e).split(":")[0]] = skipped.get(str(e).split(":")[0], 0) + 1
    if not rows:
        raise TaskDataError(inp, 1, "no record to label (file empty or every record bad)")
    results: dict[int, Any] = {}
    per_task: dict[str, int] = {}
    chunk = max(1, batch_size * 4)
    with tqdm(total=len(rows), desc="predict", unit="rec", disable=not progress, file=sys.stderr) as bar:
        for task in sorted({t for _, _, t, _ in rows}):
            idx = [i for i, (_, _, t, _) in enumerate(rows) if t == task]
            for s in range(0, len(idx), chunk):
                part = idx[s:s + chunk]
                preds = pred.predict(task, [rows[i][3] for i in part], batch_size)
                for i, p in zip(part, preds):
                    results[i] = p
                per_task[task] = per_task.get(task, 0) + len(part)
                bar.update(len(part))
    atomic_write(out, lambda f: f.writelines(json.dumps({**raw, "task": task, "prediction": results[i]},
                                                        ensure_ascii=False) + "\n"
                                             for i, (_, raw, task, _) in enumerate(rows)))
    stats: dict[str, Any] = {"written": len(rows), "skipped": skipped, "per_task": per_task}
    if without_task and implicit is not None:
        stats["without_task"] = {"task": implicit[0], "why": implicit[1], "records": without_task}
    return stats


def holds_predictions(path: Path) -> bool:
    """What predict writes: JSON lines, the first of which has a 'prediction' field."""
    try:
        with open(path, encoding="utf-8") as f:
            first = json.loads(f.readline())
    except (OSError, ValueError):
        return False
    return isinstance(first, dict) and "prediction" in first


def main(argv: Sequence[str] | None = None) -> int:
    from skillnet.common.outputs import OutputError, at_least, check_options, claim_file

    parser = build_parser()
    a = parser.parse_args(argv)
    check_options(parser, a, {"batch_size": at_least(1)})
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        if not Path(a.input).exists():
            raise FileNotFoundError(f"--input {a.input}: no such file")
        # Checked before the model loads: a refusal costs nothing, and a run never ends in an unwritable file.
        claim_file(a.output, option="--output", overwrite=a.overwrite, own=holds_predictions, inputs=[a.input])
        pred = Predictor(a.model)
        stats = predict_file(pred, a.input, a.output, a.task, a.batch_size, a.skip_bad, not a.no_progress)
    except (TaskDataError, FileNotFoundError, OutputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if "without_task" in stats:
        w = stats["without_task"]
        print(f"[predict] {w['records']} record(s) without a 'task' field labelled as task {w['task']!r} ({w['why']})",
              file=sys.stderr)
    print(json.dumps(stats, ensure_ascii=False), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
