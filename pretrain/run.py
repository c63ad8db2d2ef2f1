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
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from skillnet.pretrain.recipes import DEFAULTS, RECIPES, ResolvedSettings, describe, resolve_settings
from skillnet.training.cli import Parser

# Set before the model code imports transformers (lazily, in main): pre-training never downloads.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

__all__ = ["ARCHS", "PretrainArch", "build_parser", "main", "build_model", "build_dataset"]

PRETRAIN_SKILLS = ("s1", "s2", "s3", "s7")  # Appendix B: initialised from the dense BERT's FFN
MASK_RATIO, POISSON_LAMBDA = 0.3, 3.0  # BART's text infilling (Lewis et al. 2020, §2.2 and §5.1)


def build_parser() -> argparse.ArgumentParser:
    p = Parser("skillnet.pretrain.run", description=__doc__)
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
        "--synthetic-vocab", type=int, default=21128, help="vocab size of the synthetic corpus (>= 872)"
    )
    d.add_argument(
        "--max-seq-len", type=int, default=None, help="tokens per sample (default 128; recipe paper: 512)"
    )
    d.add_argument("--mlm-probability", type=float, default=0.15, help="share of tokens masked for MLM (BERT: 0.15)")
    d.add_argument(
        "--short-seq-prob",
        type=float,
        default=0.1,
        help="share of NSP pairs whose target length is drawn uniformly in [2, max_seq_len - 3] "
        "instead of the full length (default 0.1, as BERT)",
    )
    d.add_argument(
        "--whole-word-mask", action="store_true", help="MLM: mask whole words (needs word ids in shards)"
    )
    d.add_argument(
        "--mask-ratio",
        type=float,
        default=None,
        help=f"denoise: share of the tokens masked by text infilling (default {MASK_RATIO}, as BART)",
    )
    d.add_argument(
        "--poisson-lambda",
        type=float,
        default=None,
        help=f"denoise: mean span length of text infilling, lengths ~ Poisson(lambda) (default {POISSON_LAMBDA})",
    )
    d.add_argument(
        "--permute-sentences",
        action="store_true",
        help="denoise: shuffle the sentences of each sample before infilling (sentence ends from the shards)",
    )

    m = p.add_argument_group("model")
    m.add_argument(
        "--arch",
        choices=sorted(ARCHS),
        default="bert",
        help="bert (default): SkillNet-BERT, or a dense BERT with --dense; objectives mlm, nsp. "
        "bart: a dense SkillNet-BART (no skill layers, bert-base-chinese vocab); objective denoise",
    )
    m.add_argument(
        "--dense",
        action="store_true",
        help="no skill layers: every layer keeps one FFN under HF's names, so the export is a plain HF "
        "model (BertForPreTraining) that --init-from-dense and fine-tuning's model.init take "
        "(always on with --arch bart)",
    )
    m.add_argument(
        "--preset",
        default=None,
        help="model size preset: bert: model/config.py PRESETS tiny, small, base (default tiny; recipe "
        "paper: base); bart: model/bart.py BART_PRESETS tiny, small, base, large (default tiny)",
    )
    m.add_argument(
        "--model-config", help="JSON file of SkillNetBertConfig / SkillNetBartConfig fields (overrides --preset)"
    )
    m.add_argument(
        "--gradient-checkpointing",
        action="store_true",
        default=None,
        help="activation checkpointing: keep only each layer's input and recompute the layer in the backward "
        "pass (less activation memory, about one more forward pass of compute; same gradients). Also on when "
        "the DeepSpeed JSON has an activation_checkpointing section (its cpu_checkpointing offloads the kept "
        "inputs to host memory)",
    )
    m.add_argument(
        "--init-from-dense",
        metavar="DIR",
        help="HF BERT folder (bert: copy embeddings/attention and initialise s1, s2, s3, s7 from its FFN; "
        "with --dense, continue from it) or HF BART folder (bart: continue from it)",
    )

    o = p.add_argument_group("objectives")
    o.add_argument(
        "--objectives",
        nargs="+",
        choices=sorted({o for a in ARCHS.values() for o in a.objectives}),
        default=None,
        help="what to train: bert: mlm and/or nsp (default: mlm nsp); bart: denoise (the default)",
    )
    o.add_argument(
        "--objective-mode",
        choices=["sample", "both"],
        default="sample",
        help="'sample': one objective per step with equal chance (paper); 'both': every step "
        "accumulates one micro-batch of each objective (--grad-accum a multiple of their number)",
    )
    o.add_argument(
        "--objective-weights",
        type=float,
        nargs="+",
        metavar="W",
        help="sampling weights, one per objective in --objectives order, e.g. '3 1' for mlm nsp (default equal)",
    )

    t = p.add_argument_group(
        "training (a flag > the DeepSpeed JSON > --recipe > the default; a flag that contradicts the JSON "
        "is an error; the effective values and their sources are printed at start)"
    )
    t.add_argument(
        "--ds-config", help="DeepSpeed JSON (ds_configs/*.json); omit for plain single-process PyTorch"
    )
    t.add_argument(
        "--recipe",
        choices=sorted(RECIPES),
        default=None,
        help="named settings, usable with any ZeRO config. paper: " + RECIPES["paper"].reference,
    )
    t.add_argument(
        "--dry-run",
        action="store_true",
        help="resolve and print the settings, check the data, then exit without building the model",
    )
    t.add_argument("--output-dir", default="runs/pretrain", help="checkpoints, log.jsonl, tensorboard/ and run_args.json")
    t.add_argument(
        "--max-steps",
        type=int,
        default=None,
        help="default: the JSON scheduler's total_num_steps, else the recipe's (paper: 100000), else 100",
    )
    t.add_argument("--micro-batch-size", type=int, default=None, help="per rank (default: JSON, else 8)")
    t.add_argument(
        "--grad-accum", type=int, default=None, help="gradient accumulation steps (default: JSON, else 1)"
    )
    t.add_argument("--lr", type=float, default=None, help="peak learning rate (default 1e-4; recipe paper: 3e-5)")
    t.add_argument("--betas", type=float, nargs=2, default=None, help="Adam betas (default 0.9 0.98)")
    t.add_argument("--eps", type=float, default=None, help="Adam epsilon (default 1e-6)")
    t.add_argument("--weight-decay", type=float, default=None, help="(default 0.01)")
    t.add_argument(
        "--warmup-steps", type=int, default=None, help="linear warmup steps (default 0; recipe paper: 10000)"
    )
    t.add_argument("--max-grad-norm", type=float, default=None, help="gradient clipping (default 1.0)")
    t.add_argument(
        "--dense-updates",
        action="store_true",
        help="plain AdamW semantics (inactive skills move with momentum/decay) instead of sparse updates",
    )
    t.add_argument("--seed", type=int, default=0, help="initial weights, objective draws and the data order")
    t.add_argument(
        "--data-workers",
        type=int,
        default=None,
        help="processes per rank that build batches ahead (same batches and order as 0, which builds them "
        "in the training process); default: 2 on a GPU, 0 on a CPU, where they would take the cores training "
        "uses",
    )
    t.add_argument(
        "--save-every", type=int, default=0, help="checkpoint every N steps (always at exit and on SIGTERM)"
    )
    t.add_argument("--keep-last", type=int, default=2, help="complete checkpoints kept (older ones are deleted)")
    t.add_argument("--log-every", type=int, default=10, help="log averaged metrics every N steps (0: never)")
    t.add_argument("--eval-every", type=int, default=0, help="evaluate on fixed probe batches every N steps")
    t.add_argument("--eval-batches", type=int, default=4, help="probe batches per objective for evaluation")
    t.add_argument(
        "--resume",
        default="auto",
        help="'auto' (default): continue from <output_dir>/checkpoints/latest if present; 'none'; or a path. "
        "A DeepSpeed checkpoint may be resumed on another number of ranks (same ZeRO stage): the global batch "
        "is kept and micro-batch x accumulation re-derived (docs/pretrain.md, 'Requeue on another size')",
    )
    t.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in an --output-dir that holds a run of another model or data (its checkpoints and logs "
        "are removed); without it such a dir is refused, and a run of the same model and data resumes",
    )
    t.add_argument(
        "--new-schedule",
        action="store_true",
        help="on resume, follow this run's LR schedule (e.g. a larger --max-steps moves the decay's end) and "
        "print it; without it, a resume whose --max-steps, --lr, --warmup-steps or decay end differ from the "
        "checkpoint's is refused (the LR would jump)",
    )
    t.add_argument(
        "--compile",
        action="store_true",
        help="torch.compile each encoder/decoder layer (in place: checkpoint names unchanged); on a GPU it fuses "
        "the layers' elementwise work, and the first steps of each objective pay the compilation",
    )
    t.add_argument(
        "--zero-comm",
        choices=("auto", "json"),
        default="auto",
        help="auto: on one rank, ZeRO-1/2's overlap_comm and contiguous_gradients are turned off (nothing to "
        "reduce across ranks; they only copy every gradient and synchronise the device each step); json: keep "
        "the DeepSpeed JSON's values (default: %(default)s)",
    )
    t.add_argument(
        "--profile-steps",
        metavar="FIRST:LAST",
        default=None,
        help="record optimizer steps FIRST..LAST with torch.profiler: <output_dir>/profile/ gets a Perfetto trace "
        "and a summary per rank (wall and device-busy time per step, top operators); e.g. 20:25, after warm-up",
    )
    t.add_argument("--no-tensorboard", action="store_true", help="no TensorBoard event files")
    t.add_argument("--no-progress", action="store_true", help="no tqdm bar (CI logs)")
    t.add_argument(
        "--dump-rank-weights",
        action="store_true",
        help="at the end every rank writes <output_dir>/rank<r>_weights.safetensors (replica checks)",
    )
    t.add_argument(
        "--log-samples",
        action="store_true",
        help="every rank appends the dataset indices of each micro-batch to <output_dir>/samples_rank<r>.jsonl "
        "(an audit of the data order, e.g. across a resume)",
    )
    t.add_argument("--sigterm-at-step", type=int, default=None, help=argparse.SUPPRESS)  # test hook
    t.add_argument("--sigterm-group", action="store_true", help=argparse.SUPPRESS)  # test hook
    t.add_argument(
        "--local-rank", type=int, default=None, help=argparse.SUPPRESS
    )  # set by the deepspeed launcher
    return p


def _bert_dataset(args: argparse.Namespace) -> Any:
    if args.synthetic:
        from skillnet.pretrain.synthetic import SyntheticPretrainingDataset

        return SyntheticPretrainingDataset(
            args.synthetic,
            vocab_size=args.synthetic_vocab,
            max_seq_len=args.max_seq_len,
            seed=args.seed,
            mlm_probability=args.mlm_probability,
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


def _bart_dataset(args: argparse.Namespace) -> Any:
    from skillnet.pretrain.denoising import DenoisingDataset

    return DenoisingDataset(
        args.shards,
        max_seq_len=args.max_seq_len,
        seed=args.seed,
        mask_ratio=MASK_RATIO if args.mask_ratio is None else args.mask_ratio,
        poisson_lambda=POISSON_LAMBDA if args.poisson_lambda is None else args.poisson_lambda,
        permute_sentences=args.permute_sentences,
    )


def build_dataset(args: argparse.Namespace) -> Any:
    if not args.shards and not args.synthetic:
        raise SystemExit(
            "pretrain/run.py: give --shards DIR (built by `python -m skillnet.data_prep build`) or --synthetic N"
        )
    return ARCHS[args.arch].build_dataset(args)


def _model_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return json.loads(Path(args.model_config).read_text()) if args.model_config else {}


def _check_vocab(model: torch.nn.Module, args: argparse.Namespace, vocab_size: int | None) -> None:
    if vocab_size is not None and model.config.vocab_size != vocab_size:
        raise SystemExit(
            f"--init-from-dense {args.init_from_dense}: vocab_size {model.config.vocab_size} differs from the "
            f"shards' vocab_size {vocab_size}; build the shards with that model's vocab"
        )


def _build_bert(args: argparse.Namespace, vocab_size: int | None, dataset: Any) -> torch.nn.Module:
    from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining, skillnet_from_dense

    # Dense: no skill layer, so every layer keeps HF BERT's intermediate.dense / output.dense.
    layout: dict[str, Any] = {"skill_layers": []} if args.dense else {}
    if args.init_from_dense:
        model = skillnet_from_dense(
            args.init_from_dense,
            model_class=SkillNetBertForPreTraining,
            init_skills=list(PRETRAIN_SKILLS),
            **layout,
        )
        _check_vocab(model, args, vocab_size)
        return model
    overrides = _model_overrides(args)
    if vocab_size is not None:
        overrides["vocab_size"] = vocab_size
    overrides.setdefault("max_position_embeddings", max(512, args.max_seq_len))
    cfg = SkillNetBertConfig.preset(args.preset, **{**overrides, **layout})
    torch.manual_seed(args.seed)  # same init on every rank (DeepSpeed also broadcasts rank 0's weights)
    return SkillNetBertForPreTraining(cfg)


def _build_bart(args: argparse.Namespace, vocab_size: int | None, dataset: Any) -> torch.nn.Module:
    from skillnet.model import (
        BART_PRESETS,
        NLG_TASKS,
        SkillNetBartConfig,
        SkillNetBartForConditionalGeneration,
        skillnet_bart_from_dense,
    )
    from skillnet.pretrain.denoising import DENOISE

    # Dense (no skill layer: HF BART's fc1/fc2 names); the routing still needs the objective as a task.
    layout: dict[str, Any] = {"skill_layers": [], "tasks": {**NLG_TASKS, DENOISE: []}}
    if args.init_from_dense:
        model = skillnet_bart_from_dense(args.init_from_dense, **layout)
        _check_vocab(model, args, vocab_size)
        return model
    overrides = _model_overrides(args)
    if vocab_size is not None:
        overrides["vocab_size"] = vocab_size
    if dataset is not None:
        # The shards' special ids: decoder start [SEP], labels "[CLS] y [SEP]" (as the SkillNet-NLG code).
        overrides.update(
            pad_token_id=dataset.pad_id,
            bos_token_id=dataset.cls_id,
            eos_token_id=dataset.sep_id,
            decoder_start_token_id=dataset.sep_id,
            forced_eos_token_id=dataset.sep_id,
        )
    positions = BART_PRESETS[args.preset]["max_position_embeddings"]
    overrides.setdefault("max_position_embeddings", max(positions, args.max_seq_len))
    cfg = SkillNetBartConfig.preset(args.preset, **{**overrides, **layout})
    torch.manual_seed(args.seed)
    return SkillNetBartForConditionalGeneration(cfg)


def build_model(args: argparse.Namespace, vocab_size: int | None, dataset: Any = None) -> torch.nn.Module:
    """The model of ``args.arch``; `dataset` (optional) gives the special token ids of the shards."""
    return ARCHS[args.arch].build_model(args, vocab_size, dataset)


def _bert_presets() -> dict[str, Any]:
    from skillnet.model import PRESETS

    return PRESETS


def _bart_presets() -> dict[str, Any]:
    from skillnet.model import BART_PRESETS

    return BART_PRESETS


def _check_bert(args: argparse.Namespace) -> None:
    return None  # every flag applies to BERT


def _check_bart(args: argparse.Namespace) -> None:
    if args.synthetic:
        raise ValueError("--arch bart needs --shards: the synthetic corpus has no text to denoise")
    if args.whole_word_mask:
        raise ValueError("--whole-word-mask is an MLM option; --arch bart trains denoise")
    if args.recipe:
        raise ValueError(
            f"--recipe {args.recipe} is SkillNet-NLU's BERT recipe; BART takes its settings from flags or "
            f"the DeepSpeed JSON"
        )


def _describe_bert(args: argparse.Namespace) -> str:
    kind = (
        "dense BERT (no skill layers; exported as HF BertForPreTraining)"
        if args.dense
        else "SkillNet-BERT (skill FFNs, each objective activates its skills)"
    )
    how = "" if len(args.objectives) == 1 else (
        ", every step each" if args.objective_mode == "both" else ", one drawn per step"
    )
    return f"{kind}; objectives {' + '.join(args.objectives)} [{args.objectives_source}]{how}"


def _describe_bart(args: argparse.Namespace) -> str:
    ratio = MASK_RATIO if args.mask_ratio is None else args.mask_ratio
    lam = POISSON_LAMBDA if args.poisson_lambda is None else args.poisson_lambda
    return (
        f"dense BART (no skill layers; exported as HF BartForConditionalGeneration); objective denoise: "
        f"text infilling, mask_ratio {ratio}, span lengths ~ Poisson({lam}), sentence permutation "
        f"{'on' if args.permute_sentences else 'off'}"
    )


@dataclass(frozen=True)
class PretrainArch:
    """What ``--arch`` selects: the objectives it can train, how its samples and model are built, which
    settings it refuses (``check_args``: ValueError with a one-line message) and how the start log names
    the run (``describe``)."""

    name: str
    objectives: tuple[str, ...]
    default_objectives: tuple[str, ...]
    presets: Callable[[], dict[str, Any]]
    build_dataset: Callable[[argparse.Namespace], Any]
    build_model: Callable[[argparse.Namespace, int | None, Any], torch.nn.Module]
    check_args: Callable[[argparse.Namespace], None]
    describe: Callable[[argparse.Namespace], str]
    always_dense: bool = False


ARCHS: dict[str, PretrainArch] = {
    "bert": PretrainArch(
        "bert", ("mlm", "nsp"), ("mlm", "nsp"), _bert_presets, _bert_dataset, _build_bert, _check_bert,
        _describe_bert,
    ),
    "bart": PretrainArch(
        "bart", ("denoise",), ("denoise",), _bart_presets, _bart_dataset, _build_bart, _check_bart,
        _describe_bart, always_dense=True,
    ),
}


def check_args(args: argparse.Namespace) -> None:
    """Settings that do not fit the architecture: ValueError / KeyError with a one-line message. Fills
    ``args.objectives`` with the architecture's default when not given."""
    arch = ARCHS[args.arch]
    args.objectives_source = "flag" if args.objectives else "default"
    args.objectives = list(dict.fromkeys(args.objectives or arch.default_objectives))
    wrong = [o for o in args.objectives if o not in arch.objectives]
    if wrong:
        raise ValueError(
            f"--objectives {' '.join(wrong)}: --arch {arch.name} trains {', '.join(arch.objectives)}"
        )
    if args.objective_weights and len(args.objective_weights) != len(args.objectives):
        raise ValueError(
            f"--objective-weights gives {len(args.objective_weights)} weights for {len(args.objectives)} "
            f"objectives ({' '.join(args.objectives)})"
        )
    args.dense = args.dense or arch.always_dense
    denoise_only = {
        "--mask-ratio": args.mask_ratio is not None,
        "--poisson-lambda": args.poisson_lambda is not None,
        "--permute-sentences": args.permute_sentences,
    }
    if "denoise" not in args.objectives and any(denoise_only.values()):
        given = " ".join(k for k, v in denoise_only.items() if v)
        raise ValueError(f"{given}: options of the denoise objective (--arch bart)")
    arch.check_args(args)
    presets = arch.presets()
    if args.preset not in presets:
        raise KeyError(f"--arch {arch.name}: unknown preset {args.preset!r}; valid presets: {', '.join(presets)}")


def describe_mode(args: argparse.Namespace) -> str:
    """The start log's mode line: what is trained, on which objectives, from where."""
    what = ARCHS[args.arch].describe(args)
    if args.init_from_dense:
        what += f"; initialised from {args.init_from_dense}"
    return what


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
                correct, count = correct + c, count + k
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
    """--output-dir for this run (training/outputs.py): every rank decides alike, rank 0 then marks it (and
    with --overwrite removes the earlier run's files) while the others wait."""
    from skillnet.training import dist as D
    from skillnet.training.outputs import claim_output, remove_own

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
    from skillnet.training.outputs import at_least, check_options, in_range, non_negative, positive

    parser = build_parser()
    args = parser.parse_args(argv)
    check_options(parser, args, {
        "max_steps": at_least(1), "micro_batch_size": at_least(1), "grad_accum": at_least(1), "lr": positive(),
        "eps": positive(), "weight_decay": non_negative(), "warmup_steps": non_negative(),
        "max_grad_norm": non_negative(), "betas": in_range(0, 1, hi_open=True), "save_every": non_negative(),
        "keep_last": non_negative(), "log_every": non_negative(), "eval_every": non_negative(),
        "eval_batches": at_least(1), "max_seq_len": at_least(8), "synthetic": non_negative(),
        "data_workers": non_negative(), "seed": non_negative(),
    })
    from skillnet.data_prep.shards import ShardError
    from skillnet.data_prep.tokenizer import TokenizerError
    from skillnet.model import skill_parameters
    from skillnet.pretrain.objectives import ObjectiveSampler, PretrainBatchSource
    from skillnet.training import SkillStatistics, TrainConfig, Trainer, prepare
    from skillnet.training import dist as D
    from skillnet.training.activation_checkpointing import (
        enable_activation_checkpointing,
        resolve_activation_checkpointing,
    )
    from skillnet.training.config import DsConfigError, load_ds_config
    from skillnet.training.profile import parse_profile_steps

    # Bad settings or data (wrong shard dir, unknown preset, JSON/launch mismatch, corpus too small) end
    # with one line naming the problem; errors once training runs keep their traceback.
    try:
        raw_ds = load_ds_config(args.ds_config) if args.ds_config else None
        settings = resolve_args(args, raw_ds)
        ckpt = resolve_activation_checkpointing(args.gradient_checkpointing, raw_ds, str(args.ds_config))
        args.gradient_checkpointing = ckpt.enabled  # run_args.json records what the run did, whatever its source
        check_args(args)
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
            compile=args.compile,
            zero_comm=args.zero_comm,
            new_schedule=args.new_schedule,
            profile_steps=parse_profile_steps(args.profile_steps),
        )
        cfg, _ = prepare(cfg)
        cfg.max_steps = args.max_steps  # the JSON's total_num_steps sets the decay end, not the run length
        rank, world = D.rank(), D.world_size()
        if not args.dry_run:  # before anything is written there (the sample log, run_args.json)
            claim_output_dir(args, rank)
        dataset = build_dataset(args)
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
            mode=describe_mode(args),
            memory=ckpt.describe(),
        )
        cuda = torch.cuda.is_available()
        workers = args.data_workers if args.data_workers is not None else (2 if cuda else 0)
        if workers < 0:
            raise ValueError(f"--data-workers must be >= 0, got {workers}")
        source = PretrainBatchSource(
            dataset, sampler, cfg.micro_batch_size, cfg.grad_accum, rank, world, args.seed,
            workers=workers, pin_memory=cuda,
        )
        if args.log_samples:
            source.on_batch = _sample_logger(Path(args.output_dir) / f"samples_rank{rank}.jsonl")
        if rank == 0:
            print("\n".join(start_lines), flush=True)
        if args.dry_run:
            return 0
        model = build_model(args, getattr(dataset, "vocab_size", None), dataset)
        enable_activation_checkpointing(model, ckpt)
    except (DsConfigError, ShardError, TokenizerError, FileNotFoundError, KeyError, ValueError, OSError) as e:
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
        (Path(cfg.output_dir) / "run_args.json").write_text(json.dumps(vars(args), indent=2))
    from skillnet.training.checkpoint import CheckpointError, ResumeError

    try:
        result = trainer.train()
    except (CheckpointError, ResumeError) as e:  # nothing intact to resume from: one line, not a traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
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
