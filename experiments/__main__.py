"""Reproduce the papers' experiments at laptop scale on real Chinese data, stage by stage, and write the
report (Markdown + one self-contained HTML page).

    python scripts/reproduce.py --quick                 # ~6 min on 2 CPU cores: every stage, tiny sizes
    python scripts/reproduce.py                         # the full CPU run (~10 h on 2 cores), docs/report.md
    python scripts/reproduce.py --list-parts            # the full run in parts of <= 2.5 h, with their status
    python scripts/reproduce.py --part nlu_tune         # one part, committed with provenance to results/full
    python scripts/reproduce.py --report results/full   # docs/report.md, comparison.md, nlg.md from those alone
    python scripts/reproduce.py --profile scale --gpus 8  # BERT-base / BART-base on GPUs (expected time: docs/scale.md)
    python scripts/reproduce.py --profile scale --estimate  # GPU-hours per stage, from FLOPs
    make reproduce / make reproduce-quick / make reproduce-part PART=NAME
    skillnet-reproduce --quick                          # the same command, installed with the package

Stages, in the order they run (each writes <out>/stages/<name>.json when it finished; a rerun skips finished
stages and the commands inside a stage resume where they stopped, so the run can be spread over several sittings;
the parts that group them, and what each commits: docs/reproduce.md):

  nlu_tasks      sentiment, NER, insurance domain, QA matching, span extraction; held back: answer selection
  nlg_tasks      spelling correction (SIGHAN-2015), insurance answer / question generation, poetry; held back:
                 next line of a poem
  corpus         raw Chinese text from the installed packages, less every document that shares text with any
                 task's dev or test data (so after both task stages, whichever half runs)
  vocab          the bert-base-chinese entries the corpus and every task's training files use
  shards         data_prep build: WordPiece -> memory-mapped shards
  dense_pt       dense MLM pre-training of a small BERT, exported as a plain HF BERT
  sparse_pt      sparse MLM+NSP pre-training from it, one run per seed, 2 ranks, DeepSpeed
  dense_ctrl_pt  its dense control: the same MLM+NSP steps without skills, one run per seed
  nlu_loss_scale the NER loss scale in joint training, decided on dev
  nlu_tune       each Table 3 row's lr chosen on dev (one seed, reduced budget)
  nlu_main       every method of Table 3 on the same tasks, budget and seeds (finetune.compare)
  nlu_ablate     Table 6: SkillNet with one skill removed
  nlu_alpha      Figure 3: task sampling alpha
  nlu_adapt      Table 5: the held-back task from each seed's dev-selected multi-task model
  bart_pt        BART denoising pre-training (text infilling) of a small Chinese BART
  nlg_tune       each NLG Table 3 row's lr chosen on dev
  nlg_main       NLG Table 3: SkillNet-NLG against dense joint, task-specific and MoE
  nlg_temp       NLG §3.4: sampling temperature T
  nlg_adapt      NLG Table 4: the held-back task from each seed's dev-selected multi-task model
  report         docs/report.md (+ .html and pictures) from everything above; every number is read from
                 the stages' outputs
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from skillnet.common.files import atomic_write_json
from skillnet.experiments.profiles import PROFILES, Profile
from skillnet.experiments.runner import REPO, Runner, Stage
from skillnet.experiments.stages import PARTS, STAGES


def build_parser() -> argparse.ArgumentParser:
    prog = "skillnet-reproduce" if Path(sys.argv[0]).name == "skillnet-reproduce" else "python scripts/reproduce.py"
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", choices=list(PROFILES), default="full",
                   help="sizes and budgets: quick (~6 min, CPU), full (~10 h, CPU), scale (BERT-base/BART-base, GPUs)"
                        " (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="same as --profile quick")
    p.add_argument("--part", default="all", metavar="PART",
                   help="nlu: the SkillNet-NLU half (docs/comparison.md with the full profile); nlg: the SkillNet-NLG "
                        "half (docs/nlg.md); all: both and the whole report (docs/report.md); or one named part "
                        "(--list-parts), run in --out and committed with its provenance to --results "
                        "(docs/reproduce.md) (default: %(default)s)")
    p.add_argument("--list-parts", action="store_true",
                   help="print the profile's parts, each with its time (measured where committed, else estimated), "
                        "status (done, missing, stale) and what it needs; runs nothing")
    p.add_argument("--part-limit", type=float, default=None, metavar="HOURS",
                   help="split a by-seed group into one part per seed when its estimate exceeds this (default: "
                        "parts.PART_LIMIT_S, 2.5 h on 2 cores)")
    p.add_argument("--results", default=None, metavar="DIR",
                   help="the committed parts (default: results/<profile> in the repository)")
    p.add_argument("--docs", default=None, metavar="DIR",
                   help="with --report RESULTS: where report.md, comparison.md and nlg.md go (default: docs/ for the "
                        "full profile, RESULTS/report otherwise)")
    p.add_argument("--allow-mixed-protocols", action="store_true",
                   help="with --report RESULTS: build a report that marks parts of another protocol version instead "
                        "of refusing")
    p.add_argument("--allocator", choices=["glibc", "tcmalloc", "glibc-tuned"], default="glibc-tuned",
                   help="the memory allocator of every command: glibc with its mmap/trim thresholds raised (large "
                        "blocks stay in the heap: 1.5x faster BART steps), glibc's own default, or tcmalloc "
                        "(LD_PRELOAD of libtcmalloc_minimal, where installed) (bench/allocator.py measures them; "
                        "docs/reproduce.md) (default: %(default)s)")
    p.add_argument("--out", default=None,
                   help="where every stage writes (default: runs/reproduce-<profile>): new or empty, or an earlier "
                        "reproduction of the same profile (continued); anything else is refused")
    p.add_argument("--report", default=None,
                   help="the report's Markdown path (.html beside it; default: docs/report.md for the full profile, "
                        "<out>/report.md otherwise); a folder of committed parts (results/full): rebuild the reports "
                        "and pictures from them alone, run nothing")
    p.add_argument("--stages", nargs="+", default=None, metavar="STAGE",
                   help="run only these stages (their inputs must exist); default: all, in order")
    p.add_argument("--redo", nargs="+", default=[], metavar="STAGE",
                   help="forget that these stages finished (their runs still resume from their checkpoints)")
    p.add_argument("--gpus", type=int, default=None, help="ranks for the DeepSpeed stages (default: 2)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads per fine-tuning run")
    p.add_argument("--jobs", type=int, default=None,
                   help="fine-tuning runs at once (default: the profile's, 2 for the CPU profiles, 1 for scale)")
    p.add_argument("--subprocesses", action="store_true",
                   help="run every fine-tuning run, comparison and export as its own interpreter, as on a cluster "
                        "(default on the CPU profiles: inside long-lived workers, which skip each run's start-up; "
                        "bench/in_process.py measures what that saves)")
    p.add_argument("--no-enforce-floors", action="store_true",
                   help="go on to fine-tuning when a pre-trained model is below its accuracy floor (the report "
                        "marks the floor as failed and not enforced); default: stop before fine-tuning")
    p.add_argument("--dry-run", action="store_true", help="print the commands of the pending stages, run nothing")
    p.add_argument("--estimate", action="store_true",
                   help="print the expected GPU-hours of every stage of the profile (from FLOPs; runs nothing)")
    p.add_argument("--write", default=None, metavar="PATH", help="with --estimate: also write it as Markdown to PATH")
    p.add_argument("--overwrite", action="store_true",
                   help="replace a --report or --write file that the reproduction did not write (never a --out "
                        "folder: pick another one)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if a section of the report is empty or not run, or a picture is missing (CI)")
    return p


def rebuild(a: argparse.Namespace, profile: Profile) -> int:
    """--report RESULTS: the reports from committed parts alone."""
    from skillnet.experiments import part_run

    results = Path(a.report).resolve()
    docs = Path(a.docs) if a.docs else (REPO / "docs" if profile.name == "full" else results / "report")
    try:
        problems = part_run.rebuild_report(profile, results, docs, a.allow_mixed_protocols, part_run.limit_s(a))
    except part_run.PartError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"[reproduce] reports rebuilt from {results} in {docs}", flush=True)
    for msg in problems:
        print(f"{'error' if a.check else 'warning'}: report incomplete: {msg}", file=sys.stderr)
    return 1 if a.check and problems else 0


def claim_outputs(a: argparse.Namespace, profile_name: str, out: Path, report: Path | None) -> None:
    """--out and the report files (common/outputs.py), before any stage runs, a dry run included (it
    writes the stages' configs). A reproduction continues in a folder of the same profile; anything else is
    refused: with no list of what every stage writes, nothing there can be removed safely."""
    from skillnet.common.outputs import LOCK, claim_file, claim_output, starts_with
    from skillnet.experiments.report import MARK

    claim_output(out, option="--out", command="reproduce", identity={"profile": profile_name}, overwrite=None,
                 adopt=lambda d: any((d / "stages").glob("*.json")), ignore=(LOCK,))
    if report is None:  # a named part writes no report
        return
    claim_file(report, option="--report", overwrite=a.overwrite, own=starts_with(MARK))
    claim_file(report.with_suffix(".html"), option="--report (its .html twin)", overwrite=a.overwrite,
               own=starts_with(MARK.replace("`scripts/reproduce.py`", "<code>scripts/reproduce.py</code>")))


def main(argv: list[str] | None = None) -> int:
    from skillnet.common.outputs import (
        OutputError,
        at_least,
        check_options,
        claim_file,
        exclusive,
        starts_with,
    )

    parser = build_parser()
    a = parser.parse_args(argv)
    check_options(parser, a, {"gpus": at_least(1), "threads": at_least(1), "jobs": at_least(1)})
    if a.part_limit is not None and a.part_limit <= 0:
        parser.error(f"--part-limit {a.part_limit}: must be above 0 hours")
    overrides = {"ranks": a.gpus, "threads": a.threads, "jobs": a.jobs,
                 "in_process": False if a.subprocesses else None, "enforce_floors": False if a.no_enforce_floors else None}
    profile = dataclasses.replace(PROFILES["quick" if a.quick else a.profile],
                                  **{k: v for k, v in overrides.items() if v is not None})
    if a.estimate:
        from skillnet.experiments.estimate import write_estimate

        if a.write:
            try:
                claim_file(a.write, option="--write", overwrite=a.overwrite,
                           own=starts_with("Written by `python scripts/reproduce.py --profile"))
            except OutputError as e:
                print(f"error: {e}", file=sys.stderr)
                return 2
        print(write_estimate(profile, Path(a.write) if a.write else None), end="")
        return 0
    from skillnet.experiments import part_run

    results = Path(a.results).resolve() if a.results else part_run.default_results(profile)
    if a.list_parts:
        from skillnet.experiments.parts import list_parts
        from skillnet.experiments.provenance import committed, profile_hash

        print(list_parts(profile, committed(results), profile_hash(profile), part_run.limit_s(a)), end="")
        return 0
    if a.report and Path(a.report).is_dir():
        return rebuild(a, profile)
    from skillnet.experiments.allocator import reexec_with

    reexec_with(a.allocator, argv)  # returns only when this process already runs under it
    out = Path(a.out or f"runs/reproduce-{profile.name}").resolve()
    if a.part not in PARTS:
        try:
            claim_outputs(a, profile.name, out, None)
            with exclusive(out, option="--out", command="reproduction") as lock_fd:
                return part_run.run_part(a, profile, a.part, out, results, lock_fd, _run_stages)
        except (OutputError, part_run.PartError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
    doc_name, parts, part_stages = PARTS[a.part]
    report = Path(a.report or (REPO / "docs" / doc_name if profile.name == "full" else out / doc_name))
    names = [s.name for s in STAGES]
    bad = [s for s in [*(a.stages or []), *a.redo] if s not in names + ["report"]]
    if bad:
        print(f"error: unknown stage(s) {bad}; stages: {', '.join(names)}, report", file=sys.stderr)
        return 2
    try:
        claim_outputs(a, profile.name, out, report)
        # a dry run too: it writes the stages' configs, which a running reproduction reads
        with exclusive(out, option="--out", command="reproduction") as lock_fd:
            return run_stages(a, profile, out, report, parts, part_stages, lock_fd)
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


# How often a running stage records its seconds so far: a sitting killed without a chance to say so (SIGKILL,
# a closed session, a batch job's time limit) still counts in the stage's wall time, less at most this much.
HEARTBEAT_S = 30.0


def _write_seconds(path: Path, seconds: float) -> None:
    try:
        atomic_write_json(path, {"seconds": round(seconds, 1)}, indent=None)
    except OSError as e:  # a full disk costs the wall-time record, not the stage
        print(f"warning: cannot record the stage's seconds in {path}: {e}", file=sys.stderr)


@contextlib.contextmanager
def _heartbeat(partial: Path | None, earlier: float, t0: float) -> Iterator[None]:
    """While the block runs, keep `partial` holding the stage's seconds over every sitting so far."""
    if partial is None:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(HEARTBEAT_S):
            _write_seconds(partial, earlier + time.time() - t0)

    t = threading.Thread(target=beat, name="stage-heartbeat", daemon=True)
    t.start()
    finished = False
    try:
        yield
        finished = True
    finally:
        stop.set()
        t.join()
        if not finished:  # whatever stopped the stage, its time counts
            _write_seconds(partial, earlier + time.time() - t0)


def run_stages(a: argparse.Namespace, profile: Profile, out: Path, report: Path, parts: tuple[str, ...],
               part_stages: list[str], lock_fd: int | None = None) -> int:
    """Every pending stage of `a` in order, then the report (main holds the folder's lock meanwhile)."""
    r = Runner(out, profile, dry_run=a.dry_run, lock_fd=lock_fd)
    if not a.dry_run:  # a dry run lists a redone stage's commands below and forgets nothing
        for name in a.redo:
            (out / "stages" / f"{name}.json").unlink(missing_ok=True)
    todo = [s for s in STAGES if (a.stages is None and s.name in part_stages) or (a.stages and s.name in a.stages)]
    try:
        return _run_stages(a, r, profile, out, report, parts, part_stages, todo)
    finally:
        r.close()


def _run_stages(a: argparse.Namespace, r: Runner, profile: Profile, out: Path, report: Path, parts: tuple[str, ...],
                part_stages: list[str], todo: list[Stage]) -> int:
    t_all = time.time()
    print(f"[reproduce] profile {profile.name}, output {out}", flush=True)
    for i, st in enumerate(todo, 1):
        rec_path = out / "stages" / f"{st.name}.json"
        head = f"[reproduce] ({i}/{len(todo)}) {st.name}: {st.title}"
        if rec_path.is_file() and st.name not in a.redo:
            print(f"{head}: done before ({json.loads(rec_path.read_text())['seconds']:.0f} s), kept", flush=True)
            continue
        print(head, flush=True)
        r.stage, r.commands = st.name, []
        # A stage spread over sittings (stopped, failed, rerun) is timed over all of them: the sittings that
        # did not finish it leave their seconds here.
        partial = out / "stages" / f"{st.name}.partial.json"
        earlier = json.loads(partial.read_text())["seconds"] if partial.is_file() else 0.0
        t0 = time.time()
        try:
            with _heartbeat(None if a.dry_run else partial, earlier, t0):
                info = st.fn(r)
        except RuntimeError as e:  # _heartbeat recorded the sitting's seconds
            print(f"error: {e}\nrerun the same command to continue from here", file=sys.stderr)
            return 1
        if a.dry_run:
            continue
        secs = time.time() - t0
        rec = {"stage": st.name, "seconds": round(earlier + secs, 1), "this_sitting": round(secs, 1),
               "commands": r.commands, "info": info, "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        atomic_write_json(rec_path, rec)
        partial.unlink(missing_ok=True)
        print(f"{head}: finished in {secs:.0f} s", flush=True)
    if a.dry_run or (a.stages is not None and "report" not in a.stages):
        return 0
    from skillnet.experiments.report import build

    title = {"all": "SkillNet reproduction", "nlu": "SkillNet-NLU and its baselines on packaged Chinese tasks",
             "nlg": "SkillNet-NLG on packaged Chinese generation tasks"}[a.part]
    title += " (laptop scale, CPU)" if profile.name != "scale" else " (GPU scale)"
    path, problems = build(out, profile, [s for s in STAGES if s.name in part_stages], report, title, parts)
    print(f"[reproduce] report: {path} (+ {path.with_suffix('.html').name}); this sitting: "
          f"{time.time() - t_all:.0f} s", flush=True)
    for msg in problems:
        print(f"{'error' if a.check else 'warning'}: report incomplete: {msg}", file=sys.stderr)
    from skillnet.experiments.part_run import default_results, print_beside_committed

    print_beside_committed(out, Path(a.results).resolve() if a.results else default_results(profile))
    return 1 if a.check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
