"""What `--arch` selects in pre-training: the stage's own part of each model family (its samples, the flags
it refuses, how the start log names the run), beside the family's `ModelSpec` (model/spec.py: objectives,
presets and model classes)."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from skillnet.model.spec import ModelSpec

__all__ = ["ARCHS", "PretrainArch", "build_dataset", "build_model", "check_args", "describe_mode", "model_positions"]

PRETRAIN_SKILLS = ("s1", "s2", "s3", "s7")  # Appendix B: initialised from the dense BERT's FFN
MASK_RATIO, POISSON_LAMBDA = 0.3, 3.0  # BART's text infilling (Lewis et al. 2020, §2.2 and §5.1)


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


def _model_overrides(args: argparse.Namespace, vocab_size: int | None = None) -> dict[str, Any]:
    overrides = json.loads(Path(args.model_config).read_text()) if args.model_config else {}
    if vocab_size is not None:
        overrides["vocab_size"] = vocab_size
    return overrides


def _check_vocab(model: torch.nn.Module, args: argparse.Namespace, vocab_size: int | None) -> None:
    if vocab_size is not None and model.config.vocab_size != vocab_size:
        raise SystemExit(
            f"--init-from-dense {args.init_from_dense}: vocab_size {model.config.vocab_size} differs from the "
            f"shards' vocab_size {vocab_size}; build the shards with that model's vocab"
        )


def _build_bert(args: argparse.Namespace, vocab_size: int | None, dataset: Any) -> torch.nn.Module:
    family = ARCHS["bert"].family
    config_cls, model_cls = family.load("config"), family.load("pretraining_model")
    # Dense: no skill layer, so every layer keeps HF BERT's intermediate.dense / output.dense.
    layout: dict[str, Any] = {"skill_layers": []} if args.dense else {}
    if args.init_from_dense:
        model = family.load("from_dense")(
            args.init_from_dense,
            model_class=model_cls,
            init_skills=list(PRETRAIN_SKILLS),
            **layout,
        )
        _check_vocab(model, args, vocab_size)
        return model
    overrides = _model_overrides(args, vocab_size)
    cfg = config_cls.preset(args.preset, **{**overrides, **layout})
    torch.manual_seed(args.seed)  # same init on every rank (DeepSpeed also broadcasts rank 0's weights)
    return model_cls(cfg)


def _build_bart(args: argparse.Namespace, vocab_size: int | None, dataset: Any) -> torch.nn.Module:
    from skillnet.model import NLG_TASKS
    from skillnet.pretrain.denoising import DENOISE

    family = ARCHS["bart"].family
    config_cls, model_cls = family.load("config"), family.load("pretraining_model")

    # Dense (no skill layer: HF BART's fc1/fc2 names); the routing still needs the objective as a task.
    layout: dict[str, Any] = {"skill_layers": [], "tasks": {**NLG_TASKS, DENOISE: []}}
    if args.init_from_dense:
        model = family.load("from_dense")(args.init_from_dense, model_class=model_cls, **layout)
        _check_vocab(model, args, vocab_size)
        return model
    overrides = _model_overrides(args, vocab_size)
    if dataset is not None:
        # The shards' special ids: decoder start [SEP], labels "[CLS] y [SEP]" (as the SkillNet-NLG code).
        overrides.update(
            pad_token_id=dataset.pad_id,
            bos_token_id=dataset.cls_id,
            eos_token_id=dataset.sep_id,
            decoder_start_token_id=dataset.sep_id,
            forced_eos_token_id=dataset.sep_id,
        )
    cfg = config_cls.preset(args.preset, **{**overrides, **layout})
    torch.manual_seed(args.seed)
    return model_cls(cfg)


def build_model(args: argparse.Namespace, vocab_size: int | None, dataset: Any = None) -> torch.nn.Module:
    """The model of ``args.arch``; `dataset` (optional) gives the special token ids of the shards."""
    return ARCHS[args.arch].build_model(args, vocab_size, dataset)


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


def _routing(args: argparse.Namespace) -> str:
    """How the skill layers of the run's model route: SkillNet's task map (each objective its skills) unless
    --model-config names another router; ValueError for one that does not exist."""
    from skillnet.model.routers import router_class

    overrides = {} if args.init_from_dense else _model_overrides(args)
    config_class = ARCHS[args.arch].family.load("config")
    name = overrides.get("router", config_class.router)
    router = router_class(name)
    if router.uses_task_skills:
        return "skill FFNs, each objective activates its skills"
    if router.routes_tokens:
        cfg = config_class.preset(args.preset, **overrides)
        return (f"skill FFNs under router {name!r}: a token gate picks {cfg.moe_top_k} of the {cfg.num_skills} "
                f"for each token, whatever the objective (which picks only its head)")
    return f"skill FFNs under router {name!r}"


def _describe_bert(args: argparse.Namespace) -> str:
    kind = (
        "dense BERT (no skill layers; exported as HF BertForPreTraining)"
        if args.dense
        else f"SkillNet-BERT ({_routing(args)})"
    )
    how = "" if len(args.objectives) == 1 else (
        ", every step each" if args.objective_mode == "both" else ", one drawn per step"
    )
    return f"{kind}; objectives {' + '.join(args.objectives)} [{args.objectives_source}]{how}; {_rows(args)}"


def _rows(args: argparse.Namespace) -> str:
    if not args.packing:
        return "one sample per row [--no-packing]"
    sides = " (encoder and decoder sides)" if args.arch == "bart" else ""
    return f"packed rows (several samples per row{sides}; --no-packing: one per row)"


def _describe_bart(args: argparse.Namespace) -> str:
    ratio = MASK_RATIO if args.mask_ratio is None else args.mask_ratio
    lam = POISSON_LAMBDA if args.poisson_lambda is None else args.poisson_lambda
    return (
        f"dense BART (no skill layers; exported as HF BartForConditionalGeneration); objective denoise: "
        f"text infilling, mask_ratio {ratio}, span lengths ~ Poisson({lam}), sentence permutation "
        f"{'on' if args.permute_sentences else 'off'}; {_rows(args)}"
    )


@dataclass(frozen=True)
class PretrainArch:
    """What ``--arch`` selects beyond its model family (model/spec.py: presets, objectives, classes): how its
    samples and model are built, which settings it refuses (``check_args``: ValueError with a one-line
    message) and how the start log names the run (``describe``)."""

    name: str  # the model family's
    build_dataset: Callable[[argparse.Namespace], Any]
    build_model: Callable[[argparse.Namespace, int | None, Any], torch.nn.Module]
    check_args: Callable[[argparse.Namespace], None]
    describe: Callable[[argparse.Namespace], str]
    always_dense: bool = False
    packs: bool = False  # its samples are packed into rows unless --no-packing (training/packing.py)

    @property
    def family(self) -> ModelSpec:
        from skillnet.model.spec import model_family  # the model package only once a run needs it

        return model_family(self.name)

    @property
    def objectives(self) -> tuple[str, ...]:
        return self.family.objectives

    def presets(self) -> dict[str, Any]:
        return self.family.presets()


ARCHS: dict[str, PretrainArch] = {
    "bert": PretrainArch("bert", _bert_dataset, _build_bert, _check_bert, _describe_bert, packs=True),
    "bart": PretrainArch("bart", _bart_dataset, _build_bart, _check_bart, _describe_bart, always_dense=True,
                         packs=True),
}


def check_args(args: argparse.Namespace) -> None:
    """Settings that do not fit the architecture: ValueError / KeyError with a one-line message. Fills
    ``args.objectives`` with the architecture's default when not given."""
    arch = ARCHS[args.arch]
    args.objectives_source = "flag" if args.objectives else "default"
    args.objectives = list(dict.fromkeys(args.objectives or arch.objectives))
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
    if not args.init_from_dense and args.preset not in presets:  # a checkpoint's config gives the shape
        raise KeyError(f"--arch {arch.name}: unknown preset {args.preset!r}; valid presets: {', '.join(presets)}")
    positions, source = model_positions(args, presets)
    if args.max_seq_len > positions:
        raise ValueError(
            f"--max-seq-len {args.max_seq_len} exceeds the model's {positions} positions ({source}); use at most "
            f"{positions}"
        )


def model_positions(args: argparse.Namespace, presets: dict[str, Any]) -> tuple[int, str]:
    """(positions the model will have, where that number comes from), known before the model is built."""
    if args.init_from_dense:
        cfg_path = Path(args.init_from_dense) / "config.json"
        try:
            return int(json.loads(cfg_path.read_text())["max_position_embeddings"]), f"{cfg_path}"
        except (OSError, ValueError, KeyError):
            return 10**9, ""  # unreadable here: loading the model reports it
    overrides = _model_overrides(args)
    if "max_position_embeddings" in overrides:
        return int(overrides["max_position_embeddings"]), f"max_position_embeddings in {args.model_config}"
    return (int(presets[args.preset]["max_position_embeddings"]),
            f"preset {args.preset}; a --model-config JSON with max_position_embeddings gives more")


def describe_mode(args: argparse.Namespace) -> str:
    """The start log's mode line: what is trained, on which objectives, from where."""
    what = ARCHS[args.arch].describe(args)
    if args.init_from_dense:
        what += f"; initialised from {args.init_from_dense}"
    return what
