"""Pre-training: sparse MLM + NSP of SkillNet-BERT (the SkillNet-NLU paper §3.5, Appendix B), dense BERT, dense BART.

    python pretrain/run.py --shards data/shards --preset small --output-dir runs/pt        # one process
    deepspeed pretrain/run.py --ds-config ds_configs/zero2.json --shards ... --preset base  # ZeRO-2
    python pretrain/run.py --dense --objectives mlm --shards ... --output-dir runs/bert    # dense BERT
    python pretrain/run.py --arch bart --shards ... --output-dir runs/bart                 # BART denoising
    python -m skillnet.pretrain.export --checkpoint runs/pt --out runs/pt/hf               # HF folder

SkillNet-BERT: each optimizer step trains one objective drawn with equal chance (same draw on every rank):
MLM activates {s2, s7}, NSP {s1, s3, s7}. Skills that a step did not use stay bit-identical (parameters
and Adam moments) also under ZeRO-1/2, through training.optim.MaskedAdamW. --dense trains a plain BERT
(no skill layers; exported as HF BertForPreTraining, the --init-from-dense of a sparse run). --arch bart
trains a dense BART with text infilling (exported as HF BartForConditionalGeneration).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from skillnet.common.files import atomic_write_text
from skillnet.pretrain import options
from skillnet.pretrain.archs import (
    ARCHS,
    PretrainArch,
    build_dataset,
    build_model,
    check_args,
    describe_mode,
)
from skillnet.pretrain.recipes import (
    DEFAULTS,
    PRETRAIN_DEFAULTS,
    TRAIN_SETTINGS,
    ResolvedSettings,
    describe,
    describe_checkpoint,
    resolve_settings,
)

# Set before the model code imports transformers (lazily, in main): pre-training never downloads.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

__all__ = ["ARCHS", "PretrainArch", "build_parser", "main", "build_model", "build_dataset"]


def build_parser() -> argparse.ArgumentParser:
    return options.build_parser(__doc__)


def make_evaluator(dataset: Any, args: argparse.Namespace, micro_batch_size: int, objectives: list[str]):
    """Loss/accuracy of each objective on fixed probe batches (a far-away epoch id keeps them fixed)."""
    import numpy as np
    from skillnet.training import Batch
    from skillnet.training.logging import accuracy_metrics

    n = int(dataset.num_samples)
    probe = np.random.default_rng([args.seed, 7_777]).permutation(n)[: micro_batch_size * args.eval_batches]

    def evaluate(model: torch.nn.Module, step: int) -> dict[str, float]:
        dev = next(model.parameters()).device
        res: dict[str, float] = {}
        for obj in objectives:
            tot_loss, correct, count = 0.0, 0.0, 0.0
            for b in range(args.eval_batches):
                idx = probe[b * micro_batch_size : (b + 1) * micro_batch_size].tolist()
                batch = Batch(obj, {k: v.to(dev) for k, v in dataset.batch(idx, 10**6, obj).items()})
                out = model(task=obj, **batch.tensors)
                tot_loss += float(out.loss)
                c, k = accuracy_metrics(batch, out).get("acc", (0.0, 0.0))
                correct, count = correct + float(c), count + float(k)  # counts may be device tensors
            res[f"{obj}/loss"] = tot_loss / args.eval_batches
            if count:
                res[f"{obj}/acc"] = correct / count
        return res

    return evaluate


def resolve_args(args: argparse.Namespace, raw: dict[str, Any] | None) -> ResolvedSettings:
    """Fill the settings of DEFAULTS in ``args`` (flag > DeepSpeed JSON ``raw`` > recipe > default);
    returns them with their sources. Raises ValueError with a one-line message."""
    flags = {name: getattr(args, name) for name in DEFAULTS}
    settings = resolve_settings(flags, raw, args.recipe, ds_source=str(args.ds_config),
                                model_from=args.init_from_dense)
    for name in DEFAULTS:
        setattr(args, name, settings[name])
    return settings


def _batch_sources(args: argparse.Namespace, raw: dict[str, Any] | None, used: tuple[int, int],
                   world: int, resharded: bool = False) -> tuple[str, str]:
    """Where the micro-batch and the accumulation of the run come from. ``used``: (micro, accumulation) as
    resolved; ``resharded``: a checkpoint resumed on another number of ranks, whose global batch prepare kept,
    re-deriving the accumulation (and the micro-batch, where the flag's or the JSON's does not divide it)."""
    raw = raw or {}
    out = []
    for flag, key, value in (
        (args.micro_batch_size, "train_micro_batch_size_per_gpu", used[0]),
        (args.grad_accum, "gradient_accumulation_steps", used[1]),
    ):
        given = raw.get(key) if raw.get(key) not in (None, "auto") else None
        out.append("flag" if flag is not None else "ds_config" if given is not None else "default/derived")
        if resharded and (key == "gradient_accumulation_steps" or value != (flag if flag is not None else given)):
            out[-1] = (f"derived: the checkpoint's global batch {used[0] * used[1] * world} over {world} rank(s)"
                       + (f" of micro-batch {used[0]}" if key == "gradient_accumulation_steps" else ""))
    return out[0], out[1]


def check_init_checkpoint(args: argparse.Namespace, vocab_size: int | None = None) -> None:
    """What loading --init-from-dense needs, checked before anything is spent (a dry run stops after it): a
    folder with the architecture's dense config.json and weights; given ``vocab_size`` (the data's), the same
    vocabulary. Raises FileNotFoundError / ValueError with a one-line message."""
    if not args.init_from_dense:
        return
    folder = Path(args.init_from_dense)
    dense = ARCHS[args.arch].family.dense_type
    what = (f"a dense HF {dense} model folder (config.json and *.safetensors or pytorch_model*.bin; pre-training "
            f"never downloads, so a hub name is not one)")
    if not folder.is_dir():
        raise FileNotFoundError(f"--init-from-dense {folder}: no such folder; give {what}")
    try:
        cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"--init-from-dense {folder}: no config.json; give {what}") from None
    except ValueError as e:
        raise ValueError(f"{folder / 'config.json'}: not valid JSON ({e})") from None
    if cfg.get("model_type", dense) != dense:
        raise ValueError(f"--init-from-dense {folder}: a {cfg['model_type']!r} model; --arch {args.arch} starts "
                         f"from {what}")
    if not (any(folder.glob("*.safetensors")) or any(folder.glob("pytorch_model*.bin"))):
        raise FileNotFoundError(f"--init-from-dense {folder}: no weights (*.safetensors or pytorch_model*.bin)")
    if vocab_size is not None and cfg.get("vocab_size") != vocab_size:
        data, fix = ((f"--synthetic-vocab {vocab_size}", f"give --synthetic-vocab {cfg.get('vocab_size')}")
                     if args.synthetic else (f"the shards' vocab_size {vocab_size}",
                                             "build the shards with that model's vocab"))
        raise ValueError(f"--init-from-dense {folder}: vocab_size {cfg.get('vocab_size')} differs from {data}; {fix}")


def check_whole_word_mask(args: argparse.Namespace, dataset: Any) -> None:
    """--whole-word-mask masks the words the shards mark (`data_prep build --whole-word`). Without them the
    dataset would mask WordPiece '##' continuations, on Chinese single characters: refused, so that no run
    trains per-character masking under the flag's name. Raises ValueError."""
    if not args.whole_word_mask:
        return
    build = "`python -m skillnet.data_prep build --whole-word`"
    if args.synthetic:
        raise ValueError(f"--whole-word-mask: the synthetic corpus has no words; give --shards built with {build}")
    shards = dataset.manifest["shards"]
    without = [r["name"] for r in shards if "ww" not in r.get("files", {})]
    if without:
        raise ValueError(
            f"--whole-word-mask: {args.shards} holds no word ids ({len(without)} of {len(shards)} shards were built "
            f"without --whole-word), so MLM would mask WordPiece pieces (on Chinese text, single characters); "
            f"rebuild the shards with {build}, or drop --whole-word-mask")


def resume_point(cfg: Any, rank: int, world: int) -> int:
    """The step the run continues from (0: it starts), checked as the trainer will load it, before anything
    is built: a damaged or missing checkpoint, or one of the other kind (plain PyTorch against DeepSpeed),
    ends in one line here instead of a traceback after the model is built."""
    from skillnet.training.checkpoint import CheckpointManager, ResumeError, kind_problem
    from skillnet.training.reshard import read_trainer_state

    tdir = CheckpointManager(cfg.output_dir, rank, world, cfg.keep_last).locate(cfg.resume) if cfg.resume else None
    if tdir is None:
        return 0
    state = read_trainer_state(tdir)
    problem = kind_problem(tdir, int(state["world_size"]), world, deepspeed=bool(cfg.ds_config))
    if problem is not None:
        raise ResumeError(problem)
    return int(state["step"])


def write_run_args(path: Path, settings: dict[str, Any], first_step: int) -> None:
    """run_args.json: this segment's settings at the top level, and under ``segments`` every segment of the run
    with its steps ``[first, last]`` and settings, so a resume with other settings (``--no-packing``) does not
    rewrite the steps before it as if they had run so. A segment's last step is set when the run ends, or by
    the resume after it (to the step that resume continues from: what a killed segment did past it is trained
    again); a resume with the same settings extends its segment."""
    settings = json.loads(json.dumps(settings))  # as the file holds them (a tuple reads back as a list)
    old = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    segments = old.pop("segments", None)
    if segments is None:  # a file from before segments were kept: its settings ran the steps before this one
        segments = [{"steps": [1, None], "args": old}] if old and first_step > 1 else []
    segments = [s for s in segments if s["steps"][0] < first_step]
    for s in segments:
        if s["steps"][1] is None or s["steps"][1] >= first_step:
            s["steps"][1] = first_step - 1
    if segments and _what_ran(segments[-1]["args"]) == _what_ran(settings):
        segments[-1]["steps"][1] = None
    else:
        segments.append({"steps": [first_step, None], "args": settings})
    atomic_write_text(path, json.dumps({**settings, "segments": segments}, indent=2))


def settings_in_effect(args: argparse.Namespace, cfg: Any, data_workers: int) -> dict[str, Any]:
    """run_args.json's settings: the flags, with every one left unset that the run resolved filled in with the
    value in effect (the trainer's from the DeepSpeed JSON, recipe or defaults after the batch geometry is
    derived; BART's noise from its defaults), so the record says what ran, not only what was typed. A setting
    that does not apply (BART's noise in a BERT run) stays null."""
    from skillnet.pretrain.archs import MASK_RATIO, POISSON_LAMBDA

    out = {**vars(args), "data_workers": data_workers}
    for name in options.FLAGS:
        if out.get(name) is None and getattr(cfg, name, None) is not None:
            out[name] = getattr(cfg, name)
    if args.arch == "bart":
        out["mask_ratio"] = MASK_RATIO if args.mask_ratio is None else args.mask_ratio
        out["poisson_lambda"] = POISSON_LAMBDA if args.poisson_lambda is None else args.poisson_lambda
    return out


def _what_ran(settings: dict[str, Any]) -> dict[str, Any]:
    """A segment's settings without the launch's wiring (how the segment was started, not what it trained)."""
    return {k: v for k, v in settings.items() if k not in ("resume", "overwrite", "dry_run", "local_rank")}


def end_run_args(path: Path, last_step: int) -> None:
    """The run's last segment ends at ``last_step`` (the run finished or stopped there, saved)."""
    record = json.loads(path.read_text(encoding="utf-8"))
    record["segments"][-1]["steps"][1] = last_step
    atomic_write_text(path, json.dumps(record, indent=2))


def _sample_logger(path: Path) -> Any:
    """An ``on_batch`` hook that appends one JSON line per micro-batch (flushed: a killed run keeps them)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    f = open(path, "a")  # noqa: SIM115 (open for the life of the run)

    def log(step: int, micro: int, epoch: int, indices: list[int]) -> None:
        f.write(json.dumps({"step": step + 1, "micro": micro, "epoch": epoch, "indices": indices}) + "\n")
        f.flush()

    return log


# What a pre-training run writes in its --output-dir (--overwrite removes these, and nothing else there).
RUN_FILES = ("checkpoints", "log.jsonl", "tensorboard", "run_args.json", "train_config.json", "skill_init.safetensors")
# The options that make two runs in one --output-dir the same run (a resume) rather than different ones.
RUN_IDENTITY = ("arch", "dense", "preset", "model_config", "init_from_dense", "shards", "synthetic", "synthetic_vocab",
                "max_seq_len")


def claim_output_dir(args: argparse.Namespace, rank: int) -> None:
    """--output-dir for this run (common/outputs.py): every rank decides alike, rank 0 then marks it (and
    with --overwrite removes the earlier run's files) while the others wait."""
    from skillnet.common.outputs import claim_output, remove_own
    from skillnet.training import dist as D

    ident = {k: getattr(args, k, None) for k in RUN_IDENTITY}
    if ident["model_config"]:
        ident["model_config"] = Path(ident["model_config"]).read_text(encoding="utf-8")
    kw = dict(option="--output-dir", command="pretrain", identity=ident, overwrite=args.overwrite,
              describe=lambda p: "a run without a marker (from before runs were marked, or another tool's files)")
    claim = claim_output(args.output_dir, write=False, **kw)
    D.barrier()
    if rank == 0:
        claim_output(args.output_dir, **kw)
        if claim.state == "overwrite":
            remove_own(Path(args.output_dir), RUN_FILES)
            print(f"--overwrite: the earlier run's files in {args.output_dir} were removed", flush=True)
    D.barrier()


def main(argv: list[str] | None = None) -> int:
    from skillnet.common.outputs import at_least, check_options, non_negative
    from skillnet.training.config import check_train_flags, train_overrides

    parser = build_parser()
    args = parser.parse_args(argv)
    check_train_flags(parser, args, options.FLAGS)
    check_options(parser, args, {"eval_batches": at_least(1), "max_seq_len": at_least(8), "synthetic": non_negative(),
                                 "data_workers": non_negative()})
    from skillnet.data_prep.shards import ShardError
    from skillnet.data_prep.tokenizer import TokenizerError
    from skillnet.model import skill_parameters
    from skillnet.pretrain.objectives import ObjectiveSampler, PretrainBatchSource
    from skillnet.training import SkillStatistics, Trainer, prepare
    from skillnet.training import dist as D
    from skillnet.training.activation_checkpointing import (
        enable_activation_checkpointing,
        resolve_activation_checkpointing,
    )
    from skillnet.training.checkpoint import CheckpointError, ResumeError
    from skillnet.training.config import DsConfigError, load_ds_config

    # Bad settings or data (wrong shard dir, unknown preset, JSON/launch mismatch, corpus too small) end
    # with one line naming the problem; errors once training runs keep their traceback.
    try:
        raw_ds = load_ds_config(args.ds_config) if args.ds_config else None
        settings = resolve_args(args, raw_ds)
        ckpt = resolve_activation_checkpointing(args.gradient_checkpointing, raw_ds, str(args.ds_config))
        check_args(args)
        check_init_checkpoint(args)
        # The stage's defaults, then the flags given, then the resolved sources of DEFAULTS (recipe, JSON).
        cfg = dataclasses.replace(PRETRAIN_DEFAULTS, **{
            **train_overrides(args, options.FLAGS), **{name: settings[name] for name in TRAIN_SETTINGS},
            "gradient_checkpointing": ckpt.enabled, "output_dir": args.output_dir, "ds_config": args.ds_config,
            "resume": None if args.resume in ("none", "") else args.resume,
        })
        vars(args).update({name: getattr(cfg, name) for name in options.FLAGS})  # run_args.json: what ran
        cfg, ds = prepare(cfg)
        cfg.max_steps = args.max_steps  # the JSON's total_num_steps sets the decay end, not the run length
        rank, world = D.rank(), D.world_size()
        # prepare re-derives the batch geometry of a checkpoint resumed on another number of ranks (its global
        # batch kept) and asks DeepSpeed for a universal load then
        resharded = bool(((ds or {}).get("checkpoint") or {}).get("load_universal")) and not (
            ((raw_ds or {}).get("checkpoint") or {}).get("load_universal"))
        if not args.dry_run:  # before anything is written there (the sample log, run_args.json)
            claim_output_dir(args, rank)
        # (a dry run with --overwrite: the launch would start over, if that folder holds another run)
        resumed_at = 0 if args.dry_run and args.overwrite else resume_point(cfg, rank, world)
        dataset = build_dataset(args)
        check_whole_word_mask(args, dataset)
        check_init_checkpoint(args, getattr(dataset, "vocab_size", None))
        sampler = ObjectiveSampler(
            seed=args.seed,
            objectives=tuple(args.objectives),
            mode=args.objective_mode,
            weights=tuple(args.objective_weights) if args.objective_weights else None,
        )
        trained = [
            name
            for i, name in enumerate(sampler.objectives)
            if sampler.mode == "both" or sampler.weights is None or sampler.weights[i] > 0
        ]
        if hasattr(dataset, "check_objective"):
            for name in trained:
                dataset.check_objective(name)
        assert cfg.micro_batch_size is not None and cfg.grad_accum is not None
        # Whether rows pack, decided once: the mode line, the batches and run_args.json say the same
        args.packing = ARCHS[args.arch].packs and cfg.packing
        start_lines = describe(
            settings,
            schedule=cfg.schedule,
            decay_steps=cfg.decay_steps,
            decay_source="ds_config" if cfg.decay_steps is not None else "= max_steps",
            sparse_updates=cfg.sparse_updates,
            micro_batch_size=cfg.micro_batch_size,
            grad_accum=cfg.grad_accum,
            world_size=world,
            batch_sources=_batch_sources(args, raw_ds, (cfg.micro_batch_size, cfg.grad_accum), world, resharded),
            ds_config=args.ds_config,
            mode=describe_mode(args),
            memory=ckpt.describe(),
            model=describe_checkpoint(args.init_from_dense) if args.init_from_dense else None,
        )
        cuda = torch.cuda.is_available()
        workers = args.data_workers if args.data_workers is not None else (2 if cuda else 0)
        if workers < 0:
            raise ValueError(f"--data-workers must be >= 0, got {workers}")
        source = PretrainBatchSource(
            dataset, sampler, cfg.micro_batch_size, cfg.grad_accum, rank, world, args.seed,
            workers=workers, pin_memory=cuda, packing=args.packing,
        )
        if args.log_samples:
            source.on_batch = _sample_logger(Path(args.output_dir) / f"samples_rank{rank}.jsonl")
        if rank == 0:
            print("\n".join(start_lines), flush=True)
        if args.dry_run:
            return 0
        model = build_model(args, getattr(dataset, "vocab_size", None), dataset)
        enable_activation_checkpointing(model, ckpt)
    except (DsConfigError, ShardError, TokenizerError, FileNotFoundError, KeyError, ValueError, OSError,
            ResumeError) as e:
        print(f"error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    # The probe batches keep the size the run started with, also after a requeue re-derived the micro-batch.
    json_micro = (raw_ds or {}).get("train_micro_batch_size_per_gpu")
    probe_micro = args.micro_batch_size or (json_micro if isinstance(json_micro, int) else cfg.micro_batch_size)
    evaluator = make_evaluator(dataset, args, probe_micro, trained) if args.eval_every else None
    n_params = sum(p.numel() for p in model.parameters())  # before ZeRO-3 partitions them
    # A dense model has no skill parameters: no per-skill statistics (the gradient norms would all log 0).
    skill_params = {} if args.dense else skill_parameters(model)
    callbacks = [SkillStatistics(skill_params)] if skill_params else []
    trainer = Trainer(model, source, cfg, evaluator=evaluator, callbacks=callbacks)
    if rank == 0:
        print(
            json.dumps(
                {
                    "event": "start",
                    "arch": args.arch,
                    "dense": args.dense,
                    "objectives": args.objectives,
                    "params": n_params,
                    "world_size": world,
                    "micro_batch_size": cfg.micro_batch_size,
                    "grad_accum": cfg.grad_accum,
                    "global_batch": cfg.micro_batch_size * cfg.grad_accum * world,
                    "max_steps": cfg.max_steps,
                    "zero_stage": trainer.zero_stage,
                    "settings": settings.to_json(),
                    "activation_checkpointing": ckpt.to_json(),
                }
            ),
            flush=True,
        )
        Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
        if resumed_at < cfg.max_steps:  # a finished run started again trains nothing: its record stays
            write_run_args(Path(cfg.output_dir) / "run_args.json", settings_in_effect(args, cfg, workers),
                           resumed_at + 1)

    try:
        result = trainer.train()
    except (CheckpointError, ResumeError) as e:  # nothing intact to resume from: one line, not a traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
    if rank == 0 and resumed_at < cfg.max_steps:
        end_run_args(Path(cfg.output_dir) / "run_args.json", result.step)
    if args.dump_rank_weights:
        from safetensors.torch import save_file

        state = {k: v.detach().cpu().contiguous().clone() for k, v in trainer.module.state_dict().items()}
        save_file(state, str(Path(cfg.output_dir) / f"rank{rank}_weights.safetensors"))
    if rank == 0:
        print(
            json.dumps(
                {
                    "event": "end",
                    "step": result.step,
                    "stopped_by_signal": result.stopped_by_signal,
                    "checkpoint": result.checkpoint,
                    # this rank's peak of allocated GPU memory (what experiments/memory.py predicts)
                    **({"peak_device_bytes": torch.cuda.max_memory_allocated()} if torch.cuda.is_available() else {}),
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
