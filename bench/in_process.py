"""What the reproduction's long-lived workers buy: ``make demo`` (the quick reproduction) run as it ships,
with its fine-tuning runs, comparisons and exports inside long-lived worker processes (finetune/workers.py,
experiments/runner.py), against ``--subprocesses``, where each of them is a fresh interpreter as on a cluster.

Both arms run the whole quick profile into fresh folders, ``--reps`` times, the order alternating within a
repetition. ``saving`` is the median over repetitions of ``1 - in_process_s / subprocesses_s``: the share
of the demo's time the workers save (they stay only if it is at least 25%).

    python bench/in_process.py                 # table (two quick reproductions: ~15 min on 2 cores)
    python bench/in_process.py --json          # table, then one JSON object (last line)
    python bench/in_process.py --write         # also rewrite its section of docs/speed.md
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
ARMS = {"in_process": [], "subprocesses": ["--subprocesses"]}


def run_demo(out: Path, extra: list[str]) -> float:
    """Seconds of one quick reproduction into ``out`` (its report beside it, not docs/)."""
    cmd = [sys.executable, "scripts/reproduce.py", "--quick", "--out", str(out), "--report", str(out / "report.md"),
           *extra]
    t0 = time.perf_counter()
    r = subprocess.run(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    secs = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed (exit {r.returncode}):\n{r.stderr[-2000:]}")
    return secs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--reps", type=int, default=1, help="repetitions of the pair (each ~15 min on 2 cores)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--write", nargs="?", const="docs/speed.md", default=None, metavar="DOC",
                   help="rewrite the bench:in_process section of DOC")
    a = p.parse_args(argv)
    if a.reps < 1:
        p.error(f"--reps must be >= 1, got {a.reps}")
    secs: dict[str, list[float]] = {k: [] for k in ARMS}
    with tempfile.TemporaryDirectory(prefix="bench_in_process_") as tmp:
        for rep in range(a.reps):
            order = list(ARMS) if rep % 2 == 0 else list(reversed(ARMS))
            for arm in order:
                s = run_demo(Path(tmp) / f"r{rep}_{arm}", ARMS[arm])
                secs[arm].append(s)
                print(f"rep {rep}: {arm}: {s:.0f} s", file=sys.stderr, flush=True)
    ratio = paired_ratio(secs["in_process"], secs["subprocesses"], "r")  # saving = 1 - ratio: min and max swap
    res = {"reps": a.reps, "cpus": os.cpu_count(),
           "in_process_s": round(min(secs["in_process"]), 1), "subprocesses_s": round(min(secs["subprocesses"]), 1),
           "saving": round(1 - ratio["r"], 3), "saving_min": round(1 - ratio["r_max"], 3),
           "saving_max": round(1 - ratio["r_min"], 3)}
    table = md_table(["quick reproduction", "seconds (best of reps)"],
                     [["long-lived workers (as shipped)", res["in_process_s"]],
                      ["`--subprocesses` (a fresh interpreter per run)", res["subprocesses_s"]],
                      ["saving (median of reps; range)",
                       f"{100 * res['saving']:.1f}% ({100 * res['saving_min']:.1f}-{100 * res['saving_max']:.1f}%)"]])
    print(table)
    if a.write:
        body = (f"{machine_line()} `python bench/in_process.py --write` ({a.reps} repetition(s); the whole quick "
                f"profile, `make demo`'s work, into fresh folders):\n\n{table}\n")
        write_section(REPO / a.write, "in_process", body)
    if a.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
