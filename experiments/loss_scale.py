"""The CRF loss's scale in joint training, measured and decided on dev (issues 49 and 55): dense joint, SkillNet
and task-specific models under each `loss_reduction` of the NER head (token_mean: per word; sentence_mean: per
sentence, like the other heads' per-example losses), with or without per-task gradient normalisation, over several
seeds, paired. The winner is the arm with the best mean dev score (the average over tasks of the dev-selected
checkpoint, as checkpoint selection reads it), averaged over the rows and seeds; test scores are shown, never read
by the decision. The reproduction trains every NLU table with the winner (experiments/nlu.py `nlu_config`).

    # on a finished (or at least pre-trained) reproduction: its NLU tasks, BERTs and Table 3 config
    python -m skillnet.experiments.loss_scale --from runs/reproduce-full
    # any fine-tuning config with an NER task
    python -m skillnet.experiments.loss_scale --config tasks.json --init dense/hf --init-for skillnet=sparse/hf
    # the third option: per-task gradient normalisation (train.task_grad_norm ema) beside the two reductions
    python -m skillnet.experiments.loss_scale --from runs/reproduce-full --arms token_mean sentence_mean token_mean+ema

An arm is a reduction, alone or with ``+ema``: the same with ``train.task_grad_norm`` ``ema`` (training/
task_balance.py: each task's loss scaled so that its gradient norm meets the mean over tasks). Each arm is one
`finetune.compare` of the methods in ``<out>/<arm>/`` (resumable: rerun to continue), on the config with every NER
task's ``head.loss_reduction`` and the run's ``task_grad_norm`` set. With ``--from``, the rows of the arm the
reproduction's Table 3 ran (its config's, the head's default without normalisation unless it names others) are read from
its ``nlu_main`` comparison when that has them at the same seeds and steps, not run again. Writes
``<out>/loss_scale.md`` and ``loss_scale.json``: the decision (``winner``, ``decision``: the rule and each arm's
dev score), per method and arm each NER task's dev (``dev_scores``) and test F1 (``scores``) and the average over
all tasks (mean ± std over seeds), the paired difference of each arm from the first one, and each NER task's dev
curve (``dev_curves``: every seed's score at every evaluation; in the table, mean ± std per step and whether the
curve has flattened: its last two evaluations that every seed reached within the seed spread), the budget question.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from skillnet.common.cli import Parser
from skillnet.experiments.profiles import LOSS_SCALE_METHODS
from skillnet.finetune.document import Document, paired_test, verdict
from skillnet.model.heads import CRF_LOSS_REDUCTIONS, DEFAULT_CRF_LOSS_REDUCTION
from skillnet.training.config import TrainConfig

DEFAULT_METHODS = LOSS_SCALE_METHODS
# train.task_grad_norm's values that normalise (all but "off"): an arm "<reduction>+<value>" runs with one.
GRAD_NORMS = [v for v in TrainConfig.__dataclass_fields__["task_grad_norm"].metadata["choices"] if v != "off"]
ARMS = [*CRF_LOSS_REDUCTIONS, *(f"{r}+{g}" for g in GRAD_NORMS for r in CRF_LOSS_REDUCTIONS)]


def build_parser() -> argparse.ArgumentParser:
    p = Parser("skillnet.experiments.loss_scale",
               description="Measure the NER CRF loss's scale in joint training and decide it on dev: dev and test "
                           "scores of each method under each head.loss_reduction, with or without per-task gradient "
                           "normalisation (+ema arms), over seeds, paired, with NER's dev curve per arm (has it "
                           "flattened at this budget?); the winner is the arm with the best mean dev score over rows "
                           "and seeds (test scores are shown, never decide). Why: token_mean is a loss per word, so "
                           "beside per-example losses of other tasks, with one AdamW and one gradient clip for all, "
                           "NER's encoder gradient is several times smaller; sentence_mean (the head's default) "
                           "averages per sentence like the other heads (docs/finetune.md).")
    p.add_argument("--from", dest="source", metavar="REPRODUCTION",
                   help="a reproduction folder (scripts/reproduce.py --out): its configs/nlu_main.json, pt_dense/hf "
                        "(every row's init) and pt_sparse/hf (SkillNet's), and its Table 3 runs where they match")
    p.add_argument("--config", help="fine-tuning config with at least one ner task (default with --from: its "
                                    "configs/nlu_main.json)")
    p.add_argument("--init", help="initial weights of every row (default with --from: its pt_dense/hf)")
    p.add_argument("--init-for", dest="init_for", action="append", default=[], metavar="LABEL=DIR",
                   help="initial weights of one row (default with --from: skillnet=its pt_sparse/hf, as Table 3)")
    p.add_argument("--args-for", dest="args_for", action="append", default=[], metavar="LABEL=ARGS",
                   help="fine-tuning options of one row in every arm (finetune.compare --args-for), e.g. its lr")
    p.add_argument("--methods", nargs="+", default=DEFAULT_METHODS, help="rows (finetune methods)")
    p.add_argument("--arms", "--reductions", dest="reductions", nargs="+", default=list(CRF_LOSS_REDUCTIONS),
                   choices=ARMS, metavar="ARM",
                   help=f"NER loss reductions, each alone or with +{'/+'.join(GRAD_NORMS)} (the run's "
                        f"train.task_grad_norm: per-task gradient normalisation), of {', '.join(ARMS)}; the first is "
                        f"the one the others are compared with")
    p.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2], help="seeds; every row runs each")
    p.add_argument("--max-steps", dest="max_steps", type=int, help="override the config's train.max_steps")
    p.add_argument("--out", default=None, help="where the comparisons and the table go (default: <from>/loss_scale, "
                                               "else runs/loss_scale)")
    p.add_argument("--jobs", type=int, default=1, help="runs at once (finetune.compare --jobs)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads per run")
    p.add_argument("--no-reuse", action="store_true",
                   help="with --from: run every arm, even the one its Table 3 already ran")
    return p


def ner_tasks(cfg: dict[str, Any]) -> list[str]:
    return [t["name"] for t in cfg["tasks"] if t["type"] == "ner"]


def split_arm(arm: str) -> tuple[str, str]:
    """``"token_mean+ema"`` -> (``"token_mean"``, ``"ema"``); a reduction alone trains with ``"off"``."""
    reduction, _, norm = arm.partition("+")
    return reduction, norm or "off"


def with_arm(cfg: dict[str, Any], arm: str) -> dict[str, Any]:
    """`cfg` with every NER task's CRF loss reduced by the arm's reduction and the arm's task_grad_norm (a config
    without one trains with the default, off)."""
    reduction, norm = split_arm(arm)
    out = with_reduction(cfg, reduction)
    train = out.setdefault("train", {})
    if norm == "off":
        train.pop("task_grad_norm", None)
    else:
        train["task_grad_norm"] = norm
    return out


def with_reduction(cfg: dict[str, Any], reduction: str) -> dict[str, Any]:
    """`cfg` with every NER task's CRF loss reduced by `reduction`."""
    out = json.loads(json.dumps(cfg))
    for t in out["tasks"]:
        if t["type"] == "ner":
            t["head"] = {**t.get("head", {}), "loss_reduction": reduction}
    return out


def config_reduction(cfg: dict[str, Any]) -> str:
    """The reduction a config's NER tasks train with (the head's default where none names one)."""
    names = {t.get("head", {}).get("loss_reduction", DEFAULT_CRF_LOSS_REDUCTION) for t in cfg["tasks"]
             if t["type"] == "ner"}
    return names.pop() if len(names) == 1 else "mixed"


def config_arm(cfg: dict[str, Any]) -> str:
    """The arm a config trains: its NER reduction, with ``+<task_grad_norm>`` when that is not off."""
    norm = cfg.get("train", {}).get("task_grad_norm", "off")
    return config_reduction(cfg) + ("" if norm == "off" else f"+{norm}")


def reusable(main: Path, methods: list[str], seeds: list[int], steps: int) -> dict[str, Any] | None:
    """The reproduction's Table 3 comparison when it ran every method at `seeds` and `steps`, else None."""
    f = main / "comparison.json"
    if not f.is_file():
        return None
    agg = json.loads(f.read_text(encoding="utf-8"))
    rows = agg.get("methods", {})
    if agg.get("seeds") != seeds or any(m not in rows or rows[m].get("steps") != steps for m in methods):
        return None
    return agg


def summarise(aggs: dict[str, dict[str, Any]], methods: list[str], ner: list[str]) -> dict[str, Any]:
    """Per method and arm: each NER task's and the average's per-seed values, mean and std; and per method the
    paired difference of every arm from the first."""
    def ms(values: list[float]) -> dict[str, Any]:
        return {"values": values, "mean": statistics.fmean(values),
                "std": statistics.stdev(values) if len(values) > 1 else 0.0}

    scores: dict[str, dict[str, Any]] = {}
    for m in methods:
        scores[m] = {}
        for red, agg in aggs.items():
            row = agg["methods"][m]
            scores[m][red] = {**{t: ms(row["tasks"][t]["values"]) for t in ner}, "average": ms(row["average"]["values"])}
    first = next(iter(aggs))
    diffs = {m: {red: {k: {"diff": s[k]["mean"] - scores[m][first][k]["mean"],
                           "p": paired_test(s[k]["values"], scores[m][first][k]["values"])} for k in s}
                 for red, s in scores[m].items() if red != first} for m in methods}
    return {"reference": first, "scores": scores, "differences": diffs}


# How the study picks its winner: what the reproduction's tables then train with, so said once, here.
DECISION_RULE = ("the arm with the highest mean dev score (each run's average over tasks at its dev-selected "
                 "checkpoint), averaged over the rows and seeds; ties go to the arm listed first")


def decide(dev: dict[str, Any], arms: list[str]) -> dict[str, Any]:
    """The winner by DECISION_RULE from the dev summary (`summarise` of the dev aggregates): per arm the mean over
    rows of each row's mean dev average."""
    by_arm: dict[str, float] = {}
    for arm in arms:
        vals = [per[arm]["average"]["mean"] for per in dev["scores"].values() if arm in per]
        vals = [v for v in vals if v == v]  # a row without a dev score (nan) does not vote
        by_arm[arm] = statistics.fmean(vals) if vals else None
    winner = max(arms, key=lambda a: (-math.inf if by_arm[a] is None else by_arm[a], -arms.index(a)))
    return {"rule": DECISION_RULE, "split": "dev", "by_arm": by_arm, "winner": winner}


def dev_curves(aggs: dict[str, dict[str, Any]], methods: list[str], ner: list[str]
               ) -> dict[str, dict[str, dict[str, list[list[list[float]]]]]]:
    """Per method, arm and NER task: each seed's dev curve ([[step, score], ...], as finetune.compare keeps
    them), from the comparisons' own records (task-specific rows included)."""
    return {m: {arm: {t: agg["methods"][m].get("curves", {}).get(t, []) for t in ner} for arm, agg in aggs.items()}
            for m in methods}


def _by_step(per_seed: list[list[list[float]]]) -> dict[int, list[float]]:
    out: dict[int, list[float]] = {}
    for curve in per_seed:
        for step, v in curve:
            out.setdefault(int(step), []).append(float(v))
    return dict(sorted(out.items()))


def flattened(per_seed: list[list[list[float]]]) -> bool | None:
    """The issue's test of a dev curve that has flattened, on the last two evaluations every seed reached: their
    means over seeds differ by no more than the seed spread (std) at the last one. None with fewer than two
    seeds or two such evaluations."""
    curves = [c for c in per_seed if c]
    if len(curves) < 2:
        return None
    common = sorted(set.intersection(*({int(s) for s, _ in c} for c in curves)))
    if len(common) < 2:
        return None
    at = {s: [float(v) for c in curves for s2, v in c if int(s2) == s] for s in common[-2:]}
    last, prev = at[common[-1]], at[common[-2]]
    return abs(statistics.fmean(last) - statistics.fmean(prev)) <= statistics.stdev(last)


def curve_table(doc: Document, curves: dict[str, dict[str, dict[str, list[list[list[float]]]]]]) -> None:
    by_step = {(m, arm, t): _by_step(c) for m, per in curves.items() for arm, tasks in per.items()
               for t, c in tasks.items()}
    steps = sorted({s for c in by_step.values() for s in c})
    if not steps:
        return
    doc.p("Each NER task's dev score at every evaluation (mean ± std over seeds): the budget question. *flat*: the "
          "last two evaluations every seed reached differ by no more than the seed spread at the last one.")
    rows = []
    for (m, arm, t), c in by_step.items():
        cells = [f"{statistics.fmean(c[s]):.1f} ± {statistics.stdev(c[s]) if len(c[s]) > 1 else 0.0:.1f}"
                 if s in c else "-" for s in steps]
        flat = flattened(curves[m][arm][t])
        rising = len(c) > 1 and statistics.fmean(list(c.values())[-1]) > statistics.fmean(list(c.values())[-2])
        rows.append([m, f"`{arm}`", t, *cells, "-" if flat is None else "yes" if flat else "no, rising" if rising
                     else "no"])
    doc.table(["method", "NER loss", "task", *(f"step {s}" for s in steps), "flat"], rows)


def decision_text(doc: Document, study: dict[str, Any]) -> None:
    """The study's decision in one paragraph: the rule, each arm's dev score, the winner (or why there is none:
    a loss_scale.json written before the study decided on dev)."""
    dec = study.get("decision")
    if not dec:
        doc.p("**No decision on dev recorded**: this loss_scale.json predates the dev decision (issue 55); rerun "
              "the study (delete its folder) for a winner that the tables can read.")
        return
    scores = ", ".join(f"`{arm}` {'-' if v is None else f'{v:.2f}'}" for arm, v in dec["by_arm"].items())
    doc.p(f"**Decision, on dev**: {dec['rule']}. Mean dev score per arm: {scores}. Winner: `{dec['winner']}`, the "
          "NER loss of every NLU table of the reproduction.")


def write_section(doc: Document, study: dict[str, Any], level: int = 1,
                  title: str = "The CRF loss's scale in joint training") -> None:
    """The study's tables, from its loss_scale.json (this module's own file, and the reproduction report's)."""
    ner, seeds, sources = study["ner_tasks"], study["seeds"], study.get("sources", {})
    doc.h(level, title)
    budget = f" Every run trains {study['steps']:,} steps." if study.get("steps") else ""
    doc.p(f"Written by `{study.get('command', 'python -m skillnet.experiments.loss_scale')}`.{budget} Scores as "
          f"mean ± std over seeds {seeds}, one checkpoint per run (selected by the mean dev score over tasks). "
          "`token_mean`: the NER loss per word; `sentence_mean`: per sentence, as the other heads average theirs "
          "(its gradient is `token_mean`'s times the mean words per sentence); `+ema`: with per-task gradient "
          "normalisation (`train.task_grad_norm` `ema`: each task's loss scaled so that its gradient norm meets the "
          "mean over tasks).")
    decision_text(doc, study)
    n = len(seeds)
    if study.get("dev_scores"):
        doc.p("Dev scores (what the decision reads):")
        doc.table(["method", "NER loss", *(f"{t} (f1, dev)" for t in ner), "average (all tasks, dev)"],
                  [[m, f"`{red}`", *(f"{s[t]['mean']:.1f} ± {s[t]['std']:.1f}" for t in ner),
                    f"{s['average']['mean']:.1f} ± {s['average']['std']:.1f}"]
                   for m, per in study["dev_scores"].items() for red, s in per.items()])
        doc.p("Test scores (shown, not used by the decision):")
    head = ["method", "NER loss", *(f"{t} (f1)" for t in ner), "average (all tasks)", "runs"]
    rows = []
    for m, per in study["scores"].items():
        for red, s in per.items():
            rows.append([m, f"`{red}`", *(f"{s[t]['mean']:.1f} ± {s[t]['std']:.1f}" for t in ner),
                         f"{s['average']['mean']:.1f} ± {s['average']['std']:.1f}", sources.get(red, "-")])
    doc.table(head, rows)
    ref = study["reference"]
    doc.p(f"Differences from `{ref}`, paired over seeds:")
    doc.table(["method", "NER loss", *ner, "average"],
              [[m, f"`{red}` minus `{ref}`", *(verdict(d[k]["diff"], d[k]["p"], n) for k in [*ner, "average"])]
               for m, per in study["differences"].items() for red, d in per.items()])
    curve_table(doc, study.get("dev_curves") or {})


def main(argv: Sequence[str] | None = None) -> int:
    from skillnet.common.outputs import at_least, check_options, non_negative
    from skillnet.finetune import compare

    parser = build_parser()
    a = parser.parse_args(argv)
    check_options(parser, a, {"max_steps": at_least(1), "jobs": at_least(1), "threads": at_least(1),
                              "seeds": non_negative()})
    src = Path(a.source) if a.source else None
    if src is not None and not (src / "configs" / "nlu_main.json").is_file():
        parser.error(f"--from {src}: no configs/nlu_main.json there (run the reproduction's nlu_main stage first, "
                     "or give --config)")
    config = Path(a.config) if a.config else (src / "configs" / "nlu_main.json" if src else None)
    if config is None:
        parser.error("give --config (or --from a reproduction folder)")
    if not config.is_file():
        parser.error(f"--config {config}: no such file")
    init = a.init or (str(src / "pt_dense" / "hf") if src else None)
    init_for = a.init_for or ([f"skillnet={src / 'pt_sparse' / 'hf'}"] if src and "skillnet" in a.methods else [])
    if len(set(a.reductions)) != len(a.reductions):
        parser.error(f"--arms has duplicates: {a.reductions}")
    base = json.loads(config.read_text(encoding="utf-8"))
    from skillnet.finetune.config import FinetuneConfig

    for arm in a.reductions:  # every arm's config is checked before the first one spends its run time
        try:
            FinetuneConfig.from_dict({**with_arm(base, arm), "base_dir": str(config.parent)})
        except (ValueError, TypeError, KeyError) as e:
            parser.error(f"--config {config}, arm {arm}: {e}")
    ner = ner_tasks(base)
    if not ner:
        parser.error(f"--config {config}: no task of type ner (the study varies the NER loss)")
    out = Path(a.out) if a.out else (src / "loss_scale" if src else Path("runs/loss_scale"))
    (out / "configs").mkdir(parents=True, exist_ok=True)
    steps = a.max_steps or int(base.get("train", {}).get("max_steps", 0))
    main_cmp = reusable(src / "compare" / "nlu_main", a.methods, a.seeds, steps) if src and not a.no_reuse else None
    aggs: dict[str, dict[str, Any]] = {}
    sources: dict[str, str] = {}
    dirs: dict[str, Path] = {}  # each arm's comparison folder: its runs' results hold the dev scores
    for red in a.reductions:
        if main_cmp is not None and red == config_arm(base):
            aggs[red], sources[red] = main_cmp, "Table 3's (nlu_main)"
            dirs[red] = src / "compare" / "nlu_main"  # type: ignore[operator]
            continue
        cfg_path = out / "configs" / f"{red}.json"
        # paths of the config stay relative to its own folder (or the base_dir it names)
        where = str((config.parent / str(base.get("base_dir", ""))).resolve())
        cfg_path.write_text(json.dumps({**with_arm(base, red), "base_dir": where, "output_dir": str(out / "unused")},
                                       indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        args = ["--config", str(cfg_path), "--methods", *a.methods, "--seeds", *map(str, a.seeds),
                "--output-dir", str(out / red), "--no-plots", "--jobs", str(a.jobs), "--in-process",
                "--title", f"NER loss {red}"]
        args += ["--init", init] if init else []
        args += [x for it in init_for for x in ("--init-for", it)]
        args += [x for it in a.args_for for x in ("--args-for", it)]
        args += ["--max-steps", str(a.max_steps)] if a.max_steps else []
        args += ["--threads", str(a.threads)] if a.threads else []
        rc = compare.main(args)
        if rc != 0:
            print(f"error: the {red} comparison failed (exit {rc}); rerun to continue it", file=sys.stderr)
            return rc
        aggs[red] = json.loads((out / red / "comparison.json").read_text(encoding="utf-8"))
        sources[red] = f"`{red}/`"
        dirs[red] = out / red
    summary = summarise(aggs, a.methods, ner)
    dev = summarise({red: compare.aggregate(d, a.methods, a.seeds, split="dev") for red, d in dirs.items()},
                    a.methods, ner)
    decision = decide(dev, list(a.reductions))
    curves = dev_curves(aggs, a.methods, ner)
    command = "python -m skillnet.experiments.loss_scale " + " ".join(argv if argv is not None else sys.argv[1:])
    study = {"seeds": a.seeds, "ner_tasks": ner, "steps": steps, "command": command, "sources": sources,
             "winner": decision["winner"], "decision": decision, "dev_scores": dev["scores"],
             "dev_differences": dev["differences"], **summary, "dev_curves": curves}
    (out / "loss_scale.json").write_text(json.dumps(study, indent=2) + "\n", encoding="utf-8")
    doc = Document()
    write_section(doc, study)
    md = doc.markdown()
    (out / "loss_scale.md").write_text(md, encoding="utf-8")
    print(md)
    print(f"[loss_scale] table: {out / 'loss_scale.md'}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
