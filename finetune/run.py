"""Multi-task fine-tuning of SkillNet-BERT/-BART (the SkillNet-NLU paper §3.3-3.4, §4.1, Table 6). The commands and
what a run writes are in ``finetune/cli.py`` (``python -m skillnet.finetune.run --help``).

This module is the orchestration (setup, the joint run, one run per task for ``per_task`` methods, the
plan printed at the start); the command line is finetune/cli.py, the model finetune/build.py, evaluation
and results finetune/evaluation.py. The command's entry point is ``finetune.cli:main``: this module does not import
the command line (which imports it), so ``python -m skillnet.finetune.run`` hands over to it at the bottom.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from skillnet.common.files import atomic_write_json
from skillnet.data_prep.tasks.schema import TaskDataError
from skillnet.finetune import skill_map
from skillnet.finetune.build import META_FILE, build_model, parameter_report, save_model_dir
from skillnet.finetune.config import FinetuneConfig
from skillnet.finetune.evaluation import (
    DevEvaluator,
    below_trivial,
    final_scores,
    mix_table,
    write_hparams,
    write_results,
)
from skillnet.finetune.methods import METHODS
from skillnet.finetune.samplers import annealing_warning, build_sampler
from skillnet.finetune.source import MultiTaskBatchSource
from skillnet.finetune.tasks import TaskData, cut_what

log = logging.getLogger("finetune")


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
    from skillnet.training import SkillStatistics, Trainer, prepare
    from skillnet.training import dist as D
    from skillnet.training.activation_checkpointing import (
        enable_activation_checkpointing,
        resolve_activation_checkpointing,
    )
    from skillnet.training.config import load_ds_config
    from skillnet.training.optim import build_param_groups

    tc = cfg.train
    out = Path(cfg.output_dir).resolve()  # relative to the working directory, unlike data paths
    tcfg, _ = prepare(dataclasses.replace(tc, output_dir=str(out), resume=resume, ds_config=ds_config,
                                          tensorboard=tensorboard, progress=progress))
    rank, world = D.rank(), D.world_size()
    if ds_config is not None and tcfg.micro_batch_size * world * tcfg.grad_accum != tc.batch_size:
        log.warning("global batch from the DeepSpeed JSON (%d x %d ranks x %d accum) differs from "
                    "train.batch_size=%d; using the JSON's", tcfg.micro_batch_size, world, tcfg.grad_accum,
                    tc.batch_size)
    torch.manual_seed(tc.seed)

    tok = load_tokenizer(cfg.vocab_path())
    if data is None:
        data = load_task_data(cfg, tok)
    sizes = {n: d.num_train_rows() for n, d in data.items()}
    for n, k in sizes.items():
        if k == 0:
            raise TaskDataError(data[n].files.get("train", n), 0, f"task {n!r} has no usable training example")
    global_batch = tcfg.micro_batch_size * world
    steps_per_epoch = max(1, sum(math.ceil(k / global_batch) for k in sizes.values()))
    sampler = build_sampler(cfg.sampler, sizes, seed=tc.seed, steps_per_epoch=steps_per_epoch,
                            max_steps=tc.max_steps, grad_accum=tcfg.grad_accum)
    source = MultiTaskBatchSource(data, sampler, tcfg.micro_batch_size, rank=rank, world_size=world, seed=tc.seed,
                                  packing=tc.packing)

    ckpt = resolve_activation_checkpointing(tc.gradient_checkpointing, load_ds_config(ds_config) if ds_config else None,
                                            ds_config or "<ds_config>", flag_source="config")
    tc.gradient_checkpointing = ckpt.enabled  # finetune_config.json records what the run did, whatever its source
    model, new_skills = build_model(cfg, data)
    enable_activation_checkpointing(model, ckpt)
    params = parameter_report(model, [t.name for t in cfg.tasks])
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        (out / "finetune_config.json").write_text(cfg.to_json(), encoding="utf-8")
        atomic_write_json(out / "params.json", params)
        _print_plan(cfg, data, sampler, params, _with_origins(model, new_skills), steps_per_epoch, ckpt.describe(),
                    packing_lines(source))
    inherited = None
    if cfg.model.init and (Path(cfg.resolve(cfg.model.init)) / META_FILE).is_file():
        inherited = json.loads((Path(cfg.resolve(cfg.model.init)) / META_FILE).read_text(encoding="utf-8"))["tasks"]
    evaluator = DevEvaluator(cfg, data, source, out, tok.vocab_path, rank == 0, inherited)
    method = METHODS[cfg.method]
    frag = method.own_lr_fragment
    groups = build_param_groups(model, tc.weight_decay, {frag: tc.skill_map_lr} if frag else None,
                                check=method.zero_grad_fragments)
    loss_fn = label_smoothed_loss(tc.label_smoothing) if tc.label_smoothing > 0 else None
    trainer = Trainer(model, source, tcfg, evaluator=evaluator, callbacks=[SkillStatistics(skill_parameters(model))],
                      param_groups=groups, loss_fn=loss_fn, config_text=cfg.to_json(),
                      extra_state={"evaluator": evaluator})
    evaluator.trainer = trainer
    return Setup(cfg, out, data, source, model, trainer, evaluator, params, tok.vocab_path, rank, world)


def _with_origins(model: torch.nn.Module, names: list[str]) -> list[str]:
    """Each new skill with what it was copied from (`add_skill`'s record: ``s8 (copy of general)`` on BART,
    whose generic skill is not s7)."""
    from skillnet.model.surgery import skill_base_of

    mc = skill_base_of(model).config
    return [f"{n} ({mc.skills[mc.skill_index(n)].get('origin') or 'random init'})" for n in names]


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
        tensorboard: bool = True, progress: bool = True, where: str = "config") -> dict[str, Any]:
    """Train and evaluate; returns the results dict (also written to results.json/.md on rank 0).

    The config is first checked against the model it will build (`FinetuneConfig.check_model`, `where`
    naming it in errors), so every config error, the init folder's router included, comes before any
    data is loaded, from the command line and from Python alike."""
    cfg.check_model(where=where)
    if METHODS[cfg.method].per_task:
        tasks = _run_per_task(cfg, ds_config=ds_config, resume=resume, tensorboard=tensorboard, progress=progress)
    else:
        tasks = _run_joint(cfg, ds_config=ds_config, resume=resume, tensorboard=tensorboard,
                           progress=progress).get("tasks", {})
    # The run's last lines: a score at or below its trivial baseline is in results.md, but easy to miss there.
    for line in below_trivial(tasks):
        print(f"[finetune] {line}", file=sys.stderr, flush=True)
    return tasks


def _run_joint(cfg: FinetuneConfig, *, ds_config: str | None, resume: str | None, tensorboard: bool,
               progress: bool, data: dict[str, TaskData] | None = None, write: bool = True) -> dict[str, Any]:
    from skillnet.export.card import refresh_model_cards
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
        accum = st.trainer.cfg.grad_accum or 1
        summary = {"method": cfg.method, "selection": cfg.train.selection, "steps": result.step,
                   "seconds": round(time.time() - t_start, 1), "world_size": st.world,
                   "sampler": cfg.sampler.to_dict(),
                   # updates: the task's micro-batches drawn / accumulation, what compare checks across rows
                   "task_mix": {t: {"target": mix_t[t], "realised": mix_r[t], "updates": source.draws[t] / accum}
                                for t in mix_t},
                   "params": st.params, "tasks": results}
        if write:
            write_results(out, summary)
            refresh_model_cards(out)  # the exports' cards, now with the scores
            print(mix_table(mix_t, mix_r), file=sys.stderr)
        if tensorboard:
            write_hparams(out, cfg, summary)
    D.barrier()
    return summary


def task_specific_budget(cfg: FinetuneConfig, sizes: dict[str, int], global_batch: int,
                         grad_accum: int = 1) -> dict[str, int]:
    """Steps of each task's own model: under "share", the updates the joint run's sampler gives the task
    (``unit_counts``: what a stratified joint run realises exactly, so all task models together cost one
    joint run), or max_steps each ("full"). ``global_batch``: examples per micro-step over all ranks (an
    epoch's length for annealed sampling), ``grad_accum``: micro-steps per update, as the joint run has them."""
    tc = cfg.train
    if tc.task_specific_budget == "full":
        return {t: tc.max_steps for t in sizes}
    spe = max(1, sum(math.ceil(k / global_batch) for k in sizes.values()))
    sampler = build_sampler(cfg.sampler, sizes, seed=tc.seed, steps_per_epoch=spe, max_steps=tc.max_steps,
                            grad_accum=grad_accum)
    # a task's own run needs at least one step (a joint run may give a tiny task none: compare flags that)
    return {t: max(1, n) for t, n in sampler.unit_counts(tc.max_steps).items()}


def _run_per_task(cfg: FinetuneConfig, *, ds_config: str | None, resume: str | None, tensorboard: bool,
                  progress: bool) -> dict[str, Any]:
    """task_specific: one dense model per task from the same initial weights, each trained on its task
    alone in ``<output_dir>/<task>/``; one results table for all of them."""
    from skillnet.data_prep.tokenizer import load_tokenizer
    from skillnet.training import dist as D
    from skillnet.training import prepare

    t_start = time.time()
    tok = load_tokenizer(cfg.vocab_path())
    data = load_task_data(cfg, tok)
    out = Path(cfg.output_dir).resolve()
    # the batch geometry the joint run would have (setup's), so the counts are the ones it would draw
    tcfg, _ = prepare(dataclasses.replace(cfg.train, output_dir=str(out), resume=None, ds_config=ds_config,
                                          tensorboard=False, progress=False))
    budget = task_specific_budget(cfg, {n: d.num_train_rows() for n, d in data.items()},
                                  tcfg.micro_batch_size * D.world_size(), tcfg.grad_accum)
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
    atomic_write_json(out / "params.json", params)
    write_results(out, summary)
    return tasks


def truncation_lines(data: dict[str, TaskData]) -> list[str]:
    """The start-up plan's cuts: one line per task and length limit, each naming its own limit (a generation
    target cut at max_target_len is not blamed on max_seq_len)."""
    lines = []
    for name, d in data.items():
        cuts = d.cuts
        for limit in sorted({lim for c in cuts.values() for lim in c}, key=lambda lim: (lim != "max_seq_len", lim)):
            lines.append(f"  {name}: {cut_what(limit, d.cuts_per_limit)} truncated at {limit}={d.limit(limit)}: "
                         + ", ".join(f"{split} {c[limit]} of {len(d.records[split])}"
                                     for split, c in cuts.items() if c.get(limit)))
    if not lines:
        limits = ("max_seq_len", "max_target_len") if any(d.cuts_per_limit for d in data.values()) else ("max_seq_len",)
        lines.append(f"  no example is truncated by {' or '.join(limits)}")
    return lines


def prefix_lines(data: dict[str, TaskData]) -> list[str]:
    """Warnings about the task prefixes a generation source starts with (``"<task>: "``), encoded as training
    encodes them: one line per task whose prefix loses characters to [UNK] under the run's vocab (a compact
    vocab from ``data_prep vocab`` keeps only what its inputs use), and one per pair of tasks whose prefixes
    encode identically (the model cannot tell those tasks apart by their input)."""
    from skillnet.finetune.task_types.base import pieces

    lines, seen = [], {}
    for name, d in data.items():
        prefix = d.codec.meta(d).get("prefix")
        if not prefix:
            continue
        ids, offsets = pieces(d.tok, [prefix])[0]
        shown = " ".join(d.tok.vocab[i] for i in ids)
        lost = [prefix[a:b] for i, (a, b) in zip(ids, offsets) if i == d.tok.unk_id]
        if lost:
            lines.append(f"  warning: task {name!r}: its prefix {prefix!r} loses {', '.join(map(repr, lost))} to "
                         f"[UNK] under {d.tok.vocab_path} (encodes to {shown}): set the task's \"prefix\" to text "
                         f"the vocab has, or rebuild the vocab with the prefix in one of its inputs")
        key = tuple(ids)
        if key in seen:
            other, other_prefix = seen[key]
            lines.append(f"  warning: tasks {other!r} and {name!r}: their prefixes {other_prefix!r} and {prefix!r} "
                         f"encode identically ({shown}): the model cannot tell the two tasks apart by their input")
        else:
            seen[key] = (name, prefix)
    return lines


def packing_lines(source: MultiTaskBatchSource) -> list[str]:
    """One start-log line per task: whether its training rows pack (TrainConfig.packing, on by default) and
    the real-token share of its first micro-batches padded and as fed."""
    how = {"pooled": "pooled output per example", "tokens": "every token, back in its example's row after the "
           "encoder", "pairs": "source and target sides together"}
    lines = []
    for name, r in source.packing_report().items():
        if r["packs"]:
            what = f"rows pack ({how[r['kind']]}): real tokens {r['padded']:.0%} padded -> {r['fed']:.0%} packed"
        elif r["kind"]:
            what = f"one example per row [--no-packing]: real tokens {r['padded']:.0%}"
        else:
            what = f"one example per row (its type does not pack): real tokens {r['padded']:.0%}"
        lines.append(f"  {name:<14} {what}")
    return lines


def _print_plan(cfg: FinetuneConfig, data: dict[str, TaskData], sampler: Any, params: dict[str, Any],
                new_skills: list[str], steps_per_epoch: int, memory: str = "", packing: list[str] = ()) -> None:
    p0 = sampler.probabilities(0)
    lines = [f"[finetune] method {cfg.method}: {METHODS[cfg.method].summary}",
             f"[finetune] {len(data)} tasks, sampler {cfg.sampler.kind}, {cfg.train.max_steps} steps "
             f"(one epoch over all tasks = {steps_per_epoch} steps)"]
    if hasattr(sampler, "schedule"):
        lines.append("  annealed sampling, alpha per epoch: " + ", ".join(
            f"e{e}@{first}: {a:.2f}" for e, first, a in sampler.schedule()))
    if sampler.horizon:
        lines.append("  stratified draws: updates per task, exactly: " + ", ".join(
            f"{t} {n:,}" for t, n in sampler.unit_counts().items()))
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
        lines += d.codec.plan_lines(d)  # span: examples in several windows, answers in none
    lines += packing
    lines += truncation_lines(data)
    lines += prefix_lines(data)
    if new_skills:
        lines.append(f"  new skills: {', '.join(new_skills)}; frozen old skills: {cfg.freeze_old_skills}")
    if cfg.drop_skills:
        lines.append(f"  ablation: dropped {', '.join(cfg.drop_skills)} from every task")
    lines.append(f"  parameters: total {params['total']:,}, trainable {params['trainable']:,}")
    if memory:
        lines.append(f"  {memory}")
    print("\n".join(lines), file=sys.stderr, flush=True)


if __name__ == "__main__":  # python -m skillnet.finetune.run, deepspeed finetune/run.py: the command
    from skillnet.finetune.cli import main

    sys.exit(main())
