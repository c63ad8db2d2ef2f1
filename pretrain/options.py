"""The command line of `pretrain/run.py`: its flags, defaults and help (the settings' resolution against the
DeepSpeed JSON and the recipes is pretrain/recipes.py's)."""

from __future__ import annotations

import argparse

from skillnet.common.cli import Parser
from skillnet.common.safe_load import add_trust_flag
from skillnet.pretrain.archs import ARCHS, MASK_RATIO, POISSON_LAMBDA
from skillnet.pretrain.recipes import PRETRAIN_DEFAULTS, RECIPES, TRAIN_SETTINGS
from skillnet.training.config import add_train_flags

__all__ = ["FLAGS", "build_parser"]

# The TrainConfig fields this command takes as flags (training.config.add_train_flags), in --help's order;
# packing and gradient_checkpointing are listed under data and model.
FLAGS = ("max_steps", "micro_batch_size", "grad_accum", "lr", "betas", "eps", "weight_decay", "warmup_steps",
         "max_grad_norm", "sparse_updates", "optim_impl", "seed", "save_every", "keep_last", "log_every",
         "eval_every", "new_schedule", "compile", "zero_comm", "profile_steps", "skill_drift", "tensorboard",
         "progress", "packing", "gradient_checkpointing")
NOTES = {
    "max_steps": "a DeepSpeed JSON scheduler's total_num_steps, else the recipe's, comes first",
    **{name: f"recipe {r.name}: {r.settings[name]}" for r in RECIPES.values() for name in TRAIN_SETTINGS
       if name in r.settings and name != "max_steps" and r.settings[name] != getattr(PRETRAIN_DEFAULTS, name)},
}


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The flags of `pretrain/run.py` (its docstring is the description)."""
    p = Parser("skillnet.pretrain.run", description=description)
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
        "--whole-word-mask", action="store_true",
        help="MLM: mask whole words as the shards mark them (shards built with `python -m skillnet.data_prep build "
        "--whole-word`; refused on shards without word ids)"
    )
    unpacked = [name for name, arch in ARCHS.items() if not arch.packs]
    add_train_flags(d, ["packing"], PRETRAIN_DEFAULTS,
                    {"packing": f"--arch {', '.join(unpacked)} always uses one sample per row"} if unpacked else None)
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
    add_train_flags(m, ["gradient_checkpointing"], PRETRAIN_DEFAULTS)
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
        help="resolve and print the settings and check what the launch checks (the data, --init-from-dense and its "
        "vocab against the data's, the checkpoint a resume continues, the launch's port), then exit without "
        "building the model",
    )
    t.add_argument("--output-dir", default="runs/pretrain", help="checkpoints, log.jsonl, tensorboard/ and run_args.json")
    add_train_flags(t, FLAGS[:FLAGS.index("seed") + 1], PRETRAIN_DEFAULTS, NOTES)
    t.add_argument(
        "--data-workers",
        type=int,
        default=None,
        help="processes per rank that build batches ahead (same batches and order as 0, which builds them "
        "in the training process); default: 2 on a GPU, 0 on a CPU, where they would take the cores training "
        "uses",
    )
    add_train_flags(t, ["save_every", "keep_last", "log_every", "eval_every"], PRETRAIN_DEFAULTS)
    t.add_argument("--eval-batches", type=int, default=4, help="probe batches per objective for evaluation")
    t.add_argument(
        "--resume",
        default="auto",
        help="'auto' (default): continue from <output_dir>/checkpoints/latest if present; 'none'; or a path. "
        "A DeepSpeed checkpoint may be resumed on another number of ranks (same ZeRO stage): the global batch "
        "is kept and micro-batch x accumulation re-derived (docs/training.md, 'Requeue on another size')",
    )
    add_trust_flag(t)
    t.add_argument(
        "--overwrite",
        action="store_true",
        help="start over in an --output-dir that holds a run of another model or data (its checkpoints and logs "
        "are removed); without it such a dir is refused, and a run of the same model and data resumes",
    )
    add_train_flags(t, FLAGS[FLAGS.index("new_schedule"):FLAGS.index("packing")], PRETRAIN_DEFAULTS)
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
    t.add_argument(
        "--local-rank", type=int, default=None, help=argparse.SUPPRESS
    )  # set by the deepspeed launcher
    return p
