"""Evaluation and selection: dev evaluation during training (best checkpoints, early stopping), the final dev
and test scores of the selected checkpoint(s) next to a trivial baseline, and the results files (JSON,
Markdown, TensorBoard's HPARAMS)."""

from __future__ import annotations

import logging
import math
import sys
from pathlib import Path
from typing import Any

import torch
from skillnet.common.files import atomic_write_json

from . import skill_map
from .build import load_weights, save_model_dir
from .config import FinetuneConfig
from .methods import METHODS
from .source import MultiTaskBatchSource
from .stats import STATS_FILE, examples_key
from .tasks import TaskData

log = logging.getLogger("finetune")
SAMPLES = 20  # generation outputs kept in samples.json per task


class DevEvaluator:
    """Runs on every rank (identical results, so early stopping agrees); rank 0 saves best checkpoints."""

    def __init__(self, cfg: FinetuneConfig, data: dict[str, TaskData], source: MultiTaskBatchSource,
                 out: Path, vocab: Path, is_main: bool, inherited: dict[str, Any] | None = None) -> None:
        self.cfg = cfg
        self.inherited = inherited
        self.data = data
        self.source = source
        self.out = out
        self.vocab = vocab
        self.is_main = is_main
        self.best: dict[str, float] = {}
        self.best_step: dict[str, int] = {}
        self.best_mean = -math.inf
        self.best_mean_step: int | None = None
        # whether the best checkpoint so far (per task; of the mean) passes select_min_distinct: one that
        # passes is preferred to any that does not, whatever the scores
        self.best_ok: dict[str, bool] = {}
        self.best_mean_ok = False
        # every task's dev scores at best_mean_step: final_scores reports them instead of predicting the
        # dev splits again with the checkpoint that produced them, where this process saved that checkpoint
        # (after a crash, `best` may hold a later step than the resumed state knows of)
        self.best_mean_scores: dict[str, dict[str, float]] = {}
        # every task's dev scores at the latest evaluation, and its step: the final weights' dev scores where the
        # run ended at that step (the export/ card shows them), with no second dev pass
        self.last_scores: dict[str, dict[str, float]] = {}
        self.last_step: int | None = None
        self.saved_best = False
        self.bad_evals = 0
        self.trainer: Any = None
        self.per_task = cfg.train.selection == "per_task"
        self.history: list[dict[str, Any]] = []
        self.early_stopped = False

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step, "best_mean": self.best_mean,
                "best_mean_step": self.best_mean_step, "bad_evals": self.bad_evals, "history": self.history,
                "best_ok": self.best_ok, "best_mean_ok": self.best_mean_ok, "best_mean_scores": self.best_mean_scores}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.best, self.best_step = dict(s["best"]), {k: int(v) for k, v in s["best_step"].items()}
        self.best_mean, self.bad_evals = float(s["best_mean"]), int(s["bad_evals"])
        self.best_mean_step = s.get("best_mean_step")
        self.history = list(s.get("history", []))
        # a state saved before the distinct floor existed was selected without one: every best passed
        self.best_ok = {k: bool(s.get("best_ok", {}).get(k, True)) for k in self.best}
        self.best_mean_ok = bool(s.get("best_mean_ok", self.best_mean_step is not None))
        self.best_mean_scores = {k: dict(v) for k, v in s.get("best_mean_scores", {}).items()}

    def _passes(self, name: str, scores: dict[str, float], step: int) -> bool:
        floor = self.cfg.train.select_min_distinct
        d = scores.get("distinct")
        if not floor or d is None or d >= floor:
            return True
        log.info("step %d: %s dev outputs are %.0f%% distinct, below the selection floor %.0f%%", step, name, d, floor)
        return False

    def __call__(self, model: torch.nn.Module, step: int) -> dict[str, float]:
        res: dict[str, float] = {}
        sel = []
        all_ok = True
        bs = self.cfg.train.eval_batch_size
        dev_scores: dict[str, dict[str, float]] = {}
        for name, d in self.data.items():
            if "dev" not in d.records:
                continue
            scores = dev_scores[name] = d.score("dev", d.predict_split(model, "dev", bs))
            for k, v in scores.items():
                res[f"{name}/{k}"] = v
            s = scores[d.cfg.metric]
            sel.append(s)
            ok = self._passes(name, scores, step)
            all_ok = all_ok and ok
            if _beats(ok, s, self.best_ok.get(name, False), self.best.get(name, -math.inf)):
                self.best[name], self.best_ok[name] = s, ok
                self.best_step[name] = step
                if self.is_main and self.per_task:
                    save_model_dir(model, self.out / "best_per_task" / name, self.data, self.vocab,
                                   self.inherited)
        self.last_scores, self.last_step = dev_scores, step
        if sel:
            mean = sum(sel) / len(sel)
            res["mean_dev"] = mean
            if _beats(all_ok, mean, self.best_mean_ok, self.best_mean):
                self.best_mean, self.best_mean_ok, self.best_mean_step, self.bad_evals = mean, all_ok, step, 0
                self.best_mean_scores = dev_scores
                if self.is_main and not self.per_task:
                    save_model_dir(model, self.out / "best", self.data, self.vocab, self.inherited)
                    self.saved_best = True
            else:
                self.bad_evals += 1
        snap = skill_map.snapshot(model, list(self.data))
        if snap is not None:
            res.update(skill_map.scalars(snap))
        target, real = self.source.target_mix(), self.source.realised_mix()
        for t in target:
            res[f"mix_target/{t}"] = target[t]
            res[f"mix_realised/{t}"] = real[t]
        self.history.append({"step": step, **res})
        patience = self.cfg.train.early_stopping_patience
        if patience and self.bad_evals >= patience and self.trainer is not None:
            log.warning("early stopping at step %d: mean dev score did not improve for %d evaluations",
                        step, self.bad_evals)
            self.early_stopped = True
            request_stop(self.trainer)
        return res


def _beats(ok: bool, score: float, best_ok: bool, best: float) -> bool:
    """A checkpoint that passes the distinct floor beats one that does not; else the higher score wins.
    A NaN score never wins."""
    return not math.isnan(score) and (ok, score) > (best_ok, best)


def request_stop(trainer: Any) -> None:
    # The trainer all-reduces this flag after the next step, so every rank stops at the same step.
    if hasattr(trainer, "request_stop"):
        trainer.request_stop()
    else:
        trainer._stop_requested = True


def final_scores(model: torch.nn.Module, cfg: FinetuneConfig, data: dict[str, TaskData], out: Path,
                 evaluator: DevEvaluator, progress: bool) -> dict[str, Any]:
    """Dev and test scores of every task from one checkpoint, the one with the best mean dev score
    (``train.selection="mean"``), or of each task from its own best-on-dev checkpoint ("per_task").
    Without dev sets (or evaluations), the final model."""
    final_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    results: dict[str, Any] = {}
    samples: dict[str, list[dict[str, str]]] = {}  # generation: the first outputs of the last split scored
    # per task and split, what the bootstrap of finetune/stats.py resamples (dev only where predicted here)
    example_stats: dict[str, dict[str, Any]] = {}
    bs = cfg.train.eval_batch_size
    shared_best = out / "best"
    if not evaluator.per_task and shared_best.exists():
        load_weights(model, shared_best)
    for name, d in data.items():
        if evaluator.per_task:
            best_dir = out / "best_per_task" / name
            if best_dir.exists():
                load_weights(model, best_dir)
                source, step = f"best_per_task/{name}", evaluator.best_step.get(name)
            else:
                model.load_state_dict(final_state)
                source, step = "final", None
        elif shared_best.exists():
            source, step = "best (mean dev)", evaluator.best_mean_step
        else:
            source, step = "final", None
        r: dict[str, Any] = {"type": d.cfg.type, "metric": d.cfg.metric, "checkpoint": source,
                             "best_step": step, "skills": model.config.task_skill_names(name),
                             "train_examples": d.num_train, "max_seq_len": d.max_len}
        # The shared checkpoint's dev scores were measured when it was saved; predicting them again costs a
        # dev pass per run. Not where dev is the last split scored of a task that shows samples (from its preds).
        reuse_dev = (not evaluator.per_task and evaluator.saved_best and name in evaluator.best_mean_scores
                     and ("test" in d.records or not d.codec.shows_samples))
        for split in ("dev", "test"):
            if split in d.records:
                preds = None
                if split == "dev" and reuse_dev:
                    r[split] = dict(evaluator.best_mean_scores[name])
                else:
                    preds = d.predict_split(model, split, bs, progress=progress)
                    r[split] = d.score(split, preds)
                    # a codec from outside may define none (comparisons then fall back to the seeds' t-test)
                    rows = getattr(d.codec, "example_stats", lambda *_: None)(d, d.records[split], preds)
                    if rows is not None:  # which examples, in which order: the bootstrap pairs runs by them
                        example_stats.setdefault(name, {})[split] = {**rows, "examples": examples_key(d.records[split])}
                r[f"trivial_{split}"] = d.trivial_baseline(split)
                lexical = d.lexical_baseline(split) if cfg.train.lexical_baselines else None
                if lexical is not None:
                    r[f"lexical_{split}"] = lexical
                    r["lexical_name"] = d.codec.lexical_name
                    cut = d.lexical_baseline(split, cut=True) if d.truncated[split] else None
                    if cut is not None:  # the same baseline on what the model reads of the cut examples
                        r[f"lexical_cut_{split}"] = cut
                r[f"{split}_examples"] = len(d.records[split])
                # what a score means depends on how much of the input the model saw (TaskData.truncated)
                r[f"{split}_truncated"] = d.truncated[split]
                if d.codec.shows_samples and preds is not None:  # what a reader wants to see of a generation model
                    samples[name] = [d.codec.sample(x, y)
                                     for x, y in zip(d.records[split][:SAMPLES], preds[:SAMPLES])]
        results[name] = r
    model.load_state_dict(final_state)
    for name, d in data.items():
        if results[name]["checkpoint"] != "final":
            # export/ holds the final weights: its card shows their own scores beside the selected checkpoint's
            at_end = evaluator.last_step is not None and evaluator.last_step == cfg.train.max_steps
            results[name]["final"] = {
                split: dict(evaluator.last_scores[name]) if split == "dev" and at_end and name in evaluator.last_scores
                else d.score(split, d.predict_split(model, split, bs, progress=progress))
                for split in ("dev", "test") if split in d.records}
    if samples:
        atomic_write_json(out / "samples.json", samples)
    # written even when empty, so that a rerun never leaves an earlier run's statistics beside its results
    atomic_write_json(out / STATS_FILE, example_stats)
    return results


def trivial_name(codec: Any) -> str:
    """What a task type's trivial predictor does, from its ``trivial`` docstring ("Copy the source")."""
    first = (codec.trivial.__doc__ or "the trivial predictor").split(":")[0].split(".")[0].strip()
    return first[:1].lower() + first[1:]


def below_trivial(results: dict[str, Any]) -> list[str]:
    """One line per task whose final score (test, else dev) of its metric is at or below the task's trivial
    baseline on the same split (``trivial_<split>``, the score the reproduction's report compares against),
    or was not scored: what the run's last lines say."""
    from skillnet.finetune.task_types import codec_for

    lines = []
    for name, r in results.items():
        split = "test" if isinstance(r.get("test"), dict) else "dev"
        score, floor = (r.get(split) or {}).get(r["metric"]), (r.get(f"trivial_{split}") or {}).get(r["metric"])
        if floor is None or floor != floor:
            continue
        if score is None or score != score:
            lines.append(f"warning: task {name!r}: its {split} {r['metric']} was not scored (trivial baseline "
                         f"{floor:.1f})")
        elif score <= floor:
            lines.append(f"warning: task {name!r} ends at or below its trivial baseline: {split} {r['metric']} "
                         f"{score:.1f}, {trivial_name(codec_for(r['type']))} scores {floor:.1f}")
    return lines


def results_markdown(results: dict[str, Any], summary: dict[str, Any] | None = None) -> str:
    lines = []
    if summary is not None:
        sel = ("one checkpoint for all tasks (best mean dev score)" if summary.get("selection") == "mean"
               else "each task from its own best-on-dev checkpoint (per-task selection)")
        method = METHODS.get(summary.get("method") or "")
        if method is not None and method.per_task:
            sel = "one model per task, each at its best-on-dev checkpoint"
        lines += [f"method: {summary.get('method')}; scores: {sel}", ""]
    lines += ["| task | type | metric | best step | dev | test | trivial dev | trivial test |",
              "|---|---|---|---|---|---|---|---|"]

    def f(r: dict[str, Any], key: str) -> str:
        v = r.get(key, {}).get(r["metric"]) if isinstance(r.get(key), dict) else None
        return "-" if v is None else f"{v:.1f}"

    for name, r in results.items():
        lines.append(f"| {name} | {r['type']} | {r['metric']} | {r.get('best_step') or '-'} | {f(r, 'dev')} | "
                     f"{f(r, 'test')} | {f(r, 'trivial_dev')} | {f(r, 'trivial_test')} |")
    return "\n".join(lines) + "\n"


def write_hparams(out: Path, cfg: FinetuneConfig, summary: dict[str, Any]) -> None:
    """TensorBoard's HPARAMS tab: the run's settings against its final dev/test scores (of the reported
    checkpoint), one row per run, so runs of a sweep or a comparison sit side by side."""
    from torch.utils.tensorboard import SummaryWriter

    hp = {"method": cfg.method, "lr": cfg.train.lr, "batch_size": cfg.train.batch_size,
          "max_steps": cfg.train.max_steps, "seed": cfg.train.seed, "sampler": cfg.sampler.kind,
          "alpha": cfg.sampler.alpha, "temperature": cfg.sampler.temperature, "selection": cfg.train.selection,
          "init": str(cfg.model.init or cfg.model.preset), "new_skills": ",".join(n.name for n in cfg.new_skills),
          "drop_skills": ",".join(cfg.drop_skills), "freeze_old_skills": cfg.freeze_old_skills}
    metrics: dict[str, float] = {}
    for name, r in summary["tasks"].items():
        for split in ("dev", "test"):
            v = (r.get(split) or {}).get(r["metric"])
            if v is not None and v == v:
                metrics[f"hparam/{split}/{name}"] = float(v)
    for split in ("dev", "test"):
        vals = [v for k, v in metrics.items() if k.startswith(f"hparam/{split}/")]
        if vals:
            metrics[f"hparam/{split}/mean"] = sum(vals) / len(vals)
    from torch.utils.tensorboard.summary import hparams

    # What add_hparams writes, into one event file of tensorboard/hparams (add_hparams itself opens a second
    # writer in a sub-folder and leaves the first file empty).
    with SummaryWriter(log_dir=str(out / "tensorboard" / "hparams")) as w:
        for summary_pb in hparams(hp, metrics):
            w._get_file_writer().add_summary(summary_pb)
        for k, v in metrics.items():
            w.add_scalar(k, v)


def write_results(out: Path, summary: dict[str, Any]) -> None:
    atomic_write_json(out / "results.json", summary)
    md = results_markdown(summary["tasks"], summary)
    (out / "results.md").write_text(md, encoding="utf-8")
    print(md, file=sys.stderr)


def mix_table(target: dict[str, float], real: dict[str, float]) -> str:
    rows = ["task mix      target  realised"] + [f"  {t:<12} {target[t]:6.3f}  {real[t]:6.3f}" for t in target]
    return "\n".join(rows)
