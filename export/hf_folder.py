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

``--plain --task T`` (export/plain.py) instead writes one task of a SkillNet export as a stock
transformers model (BertFor*, BertModel, BartForConditionalGeneration) that loads without
``trust_remote_code``: the task's skills merged into one FFN per layer, exactly (export/flatten.py).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from skillnet.common.safe_load import load as safe_load
from skillnet.model.spec import (
    MODEL_FAMILIES,
    ModelSpec,
    family_of_model_type,
    resolve,
    skillnet_family,
    split_ref,
)
from transformers import PreTrainedModel

__all__ = [
    "checkpoint_kind",
    "export",
    "exported_as",
    "finish_folder",
    "init_unused_skills",
    "load_checkpoint_state",
    "locate_checkpoint",
    "reexport",
    "source_id",
    "unused_skill_sources",
]


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
    from skillnet.training.checkpoint import checkpoint_problem, complete_tags

    tags = complete_tags(p)
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
        return safe_load(d / "plain.pt")["model"]
    if list(d.glob("*zero_pp_rank_*optim_states.pt")) or list(d.glob("zero_pp_rank_*")):
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        from skillnet.training.deepspeed_patches import safe_checkpoint_loads

        with safe_checkpoint_loads():
            return get_fp32_state_dict_from_zero_checkpoint(str(root), tag=tag)
    states = sorted(d.glob("mp_rank_*_model_states.pt"))
    if states:  # DeepSpeed without ZeRO: the module is saved whole
        return safe_load(states[0])["module"]
    raise FileNotFoundError(f"{d}: neither plain.pt nor DeepSpeed model states found")


def unused_skill_sources(cfg: Any, objectives: tuple[str, ...] | None = None) -> dict[str, str]:
    """{skill: generic skill} for every skill no pre-training objective activates (default: its family's
    objectives, model/spec.py): what the export copies, and what ``skillnet.pretrain.skill_init`` reports."""
    generic = cfg.generic_skill
    if generic is None:
        return {}
    if objectives is None:
        family = family_of_model_type(cfg.model_type)
        objectives = family.objectives if family is not None else ()
    used = {s for o in objectives if o in cfg.tasks for s in cfg.task_skill_names(o)}
    return {name: generic for name in cfg.skill_names if name not in used and name != generic}


def init_unused_skills(model: torch.nn.Module, objectives: tuple[str, ...] | None = None) -> dict[str, str]:
    """Copy the generic skill into every skill no pre-training objective activated (`unused_skill_sources`);
    returns {dst: src}."""
    from skillnet.model import skill_parameters

    copied = unused_skill_sources(model.config, objectives)
    params = skill_parameters(model)
    with torch.no_grad():
        for dst, src in copied.items():
            for d, s in zip(params[dst], params[src]):
                d.copy_(s)
    return copied


def _dense_kind(family: ModelSpec) -> str:
    return f"dense-{family.name}"


def _family_of_kind(kind: str) -> ModelSpec:
    for family in MODEL_FAMILIES.values():
        if kind in (family.model_type, _dense_kind(family)):
            return family
    raise ValueError(f"unknown export kind {kind!r}")


def exported_as(kind: str) -> str:
    """What a checkpoint of `kind` is exported as (export_info.json's ``exported_as``)."""
    family = _family_of_kind(kind)
    if kind == family.model_type:
        return f"{family.title} (skills initialised for multi-task use)"
    return f"HF {split_ref(family.dense_export[1])[1]}"


def checkpoint_kind(config: dict[str, Any]) -> str:
    """What a checkpoint's model_config.json exports as: its family's model_type ('skillnet-bert') when it
    has skill layers, 'dense-<family>' ('dense-bert', 'dense-bart') when it has none (model/spec.py)."""
    model_type = config.get("model_type")
    dense = config.get("skill_layers") == [] and config.get("decoder_skill_layers") in (None, [])
    family = skillnet_family(model_type)
    if family is not None:
        if dense and family.dense_export is not None:
            return _dense_kind(family)
        if not dense and family.sparse_export:
            return family.model_type
    kinds = [f.title for f in MODEL_FAMILIES.values() if f.sparse_export]
    kinds += [f"dense {f.name.upper()} (--arch {f.name})" for f in MODEL_FAMILIES.values() if f.dense_export]
    raise ValueError(
        f"model_type {model_type!r} with skill_layers {config.get('skill_layers')!r}: pre-training exports "
        f"{', '.join(kinds)} checkpoints"
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
    family = _family_of_kind(kind)
    return family.load("pretraining_model")(family.load("config").from_json_file(str(config_file)))


def _for_export(
    kind: str, model: PreTrainedModel, init_unused: bool, where: str
) -> tuple[PreTrainedModel, dict[str, Any]]:
    """(model to save, facts for export_info.json) of a trained model of `kind`."""
    family = _family_of_kind(kind)
    if kind == family.model_type:
        copied = init_unused_skills(model, family.objectives) if init_unused else {}
        cfg = model.config
        objectives = {o: cfg.task_skill_names(o) for o in family.objectives if o in cfg.tasks}
        return model, {"skills_initialised_from": copied, "pretrain_objectives": objectives}
    config_cls, model_cls = (resolve(r) for r in family.dense_export)
    return _plain(model, config_cls, model_cls, where), {}


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
    (common/outputs.py); it never overlaps the run being exported."""
    if (Path(checkpoint) / "config.json").is_file() and not (Path(checkpoint) / "checkpoints").is_dir():
        return reexport(checkpoint, out, task, overwrite=overwrite)
    root, tag = locate_checkpoint(checkpoint, tag)
    from skillnet.training.checkpoint import check_trusted

    check_trusted(root / tag)  # before --out is touched: a refused checkpoint leaves nothing behind
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
    if dense and not kind.startswith("dense-"):
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
        step = int(safe_load(tfile)["step"])
    args_file = run_dir / "run_args.json"
    run_args = json.loads(args_file.read_text()) if args_file.is_file() else {}
    _save_tokenizer(tmp, run_args.get("shards"), saved.config.vocab_size)
    info = {
        "source": f"{run_dir.name}/{root.name}/{tag}",  # relative: an export moves
        "step": step,
        "kind": kind,
        "exported_as": exported_as(kind),
        "objectives": run_args.get("objectives"),
        **facts,
    }
    (tmp / "export_info.json").write_text(json.dumps(info, indent=2))
    from .card import finish_export

    training = {"stage": "pre-training", "step": step, "objectives": run_args.get("objectives"),
                "data": Path(run_args["shards"]).name if run_args.get("shards") else "synthetic"}
    finish_export(saved, tmp, final=out, default_task=task, training=training)
    finish_folder(tmp, out)
    return out


def _claim_export(out: str | Path, run_dir: Path, source: Path, settings: dict[str, Any], overwrite: bool) -> Path:
    """``out`` for an export of ``source`` (common/outputs.py), refusing any overlap with the run it reads."""
    from skillnet.common.outputs import OutputError, claim_output

    o, run = Path(out).resolve(), run_dir.resolve()
    if o == run or run.is_relative_to(o) or o.is_relative_to(source.resolve().parent):
        raise OutputError(f"--out {out}: is (or holds) the run being exported ({run_dir}); an export there would "
                          f"replace its checkpoints. Give another folder, e.g. {run_dir}/hf")
    claim = claim_output(o, option="--out", command="export", overwrite=overwrite,
                         identity={"source": source_id(source), **settings},
                         describe=lambda p: "files an export did not write" + (
                             " (an export written before exports were marked)" if (p / "export_info.json").is_file()
                             else ""))
    if claim.state == "own":
        print(f"replacing the earlier export of {source} in {out}", file=sys.stderr)
    elif claim.state == "overwrite":
        print(f"--overwrite: replacing what {out} held", file=sys.stderr)
    return Path(out)


def source_id(path: Path) -> str:
    """Which source an export came from, for its marker: a digest of the absolute path (an export moves and
    carries no absolute path) after the folder's own name."""
    return f"{path.name}@{hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]}"


def finish_folder(tmp: Path, out: Path) -> None:
    """Mark the finished folder as this export's and put it in place (the old one goes only after)."""
    from skillnet.common.outputs import MARKER, replace_dir

    shutil.copy2(out / MARKER, tmp / MARKER)
    replace_dir(tmp, out)


def reexport(folder: str | Path, out: str | Path, task: str | None, overwrite: bool = False) -> Path:
    """Copy a SkillNet export (e.g. a fine-tuning run's export/) with another default task: the pipelines,
    labels, generation settings and model card then follow that task."""
    import transformers

    from .card import finish_export, run_dir_of

    folder, out = Path(folder), Path(out)
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    if skillnet_family(cfg.get("model_type")) is None:
        raise ValueError(f"{folder}: model_type {cfg.get('model_type')!r} is not a SkillNet export: nothing to re-export")
    if task is None:
        raise ValueError(f"{folder} is an HF export: pass --task NAME to give it another default task")
    arch = (cfg.get("architectures") or [""])[0]
    import skillnet.model as sm

    model_cls = getattr(sm, arch, None) or getattr(transformers, arch, None)
    if model_cls is None:
        raise ValueError(f"{folder}: unknown architecture {arch!r}")
    model = model_cls.from_pretrained(str(folder)).eval()
    from skillnet.common.outputs import OutputError, claim_output

    if folder.resolve() == out.resolve() or folder.resolve().is_relative_to(out.resolve()):
        raise OutputError(f"--out {out}: is (or holds) the export being copied ({folder}); give another folder")
    claim_output(out, option="--out", command="export", overwrite=overwrite,
                 identity={"source": source_id(folder), "task": task})
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(folder, tmp)
    finish_export(model, tmp, final=out, default_task=task, run_dir=run_dir_of(folder),
                  training=json.loads((folder / "model_card.json").read_text(encoding="utf-8")).get("training")
                  if (folder / "model_card.json").is_file() else None)
    finish_folder(tmp, out)
    return out
