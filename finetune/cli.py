"""The command line of multi-task fine-tuning of SkillNet-BERT (the SkillNet-NLU paper §3.3-3.4, §4.1, Table 6).

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
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from skillnet.common.cli import Parser
from skillnet.common.safe_load import UntrustedCheckpointError, add_trust_flag
from skillnet.data_prep.tasks.schema import TaskDataError
from skillnet.training.config import add_train_flags, check_train_flags, train_overrides

from .config import FINETUNE_DEFAULTS, ConfigError, FinetuneConfig, NewSkill
from .methods import METHODS, method_names
from .samplers import SAMPLER_KINDS


def skills_table(markdown: bool = False) -> str:
    """The skills of SkillNet-NLU (Table 1) and SkillNet-NLG, each with the tasks of the papers that use it."""
    from skillnet.model.bart import NLG_SKILLS, NLG_TASKS
    from skillnet.model.config import DEFAULT_SKILLS, DEFAULT_TASKS

    out = []
    for title, skills, tasks, always in (
        ("SkillNet-NLU (BERT; Table 1 of the paper, tasks of its Table 2 and pre-training)", DEFAULT_SKILLS,
         DEFAULT_TASKS, "s7"),
        ("SkillNet-NLG (BART; skills in every other layer)", NLG_SKILLS, NLG_TASKS, "general"),
    ):
        rows = [(s["name"], s["description"], "every task" if s["name"] == always else
                 ", ".join(t for t, names in tasks.items() if s["name"] in names) or "-") for s in skills]
        if markdown:
            out.append(f"**{title}**\n\n| skill | what it is for | tasks that use it |\n| --- | --- | --- |\n"
                       + "\n".join(f"| `{n}` | {d} | {t} |" for n, d, t in rows))
        else:
            width = max(len(n) for n, _, _ in rows)
            out.append(title + "\n" + "\n".join(f"  {n:<{width}}  {d:<45}  {t}" for n, d, t in rows))
    return "\n\n".join(out)


class _ListSkills(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kw: object) -> None:
        print(skills_table())
        print("\nA task's config lists its skills (\"skills\": [...]); the generic skill is always on. Map your own "
              "task by what it needs (docs/finetune.md, 'Choosing skills'); --new-skill adds one (e.g. s8).")
        parser.exit()


# The TrainConfig fields this command takes as flags (training.config.add_train_flags); the config file's "train"
# section takes every field.
FLAGS = ("max_steps", "batch_size", "lr", "warmup_ratio", "weight_decay", "max_grad_norm", "seed", "eval_every",
         "log_every", "save_every", "keep_last", "early_stopping_patience", "selection", "select_min_distinct",
         "label_smoothing", "task_grad_norm", "packing", "gradient_checkpointing", "compile", "zero_comm",
         "profile_steps")


def _packing_note() -> str:
    """Which task types pack, from their codecs (finetune/task_types)."""
    from .task_types import codec_for, task_types

    packs = [t for t in task_types() if codec_for(t).packs]
    rest = [t for t in task_types() if not codec_for(t).packs]
    return (f"{', '.join(packs)} tasks, where it computes fewer slots, with each example's loss and outputs "
            f"unchanged; {', '.join(rest)} keep one example per row")


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
    p.add_argument("--list-skills", action=_ListSkills, nargs=0, help="print the skills (s1-s7, the NLG skills), "
                   "what each is for and which tasks use it, then exit")
    p.add_argument("--output-dir", help="where logs, checkpoints, best models and results go")
    p.add_argument("--init", help="SkillNet export or dense HF BERT folder to start from (overrides model.init)")
    p.add_argument("--method", choices=method_names(),
                   help="multi-task method (finetune/methods.py): " + "; ".join(
                       f"{n}: {m.summary}" for n, m in METHODS.items()) + " (default: the config's, else skillnet)")
    add_train_flags(p.add_argument_group("training (the config's \"train\" section; a flag given here wins)"),
                    FLAGS, FINETUNE_DEFAULTS, source="the config's train",
                    notes={"packing": _packing_note()})
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
                        "for BERT, general for BART; the start-up plan names it; 'random' for a fresh init)")
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
    g.add_argument("--resume", help="'auto' (the newest intact checkpoint in the output dir, if any) or a "
                   "checkpoint directory; default: 'auto' when the output dir holds an unfinished run of the same "
                   "configuration, else start")
    add_trust_flag(g)
    g.add_argument("--overwrite", action="store_true",
                   help="train into an output dir that holds another run (its results, checkpoints and exports are "
                        "replaced); without it such a dir is refused, and a finished run of the same configuration "
                        "is left as it is")
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
    if a.init:
        d["model"]["init"] = str(Path(a.init).resolve())  # CLI paths are relative to the working directory
    given = train_overrides(a, FLAGS)
    if "warmup_ratio" in given:
        d["train"]["warmup_steps"] = 0  # the flag's ratio replaces a step count of the file
    d["train"].update(given)
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


# What a fine-tuning run writes in its output dir (--overwrite replaces these, and nothing else there).
RUN_FILES = ("checkpoints", "best", "export", "results.json", "results.md", "params.json", "log.jsonl", "tensorboard",
             "train_config.json", "skill_init.safetensors", "predictions", "finetune_config.json")


def claim_run_dir(cfg: FinetuneConfig, resume: str | None, overwrite: bool) -> str | None:
    """The output dir for this run (common/outputs.py); returns the --resume to use, or "done".

    Same configuration: a finished run (results.json) is left as it is ("done"), an unfinished one resumes
    from its newest intact checkpoint. Another run there is refused, or with ``overwrite`` its files go."""
    from skillnet.common.outputs import claim_output, remove_own

    ident = cfg.to_dict()
    ident.pop("output_dir", None)
    # Memory, not results: a run resumed with or without checkpointing is the same run (equal gradients).
    ident["train"].pop("gradient_checkpointing", None)
    # "off" trains as every run from before the option did: such a run, whose identity lacks it, is this one.
    if ident["train"].get("task_grad_norm") == "off":
        ident["train"].pop("task_grad_norm")
    out = Path(cfg.output_dir)
    claim = claim_output(out, option="--output-dir", command="finetune.run", identity=ident, overwrite=overwrite,
                         ignore=("run.log",))
    if claim.state == "overwrite":
        remove_own(out, RUN_FILES)
        print(f"[finetune] --overwrite: the earlier run's files in {out} were removed", file=sys.stderr)
        return resume if resume not in (None, "auto") else None
    if claim.state == "own" and resume is None:
        if (out / "results.json").is_file():
            print(f"[finetune] {out} already holds this configuration's finished run (results.json); nothing to do. "
                  f"Add --overwrite to train it again", file=sys.stderr)
            return "done"
        if (out / "checkpoints").is_dir():
            print(f"[finetune] {out} holds this configuration's unfinished run: resuming it (--resume auto)",
                  file=sys.stderr)
            return "auto"
    return resume


def main(argv: Sequence[str] | None = None) -> int:
    from skillnet.common.outputs import at_least, check_options, non_negative, positive

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    parser = build_parser()
    a = parser.parse_args(argv)
    check_train_flags(parser, a, FLAGS)
    check_options(parser, a, {"alpha": non_negative(), "temperature": positive(), "size_cap": at_least(1),
                              "num_epochs": non_negative(), "threads": at_least(1)})
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if a.threads:
        import torch

        torch.set_num_threads(a.threads)
    from skillnet.common.outputs import OutputError
    from skillnet.data_prep.tokenizer import TokenizerError
    from skillnet.training.config import DsConfigError
    from skillnet.training.dist import LaunchError

    from .run import run

    try:
        cfg = apply_overrides(FinetuneConfig.load(a.config), a)
        cfg.check_model(where=a.config)  # a config error leaves the output dir as it was (not even created)
        resume = claim_run_dir(cfg, a.resume, a.overwrite)
        if resume == "done":
            return 0
        run(cfg, ds_config=a.ds_config, resume=resume, tensorboard=not a.no_tensorboard,
            progress=not a.no_progress, where=a.config)
    except (ConfigError, TaskDataError, TokenizerError, FileNotFoundError, OutputError, LaunchError,
            DsConfigError, UntrustedCheckpointError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
