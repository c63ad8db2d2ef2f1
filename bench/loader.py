"""Pre-training data loader speed: does it outrun the GPU?

The trainer takes one micro-batch per step from ``PretrainBatchSource``; with ``workers`` > 0 the batches
are built ahead in worker processes (pinned memory on a GPU), so the GPU waits for the host only if the
loader is slower than the model step. This bench measures the loader alone, at sequence 512 and
micro-batch 64 (ds_configs/a100_bf16.json), for the MLM and the NSP sample paths, with whole-word masking,
in the training process (``workers=0``) and with the workers a GPU run uses (``--workers``, default 2).

Corpus: the packaged Chinese text (People's Daily paragraphs, insuranceqa answers), consecutive paragraphs
joined into documents of about ``--doc-chars`` characters so that windows of 512 tokens fill as on a
pre-training corpus of articles; built with ``python -m skillnet.data_prep build --whole-word`` under
``--work`` (never into the repository).

``loader_tokens_per_s_seq512``: the slower objective's non-padding tokens per second with ``--workers``
workers, per rank (each rank runs its own loader). Target: >= 1.2 M, 4x the dense BERT-base step of an
H100 (~300k tokens/s).

    python bench/loader.py                 # table
    python bench/loader.py --json          # table, then one JSON object (last line)
    python bench/loader.py --write         # also rewrite its section of docs/speed.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from skillnet.experiments.benchdoc import machine_line, md_table, write_section  # noqa: E402
from skillnet.pretrain.dataset import PretrainingDataset  # noqa: E402
from skillnet.pretrain.objectives import ObjectiveSampler, PretrainBatchSource  # noqa: E402

DOC = "docs/speed.md"
TARGET = 1.2e6


def build_shards(work: Path, doc_chars: int) -> Path:
    from skillnet.data_prep.sample_corpus import packaged_chinese_docs  # noqa: PLC0415

    shards = work / f"shards_{doc_chars}"
    if (shards / "manifest.json").is_file():
        return shards
    docs, cur = [], ""
    for para in packaged_chinese_docs():
        cur += para
        if len(cur) >= doc_chars:
            docs.append(cur)
            cur = ""
    corpus = work / f"corpus_{doc_chars}.txt"
    work.mkdir(parents=True, exist_ok=True)
    corpus.write_text("".join(d + "\n" for d in docs), encoding="utf-8")
    print(f"building whole-word shards of {len(docs):,} documents under {shards} ...", flush=True)
    r = subprocess.run([sys.executable, "-m", "skillnet.data_prep", "build", str(corpus), "--out", str(shards),
                        "--whole-word", "--no-progress"], capture_output=True, text=True)
    if r.returncode:
        sys.exit(f"error: data_prep build failed:\n{r.stderr[-2000:]}")
    return shards


def measure(shards: Path, objective: str, workers: int, micro: int, seq: int, seconds: float) -> dict[str, float]:
    ds = PretrainingDataset(shards, max_seq_len=seq, whole_word_mask=True, verify="size")
    sampler = ObjectiveSampler(seed=0, objectives=(objective,))
    src = PretrainBatchSource(ds, sampler, micro, 1, workers=workers, prefetch=4)
    next(src)  # workers started, first batch through: what a run pays once
    real = padded = 0
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        b = next(src)
        real += b.num_tokens()
        padded += b.tensors["input_ids"].numel()
    dt = time.perf_counter() - t0
    src.close()
    return {"tokens_per_s": real / dt, "padded_tokens_per_s": padded / dt, "fill": real / max(padded, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, default=2, help="loader workers per rank to rate (default: %(default)s)")
    ap.add_argument("--micro", type=int, default=64, help="micro-batch size (default: %(default)s)")
    ap.add_argument("--seq", type=int, default=512, help="sequence length (default: %(default)s)")
    ap.add_argument("--seconds", type=float, default=6.0, help="timed seconds per arm (default: %(default)s)")
    ap.add_argument("--doc-chars", type=int, default=2000,
                    help="join paragraphs into documents of about this many characters (default: %(default)s)")
    ap.add_argument("--work", default="runs/bench_loader", help="scratch directory (default: %(default)s)")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--write", nargs="?", const=DOC, metavar="MD",
                    help=f"rewrite the 'loader' section of this Markdown file (default: {DOC})")
    args = ap.parse_args(argv)
    if args.workers < 1 or args.micro < 1 or args.seq < 8 or args.seconds <= 0:
        ap.error("--workers and --micro must be >= 1, --seq >= 8, --seconds > 0")
    shards = build_shards(Path(args.work), args.doc_chars)
    rows: list[dict[str, Any]] = []
    print(f"loader: micro-batch {args.micro} x seq {args.seq}, whole-word masking, {os.cpu_count()} cores")
    print(f"{'objective':<10}{'workers':>8}{'tokens/s':>12}{'padded tok/s':>14}{'fill':>7}")
    for objective in ("mlm", "nsp"):
        for workers in (0, args.workers):
            r = {"objective": objective, "workers": workers,
                 **measure(shards, objective, workers, args.micro, args.seq, args.seconds)}
            rows.append(r)
            print(f"{objective:<10}{workers:>8}{r['tokens_per_s']:>12,.0f}{r['padded_tokens_per_s']:>14,.0f}"
                  f"{r['fill']:>7.2f}", flush=True)
    rated = [r for r in rows if r["workers"] == args.workers]
    worst = min(rated, key=lambda r: r["tokens_per_s"])
    result = {
        "loader_tokens_per_s_seq512": round(worst["tokens_per_s"], 1) if args.seq == 512 else None,
        "loader_tokens_per_s": round(worst["tokens_per_s"], 1),
        "worst_objective": worst["objective"],
        "target": TARGET,
        "workers": args.workers,
        "cores": os.cpu_count(),
        "micro": args.micro,
        "seq": args.seq,
        "rows": rows,
    }
    verdict = "meets" if worst["tokens_per_s"] >= TARGET else "misses"
    print(f"slower objective with {args.workers} workers: {worst['objective']} {worst['tokens_per_s']:,.0f} "
          f"tokens/s per rank ({verdict} the target {TARGET:,.0f})")
    if args.write:
        write_section(args.write, "loader", "\n\n".join([
            f"`python bench/loader.py --workers {args.workers} --micro {args.micro} --seq {args.seq} --write` "
            f"({machine_line()}; {os.cpu_count()} cores)",
            md_table(["objective", "workers", "tokens/s (non-padding)", "padded tokens/s", "fill"],
                     [(r["objective"], r["workers"], f"{r['tokens_per_s']:,.0f}", f"{r['padded_tokens_per_s']:,.0f}",
                       f"{r['fill']:.2f}") for r in rows]),
            f"`loader_tokens_per_s_seq512` (slower objective, {args.workers} workers, per rank): "
            f"**{worst['tokens_per_s']:,.0f}**; target >= {TARGET:,.0f} (4x the dense BERT-base step of an H100).",
        ]))
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
