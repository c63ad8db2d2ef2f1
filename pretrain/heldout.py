"""MLM accuracy of a pre-trained BERT on held-out text, next to what copying the input scores there.

    python -m skillnet.pretrain.heldout --model RUN/hf --shards HELDOUT_SHARDS [--train-shards SHARDS]
        [--max-seq-len 128] [--batch-size 32] [--max-windows 2048] [--out heldout_mlm.json]

The held-out shards are masked as pre-training masks (the same `PretrainingDataset`, 15%, 80/10/10), so
both numbers are over the same predicted positions:

* ``model_acc``: the model's top prediction equals the original token;
* ``copy_acc``: the input token at the position is the original (the unchanged tenth, and the rare random
  replacement that drew the original);
* ``baseline_acc``: the best a model can do without reading the context: copy the input, and at a [MASK]
  predict the most frequent token of the training text (``--train-shards``; of the held-out text without
  it). This is the ~0.14 of the unigram-plateau model that has learned to copy (experiments/runner.py FLOORS).

A model that reads the context beats ``baseline_acc``; one that does not, cannot, whatever its training log
says. Training batches overstate it too: they are text the model has seen.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch


def most_frequent_token(shard_dir: str | Path) -> int:
    """The most frequent token id of a shard directory (special tokens never occur in shards)."""
    from skillnet.data_prep.shards import load_manifest, open_tokens

    m = load_manifest(shard_dir)
    counts = np.zeros(int(m["tokenizer"]["vocab_size"]), np.int64)
    for rec in m["shards"]:
        tokens = open_tokens(Path(shard_dir), rec, m["tokenizer"]["dtype"])
        if len(tokens):
            counts += np.bincount(np.asarray(tokens, dtype=np.int64), minlength=len(counts))[: len(counts)]
    return int(counts.argmax())


def load_mlm_model(folder: str | Path) -> torch.nn.Module:
    """The HF folder of a pre-training export: a plain BertForPreTraining (``--dense``) or SkillNet-BERT."""
    config = json.loads((Path(folder) / "config.json").read_text(encoding="utf-8"))
    if config.get("model_type") == "bert":
        from transformers import BertForPreTraining

        return BertForPreTraining.from_pretrained(str(folder)).eval()
    from skillnet.model import SkillNetBertForPreTraining

    return SkillNetBertForPreTraining.from_pretrained(str(folder)).eval()


def masked_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """[M, V] logits at the positions whose label is not -100, in row-major order."""
    sel = batch["labels"] != -100
    inputs = {k: batch[k] for k in ("input_ids", "attention_mask", "token_type_ids")}
    if hasattr(model.config, "task_skill_names"):  # SkillNet-BERT: the MLM objective's skills
        return model(task="mlm", **inputs, labels=batch["labels"]).logits
    return model(**inputs).prediction_logits[sel]


@torch.no_grad()
def heldout_mlm(model: torch.nn.Module, dataset: Any, *, unigram: int, batch_size: int = 32,
                max_windows: int = 2048) -> dict[str, Any]:
    """``model_acc``, ``copy_acc`` and ``baseline_acc`` (module docstring) over the masked positions of up to
    `max_windows` windows of `dataset` (all of them when fewer; one fixed masking, epoch 0)."""
    n = min(int(dataset.num_samples), max_windows)
    # spread over the whole held-out text, not its first documents only
    windows = np.linspace(0, dataset.num_samples - 1, n).round().astype(np.int64) if n else np.zeros(0, np.int64)
    hits = {"model": 0, "copy": 0, "baseline": 0}
    count = 0
    for lo in range(0, n, batch_size):
        batch = dataset.batch(windows[lo : lo + batch_size].tolist(), 0, "mlm")
        sel = batch["labels"] != -100
        target, seen = batch["labels"][sel], batch["input_ids"][sel]
        guess = torch.where(seen == dataset.mask_id, torch.full_like(seen, unigram), seen)
        hits["model"] += int((masked_logits(model, batch).argmax(-1) == target).sum())
        hits["copy"] += int((seen == target).sum())
        hits["baseline"] += int((guess == target).sum())
        count += int(sel.sum())
    out: dict[str, Any] = {f"{k}_acc": (v / count if count else None) for k, v in hits.items()}
    return {**out, "masked": count, "windows": n}


def build_parser() -> argparse.ArgumentParser:
    from skillnet.common.cli import Parser

    p = Parser("skillnet.pretrain.heldout", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, type=Path, help="the HF folder of a BERT pre-training export")
    p.add_argument("--shards", required=True, type=Path, help="shards of held-out text (same vocab as training)")
    p.add_argument("--train-shards", type=Path,
                   help="the training shards: the baseline's [MASK] guess is their most frequent token")
    p.add_argument("--max-seq-len", type=int, default=128, help="window length, as in pre-training (default 128)")
    p.add_argument("--mlm-probability", type=float, default=0.15, help="as in pre-training (default 0.15)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-windows", type=int, default=2048, help="at most this many windows (default 2048)")
    p.add_argument("--seed", type=int, default=0, help="the masking's seed")
    p.add_argument("--out", type=Path, help="write the result as JSON here (it is printed either way)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    from skillnet.common.outputs import at_least, check_options, in_range
    from skillnet.pretrain.dataset import PretrainingDataset

    ap = build_parser()
    a = ap.parse_args(argv)
    check_options(ap, a, {"max_seq_len": at_least(8), "batch_size": at_least(1), "max_windows": at_least(1),
                          "mlm_probability": in_range(0, 1)})
    dataset = PretrainingDataset(a.shards, max_seq_len=a.max_seq_len, seed=a.seed, mlm_probability=a.mlm_probability)
    res = heldout_mlm(load_mlm_model(a.model), dataset, unigram=most_frequent_token(a.train_shards or a.shards),
                      batch_size=a.batch_size, max_windows=a.max_windows)
    text = json.dumps({**res, "model": str(a.model), "shards": str(a.shards)}, indent=2)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(text + "\n", encoding="utf-8")
    print(text)
    return 0 if res["masked"] else 1


if __name__ == "__main__":
    sys.exit(main())
