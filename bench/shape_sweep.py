"""Dev score against compute for two or three BERT shapes: which size should the full CPU profile fine-tune?

Every shape trains the five NLU tasks of a reproduction jointly (SkillNet, Table 2's skills, the full
profile's batch, lr, sampler and dev sets) from a random init (the width rule's std), for the same
training compute: a shape that costs c times the first shape's FLOPs per step gets 1/c of its steps, with
its own warm-up and linear decay to its last step. Each run is evaluated on dev ``--evals`` times, evenly
spaced, and once on test with the checkpoint of its best mean dev score.

Compute is counted as FLOPs, not seconds, so a busy machine cannot bend the curve: 6 x (non-embedding
parameters a token passes through) per token, plus 12 x T x d per token and layer for attention (QK^T and
AV, forward and backward), at each task's max_seq_len (batches are padded to their longest row, so this
is an upper bound, alike for every shape), the tasks weighted by the sampler's mix and each task's active
skills counted (a SkillNet task runs k of the skill FFNs). The wall seconds of each run are reported
beside it.

Random init, not pre-trained: pre-training every shape would cost more than the sweep, and at the CPU
budget MLM pre-training barely leaves the unigram plateau (docs/model.md, the init sweep), so the shapes'
fine-tuning curves are what a CPU budget buys. The reproduction's rows start from a pre-trained BERT.

Needs the NLU task data and compact vocab of a reproduction:

    python scripts/reproduce.py --stages corpus nlu_tasks nlg_tasks vocab   # ~2 min
    python bench/shape_sweep.py                        # 3 shapes, ~20 min on 2 cores
    python bench/shape_sweep.py --json                 # table, then one JSON object (last line)
    python bench/shape_sweep.py --write                # also rewrite its section of docs/model.md + picture
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

DOC = "docs/model.md"
PICTURE = "docs/img/shape_sweep.png"


def parse_shapes(text: str) -> list[tuple[int, int]]:
    """``"128x2,256x2"`` -> [(128, 2), (256, 2)]: hidden width x layers (heads = width / 32, FFN = 2 x width)."""
    shapes = []
    for part in text.split(","):
        try:
            d, n = (int(v) for v in part.lower().split("x"))
        except ValueError:
            raise ValueError(f"shape {part!r}: expected WIDTHxLAYERS, e.g. 128x2") from None
        if d <= 0 or n <= 0 or d % 32:
            raise ValueError(f"shape {part!r}: width must be a positive multiple of 32 and layers positive")
        shapes.append((d, n))
    if not shapes:
        raise ValueError("no shapes given")
    return shapes


def flops_per_step(width: int, layers: int, tasks: list[dict[str, Any]], batch: int) -> float:
    """Training FLOPs of one optimizer step, the tasks weighted by ``share`` (the sampler's mix).

    Each task dict has ``seq`` (tokens per sequence), ``skills`` (skill FFNs it runs), ``seqs`` (sequences
    per example: 1 + negatives for matching) and ``share``.
    """
    ffn = 2 * width
    total = 0.0
    for t in tasks:
        params = layers * (4 * width * width + t["skills"] * 2 * width * ffn)
        tokens = batch * t["seqs"] * t["seq"]
        total += t["share"] * tokens * (6 * params + 12 * layers * t["seq"] * width)
    return total


def _task_mix(run_dir: Path) -> list[dict[str, Any]]:
    """The NLU tasks of the reproduction with their sampling share (proportional, alpha 1: by train size)."""
    from skillnet.data_prep.tasks.lengths import fitting_length
    from skillnet.experiments.nlu import NLU_TASKS

    tasks = []
    for name, (_, _, tc) in NLU_TASKS.items():
        spec = run_dir / "tasks" / name / "task.json"
        if not spec.is_file():
            raise SystemExit(f"error: {spec} is missing: run `python scripts/reproduce.py --out {run_dir} "
                             "--stages corpus nlu_tasks nlg_tasks vocab` first")
        counts = json.loads(spec.read_text(encoding="utf-8")).get("counts") or {}
        n = counts.get("train")
        if not isinstance(n, int):
            raise SystemExit(f"error: {spec} has no train count")
        # the reproduction's length (experiments/nlu.py task_seq_len) at this sweep's 128 positions
        seq = fitting_length((json.loads(spec.read_text(encoding="utf-8")).get("lengths") or {}).get("train") or {},
                             positions=128) if "max_seq_len" not in tc else tc["max_seq_len"]
        tasks.append({"name": name, "config": {**tc, "max_seq_len": seq}, "train": n, "seq": seq,
                      "skills": len(tc["skills"]), "seqs": 1 + tc.get("num_negatives", 0)})
    total = sum(t["train"] for t in tasks)
    for t in tasks:
        t["share"] = t["train"] / total
    return tasks


def _config(run_dir: Path, tasks: list[dict[str, Any]], width: int, layers: int, vocab: Path, steps: int,
            evals: int, a: argparse.Namespace, out: Path) -> dict[str, Any]:
    n_vocab = sum(1 for _ in vocab.open(encoding="utf-8"))
    return {
        "model": {"preset": "tiny", "vocab": str(vocab), "overrides": {
            "vocab_size": n_vocab, "hidden_size": width, "num_hidden_layers": layers,
            "num_attention_heads": width // 32, "intermediate_size": 2 * width, "max_position_embeddings": 128}},
        "tasks": [{"name": t["name"], "spec": str(run_dir / "tasks" / t["name"] / "task.json"), **t["config"],
                   "max_dev_examples": a.dev} for t in tasks],
        "sampler": {"kind": "proportional", "alpha": 1.0},
        "train": {"max_steps": steps, "batch_size": a.batch, "eval_batch_size": 64, "lr": a.lr, "warmup_ratio": 0.1,
                  "eval_every": max(1, steps // evals), "log_every": max(1, steps // evals), "seed": a.seed,
                  "lexical_baselines": False},
        "method": "skillnet",
        "output_dir": str(out),
    }


def run_shape(cfg: dict[str, Any], out: Path, threads: int | None) -> dict[str, Any]:
    """One fine-tuning run in its own process (its results.json is reused when it exists)."""
    res = out / "results.json"
    path = out / "sweep_config.json"
    if path.is_file() and json.loads(path.read_text(encoding="utf-8")) != cfg:
        raise SystemExit(f"error: {out} holds a run with other options (see its sweep_config.json): remove it "
                         "or pass another --out")
    if not res.is_file():
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
        cmd = [sys.executable, "-m", "skillnet.finetune.run", "--config", str(path), "--no-progress",
               "--no-tensorboard", "--resume", "auto"]
        if threads:
            cmd += ["--threads", str(threads)]
        t0 = time.perf_counter()
        r = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0 or not res.is_file():
            raise SystemExit(f"error: {' '.join(cmd)} failed ({r.returncode}):\n{r.stderr[-3000:]}")
        print(f"  {out.name}: {time.perf_counter() - t0:.0f} s", flush=True)
    return json.loads(res.read_text(encoding="utf-8"))


def _curve(results: dict[str, Any]) -> list[tuple[int, float]]:
    """Mean dev score over the tasks at each evaluated step."""
    per_step: dict[int, list[float]] = {}
    for r in results["tasks"].values():
        for step, v in r.get("dev_curve") or []:
            per_step.setdefault(int(step), []).append(float(v))
    n = len(results["tasks"])
    return [(s, sum(v) / n) for s, v in sorted(per_step.items()) if len(v) == n]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", type=Path, default=Path("runs/reproduce-full"),
                   help="reproduction folder holding tasks/ and vocab/ (default: %(default)s)")
    p.add_argument("--shapes", default="128x2,128x4,256x2",
                   help="WIDTHxLAYERS,...; the first sets the compute budget (default: %(default)s)")
    p.add_argument("--steps", type=int, default=1200, help="steps of the first shape (default: %(default)s)")
    p.add_argument("--evals", type=int, default=6, help="dev evaluations per run, evenly spaced (default: %(default)s)")
    p.add_argument("--batch", type=int, default=32, help="global batch (default: %(default)s, the full profile's)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak lr, 10%% warm-up, linear decay (default: %(default)s)")
    p.add_argument("--dev", type=int, default=300, help="dev examples per task (default: %(default)s)")
    p.add_argument("--seed", type=int, default=0, help="seed of the init and the data order (default: %(default)s)")
    p.add_argument("--threads", type=int, default=None, help="torch threads per run (default: all cores)")
    p.add_argument("--out", type=Path, default=Path("runs/shape_sweep"),
                   help="where the runs go; a finished run is reused (default: %(default)s)")
    p.add_argument("--write", nargs="?", const=DOC, metavar="MD",
                   help=f"rewrite the 'shape_sweep' section of this Markdown file and draw {PICTURE} (default: {DOC})")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    a = p.parse_args(argv)
    try:
        shapes = parse_shapes(a.shapes)
    except ValueError as e:
        p.error(f"--shapes: {e}")
    if a.steps < a.evals or a.evals < 1:
        p.error("--steps must be at least --evals, and --evals at least 1")
    a.run_dir = a.run_dir.resolve()  # the configs name their files relative to their own folder
    vocab = a.run_dir / "vocab" / "vocab.txt"
    if not vocab.is_file():
        raise SystemExit(f"error: {vocab} is missing: run `python scripts/reproduce.py --out {a.run_dir} "
                         "--stages corpus nlu_tasks nlg_tasks vocab` first")
    tasks = _task_mix(a.run_dir)
    base = flops_per_step(*shapes[0], tasks, a.batch)
    rows: list[dict[str, Any]] = []
    for d, n in shapes:
        cost = flops_per_step(d, n, tasks, a.batch)
        steps = max(a.evals, round(a.steps * base / cost))
        name = f"d{d}x{n}"
        out = a.out.resolve() / f"{name}_steps{steps}_lr{a.lr:g}_seed{a.seed}"
        print(f"{name}: {cost / 1e9:.1f} GFLOP a step ({cost / base:.2f}x), {steps} steps", flush=True)
        res = run_shape(_config(a.run_dir, tasks, d, n, vocab, steps, a.evals, a, out), out, a.threads)
        curve = _curve(res)
        best = max(curve, key=lambda c: c[1]) if curve else (0, float("nan"))
        test = {t: r["test"][r["metric"]] for t, r in res["tasks"].items() if r.get("test")}
        rows.append({
            "shape": name, "width": d, "layers": n, "steps": steps, "gflop_per_step": round(cost / 1e9, 2),
            "pflop": round(cost * steps / 1e15, 3), "seconds": res.get("seconds"),
            "params": (res.get("params") or {}).get("total"),
            "curve": [[s, round(cost * s / 1e15, 4), round(v, 2)] for s, v in curve],
            "best_dev_mean": round(best[1], 2), "test": {t: round(v, 2) for t, v in test.items()},
            "test_mean": round(sum(test.values()) / len(test), 2) if test else None,
        })
        print(json.dumps(rows[-1]), flush=True)
    result = {"shapes": [r["shape"] for r in rows], "batch": a.batch, "lr": a.lr, "seed": a.seed,
              "budget_pflop": rows[0]["pflop"], "rows": rows,
              "best_shape": max(rows, key=lambda r: r["best_dev_mean"])["shape"]}
    if a.write:
        _write(a, rows, tasks, result)
    if a.json:
        print(json.dumps(result))
    return 0


def _write(a: argparse.Namespace, rows: list[dict[str, Any]], tasks: list[dict[str, Any]], result: dict[str, Any]) -> None:
    names = [t["name"] for t in tasks]
    table = md_table(
        ["shape (width x layers)", "parameters", "GFLOP a step", "steps", "wall s", "best mean dev",
         "mean test", *[f"{t} test" for t in names]],
        [(r["shape"], f"{r['params']:,}" if r["params"] else "-", r["gflop_per_step"], r["steps"], r["seconds"],
          r["best_dev_mean"], r["test_mean"], *[r["test"].get(t, "-") for t in names]) for r in rows])
    cmd = (f"`python bench/shape_sweep.py --shapes {a.shapes} --steps {a.steps} --evals {a.evals} --batch {a.batch} "
           f"--lr {a.lr:g} --dev {a.dev} --seed {a.seed} --write` (one seed; every shape gets "
           f"{result['budget_pflop']} PFLOP of training). {machine_line()}")
    curves = "\n".join(f"- {r['shape']}: " + ", ".join(f"{pf:g} PFLOP {v:.1f}" for _, pf, v in r["curve"]) for r in rows)
    write_section(a.write, "shape_sweep",
                  f"{cmd}\n\n{table}\n\nMean dev score over the five tasks against training compute:\n\n{curves}\n\n"
                  f"![dev score against compute]({os.path.relpath(PICTURE, Path(a.write).parent)})")
    _plot(rows, Path(PICTURE))


def _plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.0, 3.6))
    for r in rows:
        ax.plot([c[1] for c in r["curve"]], [c[2] for c in r["curve"]], marker="o", ms=3,
                label=f"{r['shape']} ({r['steps']} steps)")
    ax.set_xlabel("training compute (PFLOP)")
    ax.set_ylabel("mean dev score (5 NLU tasks)")
    ax.set_title("NLU fine-tuning from random init: equal compute per shape", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
