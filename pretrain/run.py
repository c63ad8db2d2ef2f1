"""Sparse MLM + NSP pre-training of SkillNet-BERT (skillnet-nlu.md §3.5, Appendix B).

    python pretrain/run.py --shards data/shards --preset small --output_dir runs/pt        # one process
    deepspeed pretrain/run.py --ds_config ds_configs/zero2.json --shards ... --preset base  # ZeRO-2
    python -m skillnet.pretrain.export --checkpoint runs/pt --out runs/pt/hf                        # HF folder

Each optimizer step trains one objective drawn with equal chance (same draw on every rank): MLM
activates {s2, s7}, NSP {s1, s3, s7}. Skills that a step did not use stay bit-identical (parameters and
Adam moments) also under ZeRO-1/2, through training.optim.MaskedAdamW.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# `deepspeed pretrain/run.py` and `python pretrain/run.py` run this file as a script: make the repo
# root importable so it works from a plain clone without `pip install -e .`.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import json  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from skillnet.pretrain.recipes import DEFAULTS, RECIPES, ResolvedSettings, describe, resolve_settings  # noqa: E402

__all__ = ["build_parser", "main", "build_model", "build_dataset"]

PRETRAIN_SKILLS = ("s1", "s2", "s3", "s7")  # Appendix B: initialised from the dense BERT's FFN


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="pretrain/run.py",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = p.add_argument_group("data")
    d.add_argument(
        "--shards", help="shard directory built by `python -m skillnet.data_prep build` (manifest.json + .bin/.idx)"
    )
    d.add_argument(
        "--synthetic",
        type=int,
        default=0,
        metavar="N",
        help="train on N deterministic synthetic samples instead of shards (smoke tests, benchmarks)",
    )
    d.add_argument(
        "--synthetic_vocab", type=int, default=21128, help="vocab size of the synthetic corpus (>= 872)"
    )
    d.add_argument(
        "--max_seq_len", type=int, default=None, help="tokens per sample (default 128; recipe paper: 512)"
    )
    d.add_argument("--mlm_probability", type=float, default=0.15)
    d.add_argument(
        "--short_seq_prob",
        type=float,
        default=0.1,
        help="share of NSP pairs whose target length is drawn uniformly in [2, max_seq_len - 3] "
        "instead of the full length (default 0.1, as BERT)",
    )
    d.add_argument(
        "--whole_word_mask", action="store_true", help="mask whole words (needs word ids in shards)"
    )

    m = p.add_argument_group("model")
    m.add_argument(
        "--preset",
        default=None,
        help="model size preset from model/config.py PRESETS: tiny, small, base (default tiny; recipe paper: base)",
    )
    m.add_argument("--model_config", help="JSON file of SkillNetBertConfig fields (overrides --preset)")
    m.add_argument(
        "--init_from_dense",
        metavar="DIR",
        help="HF BERT folder: copy embeddings/attention and initialise s1, s2, s3, s7 from its FFN",
    )

    o = p.add_argument_group("objectives")
    o.add_argument(
        "--objective_mode",
        choices=["sample", "both"],
        default="sample",
        help="'sample': one objective per step with equal chance (paper); 'both': every step "
        "accumulates one MLM and one NSP micro-batch (needs even --grad_accum)",
    )
    o.add_argument(
        "--objective_weights",
        type=float,
        nargs=2,
        metavar=("MLM", "NSP"),
        help="sampling weights (default equal)",
    )

    t = p.add_argument_group(
        "training (a flag > the DeepSpeed JSON > --recipe > the default; a flag that contradicts the JSON "
        "is an error; the effective values and their sources are printed at start)"
    )
    t.add_argument(
        "--ds_config", help="DeepSpeed JSON (ds_configs/*.json); omit for plain single-process PyTorch"
    )
    t.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default=None,
        help="named settings, usable with any ZeRO config. paper: " + RECIPES["paper"].reference,
    )
    t.add_argument(
        "--dry_run",
        action="store_true",
        help="resolve and print the settings, check the data, then exit without building the model",
    )
    t.add_argument("--output_dir", default="runs/pretrain")
    t.add_argument(
        "--max_steps",
        type=int,
        default=None,
        help="default: the JSON scheduler's total_num_steps, else the recipe's (paper: 100000), else 100",
    )
    t.add_argument("--micro_batch_size", type=int, default=None, help="per rank (default: JSON, else 8)")
    t.add_argument(
        "--grad_accum", type=int, default=None, help="gradient accumulation steps (default: JSON, else 1)"
    )
    t.add_argument("--lr", type=float, default=None, help="peak learning rate (default 1e-4; recipe paper: 3e-5)")
    t.add_argument("--betas", type=float, nargs=2, default=None, help="Adam betas (default 0.9 0.98)")
    t.add_argument("--eps", type=float, default=None, help="Adam epsilon (default 1e-6)")
    t.add_argument("--weight_decay", type=float, default=None, help="(default 0.01)")
    t.add_argument(
        "--warmup_steps", type=int, default=None, help="linear warmup steps (default 0; recipe paper: 10000)"
    )
    t.add_argument("--max_grad_norm", type=float, default=None, help="gradient clipping (default 1.0)")
    t.add_argument(
        "--dense_updates",
        action="store_true",
        help="plain AdamW semantics (inactive skills move with momentum/decay) instead of sparse updates",
    )
    t.add_argument("--seed", type=int, default=0)
    t.add_argument(
        "--save_every", type=int, default=0, help="checkpoint every N steps (always at exit and on SIGTERM)"
    )
    t.add_argument("--keep_last", type=int, default=2)
    t.add_argument("--log_every", type=int, default=10)
    t.add_argument("--eval_every", type=int, default=0, help="evaluate on fixed probe batches every N steps")
    t.add_argument("--eval_batches", type=int, default=4, help="probe batches per objective for evaluation")
    t.add_argument(
        "--resume",
        default="auto",
        help="'auto' (default): continue from <output_dir>/checkpoints/latest if present; 'none'; or a path",
    )
    t.add_argument("--no_tensorboard", action="store_true")
    t.add_argument("--no_progress", action="store_true")
    t.add_argument(
        "--dump_rank_weights",
        action="store_true",
        help="at the end every rank writes <output_dir>/rank<r>_weights.safetensors (replica checks)",
    )
    t.add_argument("--sigterm_at_step", type=int, default=None, help=argparse.SUPPRESS)  # test hook
    t.add_argument("--sigterm_group", action="store_true", help=argparse.SUPPRESS)  # test hook
    t.add_argument(
        "--local_rank", type=int, default=None, help=argparse.SUPPRESS
    )  # set by the deepspeed launcher
    return p


def build_dataset(args: argparse.Namespace) -> Any:
    if args.synthetic:
        from skillnet.pretrain.synthetic import SyntheticPretrainingDataset

        return SyntheticPretrainingDataset(
            args.synthetic,
            vocab_size=args.synthetic_vocab,
            max_seq_len=args.max_seq_len,
            seed=args.seed,
            mlm_probability=args.mlm_probability,
        )
    if not args.shards:
        raise SystemExit(
            "pretrain/run.py: give --shards DIR (built by `python -m skillnet.data_prep build`) or --synthetic N"
        )
    from skillnet.pretrain.dataset import PretrainingDataset

    kwargs: dict[str, Any] = dict(
        max_seq_len=args.max_seq_len,
        seed=args.seed,
        mlm_probability=args.mlm_probability,
        short_seq_prob=args.short_seq_prob,
    )
    if args.whole_word_mask:
        kwargs["whole_word_mask"] = True
    return PretrainingDataset(args.shards, **kwargs)


def build_model(args: argparse.Namespace, vocab_size: int | None) -> torch.nn.Module:
    from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining, skillnet_from_dense

    if args.init_from_dense:
        model = skillnet_from_dense(
            args.init_from_dense, model_class=SkillNetBertForPreTraining, init_skills=list(PRETRAIN_SKILLS)
        )
        if vocab_size is not None and model.config.vocab_size != vocab_size:
            raise SystemExit(
                f"--init_from_dense {args.init_from_dense}: vocab_size {model.config.vocab_size} differs from the "
                f"shards' vocab_size {vocab_size}; build the shards with that model's vocab"
            )
        return model
    overrides: dict[str, Any] = {}
    if args.model_config:
        overrides = json.loads(Path(args.model_config).read_text())
    if vocab_size is not None:
        overrides["vocab_size"] = vocab_size
    overrides.setdefault("max_position_embeddings", max(512, args.max_seq_len))
    cfg = SkillNetBertConfig.preset(args.preset, **overrides)
    torch.manual_seed(args.seed)  # same init on every rank (DeepSpeed also broadcasts rank 0's weights)
    return SkillNetBertForPreTraining(cfg)


def make_evaluator(dataset: Any, args: argparse.Namespace, micro_batch_size: int):
    """Loss/accuracy of both objectives on fixed probe batches (a far-away epoch id keeps them fixed)."""
    import numpy as np

    n = int(dataset.num_samples)
    probe = np.random.default_rng([args.seed, 7_777]).permutation(n)[: micro_batch_size * args.eval_batches]

    def evaluate(model: torch.nn.Module, step: int) -> dict[str, float]:
        dev = next(model.parameters()).device
        res: dict[str, float] = {}
        for obj in ("mlm", "nsp"):
            tot_loss, correct, count = 0.0, 0.0, 0.0
            for b in range(args.eval_batches):
                idx = probe[b * micro_batch_size : (b + 1) * micro_batch_size].tolist()
                batch = {k: v.to(dev) for k, v in dataset.batch(idx, 10**6, obj).items()}
                out = model(task=obj, **batch)
                tot_loss += float(out.loss)
                mets = getattr(out, "metrics", None) or {}
                correct += float(mets.get(f"{obj}_correct", 0.0))
                count += float(mets.get(f"{obj}_count", 0.0))
            res[f"{obj}/loss"] = tot_loss / args.eval_batches
            if count:
                res[f"{obj}/acc"] = correct / count
        return res

    return evaluate


def resolve_args(args: argparse.Namespace, raw: dict[str, Any] | None) -> ResolvedSettings:
    """Fill the settings of DEFAULTS in ``args`` (flag > DeepSpeed JSON ``raw`` > recipe > default);
    returns them with their sources. Raises ValueError with a one-line message."""
    flags = {name: getattr(args, name) for name in DEFAULTS}
    settings = resolve_settings(flags, raw, args.recipe, ds_source=str(args.ds_config))
    for name in DEFAULTS:
        setattr(args, name, settings[name])
    return settings


def _batch_sources(args: argparse.Namespace, raw: dict[str, Any] | None) -> tuple[str, str]:
    raw = raw or {}
    out = []
    for flag, key in (
        (args.micro_batch_size, "train_micro_batch_size_per_gpu"),
        (args.grad_accum, "gradient_accumulation_steps"),
    ):
        given = raw.get(key) not in (None, "auto")
        out.append("flag" if flag is not None else "ds_config" if given else "default/derived")
    return out[0], out[1]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from skillnet.data_prep.shards import ShardError
    from skillnet.data_prep.tokenizer import TokenizerError
    from skillnet.model import skill_parameters
    from skillnet.pretrain.objectives import ObjectiveSampler, PretrainBatchSource
    from skillnet.training import TrainConfig, Trainer, prepare
    from skillnet.training import dist as D
    from skillnet.training.config import DsConfigError, load_ds_config

    # Bad settings or data (wrong shard dir, unknown preset, JSON/launch mismatch, corpus too small) end
    # with one line naming the problem; errors once training runs keep their traceback.
    try:
        raw_ds = load_ds_config(args.ds_config) if args.ds_config else None
        settings = resolve_args(args, raw_ds)
        cfg = TrainConfig(
            output_dir=args.output_dir,
            max_steps=args.max_steps,
            lr=args.lr,
            betas=tuple(args.betas),
            eps=args.eps,
            weight_decay=args.weight_decay,
            warmup_steps=args.warmup_steps,
            max_grad_norm=args.max_grad_norm,
            sparse_updates=not args.dense_updates,
            micro_batch_size=args.micro_batch_size,
            grad_accum=args.grad_accum,
            seed=args.seed,
            save_every=args.save_every,
            keep_last=args.keep_last,
            log_every=args.log_every,
            eval_every=args.eval_every,
            resume=None if args.resume in ("none", "") else args.resume,
            ds_config=args.ds_config,
            tensorboard=not args.no_tensorboard,
            progress=not args.no_progress,
            sigterm_at_step=args.sigterm_at_step,
            sigterm_group=args.sigterm_group,
        )
        cfg, _ = prepare(cfg)
        cfg.max_steps = args.max_steps  # the JSON's total_num_steps sets the decay end, not the run length
        rank, world = D.rank(), D.world_size()
        dataset = build_dataset(args)
        sampler = ObjectiveSampler(
            seed=args.seed,
            mode=args.objective_mode,
            weights=tuple(args.objective_weights) if args.objective_weights else None,
        )
        if hasattr(dataset, "check_objective"):
            for i, name in enumerate(sampler.objectives):
                if sampler.mode == "both" or sampler.weights is None or sampler.weights[i] > 0:
                    dataset.check_objective(name)
        assert cfg.micro_batch_size is not None and cfg.grad_accum is not None
        start_lines = describe(
            settings,
            schedule=cfg.schedule,
            decay_steps=cfg.decay_steps,
            decay_source="ds_config" if cfg.decay_steps is not None else "= max_steps",
            sparse_updates=cfg.sparse_updates,
            micro_batch_size=cfg.micro_batch_size,
            grad_accum=cfg.grad_accum,
            world_size=world,
            batch_sources=_batch_sources(args, raw_ds),
            ds_config=args.ds_config,
        )
        source = PretrainBatchSource(
            dataset, sampler, cfg.micro_batch_size, cfg.grad_accum, rank, world, args.seed
        )
        if rank == 0:
            print("\n".join(start_lines), flush=True)
        if args.dry_run:
            return 0
        model = build_model(args, getattr(dataset, "vocab_size", None))
    except (DsConfigError, ShardError, TokenizerError, FileNotFoundError, KeyError, ValueError) as e:
        print(f"error: {e.args[0] if isinstance(e, KeyError) else e}", file=sys.stderr)
        return 2
    evaluator = make_evaluator(dataset, args, cfg.micro_batch_size) if args.eval_every else None
    n_params = sum(p.numel() for p in model.parameters())  # before ZeRO-3 partitions them
    trainer = Trainer(model, source, cfg, evaluator=evaluator, skill_params=skill_parameters(model))
    if rank == 0:
        print(
            json.dumps(
                {
                    "event": "start",
                    "params": n_params,
                    "world_size": world,
                    "micro_batch_size": cfg.micro_batch_size,
                    "grad_accum": cfg.grad_accum,
                    "global_batch": cfg.micro_batch_size * cfg.grad_accum * world,
                    "max_steps": cfg.max_steps,
                    "zero_stage": trainer.zero_stage,
                    "settings": settings.to_json(),
                }
            ),
            flush=True,
        )
        Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(cfg.output_dir) / "run_args.json").write_text(json.dumps(vars(args), indent=2))
    result = trainer.train()
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
                }
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
