"""How much of a pre-training row is real text: a shard set's real-token share, padded and packed.

    python -m skillnet.pretrain.padding shards/ --max-seq-len 512
    python -m skillnet.pretrain.padding shards/ --max-seq-len 128 --objectives mlm --micro-batch-size 64

For each objective, a batch of ``--samples`` samples drawn as a run draws them (seed 0, epoch 0) is built one
sample per row (``--no-packing``) and packed per micro-batch of ``--micro-batch-size`` samples (the default);
the share is real tokens over row slots. ``bound`` is the most any packing of those micro-batches can reach:
a sample longer than half a row needs a row that no other such sample shares.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from skillnet.common.cli import Parser

OBJECTIVES = ("mlm", "nsp")


def shares(dataset: Any, objective: str, samples: int, micro: int) -> dict[str, float]:
    """{unpacked, packed, bound} real-token shares of ``samples`` samples in micro-batches of ``micro``."""
    from skillnet.training.packing import fewest_rows, pack_rows

    seq = dataset.max_seq_len
    order = np.random.default_rng([0, 0]).permutation(len(dataset))[:samples]
    real = rows = bound_rows = 0
    for at in range(0, len(order), micro):
        batch = dataset.batch(order[at : at + micro].tolist(), 0, objective)
        lengths = batch["attention_mask"].sum(1).numpy()
        real += int(lengths.sum())
        rows += pack_rows(batch, dataset.pad_id)[0]["input_ids"].shape[0]
        bound_rows += fewest_rows(lengths, seq)
    return {"unpacked": real / (len(order) * seq), "packed": real / (rows * seq), "bound": real / (bound_rows * seq)}


def main(argv: list[str] | None = None) -> int:
    p = Parser("skillnet.pretrain.padding", description=__doc__)
    p.add_argument("shards", help="shard directory (manifest.json + .bin/.idx)")
    p.add_argument("--max-seq-len", type=int, default=128, help="row length in tokens (default: 128)")
    p.add_argument("--objectives", nargs="+", choices=OBJECTIVES, default=list(OBJECTIVES),
                   help="objectives to measure (default: mlm nsp)")
    p.add_argument("--samples", type=int, default=2048, help="samples per objective (default: 2048)")
    p.add_argument("--micro-batch-size", type=int, default=64,
                   help="samples packed together, a rank's micro-batch in a run (default: 64)")
    p.add_argument("--short-seq-prob", type=float, default=0.1, help="as pretrain/run.py (default: 0.1)")
    a = p.parse_args(argv)
    for name in ("max_seq_len", "samples", "micro_batch_size"):
        if getattr(a, name) < (8 if name == "max_seq_len" else 1):
            p.error(f"--{name.replace('_', '-')} {getattr(a, name)} is too small")
    from skillnet.data_prep.shards import ShardError
    from skillnet.pretrain.dataset import PretrainingDataset

    try:
        ds = PretrainingDataset(a.shards, max_seq_len=a.max_seq_len, short_seq_prob=a.short_seq_prob, verify="size")
        for o in a.objectives:
            ds.check_objective(o)
    except (ShardError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    n = min(a.samples, len(ds))
    print(f"{a.shards}: {len(ds):,} samples at {a.max_seq_len} tokens; real tokens over row slots, {n:,} samples "
          f"per objective, packed per micro-batch of {a.micro_batch_size}")
    print(f"{'objective':<10}{'one per row':>13}{'packed':>9}{'bound':>8}")
    for o in a.objectives:
        s = shares(ds, o, n, a.micro_batch_size)
        print(f"{o:<10}{s['unpacked']:>13.1%}{s['packed']:>9.1%}{s['bound']:>8.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
