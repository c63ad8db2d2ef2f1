"""The stage runner: runs a stage's commands from the repository root, logs them, records them for the
report; and what every stage shares (output paths, config files, the pre-training and compare commands)."""

from __future__ import annotations

import json
import math
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, NoReturn

from skillnet.experiments.profiles import Profile
from skillnet.finetune.workers import InProcessCommands

# The stages run the repository's scripts (`deepspeed pretrain/run.py`, ds_configs/) from its root.
REPO = Path(__file__).resolve().parents[1]
PY = sys.executable


class Runner:
    """Runs commands of a stage, logs them to <out>/logs/<stage>.log, records them for the report."""

    def __init__(self, out: Path, profile: Profile, dry_run: bool = False, lock_fd: int | None = None) -> None:
        # lock_fd: the output folder's lock (outputs.exclusive); every command inherits it, so the folder stays
        # locked while a command runs even if this process is killed.
        self.out, self.p, self.dry_run, self.lock_fd = out, profile, dry_run, lock_fd
        (out / "stages").mkdir(parents=True, exist_ok=True)
        (out / "logs").mkdir(parents=True, exist_ok=True)
        self.stage: str = ""
        self.commands: list[str] = []
        # A per-seed part (experiments/parts.py): the comparisons of its stage run these seeds' runs only.
        self.only_seeds: list[int] | None = None
        # the comparisons, exports and held-out checks of an in-process profile, run in this process
        self.in_process = InProcessCommands(lock_fd) if profile.in_process else None

    def env(self) -> dict[str, str]:
        # skillnet.* resolves through the install (pyproject's package-dir), not through the repository on a path
        return {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}

    def _pending(self, cmds: list[tuple[list[str], Path | None]]) -> list[tuple[list[str], str]]:
        """Record and echo every command; return those still to run (not done in an earlier sitting, as
        their `check_file` says, and not a dry run)."""
        out = []
        for cmd, check_file in cmds:
            text = shlex.join(cmd)
            self.commands.append(text)
            if check_file is not None and check_file.exists():
                continue
            print(f"  $ {text}", flush=True)
            if not self.dry_run:
                out.append((cmd, text))
        return out

    def _exec(self, cmd: list[str], f: IO[str], threaded: bool = False) -> int:
        """Run one command from the repository root, its output (stdout and stderr) into `f`. A command
        that cannot start (e.g. `deepspeed` not installed) fails like one that exits 127, with the reason
        in its output, so the other commands of the stage still reach the log."""
        if self.in_process is not None and not threaded and self.in_process.takes(cmd):
            return self.in_process.run(cmd, f, self.env())
        try:
            fds = () if self.lock_fd is None else (self.lock_fd,)
            return subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=self.env(),
                                  pass_fds=fds).returncode
        except OSError as e:
            f.write(f"cannot run {cmd[0]}: {e}\n")
            return 127

    def close(self) -> None:
        """Stop the comparisons' worker processes (they finish a run in progress first)."""
        if self.in_process is not None:
            self.in_process.close()

    def _fail(self, what: str, rc: int, text: str, output: str, log: Path) -> NoReturn:
        tail = output.splitlines()[-15:]  # the failed command's own last lines
        raise RuntimeError(f"stage {self.stage}: {what} (exit {rc}): {text}\n  " + "\n  ".join(tail)
                           + f"\n(full log: {log})")

    def run(self, cmd: list[str], check_file: Path | None = None) -> None:
        """Run `cmd` from the repository root, its output streamed to the stage log; skip it when
        `check_file` exists (done in an earlier sitting)."""
        log = self.out / "logs" / f"{self.stage}.log"
        for c, text in self._pending([(cmd, check_file)]):
            with open(log, "ab") as fb:
                fb.write(f"\n$ {text}\n".encode())
                start = fb.tell()  # where this command's output begins
            with open(log, "a", encoding="utf-8") as f:
                rc = self._exec(c, f)
            if rc != 0:
                self._fail("command failed", rc, text, log.read_bytes()[start:].decode("utf-8", "replace"), log)

    def run_many(self, cmds: list[tuple[list[str], Path | None]], jobs: int) -> None:
        """Independent commands (each with its `check_file`), up to `jobs` at once: single-threaded work such
        as the task converters, whose interpreter start-up and package reading dominate. Each command's
        output goes to its own file and is appended to the stage log in command order."""
        pending = self._pending(cmds)
        if not pending:
            return
        import tempfile
        from concurrent.futures import ThreadPoolExecutor

        log = self.out / "logs" / f"{self.stage}.log"
        with tempfile.TemporaryDirectory(prefix="stage_", dir=self.out / "logs") as tmp:
            def one(i: int) -> int:
                with open(Path(tmp) / f"{i}.log", "w", encoding="utf-8") as f:
                    return self._exec(pending[i][0], f, threaded=True)

            with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
                codes = list(pool.map(one, range(len(pending))))
            outputs = [(Path(tmp) / f"{i}.log").read_text(encoding="utf-8", errors="replace")
                       for i in range(len(pending))]
        with open(log, "a", encoding="utf-8") as f:
            for (_, text), output in zip(pending, outputs):
                f.write(f"\n$ {text}\n" + output)
        bad = [i for i, rc in enumerate(codes) if rc != 0]
        if bad:
            i = bad[0]
            self._fail(f"{len(bad)} command(s) failed, first", codes[i], pending[i][1], outputs[i], log)

    def deepspeed(self, script: str, args: list[str], micro_batch: int) -> list[str]:
        """`deepspeed` over the profile's ranks with a copy of its DeepSpeed JSON whose micro-batch is this
        stage's (the JSON is the single source of batch geometry)."""
        cfg = json.loads((REPO / self.p.ds_config).read_text())
        cfg["train_micro_batch_size_per_gpu"] = micro_batch
        cfg["gradient_accumulation_steps"] = 1
        path = self.out / "configs" / f"ds_{self.stage}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cfg, indent=2) + "\n")
        return ["deepspeed", "--num_gpus", str(self.p.ranks), script, *args, "--ds-config", str(path)]


# Accuracy floors of the pre-trained models: below them a model is still at the init plateau, and fine-tuning it
# wastes the budget.
# - BART text infilling leaves ~70% of the target's tokens visible in the source (30% masked in spans): a
#   decoder that copies what it sees scores ~0.7 before it infills anything, one at the plateau ~0.2. Floor:
#   0.5, over the last logged training windows.
# - MLM: BERT's 80/10/10 rule keeps 10% of the predicted tokens in the input, so a model that copies its input
#   and guesses the most frequent character (~0.05 of the packaged text) at [MASK] scores ~0.14 without
#   reading any context; its training accuracy says little. The floor is therefore measured
#   (pretrain/heldout.py): on text held out of pre-training (one corpus document in 100), with pre-training's
#   masking, the model must beat that context-free baseline by three standard errors of the baseline's own
#   measurement, and by at least MLM_MARGIN where the held-out text is small (~0.144 on the full profile's).
MLM_MARGIN = 0.01
HELDOUT_MLM = "heldout_mlm.json"  # in the pre-training run's folder, written by the stage (mlm_heldout)
FLOORS: dict[str, tuple[str, float, str]] = {  # stage -> (what is measured, floor, what the floor means)
    "dense_pt": ("held-out mlm acc", MLM_MARGIN, "MLM accuracy on held-out text"),
    "sparse_pt": ("held-out mlm acc", MLM_MARGIN, "MLM accuracy on held-out text"),
    "dense_ctrl_pt": ("held-out mlm acc", MLM_MARGIN, "MLM accuracy on held-out text"),
    "bart_pt": ("denoise/acc", 0.5, "denoising accuracy (copying the ~70% visible tokens scores ~0.7)"),
}


# The pre-training stages' run folders (keys of `paths`): the report reads their logs.
PRETRAIN_RUNS = {"dense_pt": "dense", "bart_pt": "bart"}
# The pre-training stages run once per fine-tuning seed (experiments/nlu.py continue_pretraining): stage -> the
# folder holding one run folder per seed, seed{k}.
PT_SEEDED = {"sparse_pt": "pt_sparse", "dense_ctrl_pt": "pt_dense_ctrl"}


def pretrain_dirs(out: Path, stage: str) -> list[Path]:
    """The run folders of a pre-training stage in the reproduction folder `out`: one, or one per seed."""
    if stage in PT_SEEDED:
        return sorted(d for d in (out / PT_SEEDED[stage]).glob("seed*") if d.is_dir())
    return [paths(out)[PRETRAIN_RUNS[stage]]] if stage in PRETRAIN_RUNS else []


def mlm_heldout(r: Runner, hf: Path, run_dir: Path) -> None:
    """Measure the exported BERT `hf` on the held-out shards into `run_dir`/heldout_mlm.json (check_floor)."""
    P = paths(r.out)
    r.run([PY, "-m", "skillnet.pretrain.heldout", "--model", str(hf), "--shards", str(P["heldout_shards"]),
           "--train-shards", str(P["shards"]), "--max-seq-len", str(r.p.pt_seq), "--out", str(run_dir / HELDOUT_MLM)])


def mlm_floor(measured: dict[str, Any]) -> float:
    """The held-out floor: the context-free baseline plus the larger of MLM_MARGIN and three standard errors
    of that baseline over the masked tokens measured."""
    b, n = float(measured["baseline_acc"]), max(1, int(measured["masked"]))
    return b + max(MLM_MARGIN, 3 * math.sqrt(b * (1 - b) / n))


def logged(log: Path, key: str, split: str = "train") -> list[tuple[int, float]]:
    """(step, value) of every line of a run's log.jsonl of `split` ("train" or "eval") that carries ``key``
    (a line cut by a crash is skipped)."""
    if not log.is_file():
        return []
    out = []
    for line in log.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if rec.get("split", "train") == split and isinstance(rec.get(key), (int, float)):
            out.append((int(rec.get("step", 0)), float(rec[key])))
    return out


def tokens_seen(log: Path) -> float | None:
    """Real tokens a run trained on, from its log.jsonl: each logging window's real tokens/s times its seconds
    (seconds per step times the steps since the previous window). A resumed run logs some steps again: the
    last line of each step counts."""
    rate = dict(logged(log, "real_tokens_per_s"))
    per_step = dict(logged(log, "seconds_per_step"))
    total, prev = 0.0, 0
    for step in sorted(set(rate) & set(per_step)):
        total += rate[step] * per_step[step] * (step - prev)
        prev = step
    return total or None


def last_logged(log: Path, key: str, windows: int = 3) -> float | None:
    """Mean of ``key`` over the last ``windows`` training lines of a run's log.jsonl that carry it."""
    vals = [v for _, v in logged(log, key)][-windows:]
    return sum(vals) / len(vals) if vals else None


def check_floor(r: Runner, run_dir: Path) -> dict[str, Any]:
    """The stage's floor check: a record for the report; an error (the reproduction stops before any
    fine-tuning) when the profile enforces floors and the model is below its floor."""
    key, floor, what = FLOORS[r.stage]
    if r.dry_run:
        return {}
    rec: dict[str, Any] = {"floor_key": key}
    if key == "held-out mlm acc":
        f = run_dir / HELDOUT_MLM
        measured = json.loads(f.read_text(encoding="utf-8")) if f.is_file() else {}
        value = measured.get("model_acc")
        if value is not None:
            floor = mlm_floor(measured)
            what += (f" (copying the input and guessing the most frequent character at [MASK] scores "
                     f"{measured['baseline_acc']:.3f} over the same {measured['masked']:,} masked tokens)")
        rec.update({f"heldout_{k}": measured.get(k) for k in ("copy_acc", "baseline_acc", "masked")})
        source = f
    else:
        value = last_logged(run_dir / "log.jsonl", key)
        what += " over the last logged steps"
        source = run_dir / "log.jsonl"
    rec.update({"floor": round(floor, 4), "floor_value": value, "floor_passed": value is not None and value >= floor,
                "floor_enforced": r.p.enforce_floors})
    if not rec["floor_passed"]:
        msg = (f"stage {r.stage}: {what} is {'missing' if value is None else f'{value:.3f}'}, below the floor "
               f"{floor:.3f}: the pre-trained model has not learned yet, and fine-tuning it would not either. "
               f"Pre-train longer, or check the init and learning rate ({source}).")
        if r.p.enforce_floors:
            raise RuntimeError(msg)
        print(f"  note: {msg} (floors not enforced in this run: going on)", flush=True)
    return rec


@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    fn: Callable[[Runner], dict[str, Any]]


def paths(out: Path) -> dict[str, Path]:
    return {"corpus": out / "corpus" / "corpus.txt", "shards": out / "shards", "dense": out / "pt_dense",
            "dense_hf": out / "pt_dense" / "hf", "sparse": out / "pt_sparse", "sparse_hf": out / "pt_sparse" / "hf",
            "tasks": out / "tasks", "vocab": out / "vocab", "bart": out / "pt_bart", "bart_hf": out / "pt_bart" / "hf",
            "configs": out / "configs", "cmp": out / "compare", "heldout": out / "corpus" / "heldout.txt",
            "heldout_shards": out / "shards_heldout"}


# The stages that convert the tasks: the corpus is decontaminated against every dev/test example they write.
TASK_STAGES = ("nlu_tasks", "nlg_tasks")


def stage_corpus(r: Runner) -> dict[str, Any]:
    """The packaged text, less every document (held-out ones too) that shares text with a dev or test example
    of any task (data_prep/decontaminate.py): built after both task stages, whichever part runs."""
    P = paths(r.out)
    missing = [s for s in TASK_STAGES if not (r.out / "stages" / f"{s}.json").is_file()]
    if missing and not r.dry_run:
        raise RuntimeError(f"stage corpus: the task stage(s) {', '.join(missing)} have not finished; the corpus is "
                           f"decontaminated against every task's dev and test data, so run them first")
    report = P["corpus"].parent / "decontamination.json"
    # One document in 100 is held out of pre-training: the MLM floor is measured on it (check_floor).
    cmd = [PY, "-m", "skillnet.data_prep", "sample-corpus", "--out", str(P["corpus"]), "--held-out", str(P["heldout"]),
           "--decontaminate", str(P["tasks"]), "--report", str(report)]
    if r.p.corpus_docs:
        cmd += ["--max-docs", str(r.p.corpus_docs)]
    r.run(cmd, check_file=report)  # written last
    if not report.is_file():  # a dry run
        return {}
    from skillnet.data_prep.decontaminate import summary_lines

    rec = json.loads(report.read_text(encoding="utf-8"))
    lines = summary_lines(rec)
    print("\n".join(f"  {line}" for line in lines), flush=True)
    with open(r.out / "logs" / f"{r.stage}.log", "a", encoding="utf-8") as f:  # also when the command was skipped
        f.write("\n".join(lines) + "\n")
    return {"bytes": P["corpus"].stat().st_size, "decontamination": rec}


def stage_vocab(r: Runner) -> dict[str, Any]:
    """The compact vocab of a CPU profile: the bert-base-chinese entries that the corpus and the tasks'
    training files use (dev and test are checked, not built from). The scale profile keeps all 21,128."""
    P = paths(r.out)
    if not r.p.compact_vocab:
        return {"vocab": "bert-base-chinese (21,128 entries)"}
    train = sorted(str(f) for f in P["tasks"].glob("*/train.jsonl"))
    check = sorted(str(f) for split in ("dev", "test") for f in P["tasks"].glob(f"*/{split}.jsonl"))
    r.run([PY, "-m", "skillnet.data_prep", "vocab", str(P["corpus"]), *train, "--check", *check,
           "--out", str(P["vocab"])], check_file=P["vocab"] / "vocab_report.json")
    report = P["vocab"] / "vocab_report.json"
    return json.loads(report.read_text(encoding="utf-8")) if report.exists() else {}


def stage_shards(r: Runner) -> dict[str, Any]:
    P = paths(r.out)
    vocab = P["vocab"] / "vocab.txt"
    vocab_args = ["--vocab", str(vocab)] if r.p.compact_vocab else []
    r.run([PY, "-m", "skillnet.data_prep", "build", str(P["corpus"]), "--out", str(P["shards"]), "--workers", "2",
           "--no-progress", *vocab_args])
    r.run([PY, "-m", "skillnet.data_prep", "build", str(P["heldout"]), "--out", str(P["heldout_shards"]),
           "--workers", "1", "--no-progress", *vocab_args])
    manifest = json.loads((P["shards"] / "manifest.json").read_text()) if (P["shards"] / "manifest.json").exists() else {}
    return {"tokens": manifest.get("totals", {}).get("num_tokens")}


def task_counts(tasks: Path, names: list[str]) -> dict[str, Any]:
    """The example counts of every converted task of `names` (its task.json in `tasks`), for the stage record."""
    return {n: json.loads((tasks / n / "task.json").read_text()).get("counts") for n in names
            if (tasks / n / "task.json").exists()}


def write_config(r: Runner, name: str, d: dict[str, Any]) -> Path:
    P = paths(r.out)
    P["configs"].mkdir(parents=True, exist_ok=True)
    path = P["configs"] / f"{name}.json"
    path.write_text(json.dumps(d, indent=2) + "\n", encoding="utf-8")
    return path


def pt_args(r: Runner, steps: int, lr: float | None = None) -> list[str]:
    p = r.p
    return ["--max-seq-len", str(p.pt_seq), "--max-steps", str(steps), "--lr", str(lr or p.pt_lr), "--warmup-steps",
            str(max(1, steps // 20)), "--log-every", str(max(1, steps // 20)), "--save-every", str(max(10, steps // 4)),
            "--no-progress"]


def compare(r: Runner, config: Path, out: Path, rows: list[str], seeds: list[int], init: Path,
            extra: Sequence[str] = ()) -> None:
    """One `finetune.compare` run (skipped once its comparison.json exists). With `r.only_seeds` (a per-seed
    part) only those seeds' runs: the table over one seed is not the comparison's, so it is removed, and the
    comparison is aggregated once every seed's runs are there (experiments/part_run.py)."""
    part_seeds = [s for s in seeds if r.only_seeds is None or s in r.only_seeds]
    partial = part_seeds != list(seeds)
    cmd = [PY, "-m", "skillnet.finetune.compare", "--config", str(config), "--methods", *rows,
           "--seeds", *map(str, part_seeds), "--output-dir", str(out), *extra, "--init", str(init)]
    if r.p.threads:
        cmd += ["--threads", str(r.p.threads)]
    if r.p.jobs > 1:
        cmd += ["--jobs", str(r.p.jobs)]
    if r.p.in_process:
        cmd += ["--in-process"]
    if not partial:
        r.run(cmd, check_file=out / "comparison.json")
        return
    if all((out / row.split("=")[0] / f"seed{s}" / "results.json").is_file() for row in rows for s in part_seeds):
        r.commands.append(shlex.join(cmd))  # done in an earlier sitting
        return
    r.run(cmd)
    if not r.dry_run:  # the table and pictures over these seeds only: the aggregation writes the comparison's
        for f in [out / "comparison.json", out / "comparison.md", *out.glob("*.png")]:
            f.unlink(missing_ok=True)


def paper_ratio_caps(sizes: dict[str, int], cap: int) -> dict[str, int]:
    top = max(sizes.values())
    return {n: max(1, round(cap * v / top)) for n, v in sizes.items()}

