"""Runs at once in a comparison: ``finetune.compare --jobs 2`` (two runs, one thread each) against
``--jobs 1`` (one run at a time on every core), on this CPU.

A tiny model makes many small kernels; two threads share each of them and wait on each other more than
they compute, so two runs on one thread each get more done than one run on two. The bench runs the same
comparison both ways, side by side, ``--reps`` times (fresh output folders each time; the order within a
repetition alternates), and reports the median of the per-repetition ratios ``jobs1_s / jobsN_s``
(``jobs_speedup``, with ``_min`` / ``_max``). The tasks are synthetic, with the shapes of the full CPU
reproduction (BERT hidden 128, 2 layers; batch 32; a 60-character classification task and a
90-character NER task), because the speed depends on shapes, not on what is learnt.

    python bench/compare_jobs.py                 # table
    python bench/compare_jobs.py --json          # table, then one JSON object (last line)
    python bench/compare_jobs.py --write         # also rewrite its section of docs/speed.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from skillnet.experiments.benchdoc import machine_line, md_table, paired_ratio, write_section  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CJK = [chr(c) for c in range(0x4E00, 0x4E00 + 3000)]


def write_tasks(root: Path, n_train: int, seed: int = 0) -> Path:
    """Two synthetic tasks (classification, NER) and a fine-tuning config over them; returns the config."""
    import random

    rng = random.Random(seed)
    splits = {"train": n_train, "dev": 200, "test": 200}
    for name in ("cls", "ner"):
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        for split, n in splits.items():
            with open(d / f"{split}.jsonl", "w", encoding="utf-8") as f:
                for _ in range(n):
                    if name == "cls":
                        rec = {"text": "".join(rng.choices(CJK, k=60)), "label": rng.choice(["a", "b", "c"])}
                    else:
                        toks = rng.choices(CJK, k=90)
                        labels, i = [], 0
                        while i < len(toks):  # valid BIO: entities of 1-3 tokens
                            n = rng.randint(1, 3) if rng.random() < 0.1 else 0
                            labels += ["B-PER"] + ["I-PER"] * (n - 1) if n else ["O"]
                            i += max(n, 1)
                        rec = {"tokens": toks, "labels": labels[: len(toks)]}
                    f.write(json.dumps(rec, ensure_ascii=False) + "\n")
    cfg = {
        "model": {"preset": "tiny", "overrides": {"hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                                                   "intermediate_size": 256, "max_position_embeddings": 128}},
        "tasks": [
            {"name": "cls", "type": "classification", "skills": ["s1", "s7"], "max_seq_len": 64,
             **{s: str(root / "cls" / f"{s}.jsonl") for s in splits}},
            {"name": "ner", "type": "ner", "skills": ["s2", "s7"], "max_seq_len": 96,
             **{s: str(root / "ner" / f"{s}.jsonl") for s in splits}},
        ],
        "train": {"batch_size": 32, "eval_batch_size": 64, "lr": 1e-3, "warmup_ratio": 0.1, "seed": 0},
        "output_dir": str(root / "unused"),
    }
    path = root / "config.json"
    path.write_text(json.dumps(cfg, indent=2), encoding="utf-8")
    return path


def run_compare(config: Path, out: Path, methods: list[str], steps: int, jobs: int) -> float:
    cmd = [sys.executable, "-m", "skillnet.finetune.compare", "--config", str(config), "--methods", *methods,
           "--seeds", "0", "--output-dir", str(out), "--max-steps", str(steps), "--in-process", "--no-plots",
           "--jobs", str(jobs)]
    t0 = time.perf_counter()
    # skillnet.* resolves through the install (pyproject's package-dir), as this process's own import above does
    r = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    secs = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return secs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--methods", nargs="+", default=["skillnet", "dense_joint", "moe", "pals"],
                   help="rows of the comparison (one seed each)")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps per run (the full CPU profile runs 300-400)")
    p.add_argument("--train", type=int, default=2000, help="training examples per task")
    p.add_argument("--jobs", type=int, default=2, help="runs at once in the --jobs run")
    p.add_argument("--reps", type=int, default=1, help="repetitions of the pair")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--write", nargs="?", const="docs/speed.md", default=None, metavar="DOC",
                   help="rewrite the bench:compare_jobs section of DOC")
    a = p.parse_args(argv)
    one, many = [], []
    with tempfile.TemporaryDirectory(prefix="bench_jobs_") as tmp:
        root = Path(tmp)
        config = write_tasks(root / "tasks", a.train)
        for rep in range(a.reps):
            order = [1, a.jobs] if rep % 2 == 0 else [a.jobs, 1]
            for jobs in order:
                secs = run_compare(config, root / f"r{rep}_j{jobs}", a.methods, a.steps, jobs)
                (one if jobs == 1 else many).append(secs)
                print(f"rep {rep}: --jobs {jobs}: {secs:.1f} s", file=sys.stderr, flush=True)
    res = {"runs": len(a.methods), "steps": a.steps, "jobs": a.jobs, "cpus": os.cpu_count(),
           "jobs1_s": round(min(one), 1), "jobsN_s": round(min(many), 1),
           **paired_ratio(one, many, "jobs_speedup")}
    table = md_table(["runs x steps", "--jobs 1 (s)", f"--jobs {a.jobs} (s)", "speed-up (median of reps)", "range"],
                     [[f"{len(a.methods)} x {a.steps}", res["jobs1_s"], res["jobsN_s"], res["jobs_speedup"],
                       f"{res['jobs_speedup_min']}-{res['jobs_speedup_max']}"]])
    print(table)
    if a.write:
        body = (f"{machine_line()} `python bench/compare_jobs.py --write` ({a.reps} repetition(s); methods "
                f"{', '.join(a.methods)}; synthetic tasks at the full CPU profile's shapes):\n\n{table}\n")
        write_section(REPO / a.write, "compare_jobs", body)
    if a.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
