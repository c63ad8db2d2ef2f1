"""Run several multi-task methods on the same tasks, data, budget and seeds, and put them side by side.

    python -m skillnet.finetune.compare --config tasks.json --methods all --seeds 0 1 2 --init runs/pt/hf
    # 2 CPU ranks per run (or GPUs): every run goes through `deepspeed --num_gpus 2 ... --ds-config`
    python -m skillnet.finetune.compare --config tasks.json --methods skillnet dense_joint --nproc 2
    # any launcher (a cluster): the command prefix is yours
    python -m skillnet.finetune.compare --config tasks.json --launcher "deepspeed --hostfile hosts" --ds-config ds.json

Each (method, seed) run is an ordinary ``finetune.run`` in ``<output-dir>/<method>/seed<k>/`` (its log in
``run.log`` there). A run whose ``results.json`` exists is not run again, and an interrupted one resumes
from its last checkpoint, so the command can be stopped and rerun at any point. The table is written
whenever every run has finished: ``comparison.md`` / ``comparison.json`` (per-task test scores as mean ±
std over seeds, the average, parameters total / trainable / activated per task, wall time), and the
pictures ``curves.png`` (dev metric against step, per task and method) and ``skill_map.png`` (the
learned task-skill map of the first row that learned one).

Differences: every method sees the same seeds, and a seed fixes the initial weights, the task sequence
and the data order, so methods are compared seed by seed (paired). A difference is called beyond the
spread when a paired t-test over the seeds gives p < 0.05; with 3 seeds that needs a large, consistent
gap, so most small differences at this scale are within noise.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from skillnet.finetune.config import ConfigError, FinetuneConfig
from skillnet.finetune.document import Document, copied_to, paired_test
from skillnet.finetune.methods import METHODS
from skillnet.training.cli import Parser, output_to

REPO = Path(__file__).resolve().parents[1]


def build_parser() -> argparse.ArgumentParser:
    p = Parser("skillnet.finetune.compare", description="Run multi-task methods with the same tasks, data, budget and seeds; write one comparison "
                    "table (Markdown + JSON) and pictures. Resumable: finished runs are kept.")
    p.add_argument("--config", required=True, help="fine-tuning config (JSON) shared by every run")
    p.add_argument("--methods", nargs="+", default=["all"], metavar="[LABEL=]METHOD",
                   help=f"rows of the table: methods, or 'all' ({', '.join(METHODS)}); LABEL=METHOD adds a "
                        "variant under its own label (e.g. skillnet_dense=skillnet with --init-for)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds; every method runs each")
    p.add_argument("--init", help="initial weights for every method (SkillNet export or dense HF checkpoint "
                                  "folder); '{seed}' in the path is replaced by each run's seed")
    p.add_argument("--init-for", dest="init_for", action="append", default=[], metavar="LABEL=DIR",
                   help="initial weights of one row instead of --init (repeatable), e.g. the 'w/o sparse "
                        "pre-training' row from the dense BERT")
    p.add_argument("--args-for", dest="args_for", action="append", default=[],
                   metavar="LABEL=ARGS", help="extra finetune.run options of one row (repeatable), e.g. "
                   "'s8_frozen=--new-skill s8 --freeze-old-skills' for the adaptation rows of Table 5")
    p.add_argument("--output-dir", dest="output_dir", default="runs/compare",
                   help="where runs, tables and pictures go: new or empty, or an earlier comparison of the same "
                        "config (continued); anything else is refused")
    p.add_argument("--max-steps", dest="max_steps", type=int,
                   help="override train.max_steps of the config")
    p.add_argument("--reference", default=None,
                   help="method the others are compared with (default: skillnet if run, else the first)")
    p.add_argument("--nproc", type=int, default=1,
                   help="ranks per run: 1 = plain PyTorch; N > 1 = `deepspeed --num_gpus N` with --ds-config")
    p.add_argument("--ds-config", dest="ds_config", default=None,
                   help="DeepSpeed JSON for multi-rank runs (default with --nproc > 1: ds_configs/cpu_fp32.json "
                        "without a GPU, ds_configs/zero2.json with one)")
    p.add_argument("--launcher", default=None,
                   help="command prefix that starts one run on many ranks, e.g. 'deepspeed --hostfile h' "
                        "(overrides --nproc)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads per run (default: torch's, or cores / --jobs with --jobs > 1)")
    p.add_argument("--jobs", type=int, default=1,
                   help="runs at once, each in its own worker process with cores / jobs threads: tiny models "
                        "use one thread better than two, so on a 2-core CPU --jobs 2 finishes a comparison "
                        "sooner (bench/compare_jobs.py measures it). Keep 1 on a GPU")
    p.add_argument("--report", default=None, metavar="MD",
                   help="also write the comparison as this Markdown file, its pictures beside it in img/ (an "
                        "existing file is replaced only if a comparison wrote it, or with --overwrite)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing --report file that a comparison did not write")
    p.add_argument("--title", default="Multi-task methods compared", help="title of the report")
    p.add_argument("--no-plots", action="store_true", help="skip the pictures (no matplotlib needed)")
    p.add_argument("--dry-run", action="store_true", help="print the runs and their commands, run nothing")
    p.add_argument("--in-process", action="store_true",
                   help="run the one-process runs inside this process instead of a fresh interpreter each (saves "
                        "the start-up of Python and the libraries per run, which dominates tiny runs)")
    return p


@dataclass(frozen=True)
class Row:
    """One row of the table: a method under a label, with its own initial weights and options if given."""

    label: str
    method: str
    init: str | None = None
    args: tuple[str, ...] = ()


def resolve_methods(names: Sequence[str]) -> list[str]:
    """Row labels of --methods (the method name unless LABEL=METHOD)."""
    return [r.label for r in resolve_rows(names)]


def resolve_rows(names: Sequence[str], init: str | None = None, init_for: Sequence[str] = (),
                 args_for: Sequence[str] = ()) -> list[Row]:
    if list(names) == ["all"]:
        names = list(METHODS)
    pairs = [n.split("=", 1) if "=" in n else [n, n] for n in names]
    bad = [m for _, m in pairs if m not in METHODS]
    if bad:
        raise ConfigError(f"--methods: unknown method(s) {bad}; valid: {', '.join(METHODS)} or all")
    labels = [lab for lab, _ in pairs]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"--methods: duplicate row labels {labels}; give variants their own LABEL=METHOD")

    def per_label(items: Sequence[str], flag: str) -> dict[str, str]:
        out = {}
        for it in items:
            if "=" not in it:
                raise ConfigError(f"{flag} {it!r}: expected LABEL=VALUE")
            lab, val = it.split("=", 1)
            if lab not in labels:
                raise ConfigError(f"{flag} {it!r}: no row labelled {lab!r}; rows: {', '.join(labels)}")
            out[lab] = val
        return out

    inits, extra = per_label(init_for, "--init-for"), per_label(args_for, "--args-for")
    for lab, path in inits.items():
        # "{seed}" in a path: each seed starts from its own folder (e.g. that seed's multi-task model)
        if "{seed}" not in path and not Path(path).exists():
            raise ConfigError(f"--init-for {lab}={path}: {path} does not exist")
    return [Row(lab, m, inits.get(lab, init), tuple(shlex.split(extra.get(lab, "")))) for lab, m in pairs]


def _check_row(base: FinetuneConfig, row: Row, seed: int) -> None:
    d = base.to_dict()
    d["method"] = row.method
    if row.init:
        init = Path(row.init.replace("{seed}", str(seed)))
        if not init.exists():
            raise ConfigError(f"row {row.label}, seed {seed}: initial weights {init} do not exist")
        d["model"]["init"] = str(init.resolve())
    cfg = FinetuneConfig.from_dict(d, where=f"config (row {row.label})", base_dir=base.base_dir)
    cfg.check_model(f"row {row.label}")


def run_dir(out: Path, label: str, seed: int) -> Path:
    return out / label / f"seed{seed}"


def run_command(a: argparse.Namespace, config: Path, row: Row, seed: int, rdir: Path) -> list[str]:
    args = ["--config", str(config), "--method", row.method, "--seed", str(seed), "--output-dir", str(rdir),
            "--resume", "auto", "--no-progress", *row.args]
    if row.init:
        init = Path(row.init.replace("{seed}", str(seed)))
        if not init.exists():
            raise ConfigError(f"row {row.label}, seed {seed}: initial weights {init} do not exist")
        args += ["--init", str(init.resolve())]
    if a.max_steps is not None:
        args += ["--max-steps", str(a.max_steps)]
    if a.threads:
        args += ["--threads", str(a.threads)]
    if a.launcher or a.nproc > 1:
        import torch

        ds = a.ds_config or str(REPO / "ds_configs" / ("zero2.json" if torch.cuda.is_available() else "cpu_fp32.json"))
        prefix = shlex.split(a.launcher) if a.launcher else ["deepspeed", "--num_gpus", str(a.nproc)]
        return [*prefix, str(REPO / "finetune" / "run.py"), *args, "--ds-config", ds]
    return [sys.executable, "-m", "skillnet.finetune.run", *args]


def _run_in_process(cmd: list[str], rdir: Path) -> tuple[int, float]:
    """The run of `cmd` (a plain `python -m skillnet.finetune.run ...`) in this process, its output in
    run.log: no interpreter and library start-up per run (seconds each, which dominate tiny runs)."""
    import logging

    import torch
    from skillnet.finetune import run as run_cli

    rdir.mkdir(parents=True, exist_ok=True)
    args = cmd[cmd.index("skillnet.finetune.run") + 1:]
    t0 = time.time()
    threads = torch.get_num_threads()
    with open(rdir / "run.log", "a", encoding="utf-8") as logf:
        logf.write(f"$ {shlex.join(cmd)}   (in process)\n")
        logf.flush()
        # Every log record of the run goes to its run.log: the root logger gets one handler on that file for
        # the duration (the run's own logging.basicConfig is then a no-op), restored afterwards.
        handler = logging.StreamHandler(logf)
        handler.setFormatter(logging.Formatter("%(message)s"))
        root = logging.getLogger()
        saved = (root.handlers[:], root.level)
        root.handlers[:] = [handler]
        root.setLevel(logging.INFO)
        try:
            with output_to(logf):
                rc = run_cli.main(args)
        except Exception:  # noqa: BLE001 (a failed run is reported like a failed subprocess)
            import traceback

            logf.write(traceback.format_exc())
            rc = 1
        finally:
            root.handlers[:], level = saved
            root.setLevel(level)
            torch.set_num_threads(threads)
    return rc, time.time() - t0


def _run_one(cmd: list[str], rdir: Path) -> tuple[int, float]:
    rdir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.time()
    with open(rdir / "run.log", "a", encoding="utf-8") as logf:
        logf.write(f"$ {shlex.join(cmd)}\n")
        logf.flush()
        r = subprocess.run(cmd, cwd=REPO, stdout=logf, stderr=subprocess.STDOUT, env=env)
    return r.returncode, time.time() - t0


Job = tuple[str, list[str], Path, bool]  # (progress line head, command, run dir, in process)


_RUNNING: list[Path] = []  # the run a worker process is in (read by its parent watch)


def _run_job(job: Job) -> tuple[int, float]:
    _, cmd, rdir, in_process = job
    t0 = time.time()
    _RUNNING.append(rdir)
    try:
        return (_run_in_process if in_process else _run_one)(cmd, rdir)
    except Exception as e:  # noqa: BLE001 (an error outside the run reports like a failed run)
        rdir.mkdir(parents=True, exist_ok=True)
        with open(rdir / "run.log", "a", encoding="utf-8") as f:
            f.write(f"run aborted: {type(e).__name__}: {e}\n")
        return 1, time.time() - t0
    finally:
        _RUNNING.remove(rdir)


def _watch_parent(parent: int, grace_s: float = 120.0, held: Any = None) -> None:
    """Worker initializer: when the comparison's process is gone (killed, or stopped by SIGTERM), the worker
    gets SIGTERM itself (its run saves a checkpoint and stops, as a preempted run does), and exits after
    `grace_s` at the latest; an orphaned worker would otherwise wait for work forever. `held`: the descriptor
    of an output folder's lock (an _InheritedFd in the parent), open in the worker for as long as it lives:
    nothing closes it, so the worker holds the lock; its number is all that arrives here."""
    import signal
    import threading

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)
        end = time.time() + grace_s
        while _RUNNING and time.time() < end:  # the run is saving its checkpoint
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


class _InheritedFd:
    """A file descriptor that a spawned worker inherits under the same number: multiprocessing passes it to
    the child when the worker's start arguments are pickled (this is how its own pipes reach the child)."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __reduce__(self) -> tuple[Any, ...]:
        from multiprocessing import reduction

        return (_detach, (reduction.DupFd(self.fd),))


def _detach(dup: Any) -> int:
    return dup.detach()


def _new_pool(jobs: int, lock_fd: int | None = None) -> Any:
    import concurrent.futures as cf
    import multiprocessing as mp

    held = None if lock_fd is None else _InheritedFd(lock_fd)
    return cf.ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"), initializer=_watch_parent,
                                  initargs=(os.getpid(), 120.0, held))


# The worker pool shared by the comparisons of this process, by number of workers (shared_workers), or None.
_SHARED: dict[int, Any] | None = None
_SHARED_LOCK_FD: int | None = None


@contextlib.contextmanager
def shared_workers(lock_fd: int | None = None) -> Iterator[None]:
    """Within the block, the in-process runs of every comparison that this process runs (``main``, called once
    per comparison, as a reproduction does) go to one pool of worker processes, kept from one comparison to
    the next: a worker pays its start-up (importing torch, transformers and the model code: ~10 s on a
    laptop core) and warms its caches (metric scorers, baselines) once, not once per comparison. `lock_fd`:
    the descriptor of an output folder's lock (training/outputs.exclusive), which every worker holds too,
    so that the folder stays locked while a worker runs even if this process is killed."""
    global _SHARED, _SHARED_LOCK_FD
    if _SHARED is not None:  # nested: the outer block's pool serves
        yield
        return
    _SHARED, _SHARED_LOCK_FD = {}, lock_fd
    try:
        yield
    finally:
        pools, _SHARED, _SHARED_LOCK_FD = _SHARED, None, None
        for pool in pools.values():
            pool.shutdown(wait=True, cancel_futures=True)


def _run_all(todo: list[Job], jobs: int, finished: Callable[[Job, int, float], None]) -> None:
    """Every run of `todo`, up to `jobs` at once; `finished(job, exit code, seconds)` as each ends. In-process
    runs go to long-lived worker processes (start-up paid once per worker, not per run; once per process
    within ``shared_workers``); the others are subprocesses anyway."""
    if jobs <= 1 or len(todo) <= 1:
        for job in todo:
            print(f"{job[0]}: running (log: {job[2] / 'run.log'})", file=sys.stderr, flush=True)
            finished(job, *_run_job(job))
        return
    import concurrent.futures as cf

    pool: cf.Executor
    owned = True
    if all(j[3] for j in todo):
        if _SHARED is not None:
            if jobs not in _SHARED:
                _SHARED[jobs] = _new_pool(jobs, _SHARED_LOCK_FD)
            pool, owned = _SHARED[jobs], False
        else:
            pool = _new_pool(min(jobs, len(todo)))
    else:
        pool = cf.ThreadPoolExecutor(max_workers=min(jobs, len(todo)))
    with contextlib.ExitStack() as stack:
        if owned:
            stack.enter_context(pool)
        futures = {pool.submit(_run_job, job): job for job in todo}
        print(f"[compare] {len(todo)} runs, {jobs} at a time (logs: <run dir>/run.log)", file=sys.stderr, flush=True)
        for f in cf.as_completed(futures):
            try:
                rc, secs = f.result()
            except Exception as e:  # noqa: BLE001 (the worker process itself died)
                print(f"{futures[f][0]}: worker died: {e}", file=sys.stderr, flush=True)
                rc, secs = 1, 0.0
                # a broken pool takes no more work: the next comparison starts another
                if (not owned and isinstance(e, cf.process.BrokenProcessPool) and _SHARED is not None
                        and _SHARED.pop(jobs, None) is not None):
                    pool.shutdown(wait=False)
            finished(futures[f], rc, secs)


# ---------------------------------------------------------------------------------------- aggregation
def _mean_std(xs: Sequence[float]) -> tuple[float, float]:
    xs = [x for x in xs if x is not None and not math.isnan(x)]
    if not xs:
        return math.nan, math.nan
    return statistics.fmean(xs), (statistics.stdev(xs) if len(xs) > 1 else 0.0)


def _score(r: dict[str, Any], split: str) -> float | None:
    v = r.get(split)
    return None if not isinstance(v, dict) else v.get(r["metric"])


def aggregate(out: Path, methods: list[str], seeds: list[int], split: str = "test") -> dict[str, Any]:
    rows: dict[str, Any] = {}
    tasks: list[str] = []
    for m in methods:
        runs = [json.loads((run_dir(out, m, s) / "results.json").read_text(encoding="utf-8")) for s in seeds]
        if not tasks:
            tasks = list(runs[0]["tasks"])
        per_task = {}
        for t in tasks:
            vals = [_score(r["tasks"][t], split) for r in runs]
            mean, std = _mean_std(vals)
            per_task[t] = {"mean": mean, "std": std, "values": vals, "metric": runs[0]["tasks"][t]["metric"]}
        avg_per_seed = [statistics.fmean(per_task[t]["values"][i] for t in tasks) for i in range(len(seeds))]
        a_mean, a_std = _mean_std(avg_per_seed)
        p = runs[0]["params"]
        rows[m] = {
            "tasks": per_task, "average": {"mean": a_mean, "std": a_std, "values": avg_per_seed},
            "params": {"total": p["total"], "trainable": p["trainable"],
                       "activated": {t: p["tasks"][t]["activated"] for t in tasks}},
            "seconds": {"mean": statistics.fmean(r["seconds"] for r in runs), "values": [r["seconds"] for r in runs]},
            "steps": runs[0]["steps"],
            "curves": {t: [r["tasks"][t].get("dev_curve", []) for r in runs] for t in tasks},
        }
    return {"split": split, "seeds": seeds, "tasks": tasks, "methods": rows}


def differences(agg: dict[str, Any], reference: str) -> dict[str, Any]:
    ref = agg["methods"][reference]
    res: dict[str, Any] = {}
    for m, row in agg["methods"].items():
        if m == reference:
            continue
        entry = {}
        for key in [*agg["tasks"], "average"]:
            a = row["average"]["values"] if key == "average" else row["tasks"][key]["values"]
            b = ref["average"]["values"] if key == "average" else ref["tasks"][key]["values"]
            diff = statistics.fmean(a) - statistics.fmean(b)
            pv = paired_test(a, b)
            entry[key] = {"diff": diff, "p": pv, "beyond_noise": pv is not None and pv < 0.05}
        res[m] = entry
    return res


def _fmt(ms: dict[str, Any]) -> str:
    if math.isnan(ms["mean"]):
        return "-"
    return f"{ms['mean']:.1f} ± {ms['std']:.1f}"


def document(agg: dict[str, Any], diffs: dict[str, Any], reference: str, title: str, pictures: dict[str, Path],
             command: str) -> Document:
    """The comparison as a document: scores, parameters, differences from the reference, variant rows,
    learned maps and the pictures (caption -> file)."""
    tasks, rows = agg["tasks"], agg["methods"]
    n = len(agg["seeds"])
    metric = {t: next(iter(rows.values()))["tasks"][t]["metric"] for t in tasks}
    doc = Document()
    doc.h(1, title)
    doc.p(f"Written by `{command}`. Scores are on the **{agg['split']}** split, one checkpoint per run "
          f"(selected by the mean dev score over tasks), as mean ± standard deviation over {n} seeds "
          f"({', '.join(map(str, agg['seeds']))}).")
    doc.table(["method", *(f"{t} ({metric[t]})" for t in tasks), "average", "steps", "wall time / run"],
              [[m, *(_fmt(row["tasks"][t]) for t in tasks), _fmt(row["average"]), str(row["steps"]),
                f"{row['seconds']['mean']:.0f} s"] for m, row in rows.items()])
    doc.p("Parameters (Tables 4 and 6: *activated* = what one task's forward pass uses):")
    doc.table(["method", "total", "trainable", *(f"activated: {t}" for t in tasks)],
              [[m, f"{row['params']['total']:,}", f"{row['params']['trainable']:,}",
                *(f"{row['params']['activated'][t]:,}" for t in tasks)] for m, row in rows.items()])
    if diffs:
        doc.p(f"Differences from **{reference}** (method − {reference}; paired over seeds; "
              "**bold** = beyond the spread, paired t-test p < 0.05):")
        table = []
        for m, entry in diffs.items():
            cells = []
            for key in [*tasks, "average"]:
                e = entry[key]
                s = f"{e['diff']:+.1f}" + (f" (p={e['p']:.2f})" if e["p"] is not None else "")
                cells.append(f"**{s}**" if e["beyond_noise"] else s)
            table.append([m, *cells])
        doc.table(["method", *tasks, "average"], table)
        beyond = [(m, k) for m, e in diffs.items() for k, v in e.items() if v["beyond_noise"]]
        doc.p(("Beyond the spread: " + ", ".join(f"{m} on {k}" for m, k in beyond) + ".") if beyond
              else "No difference from the reference lies beyond the spread over seeds.")
    variants = {lab: r for lab, r in agg.get("rows", {}).items() if lab != r["method"] or r["init"] or r["args"]}
    if variants:
        doc.p("Rows that are variants (method, initial weights, extra options):")
        doc.bullets([f"**{lab}**: method `{r['method']}`, init `{r['init'] or 'the preset, random'}`"
                     + (f", options `{' '.join(r['args'])}`" if r["args"] else "") for lab, r in variants.items()])
    maps = agg.get("learned_maps") or {}
    if maps:
        doc.p("Learned task-skill maps: task x skill cells whose selection changed during training (per seed):")
        doc.table(["row", "estimator", "sharpness", "changed cells"],
                  [[lab, str(m["estimator"]), f"{m['sharpness']:g}",
                    ", ".join("-" if c is None else str(c) for c in m["changed_cells"]) + f" of {m['cells']}"]
                   for lab, m in maps.items()])
    for caption, path in pictures.items():
        doc.img(path, caption)
    return doc


# ---------------------------------------------------------------------------------------- pictures
def plot_curves(agg: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tasks, rows = agg["tasks"], agg["methods"]
    cols = min(3, len(tasks))
    nrows = math.ceil(len(tasks) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), squeeze=False)
    for i, t in enumerate(tasks):
        ax = axes[i // cols][i % cols]
        for m, row in rows.items():
            curves = [c for c in row["curves"][t] if c]
            if not curves:
                continue
            steps = sorted({s for c in curves for s, _ in c})
            by_step = [[v for c in curves for s2, v in c if s2 == s] for s in steps]
            mean = [statistics.fmean(v) for v in by_step]
            ax.plot(steps, mean, marker="o", ms=3, label=m)
            ax.fill_between(steps, [min(v) for v in by_step], [max(v) for v in by_step], alpha=0.15)
        metric = next(iter(rows.values()))["tasks"][t]["metric"]
        ax.set_title(t)
        ax.set_xlabel("optimizer step (task_specific: steps of its own run)")
        ax.set_ylabel(f"dev {metric}")
        ax.grid(alpha=0.3)
    for j in range(len(tasks), nrows * cols):
        axes[j // cols][j % cols].axis("off")
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(labels)), frameon=False)
    fig.suptitle(f"Dev score during training (mean over seeds {agg['seeds']}; band = min..max)")
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def learned_maps(out: Path, rows: list[Row], seeds: list[int]) -> dict[str, Any]:
    """Per learned-map row: its estimator and how many task-skill cells the training changed, per seed
    (the map each run exported as skill_map.json)."""
    res: dict[str, Any] = {}
    for r in rows:
        docs = [run_dir(out, r.label, s) / "skill_map.json" for s in seeds]
        docs = [json.loads(d.read_text(encoding="utf-8")) for d in docs if d.is_file()]
        if docs:
            res[r.label] = {"estimator": docs[0].get("estimator"), "sharpness": docs[0].get("sharpness"),
                            "cells": len(docs[0]["tasks"]) * len(docs[0]["skills"]),
                            "changed_cells": [d.get("changed_cells") for d in docs]}
    return res


def learned_map_picture(out: Path, rows: list[Row], seeds: list[int], dest: Path) -> str | None:
    """The learned task-skill map of the first row whose run drew one (skill_map.png, written by every run
    with a learned map, whatever its method), copied to `dest`; returns that row's label."""
    for r in rows:
        for s in seeds:
            src = run_dir(out, r.label, s) / "skill_map.png"
            if src.is_file():
                shutil.copyfile(src, dest)
                return r.label
    return None


# ---------------------------------------------------------------------------------------- main
def claim_compare_dir(a: argparse.Namespace, config: Path, out: Path) -> None:
    """--output-dir and --report (training/outputs.py), before any run starts. A comparison of the same config
    continues in its folder (new rows or seeds included: each run's folder is claimed by its own finetune.run),
    anything else there is refused; with no way to tell another tool's files from its own, compare has no
    --overwrite for the folder."""
    from skillnet.training.outputs import claim_file, claim_output, starts_with

    claim_output(out, option="--output-dir", command="finetune.compare", identity={"config": str(config)},
                 overwrite=None, adopt=lambda d: any(d.glob("*/seed*/run.log")))
    if a.report:
        claim_file(a.report, option="--report", overwrite=a.overwrite,
                   own=starts_with("Written by `python -m skillnet.finetune.compare"))


def main(argv: Sequence[str] | None = None) -> int:
    from skillnet.training.outputs import OutputError, at_least, check_options, non_negative

    parser = build_parser()
    a = parser.parse_args(argv)
    check_options(parser, a, {"max_steps": at_least(1), "nproc": at_least(1), "threads": at_least(1),
                              "jobs": at_least(1), "seeds": non_negative()})
    if a.ds_config and not Path(a.ds_config).is_file():  # else every run fails on it, one after the other
        parser.error(f"--ds-config {a.ds_config}: no such file")
    try:
        rows = resolve_rows(a.methods, a.init, a.init_for, a.args_for)
        methods = [r.label for r in rows]
        config = Path(a.config).resolve()
        base = FinetuneConfig.load(config)  # fail on a bad config before the first run
        if len(set(a.seeds)) != len(a.seeds):
            raise ConfigError(f"--seeds has duplicates: {a.seeds}")
        for row in rows:  # every row against its model, before the first run starts
            for seed in a.seeds:
                _check_row(base, row, seed)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not a.no_plots:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            print("error: the pictures need matplotlib: pip install 'skillnet[plots]' (or pass --no-plots)",
                  file=sys.stderr)
            return 2
    if a.jobs > 1 and not a.threads:
        a.threads = max(1, (os.cpu_count() or 1) // a.jobs)
    out = Path(a.output_dir).resolve()
    try:
        claim_compare_dir(a, config, out)
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    plan = [(r, s) for s in a.seeds for r in rows]
    failed: list[tuple[str, int]] = []
    t_all = time.time()
    todo: list[Job] = []
    row_seed: dict[Path, tuple[str, int]] = {}  # a failed run is named by its row and seed, not its folder
    for i, (row, s) in enumerate(plan, 1):
        rdir = run_dir(out, row.label, s)
        row_seed[rdir] = (row.label, s)
        cmd = run_command(a, config, row, s, rdir)
        head = f"[compare] ({i}/{len(plan)}) {row.label} seed {s}"
        if (rdir / "results.json").is_file():
            print(f"{head}: done before, kept ({rdir / 'results.json'})", file=sys.stderr, flush=True)
        elif a.dry_run:
            print(f"{head}: {shlex.join(cmd)}", file=sys.stderr)
        else:
            todo.append((head, cmd, rdir, a.in_process and cmd[:3] == [sys.executable, "-m", "skillnet.finetune.run"]))

    def finished(job: Job, rc: int, secs: float) -> None:
        head, _, rdir, _ = job
        if rc != 0 or not (rdir / "results.json").is_file():
            tail = (rdir / "run.log").read_text(encoding="utf-8", errors="replace").splitlines()[-5:]
            print(f"{head}: FAILED (exit {rc}) after {secs:.0f} s; last lines of its log:\n  " + "\n  ".join(tail),
                  file=sys.stderr, flush=True)
            failed.append(row_seed[rdir])
            return
        res = json.loads((rdir / "results.json").read_text(encoding="utf-8"))
        dev = [_score(r, "dev") for r in res["tasks"].values()]
        dev = [x for x in dev if x is not None]
        msg = f"mean dev {statistics.fmean(dev):.1f}" if dev else "no dev set"
        print(f"{head}: finished in {secs:.0f} s, {msg}", file=sys.stderr, flush=True)

    _run_all(todo, a.jobs, finished)
    if a.dry_run:
        return 0
    if failed:
        print(f"error: {len(failed)} run(s) failed: {failed}; fix and rerun the same command "
              "(finished runs are kept)", file=sys.stderr)
        return 1
    agg = aggregate(out, methods, a.seeds)
    agg["learned_maps"] = learned_maps(out, rows, a.seeds)
    agg["rows"] = {r.label: {"method": r.method, "init": r.init, "args": list(r.args)} for r in rows}
    reference = a.reference or ("skillnet" if "skillnet" in methods else methods[0])
    diffs = differences(agg, reference) if len(methods) > 1 else {}
    pictures: dict[str, Path] = {}
    if not a.no_plots:
        plot_curves(agg, out / "curves.png")
        pictures["Dev score against training step, per task and method"] = out / "curves.png"
        label = learned_map_picture(out, rows, a.seeds, out / "skill_map.png")
        if label:
            pictures[f"Learned task-skill map ({label}, first seed): alpha per task and skill, selected cells "
                     "marked"] = out / "skill_map.png"
    command = "python -m skillnet.finetune.compare " + shlex.join(list(argv) if argv is not None else sys.argv[1:])
    (out / "comparison.json").write_text(json.dumps({"reference": reference, **agg, "differences": diffs},
                                                    indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    doc = document(agg, diffs, reference, a.title, pictures, command)
    md = doc.markdown()
    (out / "comparison.md").write_text(md, encoding="utf-8")
    if a.report:
        rep = Path(a.report)
        stem = rep.stem
        rep.write_text(doc.markdown(copied_to(rep.parent / "img", lambda p: f"{stem}_{p.name}")), encoding="utf-8")
    print(md, file=sys.stderr)
    print(f"[compare] {len(plan)} runs, {time.time() - t_all:.0f} s; table: {out / 'comparison.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
