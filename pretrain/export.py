"""Export a pre-training checkpoint as a consolidated HF-format folder.

    python -m skillnet.pretrain.export --checkpoint runs/pt --out runs/pt/hf            # newest checkpoint
    python -m skillnet.pretrain.export --checkpoint runs/pt/checkpoints/step_00001000 --out hf_1000

Reads plain (single-process) and DeepSpeed ZeRO-1/2/3 checkpoints (ZeRO partitions are merged to fp32
on the CPU, no GPUs or process group needed). What it writes follows from the checkpoint's model config:

* SkillNet-BERT (sparse pre-training): for multi-task use (Appendix B), every skill that no pre-training
  objective trained (s4, s5, s6 by default) is initialised from the generic skill s7; the folder
  (skills, task -> skills map) loads with ``SkillNetBertForMultiTask.from_pretrained`` and ``finetune/``;
* dense BERT (``pretrain/run.py --dense``): a plain HF ``BertForPreTraining`` folder (model_type "bert"),
  the ``--init-from-dense`` of sparse pre-training and a dense ``model.init`` of fine-tuning;
* dense BART (``pretrain/run.py --arch bart``): a plain HF ``BartForConditionalGeneration`` folder
  (model_type "bart"), which generation fine-tuning turns into SkillNet-BART (``skillnet_bart_from_dense``).

Every folder gets the tokenizer of the shards (vocab.txt, tokenizer files, ``model_max_length`` = the
model's positions), export_info.json (source checkpoint, step, architecture, objectives, and which skills
were copied from which) and a model card (README.md, from model_card.json). A SkillNet-BERT export's
``default_task`` (``--task``; default ``mlm``) is what a call without ``task=`` runs, and its ``auto_map``
names the fill-mask class (docs/hf.md).

``--plain --task T`` (pretrain/plain_export.py) instead writes one task of a SkillNet export as a stock
transformers model (BertFor*, BertModel, BartForConditionalGeneration) that loads without
``trust_remote_code``: the task's skills merged into one FFN per layer, exactly (model/plain.py).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from typing import Any  # noqa: E402

import torch  # noqa: E402
from skillnet.training.cli import Parser  # noqa: E402
from transformers import PreTrainedModel  # noqa: E402

__all__ = [
    "EXPORT_KINDS",
    "checkpoint_kind",
    "export",
    "locate_checkpoint",
    "load_checkpoint_state",
    "init_unused_skills",
    "main",
]

PRETRAIN_OBJECTIVES = ("mlm", "nsp")


def _save_tokenizer(folder: Path, shards: str | None, vocab_size: int) -> None:
    """The tokenizer the shards were built with (their vocab.txt and normalisation), else the default
    bert-base-chinese vocab when the model's vocab size is its size (synthetic-data runs)."""
    from skillnet.data_prep.tokenizer import TokenizerError, default_vocab_path
    from skillnet.model.hub import save_tokenizer

    lowercase = True
    vocab = Path(shards) / "vocab.txt" if shards else None
    if shards and (Path(shards) / "manifest.json").is_file():
        tk = json.loads((Path(shards) / "manifest.json").read_text(encoding="utf-8")).get("tokenizer", {})
        lowercase = bool(tk.get("settings", {}).get("lowercase", True))
    if vocab is None or not vocab.is_file():
        try:
            vocab = default_vocab_path()
        except TokenizerError:
            return
        if sum(1 for _ in vocab.read_text(encoding="utf-8").split("\n") if _) != vocab_size:
            return  # a synthetic vocab: no real tokenizer belongs to this model
    save_tokenizer(folder, vocab, lowercase=lowercase)


def locate_checkpoint(path: str | Path, tag: str | None = None) -> tuple[Path, str]:
    """(checkpoints root, tag) from a run dir, a checkpoints dir or a step_* dir."""
    p = Path(path)
    if (p / "checkpoints" / "latest").is_file():
        p = p / "checkpoints"
    if p.name.startswith("step_") and p.is_dir():
        return p.parent, tag or p.name
    if tag is not None:
        if not (p / tag).is_dir():
            raise FileNotFoundError(f"{p / tag}: checkpoint tag not found")
        return p, tag
    from skillnet.training.checkpoint import checkpoint_problem, complete_tags, latest_complete

    tags = complete_tags(p) or [t for t in [latest_complete(p)] if t is not None]
    if not tags:
        raise FileNotFoundError(f"{path}: no complete checkpoint (checkpoints/step_*/complete) found")
    skipped = []
    for t in reversed(tags):  # the newest intact one; a damaged newer one is named, not exported
        problem = checkpoint_problem(p / t)
        if problem is None:
            if skipped:
                print(f"warning: skipped damaged checkpoint(s) {'; '.join(skipped)}; exporting {p / t}",
                      file=sys.stderr)
            return p, t
        skipped.append(f"{t} ({problem})")
    raise FileNotFoundError(f"{path}: no intact checkpoint: {'; '.join(skipped)}")


def load_checkpoint_state(root: Path, tag: str) -> dict[str, torch.Tensor]:
    """fp32 model state dict of a plain or DeepSpeed checkpoint."""
    d = root / tag
    if (d / "plain.pt").is_file():
        return torch.load(d / "plain.pt", map_location="cpu", weights_only=False)["model"]
    if list(d.glob("*zero_pp_rank_*optim_states.pt")) or list(d.glob("zero_pp_rank_*")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        return get_fp32_state_dict_from_zero_checkpoint(str(root), tag=tag)
    states = sorted(d.glob("mp_rank_*_model_states.pt"))
    if states:  # DeepSpeed without ZeRO: the module is saved whole
        return torch.load(states[0], map_location="cpu", weights_only=False)["module"]
    raise FileNotFoundError(f"{d}: neither plain.pt nor DeepSpeed model states found")


def init_unused_skills(
    model: torch.nn.Module, objectives: tuple[str, ...] = PRETRAIN_OBJECTIVES
) -> dict[str, str]:
    """Copy the generic skill into every skill no pre-training objective activated; returns {dst: src}."""
    from skillnet.model import skill_parameters

    cfg = model.config
    generic = cfg.generic_skill
    if generic is None:
        return {}
    used = {s for o in objectives if o in cfg.tasks for s in cfg.task_skill_names(o)}
    params = skill_parameters(model)
    copied = {}
    with torch.no_grad():
        for name in cfg.skill_names:
            if name in used or name == generic:
                continue
            for dst, src in zip(params[name], params[generic]):
                dst.copy_(src)
            copied[name] = generic
    return copied


# What a checkpoint is exported as, by the kind of its model config.
EXPORT_KINDS = {
    "skillnet-bert": "SkillNet-BERT (skills initialised for multi-task use)",
    "dense-bert": "HF BertForPreTraining",
    "dense-bart": "HF BartForConditionalGeneration",
}


def checkpoint_kind(config: dict[str, Any]) -> str:
    """'skillnet-bert', 'dense-bert' or 'dense-bart' from a checkpoint's model_config.json."""
    model_type = config.get("model_type")
    dense = config.get("skill_layers") == [] and config.get("decoder_skill_layers") in (None, [])
    if model_type == "skillnet-bert":
        return "dense-bert" if dense else "skillnet-bert"
    if model_type == "skillnet-bart" and dense:
        return "dense-bart"
    raise ValueError(
        f"model_type {model_type!r} with skill_layers {config.get('skill_layers')!r}: pre-training exports "
        f"SkillNet-BERT, dense BERT (--dense) and dense BART (--arch bart) checkpoints"
    )


def _load_into(model: PreTrainedModel, state: dict[str, torch.Tensor], where: str) -> None:
    """Load `state` into `model`: every parameter must come from it, except weights tied to one that did
    (a ZeRO state lists tied tensors once)."""
    result = model.load_state_dict(state, strict=False)
    model.tie_weights()
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = {id(params[k]) for k in state if k in params}
    missing = [k for k in result.missing_keys if not (k in params and id(params[k]) in loaded)]
    if missing or result.unexpected_keys:
        raise ValueError(
            f"{where}: state does not fit the model: missing {missing[:5]}, unexpected {result.unexpected_keys[:5]}"
        )


def _plain(model: PreTrainedModel, config_cls: type, model_cls: type, where: str) -> PreTrainedModel:
    """The HF model of the same weights: a dense SkillNet model keeps HF's parameter names, so only the
    config changes (the skill layout fields are dropped)."""
    keep = set(config_cls().to_dict()) - {"model_type", "architectures", "transformers_version", "_name_or_path"}
    config = config_cls(**{k: v for k, v in model.config.to_dict().items() if k in keep})
    plain = model_cls(config)
    _load_into(plain, model.state_dict(), where)
    return plain.eval()


def _trained_model(kind: str, config_file: Path) -> PreTrainedModel:
    if kind == "dense-bart":
        from skillnet.model import SkillNetBartConfig, SkillNetBartForConditionalGeneration

        return SkillNetBartForConditionalGeneration(SkillNetBartConfig.from_json_file(str(config_file)))
    from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining

    return SkillNetBertForPreTraining(SkillNetBertConfig.from_json_file(str(config_file)))


def _for_export(
    kind: str, model: PreTrainedModel, init_unused: bool, where: str
) -> tuple[PreTrainedModel, dict[str, Any]]:
    """(model to save, facts for export_info.json) of a trained model of `kind`."""
    if kind == "skillnet-bert":
        copied = init_unused_skills(model) if init_unused else {}
        cfg = model.config
        objectives = {o: cfg.task_skill_names(o) for o in PRETRAIN_OBJECTIVES if o in cfg.tasks}
        return model, {"skills_initialised_from": copied, "pretrain_objectives": objectives}
    if kind == "dense-bert":
        from transformers import BertConfig, BertForPreTraining

        return _plain(model, BertConfig, BertForPreTraining, where), {}
    from transformers import BartConfig, BartForConditionalGeneration

    return _plain(model, BartConfig, BartForConditionalGeneration, where), {}


def export(
    checkpoint: str | Path,
    out: str | Path,
    tag: str | None = None,
    init_unused: bool = True,
    dense: bool = False,
    task: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Write the HF folder of a checkpoint (see the module docstring); `dense=True` requires a dense one.
    `task`: the default task of a SkillNet export (default: ``mlm``, the MLM head's skills). `out` must be
    new, empty or an earlier export of the same checkpoint and settings, unless `overwrite`
    (training/outputs.py); it never overlaps the run being exported."""
    if (Path(checkpoint) / "config.json").is_file() and not (Path(checkpoint) / "checkpoints").is_dir():
        return reexport(checkpoint, out, task, overwrite=overwrite)
    root, tag = locate_checkpoint(checkpoint, tag)
    out = _claim_export(out, root.parent, root / tag,
                        {"init_unused": init_unused, "dense": dense, "task": task}, overwrite)
    cfg_file = root / tag / "model_config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{cfg_file} missing: was this checkpoint written by training.Trainer?")
    raw = json.loads(cfg_file.read_text())
    try:
        kind = checkpoint_kind(raw)
    except ValueError as e:
        raise ValueError(f"{cfg_file}: {e}") from None
    if dense and kind == "skillnet-bert":
        raise ValueError(
            f"{cfg_file}: --dense, but the model has skill layers ({raw.get('skill_layers')!r}): it was not "
            f"pre-trained with pretrain/run.py --dense"
        )
    model = _trained_model(kind, cfg_file)
    _load_into(model, load_checkpoint_state(root, tag), str(root / tag))
    saved, facts = _for_export(kind, model, init_unused, str(root / tag))
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    saved.save_pretrained(str(tmp), safe_serialization=True)
    step = None
    run_dir = root.parent
    tfile = root / tag / "trainer_rank0.pt"
    if tfile.is_file():
        step = int(torch.load(tfile, map_location="cpu", weights_only=False)["step"])
    args_file = run_dir / "run_args.json"
    run_args = json.loads(args_file.read_text()) if args_file.is_file() else {}
    _save_tokenizer(tmp, run_args.get("shards"), saved.config.vocab_size)
    info = {
        "source": f"{run_dir.name}/{root.name}/{tag}",  # relative: an export moves
        "step": step,
        "kind": kind,
        "exported_as": EXPORT_KINDS[kind],
        "objectives": run_args.get("objectives"),
        **facts,
    }
    (tmp / "export_info.json").write_text(json.dumps(info, indent=2))
    from skillnet.model.card import finish_export

    training = {"stage": "pre-training", "step": step, "objectives": run_args.get("objectives"),
                "data": Path(run_args["shards"]).name if run_args.get("shards") else "synthetic"}
    finish_export(saved, tmp, final=out, default_task=task, training=training)
    _finish(tmp, out)
    return out


def _claim_export(out: str | Path, run_dir: Path, source: Path, settings: dict[str, Any], overwrite: bool) -> Path:
    """``out`` for an export of ``source`` (training/outputs.py), refusing any overlap with the run it reads."""
    from skillnet.training.outputs import OutputError, claim_output

    o, run = Path(out).resolve(), run_dir.resolve()
    if o == run or run.is_relative_to(o) or o.is_relative_to(source.resolve().parent):
        raise OutputError(f"--out {out}: is (or holds) the run being exported ({run_dir}); an export there would "
                          f"replace its checkpoints. Give another folder, e.g. {run_dir}/hf")
    claim = claim_output(o, option="--out", command="export", overwrite=overwrite,
                         identity={"source": _where(source), **settings},
                         describe=lambda p: "files an export did not write" + (
                             " (an export written before exports were marked)" if (p / "export_info.json").is_file()
                             else ""))
    if claim.state == "own":
        print(f"replacing the earlier export of {source} in {out}", file=sys.stderr)
    elif claim.state == "overwrite":
        print(f"--overwrite: replacing what {out} held", file=sys.stderr)
    return Path(out)


def _where(path: Path) -> str:
    """Which source an export came from, for its marker: a digest of the absolute path (an export moves and
    carries no absolute path) after the folder's own name."""
    import hashlib

    return f"{path.name}@{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]}"


def _finish(tmp: Path, out: Path) -> None:
    """Mark the finished folder as this export's and put it in place (the old one goes only after)."""
    from skillnet.training.outputs import MARKER, replace_dir

    shutil.copy2(out / MARKER, tmp / MARKER)
    replace_dir(tmp, out)


def reexport(folder: str | Path, out: str | Path, task: str | None, overwrite: bool = False) -> Path:
    """Copy a SkillNet export (e.g. a fine-tuning run's export/) with another default task: the pipelines,
    labels, generation settings and model card then follow that task."""
    import transformers
    from skillnet.model.card import _run_dir, finish_export

    folder, out = Path(folder), Path(out)
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if cfg.get("model_type") not in ("skillnet-bert", "skillnet-bart"):
        raise ValueError(f"{folder}: model_type {cfg.get('model_type')!r} is not a SkillNet export: nothing to re-export")
    if task is None:
        raise ValueError(f"{folder} is an HF export: pass --task NAME to give it another default task")
    arch = (cfg.get("architectures") or [""])[0]
    import skillnet.model as sm

    model_cls = getattr(sm, arch, None) or getattr(transformers, arch, None)
    if model_cls is None:
        raise ValueError(f"{folder}: unknown architecture {arch!r}")
    model = model_cls.from_pretrained(str(folder)).eval()
    from skillnet.training.outputs import OutputError, claim_output

    if folder.resolve() == out.resolve() or folder.resolve().is_relative_to(out.resolve()):
        raise OutputError(f"--out {out}: is (or holds) the export being copied ({folder}); give another folder")
    claim_output(out, option="--out", command="export", overwrite=overwrite,
                 identity={"source": _where(folder), "task": task})
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folder, tmp)
    finish_export(model, tmp, final=out, default_task=task, run_dir=_run_dir(folder),
                  training=json.loads((folder / "model_card.json").read_text(encoding="utf-8")).get("training")
                  if (folder / "model_card.json").is_file() else None)
    _finish(tmp, out)
    return out


def build_parser() -> Parser:
    p = Parser("skillnet.pretrain.export", description=__doc__)
    p.add_argument(
        "--checkpoint", required=True,
        help="run dir (uses checkpoints/latest), checkpoints dir or step_* dir; or a SkillNet HF export (e.g. a "
        "fine-tuning run's export/), copied to --out with the default task --task",
    )
    p.add_argument("--tag", help="checkpoint tag (step_XXXXXXXX); default: latest")
    p.add_argument("--out", required=True, help="output folder, written atomically; it must be new, empty or an earlier "
                   "export of the same checkpoint and settings (replaced), unless --overwrite")
    p.add_argument("--overwrite", action="store_true",
                   help="replace whatever --out holds (never the run being exported)")
    p.add_argument(
        "--no-init-unused",
        action="store_true",
        help="SkillNet-BERT: keep the untrained skills as they are instead of copying the generic skill into them",
    )
    p.add_argument(
        "--task",
        help="SkillNet-BERT: the default task, what a call without task= runs (any task of the model's config; "
        "default: mlm, which fill-mask and feature-extraction pipelines then use)",
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="write --task of a SkillNet export (--checkpoint FOLDER) as a stock transformers model that loads "
        "without trust_remote_code: the task's skills merged into one FFN per layer, the head as the matching "
        "BertFor*/BartForConditionalGeneration class, the card stating the measured equality (docs/hf.md). "
        "MoE and PALs cannot be written so and are refused",
    )
    p.add_argument("--onnx", action="store_true",
                   help="with --plain: also model.onnx (fp32) and model_int8.onnx (dynamic int8) for a BERT task, or "
                   "ort/ (encoder and decoder graphs, fp32 and int8, and seq2seq.py to decode them) for a BART "
                   "task, each measured against the sparse model (needs the deploy extra: onnx, onnxscript, "
                   "onnxruntime)")
    p.add_argument("--features", action="store_true",
                   help="with --plain: a BertModel of the task's skills (features), whatever the task's head")
    p.add_argument("--test", help="with --plain: JSONL records of the task to measure the equality (and a CRF's "
                   "argmax agreement) on; default: the fine-tuning run's test file of the task, else its dev file")
    p.add_argument(
        "--dense",
        action="store_true",
        help="require a dense checkpoint (pretrain/run.py --dense or --arch bart) and write a plain HF folder; "
        "without it the kind is read from the checkpoint's model config all the same",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    if (args.features or args.test or args.onnx) and not args.plain:
        p.error("--features, --test and --onnx go with --plain")
    if args.plain and not args.task:
        p.error("--plain needs --task: the one task the stock model computes")
    try:
        if args.plain:
            from skillnet.pretrain.plain_export import export_plain

            out = export_plain(args.checkpoint, args.out, args.task, features=args.features, test=args.test,
                               overwrite=args.overwrite, onnx=args.onnx)
            print(json.dumps({"event": "exported", "out": str(out), "plain": True}))
            return 0
        out = export(args.checkpoint, args.out, args.tag, init_unused=not args.no_init_unused, dense=args.dense,
                     task=args.task, overwrite=args.overwrite)
    except (FileNotFoundError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps({"event": "exported", "out": str(out)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
