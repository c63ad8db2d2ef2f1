"""The export command's flags and dispatch; ``python -m skillnet.pretrain.export`` (pretrain/export.py) runs it
with fine-tuning's task loader. The work itself: export/hf_folder.py (checkpoint or export -> HF folder) and
export/plain.py (``--plain``: one task as a stock transformers folder)."""

from __future__ import annotations

import json
import os
import sys
from typing import TYPE_CHECKING

from skillnet.common.cli import Parser
from skillnet.common.safe_load import add_trust_flag

if TYPE_CHECKING:
    from .plain import TaskLoader

# Exports read local folders only: a path that does not exist must fail as such, not as a hub lookup. Set
# before transformers is imported (export/hf_folder.py and export/plain.py import it).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# --plain reads the task's records (a .json or a table through datasets): a refusal is then the one line on stderr
os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")

def build_parser() -> Parser:
    from . import hf_folder

    p = Parser("skillnet.pretrain.export", description=hf_folder.__doc__)
    p.add_argument(
        "--checkpoint", required=True,
        help="run dir (uses checkpoints/latest), checkpoints dir or step_* dir; or a SkillNet HF export (e.g. a "
        "fine-tuning run's export/), copied to --out with the default task --task",
    )
    p.add_argument("--tag", help="checkpoint tag (step_XXXXXXXX); default: latest")
    p.add_argument("--out", required=True, help="output folder, written atomically; it must be new, empty or an earlier "
                   "export of the same checkpoint and settings (replaced), unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace whatever --out holds (never the run being exported)")
    p.add_argument(
        "--no-init-unused",
        action="store_true",
        help="SkillNet-BERT: keep the untrained skills as they are instead of copying the generic skill into them",
    )
    p.add_argument(
        "--task",
        help="SkillNet-BERT: the default task, what a call without task= runs (any task of the model's config; "
        "default: mlm, which fill-mask and feature-extraction pipelines then use)",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="write --task of a SkillNet export (--checkpoint FOLDER) as a stock transformers model that loads "
        "without trust_remote_code: the task's skills merged into one FFN per layer, the head as the matching "
        "BertFor*/BartForConditionalGeneration class, the card stating the measured equality (docs/hf.md). "
        "MoE and PALs cannot be written so and are refused",
    )
    p.add_argument("--onnx", action="store_true",
                   help="with --plain: also model.onnx (fp32) and model_int8.onnx (dynamic int8) for a BERT task, or "
                   "ort/ (encoder and decoder graphs, fp32 and int8, and seq2seq.py to decode them) for a BART "
                   "task, each measured against the sparse model (needs the deploy extra: onnx, onnxscript, "
                   "onnxruntime)")
    p.add_argument("--features", action="store_true",
                   help="with --plain: a BertModel of the task's skills (features), whatever the task's head")
    p.add_argument("--test", help="with --plain: records of the task in its own format (the fields its 'columns' "
                   "map; JSONL, JSON, CSV, TSV or Parquet, read as fine-tuning reads them) to measure the equality, a "
                   "CRF's argmax agreement and the ONNX scores on; default: the fine-tuning run's test split, else its "
                   "dev split (paths relative to the run's config file), else five fixed sentences, with a warning")
    p.add_argument(
        "--dense",
        action="store_true",
        help="require a dense checkpoint (pretrain/run.py --dense or --arch bart) and write a plain HF folder; "
        "without it the kind is read from the checkpoint's model config all the same",
    )
    add_trust_flag(p)
    return p


def main(argv: list[str] | None = None, *, task_loader: TaskLoader | None = None) -> int:
    """The export command. `task_loader` reads a fine-tuned export's tasks for ``--plain`` (export/plain.py);
    the user-facing command (pretrain/export.py) passes fine-tuning's."""
    p = build_parser()
    args = p.parse_args(argv)
    if (args.features or args.test or args.onnx) and not args.plain:
        p.error("--features, --test and --onnx go with --plain")
    if args.plain and not args.task:
        p.error("--plain needs --task: the one task the stock model computes")
    try:
        if args.plain:
            from .plain import export_plain

            out = export_plain(args.checkpoint, args.out, args.task, features=args.features, test=args.test,
                               overwrite=args.overwrite, onnx=args.onnx, task_loader=task_loader)
            print(json.dumps({"event": "exported", "out": str(out), "plain": True}))
            return 0
        from .hf_folder import export

        out = export(args.checkpoint, args.out, args.tag, init_unused=not args.no_init_unused, dense=args.dense,
                     task=args.task, overwrite=args.overwrite)
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"event": "exported", "out": str(out)}))
    return 0

