"""``python -m skillnet.pretrain.export`` and ``skillnet-export``: the export command (export/cli.py), run with
fine-tuning's task loader so that ``--plain`` measures a fine-tuned task on its own test records.

The command keeps this module path because users, docs and every shipped export's remote code
(model/routers.py ``REMOTE_CODE_EXPORT``) name it. It is also the one place that joins export/ (which
imports nothing from finetune/) with finetune's predictor: export/ stays below finetune/.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from skillnet.export.cli import build_parser
from skillnet.export.cli import main as export_main

__all__ = ["build_parser", "main"]


def _finetuned_tasks(folder: Path) -> tuple[Any, Any] | None:
    # imported on use: fine-tuning's task types are heavy, and only --plain of a fine-tuned export needs them
    from skillnet.finetune.predict import task_source

    return task_source(folder)


def main(argv: list[str] | None = None) -> int:
    return export_main(argv, task_loader=_finetuned_tasks)


if __name__ == "__main__":
    sys.exit(main())
