"""Label a JSONL file with an exported fine-tuned SkillNet model (any of its tasks, mixed in one file).

    python -m skillnet.finetune.predict --model runs/ft/export --input in.jsonl --output out.jsonl
    python -m skillnet.finetune.predict --model runs/ft/best/ner --task ner --input sentences.jsonl --output tagged.jsonl

Each input line is a record of the task's kind (docs/task_data.md), labels optional, plus ``"task"``
naming the task (or pass ``--task`` for a file of one task). The output has the input records in the
same order with a ``"prediction"`` field:

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
from skillnet.data_prep.tasks.schema import TaskDataError, check_record, iter_jsonl
from skillnet.export.card import FINETUNE_META as META_FILE
from skillnet.finetune.tasks import TaskData


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
        self.tasks = {n: TaskData.for_inference(n, m, self.tok) for n, m in meta["tasks"].items()}

    def check(self, obj: Any, task: str) -> dict[str, Any]:
        d = self.tasks[task]
        rec = check_record(obj, d.kind, label_list=None, regression=d.regression, require_labels=False)
        return rec

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
    p.add_argument("--input", required=True, help="JSONL records; each names its task in 'task' unless --task")
    p.add_argument("--output", required=True,
                   help="JSONL with a 'prediction' field added (written atomically); an existing file is replaced "
                        "only if it holds predictions, or with --overwrite")
    p.add_argument("--overwrite", action="store_true", help="replace --output whatever it holds (never --input)")
    p.add_argument("--task", help="task of every record that has no 'task' field")
    p.add_argument("--batch-size", type=int, default=32, help="records per forward pass (>= 1)")
    p.add_argument("--skip-bad", action="store_true", help="count and skip bad records instead of stopping")
    p.add_argument("--no-progress", action="store_true", help="no tqdm bar")
    return p


def predict_file(pred: Predictor, inp: str, out: str, default_task: str | None = None, batch_size: int = 32,
                 skip_bad: bool = False, progress: bool = True) -> dict[str, Any]:
    """Label `inp` into `out`; returns counts {"written", "skipped", "per_task"}."""
    from tqdm import tqdm

    rows: list[tuple[int, dict[str, Any], str, dict[str, Any]]] = []  # (line, raw, task, record)
    skipped: dict[str, int] = {}
    for line_no, obj in iter_jsonl(inp):
        try:
            if not isinstance(obj, dict):
                raise ValueError(getattr(obj, "msg", f"expected a JSON object, got {type(obj).__name__}"))
            task = obj.get("task", default_task)
            if task is None:
                raise ValueError("no 'task' field and no --task given")
            if task not in pred.tasks:
                raise ValueError(f"unknown task {task!r}; the model knows {sorted(pred.tasks)}")
            rows.append((line_no, obj, task, pred.check(obj, task)))
        except ValueError as e:
            if not skip_bad:
                raise TaskDataError(inp, line_no, str(e)) from None
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
    return {"written": len(rows), "skipped": skipped, "per_task": per_task}


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
    print(json.dumps(stats, ensure_ascii=False), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
