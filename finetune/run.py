"""Multi-task fine-tuning of SkillNet-BERT (skillnet-nlu.md §3.3-3.4, §4.1, Table 6).

    # one process (CPU or one GPU)
    python -m skillnet.finetune.run --config finetune/configs/tiny.json --output-dir runs/ft-tiny
    # several ranks through DeepSpeed (ZeRO-1/2; same task on every rank for every step)
    deepspeed --num_gpus 8 finetune/run.py --config CFG --ds-config ds_configs/zero2.json
    # adaptation (§3.4): a new skill s8 copied from s7, only s8 and the heads train
    python -m skillnet.finetune.run --config CFG --init runs/mt/export --new-skill s8 --freeze-old-skills
    # ablation (Table 6): no task uses s4
    python -m skillnet.finetune.run --config CFG --drop-skill s4

Writes to ``--output-dir``: ``log.jsonl`` + ``tensorboard/`` (per-task ``train/<task>/loss``,
``eval/<task>/<metric>``, ``eval/mix_target/<task>`` vs ``eval/mix_realised/<task>``), ``best/<task>/``
(the checkpoint with the best dev score of that task), ``export/`` (the final model), ``results.json``
and ``results.md`` (dev and test scores of each task's best checkpoint, next to a trivial baseline),
``params.json`` (activated and trainable parameter counts per task) and ``checkpoints/`` (resumable).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # `deepspeed finetune/run.py` runs this file as a script
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from skillnet.data_prep.tasks.schema import TaskDataError
from skillnet.finetune import skill_map
from skillnet.finetune.config import SELECTIONS, ConfigError, FinetuneConfig, NewSkill
from skillnet.finetune.methods import METHODS, method_names
from skillnet.finetune.samplers import SAMPLER_KINDS, annealing_warning, build_sampler
from skillnet.finetune.source import MultiTaskBatchSource
from skillnet.finetune.tasks import TaskData
from skillnet.training.cli import Parser

log = logging.getLogger("finetune")
META_FILE = "finetune_tasks.json"
SAMPLES = 20  # generation outputs kept in samples.json per task


# ----------------------------------------------------------------------------------------- CLI
def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        "skillnet.finetune.run",
        description="Multi-task fine-tuning of SkillNet-BERT (NLU tasks) or SkillNet-BART (generation tasks): one "
        "task's mini-batch per step, drawn by a task sampler identical on all ranks; one checkpoint for all tasks "
        "selected on dev; dev/test scores as JSON and Markdown. Options given here override the config file; "
        "options without a default shown take the config's value.",
        epilog=__doc__.split("Writes to")[0].split("\n\n", 1)[1],
    )
    p.add_argument("--config", required=True, help="fine-tuning config (JSON; see finetune/config.py, docs/finetune.md)")
    p.add_argument("--output-dir", help="where logs, checkpoints, best models and results go")
    p.add_argument("--init", help="SkillNet export or dense HF BERT folder to start from (overrides model.init)")
    p.add_argument("--method", choices=method_names(),
                   help="multi-task method (finetune/methods.py): " + "; ".join(
                       f"{n}: {m.summary}" for n, m in METHODS.items()) + " (default: the config's, else skillnet)")
    p.add_argument("--selection", choices=SELECTIONS,
                   help="mean: one checkpoint for all tasks, best mean dev score (default); per_task: each task "
                        "from its own best-on-dev checkpoint")
    p.add_argument("--max-steps", type=int, help="optimizer steps")
    p.add_argument("--batch-size", type=int, help="global batch size (summed over ranks)")
    p.add_argument("--lr", type=float, help="peak learning rate (§4.1: 2e-5 for BERT-base)")
    p.add_argument("--seed", type=int, help="seed of the initial weights of new parts, the task sequence and the data "
                   "order")
    p.add_argument("--eval-every", type=int, help="evaluate on dev every N steps (and at the end)")
    p.add_argument("--early-stopping", type=int, metavar="N",
                   help="stop after N evaluations without improvement of the mean dev score (0 = off)")
    g = p.add_argument_group("task sampling")
    g.add_argument("--sampler", choices=SAMPLER_KINDS, help="proportional (Eq. 3) | temperature (NLG Eq. 4) | "
                   "annealed (PALs Eq. 6) | round_robin")
    g.add_argument("--alpha", type=float, help="proportional: q_i ∝ p_i^alpha (1 = natural mix, 0 = uniform)")
    g.add_argument("--temperature", type=float, help="temperature: p_i ∝ min(n_i, K)^(1/T)")
    g.add_argument("--size-cap", type=int, help="temperature: K")
    g.add_argument("--num-epochs", type=int, help="annealed: E (alpha goes from 1 to 0.2 over E epochs; "
                   "0 = derived from --max-steps and the epoch length)")
    g = p.add_argument_group("adaptation and ablation")
    g.add_argument("--new-skill", action="append", default=[], metavar="NAME",
                   help="add a skill (e.g. s8) to every skill layer, activated with the tasks' skills")
    g.add_argument("--new-skill-init", default="generic", metavar="SKILL",
                   help="initialise new skills as a copy of this skill ('generic': the model's generic skill, s7 "
                        "for NLU; 'random' for a fresh init)")
    g.add_argument("--new-skill-tasks", default="", metavar="T1,T2",
                   help="tasks that activate the new skills (default: every task of the config)")
    g.add_argument("--freeze-old-skills", action="store_true",
                   help="train only the new skills and the task heads (Table 5 'Update Old Skills: N')")
    g.add_argument("--drop-skill", action="append", default=[], metavar="SKILL",
                   help="ablation: remove this skill from every task that uses it (repeatable)")
    g = p.add_argument_group("data")
    g.add_argument("--skip-bad", action="store_true",
                   help="count and skip bad task records instead of stopping at the first one")
    g = p.add_argument_group("runtime")
    g.add_argument("--ds-config", dest="ds_config",
                   help="DeepSpeed JSON (ZeRO-1/2); without it: plain PyTorch, one process")
    g.add_argument("--resume", help="'auto' (the newest complete checkpoint in the output dir, if any) or a "
                   "checkpoint directory; default: start over")
    g.add_argument("--no-tensorboard", action="store_true", help="no TensorBoard event files")
    g.add_argument("--no-progress", action="store_true", help="no tqdm bars (CI logs)")
    g.add_argument("--threads", type=int, help="torch CPU threads")
    g.add_argument("--local-rank", type=int, default=None, help=argparse.SUPPRESS)  # the deepspeed launcher's
    return p


def apply_overrides(cfg: FinetuneConfig, a: argparse.Namespace) -> FinetuneConfig:
    d = cfg.to_dict()
    if a.output_dir:
        d["output_dir"] = a.output_dir
    if a.method:
        d["method"] = a.method
    if a.selection:
        d["train"]["selection"] = a.selection
    if a.init:
        d["model"]["init"] = str(Path(a.init).resolve())  # CLI paths are relative to the working directory
    for key, val in (("max_steps", a.max_steps), ("batch_size", a.batch_size), ("lr", a.lr), ("seed", a.seed),
                     ("eval_every", a.eval_every), ("early_stopping_patience", a.early_stopping)):
        if val is not None:
            d["train"][key] = val
    for key, val in (("kind", a.sampler), ("alpha", a.alpha), ("temperature", a.temperature),
                     ("size_cap", a.size_cap), ("num_epochs", a.num_epochs)):
        if val is not None:
            d["sampler"][key] = val
    if a.new_skill:
        tasks = [t for t in a.new_skill_tasks.split(",") if t]
        init = None if a.new_skill_init in ("random", "none", "") else a.new_skill_init
        d["new_skills"] = d.get("new_skills", []) + [
            NewSkill(name=n, init_from=init, tasks=tasks).__dict__ for n in a.new_skill]
    if a.freeze_old_skills:
        d["freeze_old_skills"] = True
    if a.drop_skill:
        d["drop_skills"] = sorted(set(d.get("drop_skills", [])) | set(a.drop_skill))
    if a.skip_bad:
        d["skip_bad"] = True
    return FinetuneConfig.from_dict(d, where="config + command line", base_dir=cfg.base_dir)


# ----------------------------------------------------------------------------------------- model
def _init_kind(path: str, arch: Any) -> str:
    """'skillnet' or 'dense' from the folder's config.json (cheap: no weights are read)."""
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"model.init {path} has no config.json (a folder written by save_pretrained / export)")
    try:
        model_type = json.loads(cfg_file.read_text(encoding="utf-8")).get("model_type")
    except json.JSONDecodeError as e:
        raise ConfigError(f"{cfg_file}: invalid JSON ({e.msg})") from None
    if model_type == arch.skillnet_type:
        return "skillnet"
    if model_type == arch.dense_type:
        return "dense"
    raise ConfigError(f"model.init {path}: model_type {model_type!r} is neither a SkillNet export "
                      f"({arch.skillnet_type!r}) nor a dense HF checkpoint ({arch.dense_type!r})")


def build_reference(cfg: FinetuneConfig, data: dict[str, TaskData]) -> tuple[torch.nn.Module, list[str]]:
    """The SkillNet model every method starts from, with every config task registered (skills, and a head
    per task for BERT; BART's tasks share its LM head).

    From ``model.init``: a SkillNet export as it is, or a dense HF checkpoint with every skill a copy of its
    FFN (the "w/o sparse pre-training" row of Table 3; SkillNet-NLG's initialisation); without it, a preset
    with weights drawn from the seed. Heads are drawn from (seed, task name), so a task's head starts the
    same whatever the other tasks are (``task_specific`` trains each task alone from the same weights as
    the joint methods)."""
    from skillnet.finetune.archs import ARCHS
    from skillnet.model.surgery import add_skill

    arch = ARCHS[cfg.arch]
    model_cls = arch.model_cls()
    torch.manual_seed(cfg.train.seed)
    if cfg.model.init:
        init = cfg.resolve(cfg.model.init)
        if not Path(init).exists():
            raise ConfigError(f"model.init {init} does not exist (a folder written by save_pretrained / export)")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        if _init_kind(init, arch) == "dense":
            model = arch.from_dense()(init)
        else:
            model = model_cls.from_pretrained(init)
        if getattr(model.config, "router", "task") != "task":
            raise ConfigError(f"model.init {init} is a {model.config.router!r}-router model; every method starts "
                              "from a SkillNet (router 'task') export or a dense checkpoint")
    else:
        model = model_cls(arch.config_cls().preset(cfg.model.preset, **cfg.model.overrides))
    mc = model.config
    new_names = []
    for ns in cfg.new_skills:
        if ns.name in mc.skill_names:
            raise ConfigError(f"new skill {ns.name!r} already exists in the model (skills: {mc.skill_names})")
        src = mc.generic_skill if ns.init_from == "generic" else ns.init_from
        add_skill(model, ns.name, init_from=src, description=ns.description or "new task skill (§3.4)")
        new_names.append(ns.name)
    for t in cfg.tasks:
        skills = cfg.effective_skills(t)
        if not arch.has_heads:
            mc.set_task(t.name, skills)
            continue
        head = data[t.name].head_spec()
        old = (mc.task_heads or {}).get(t.name)
        same = (t.name in model.heads and old is not None
                and all(old.get(k) == head.get(k) for k in ("type", "num_labels", "labels")))
        if same:
            mc.set_task(t.name, skills)  # keep the trained head of a task the checkpoint already knows
        else:
            with torch.random.fork_rng():
                torch.manual_seed(cfg.train.seed * 1_000_003 + _stable_task_seed(t.name))
                model.add_task(t.name, skills, head)
    for s in cfg.drop_skills:
        try:
            mc.drop_skill(s)
        except (KeyError, ValueError) as e:
            raise ConfigError(f"--drop-skill {s}: {e}") from None
    return model, new_names


def _stable_task_seed(name: str) -> int:
    import zlib

    return zlib.crc32(name.encode("utf-8"))


def build_model(cfg: FinetuneConfig, data: dict[str, TaskData]) -> tuple[torch.nn.Module, list[str]]:
    """The multi-task model of ``cfg.method`` (finetune/methods.py); returns (model, new skills)."""
    from skillnet.finetune.methods import METHODS

    ref, new_names = build_reference(cfg, data)
    with torch.random.fork_rng():
        # What a method adds (gate, map, PALs) is drawn from the seed, not from the RNG's history.
        torch.manual_seed(cfg.train.seed + 7919)
        model = METHODS[cfg.method].build(ref)
    if cfg.freeze_old_skills:
        freeze_all_but(model, new_names, [t.name for t in cfg.tasks])
    return model, new_names


def freeze_all_but(model: torch.nn.Module, skills: Sequence[str], heads: Sequence[str]) -> None:
    """requires_grad only for the given skills and task heads (embeddings, attention, old skills frozen)."""
    from skillnet.model.surgery import skill_parameters

    keep = {id(p) for s in skills for p in skill_parameters(model)[s]}
    if hasattr(model, "heads"):  # BART's tasks have no heads of their own
        keep |= {id(p) for h in heads for p in model.heads[h].parameters()}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)


def parameter_report(model: torch.nn.Module, tasks: Sequence[str]) -> dict[str, Any]:
    from skillnet.model.counts import activated_parameters, count_parameters, trainable_activated_parameters

    c = count_parameters(model)
    return {
        "total": c["total"], "trainable": c["trainable"], "shared": c["shared"], "skills": c["skills"],
        "tasks": {t: {"skills": model.config.task_skill_names(t), "activated": activated_parameters(model, t),
                      "trainable_activated": trainable_activated_parameters(model, t)} for t in tasks},
    }


# ----------------------------------------------------------------------------------------- saving
def save_model_dir(model: torch.nn.Module, path: Path, data: dict[str, TaskData], vocab: Path,
                   inherited: dict[str, Any] | None = None) -> None:
    """save_pretrained + task metadata + vocab, written to a temp dir and renamed (never half-written).

    `inherited`: task metadata of the checkpoint this run started from, so an adapted model can still
    predict the tasks it learnt before (their heads are in the weights)."""
    from skillnet.model.card import finish_export
    from skillnet.model.hub import save_tokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    known = model.heads if hasattr(model, "heads") else model.config.tasks  # BART's tasks share the LM head
    tasks = {n: m for n, m in (inherited or {}).items() if n in known}
    tasks.update({n: d.meta() for n, d in data.items()})
    meta = {"tasks": tasks, "vocab": "vocab.txt", "lowercase": True}
    (tmp / META_FILE).write_text(json.dumps(meta, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    save_tokenizer(tmp, vocab, lowercase=True)
    finish_export(model, tmp, final=path)  # default task, pipeline labels/prompts, model card
    old = path.with_name(f".{path.name}.old")
    shutil.rmtree(old, ignore_errors=True)
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def load_weights(model: torch.nn.Module, path: Path) -> None:
    from safetensors.torch import load_file

    files = sorted(Path(path).glob("*.safetensors"))
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied weights (BART's embeddings and LM head) are saved once: missing names of a loaded tensor are fine.
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = {id(params[k]) for k in state if k in params}
    missing = [k for k in missing if k not in params or id(params[k]) not in loaded]
    if missing or unexpected:
        raise RuntimeError(f"{path}: weights do not fit the model (missing {missing[:4]}, unexpected {unexpected[:4]})")


# ----------------------------------------------------------------------------------------- evaluation
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
        self.bad_evals = 0
        self.trainer: Any = None
        self.per_task = cfg.train.selection == "per_task"
        self.history: list[dict[str, Any]] = []
        self.early_stopped = False

    def state_dict(self) -> dict[str, Any]:
        return {"best": self.best, "best_step": self.best_step, "best_mean": self.best_mean,
                "best_mean_step": self.best_mean_step, "bad_evals": self.bad_evals, "history": self.history}

    def load_state_dict(self, s: dict[str, Any]) -> None:
        self.best, self.best_step = dict(s["best"]), {k: int(v) for k, v in s["best_step"].items()}
        self.best_mean, self.bad_evals = float(s["best_mean"]), int(s["bad_evals"])
        self.best_mean_step = s.get("best_mean_step")
        self.history = list(s.get("history", []))

    def __call__(self, model: torch.nn.Module, step: int) -> dict[str, float]:
        res: dict[str, float] = {}
        sel = []
        bs = self.cfg.train.eval_batch_size
        for name, d in self.data.items():
            if "dev" not in d.records:
                continue
            scores = d.score("dev", d.predict_split(model, "dev", bs))
            for k, v in scores.items():
                res[f"{name}/{k}"] = v
            s = scores[d.cfg.metric]
            sel.append(s)
            if s > self.best.get(name, -math.inf):
                self.best[name] = s
                self.best_step[name] = step
                if self.is_main and self.per_task:
                    save_model_dir(model, self.out / "best_per_task" / name, self.data, self.vocab,
                                   self.inherited)
        if sel:
            mean = sum(sel) / len(sel)
            res["mean_dev"] = mean
            if mean > self.best_mean:
                self.best_mean, self.best_mean_step, self.bad_evals = mean, step, 0
                if self.is_main and not self.per_task:
                    save_model_dir(model, self.out / "best", self.data, self.vocab, self.inherited)
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
                             "train_examples": d.num_train}
        for split in ("dev", "test"):
            if split in d.records:
                preds = d.predict_split(model, split, bs, progress=progress)
                r[split] = d.score(split, preds)
                r[f"trivial_{split}"] = d.trivial_baseline(split)
                r[f"{split}_examples"] = len(d.records[split])
                if d.codec.shows_samples:  # what a reader wants to see of a generation model
                    samples[name] = [d.codec.sample(x, y)
                                     for x, y in zip(d.records[split][:SAMPLES], preds[:SAMPLES])]
        results[name] = r
    model.load_state_dict(final_state)
    if samples:
        _write_json(out / "samples.json", samples)
    return results


def results_markdown(results: dict[str, Any], summary: dict[str, Any] | None = None) -> str:
    lines = []
    if summary is not None:
        sel = ("one checkpoint for all tasks (best mean dev score)" if summary.get("selection") == "mean"
               else "each task from its own best-on-dev checkpoint (per-task selection)")
        if summary.get("method") == "task_specific":
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


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------- main
@dataclass
class Setup:
    """Everything a fine-tuning run is made of (also what tests drive step by step)."""

    cfg: FinetuneConfig
    out: Path
    data: dict[str, TaskData]
    source: MultiTaskBatchSource
    model: torch.nn.Module
    trainer: Any
    evaluator: DevEvaluator
    params: dict[str, Any]
    vocab: Path
    rank: int
    world: int


def setup(cfg: FinetuneConfig, *, ds_config: str | None = None, resume: str | None = None,
          tensorboard: bool = True, progress: bool = True, data: dict[str, TaskData] | None = None) -> Setup:
    """Build data, sampler, model and trainer. ``data``: task data already loaded (task_specific runs
    load every task once and train each alone)."""
    from skillnet.data_prep.tokenizer import load_tokenizer
    from skillnet.model.surgery import skill_parameters
    from skillnet.training import TrainConfig, Trainer, prepare
    from skillnet.training import dist as D
    from skillnet.training.optim import build_param_groups

    tc = cfg.train
    out = Path(cfg.output_dir).resolve()  # relative to the working directory, unlike data paths
    raw = TrainConfig(
        output_dir=str(out), max_steps=tc.max_steps, lr=tc.lr, betas=tuple(tc.betas), eps=tc.eps,
        weight_decay=tc.weight_decay, warmup_steps=int(round(tc.warmup_ratio * tc.max_steps)),
        max_grad_norm=tc.grad_clip, seed=tc.seed, save_every=tc.save_every, keep_last=tc.keep_last,
        log_every=tc.log_every, eval_every=tc.eval_every, resume=resume, ds_config=ds_config,
        tensorboard=tensorboard, progress=progress,
    )
    if ds_config is None:
        raw.micro_batch_size = tc.batch_size
        raw.grad_accum = 1
    tcfg, _ = prepare(raw)
    rank, world = D.rank(), D.world_size()
    if ds_config is not None and tcfg.micro_batch_size * world * tcfg.grad_accum != tc.batch_size:
        log.warning("global batch from the DeepSpeed JSON (%d x %d ranks x %d accum) differs from "
                    "train.batch_size=%d; using the JSON's", tcfg.micro_batch_size, world, tcfg.grad_accum,
                    tc.batch_size)
    torch.manual_seed(tc.seed)

    tok = load_tokenizer(cfg.resolve(cfg.model.vocab) if cfg.model.vocab else None)
    if data is None:
        data = load_task_data(cfg, tok)
    sizes = {n: d.num_train_rows() for n, d in data.items()}
    for n, k in sizes.items():
        if k == 0:
            raise TaskDataError(data[n].files.get("train", n), 0, f"task {n!r} has no usable training example")
    global_batch = tcfg.micro_batch_size * world
    steps_per_epoch = max(1, sum(math.ceil(k / global_batch) for k in sizes.values()))
    sampler = build_sampler(cfg.sampler, sizes, seed=tc.seed, steps_per_epoch=steps_per_epoch,
                            max_steps=tc.max_steps)
    source = MultiTaskBatchSource(data, sampler, tcfg.micro_batch_size, rank=rank, world_size=world, seed=tc.seed)

    model, new_skills = build_model(cfg, data)
    params = parameter_report(model, [t.name for t in cfg.tasks])
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "finetune_config.json").write_text(cfg.to_json(), encoding="utf-8")
        _write_json(out / "params.json", params)
        _print_plan(cfg, data, sampler, params, new_skills, steps_per_epoch)
    inherited = None
    if cfg.model.init and (Path(cfg.resolve(cfg.model.init)) / META_FILE).is_file():
        inherited = json.loads((Path(cfg.resolve(cfg.model.init)) / META_FILE).read_text(encoding="utf-8"))["tasks"]
    evaluator = DevEvaluator(cfg, data, source, out, tok.vocab_path, rank == 0, inherited)
    method = METHODS[cfg.method]
    frag = method.own_lr_fragment
    groups = build_param_groups(model, tc.weight_decay, {frag: tc.skill_map_lr} if frag else None,
                                check=method.zero_grad_fragments)
    loss_fn = label_smoothed_loss(tc.label_smoothing) if tc.label_smoothing > 0 else None
    trainer = Trainer(model, source, tcfg, evaluator=evaluator, skill_params=skill_parameters(model),
                      param_groups=groups, loss_fn=loss_fn, config_text=cfg.to_json(),
                      extra_state={"evaluator": evaluator})
    evaluator.trainer = trainer
    return Setup(cfg, out, data, source, model, trainer, evaluator, params, tok.vocab_path, rank, world)


def label_smoothed_loss(eps: float) -> Any:
    """Cross-entropy with label smoothing `eps` over the target tokens (padding -100 excluded), plus the
    model's auxiliary loss when it has one (MoE balancing), in place of the model's plain CE."""
    import torch.nn.functional as F

    def loss(batch: Any, out: Any) -> torch.Tensor:
        labels = batch.tensors["labels"]
        ce = F.cross_entropy(out.logits.flatten(0, -2).float(), labels.reshape(-1), ignore_index=-100,
                             label_smoothing=eps)
        aux = getattr(out, "aux_loss", None)
        return ce if aux is None else ce + aux

    return loss


def load_task_data(cfg: FinetuneConfig, tok: Any) -> dict[str, TaskData]:
    return {t.name: TaskData(t, cfg, tok, skip_bad=cfg.skip_bad) for t in cfg.tasks}


def run(cfg: FinetuneConfig, *, ds_config: str | None = None, resume: str | None = None,
        tensorboard: bool = True, progress: bool = True) -> dict[str, Any]:
    """Train and evaluate; returns the results dict (also written to results.json/.md on rank 0)."""
    if METHODS[cfg.method].per_task:
        return _run_per_task(cfg, ds_config=ds_config, resume=resume, tensorboard=tensorboard, progress=progress)
    summary = _run_joint(cfg, ds_config=ds_config, resume=resume, tensorboard=tensorboard, progress=progress)
    return summary.get("tasks", {})


def _run_joint(cfg: FinetuneConfig, *, ds_config: str | None, resume: str | None, tensorboard: bool,
               progress: bool, data: dict[str, TaskData] | None = None, write: bool = True) -> dict[str, Any]:
    from skillnet.model.card import refresh_model_cards
    from skillnet.training import dist as D

    t_start = time.time()
    st = setup(cfg, ds_config=ds_config, resume=resume, tensorboard=tensorboard, progress=progress, data=data)
    initial_map = skill_map.snapshot(st.model, list(st.data))
    result = st.trainer.train()
    if result.stopped_by_signal and not st.evaluator.early_stopped:
        # Interrupted (SIGTERM/SIGINT), not early-stopped: the checkpoint is saved, resume with --resume auto.
        if st.rank == 0:
            print(f"[finetune] interrupted at step {result.step}; resume with --resume auto", file=sys.stderr)
        return {}
    summary: dict[str, Any] = {}
    if st.rank == 0:
        out, source = st.out, st.source
        save_model_dir(st.model, out / "export", st.data, st.vocab, st.evaluator.inherited)
        final_map = skill_map.snapshot(st.model, list(st.data))
        if final_map is not None:
            # initial_map is rebuilt after a resume from the same seed: it is the map the run started from
            skill_map.write(out, final_map, initial_map)
        results = final_scores(st.model, cfg, st.data, out, st.evaluator, progress)
        for name, r in results.items():
            metric = f"{name}/{r['metric']}"
            r["dev_curve"] = [[h["step"], h[metric]] for h in st.evaluator.history if metric in h]
        mix_t, mix_r = source.target_mix(), source.realised_mix()
        summary = {"method": cfg.method, "selection": cfg.train.selection, "steps": result.step,
                   "seconds": round(time.time() - t_start, 1), "world_size": st.world,
                   "sampler": cfg.sampler.to_dict(),
                   "task_mix": {t: {"target": mix_t[t], "realised": mix_r[t]} for t in mix_t},
                   "params": st.params, "tasks": results}
        if write:
            _write_results(out, summary)
            refresh_model_cards(out)  # the exports' cards, now with the scores
            print(_mix_table(mix_t, mix_r), file=sys.stderr)
        if tensorboard:
            write_hparams(out, cfg, summary)
    D.barrier()
    return summary


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


def _write_results(out: Path, summary: dict[str, Any]) -> None:
    _write_json(out / "results.json", summary)
    md = results_markdown(summary["tasks"], summary)
    (out / "results.md").write_text(md, encoding="utf-8")
    print(md, file=sys.stderr)


def task_specific_budget(cfg: FinetuneConfig, sizes: dict[str, int], global_batch: int) -> dict[str, int]:
    """Steps of each task's own model: its expected share of the joint run under the configured sampler
    ("share", so all task models together cost one joint run), or max_steps each ("full")."""
    tc = cfg.train
    if tc.task_specific_budget == "full":
        return {t: tc.max_steps for t in sizes}
    spe = max(1, sum(math.ceil(k / global_batch) for k in sizes.values()))
    sampler = build_sampler(cfg.sampler, sizes, seed=tc.seed, steps_per_epoch=spe, max_steps=tc.max_steps)
    share = sampler.target_mix(0, tc.max_steps)
    return {t: max(1, round(share[t] * tc.max_steps)) for t in sizes}


def _run_per_task(cfg: FinetuneConfig, *, ds_config: str | None, resume: str | None, tensorboard: bool,
                  progress: bool) -> dict[str, Any]:
    """task_specific: one dense model per task from the same initial weights, each trained on its task
    alone in ``<output_dir>/<task>/``; one results table for all of them."""
    from skillnet.data_prep.tokenizer import load_tokenizer
    from skillnet.training import dist as D

    t_start = time.time()
    tok = load_tokenizer(cfg.resolve(cfg.model.vocab) if cfg.model.vocab else None)
    data = load_task_data(cfg, tok)
    global_batch = cfg.train.batch_size
    budget = task_specific_budget(cfg, {n: d.num_train_rows() for n, d in data.items()}, global_batch)
    out = Path(cfg.output_dir).resolve()
    summaries: dict[str, dict[str, Any]] = {}
    for t in cfg.tasks:
        d = cfg.to_dict()
        d["tasks"] = [tc for tc in d["tasks"] if tc["name"] == t.name]
        d["output_dir"] = str(out / t.name)
        d["train"]["max_steps"] = budget[t.name]
        d["sampler"]["order"] = []  # one task: nothing to order
        sub = FinetuneConfig.from_dict(d, where=f"task_specific/{t.name}", base_dir=cfg.base_dir)
        if D.rank() == 0:
            print(f"[finetune] task_specific: {t.name}: {budget[t.name]} steps "
                  f"({cfg.train.task_specific_budget} budget)", file=sys.stderr, flush=True)
        s = _run_joint(sub, ds_config=ds_config, resume=resume, tensorboard=tensorboard, progress=progress,
                       data={t.name: data[t.name]}, write=False)
        if not s and D.rank() == 0:
            return {}  # interrupted: rerun with --resume auto
        summaries[t.name] = s
    if D.rank() != 0:
        return {}
    tasks = {n: {**s["tasks"][n], "run": n, "steps": s["steps"]} for n, s in summaries.items()}
    per_task_params = {n: s["params"] for n, s in summaries.items()}
    params = {
        "total": sum(p["total"] for p in per_task_params.values()),
        "trainable": sum(p["trainable"] for p in per_task_params.values()),
        "shared": 0, "skills": {},
        "tasks": {n: p["tasks"][n] for n, p in per_task_params.items()},
        "per_task_models": {n: p["total"] for n, p in per_task_params.items()},
    }
    summary = {"method": cfg.method, "selection": cfg.train.selection, "steps": sum(budget.values()),
               "budget": budget, "seconds": round(time.time() - t_start, 1), "world_size": D.world_size(),
               "sampler": cfg.sampler.to_dict(), "params": params, "tasks": tasks}
    out.mkdir(parents=True, exist_ok=True)
    _write_json(out / "params.json", params)
    _write_results(out, summary)
    return tasks


def _mix_table(target: dict[str, float], real: dict[str, float]) -> str:
    rows = ["task mix      target  realised"] + [f"  {t:<12} {target[t]:6.3f}  {real[t]:6.3f}" for t in target]
    return "\n".join(rows)


def _print_plan(cfg: FinetuneConfig, data: dict[str, TaskData], sampler: Any, params: dict[str, Any],
                new_skills: list[str], steps_per_epoch: int) -> None:
    p0 = sampler.probabilities(0)
    lines = [f"[finetune] method {cfg.method}: {METHODS[cfg.method].summary}",
             f"[finetune] {len(data)} tasks, sampler {cfg.sampler.kind}, {cfg.train.max_steps} steps "
             f"(one epoch over all tasks = {steps_per_epoch} steps)"]
    if hasattr(sampler, "schedule"):
        lines.append("  annealed sampling, alpha per epoch: " + ", ".join(
            f"e{e}@{first}: {a:.2f}" for e, first, a in sampler.schedule()))
    warn = annealing_warning(sampler, cfg.train.max_steps)
    if warn:
        log.warning("warning: %s", warn)
    for (name, d), q in zip(data.items(), p0):
        pt = params["tasks"][name]
        lines.append(f"  {name:<14} {d.cfg.type:<14} train={d.num_train:<7} q={q:.3f} skills={','.join(pt['skills'])} "
                     f"activated={pt['activated']:,} trainable={pt['trainable_activated']:,}")
    for name, d in data.items():
        for split, rep in d.reports.items():
            if rep.num_skipped:
                lines.append(f"  --skip-bad: {name}/{split}: " + rep.summary().replace("\n", "\n    "))
        if d.skipped_windows:
            lines.append(f"  {name}/train: skipped {d.skipped_windows} examples whose answer fits no window")
        cut = d.truncated
        if any(cut.values()):
            lines.append(f"  {name}: truncated at max_seq_len={d.max_len}: "
                         + ", ".join(f"{split} {n} of {len(d.records[split])}" for split, n in cut.items()))
    if not any(any(d.truncated.values()) for d in data.values()):
        lines.append("  no example is truncated by max_seq_len")
    if new_skills:
        lines.append(f"  new skills: {', '.join(new_skills)}; frozen old skills: {cfg.freeze_old_skills}")
    if cfg.drop_skills:
        lines.append(f"  ablation: dropped {', '.join(cfg.drop_skills)} from every task")
    lines.append(f"  parameters: total {params['total']:,}, trainable {params['trainable']:,}")
    print("\n".join(lines), file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    a = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if a.threads:
        torch.set_num_threads(a.threads)
    from skillnet.data_prep.tokenizer import TokenizerError

    try:
        cfg = apply_overrides(FinetuneConfig.load(a.config), a)
        cfg.check_model(where=a.config)  # every config error before any data is loaded
        run(cfg, ds_config=a.ds_config, resume=a.resume, tensorboard=not a.no_tensorboard,
            progress=not a.no_progress)
    except (ConfigError, TaskDataError, TokenizerError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
