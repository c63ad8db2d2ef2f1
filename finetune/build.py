"""The fine-tuning model: the reference SkillNet model every method starts from (``model.init`` or a preset,
with the config's skills, tasks and heads), the method's model derived from it, freezing, parameter counts,
and saving/loading model folders (weights, task metadata, vocab)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from skillnet.export.card import FINETUNE_META as META_FILE

from .config import ConfigError, FinetuneConfig
from .tasks import TaskData

if TYPE_CHECKING:
    from skillnet.model.spec import ModelSpec


def _init_kind(path: str, arch: ModelSpec) -> str:
    """'skillnet' or 'dense' from the folder's config.json (cheap: no weights are read)."""
    cfg_file = Path(path) / "config.json"
    if not cfg_file.is_file():
        raise ConfigError(f"model.init {path} has no config.json (a folder written by save_pretrained / export)")
    try:
        model_type = json.loads(cfg_file.read_text(encoding="utf-8")).get("model_type")
    except json.JSONDecodeError as e:
        raise ConfigError(f"{cfg_file}: invalid JSON ({e.msg})") from None
    if model_type == arch.model_type:
        return "skillnet"
    if model_type == arch.dense_type:
        return "dense"
    raise ConfigError(f"model.init {path}: model_type {model_type!r} is neither a SkillNet export "
                      f"({arch.model_type!r}) nor a dense HF checkpoint ({arch.dense_type!r})")


def build_reference(cfg: FinetuneConfig, data: dict[str, TaskData]) -> tuple[torch.nn.Module, list[str]]:
    """The SkillNet model every method starts from, with every config task registered (skills, and a head
    per task for BERT; BART's tasks share its LM head).

    From ``model.init``: a SkillNet export as it is, or a dense HF checkpoint with every skill a copy of its
    FFN (the "w/o sparse pre-training" row of Table 3; SkillNet-NLG's initialisation); without it, a preset
    with weights drawn from the seed. Heads are drawn from (seed, task name), so a task's head starts the
    same whatever the other tasks are (``task_specific`` trains each task alone from the same weights as
    the joint methods)."""
    from skillnet.model.spec import model_family
    from skillnet.model.surgery import add_skill

    arch = model_family(cfg.arch)
    model_cls = arch.load("task_model")
    torch.manual_seed(cfg.train.seed)
    if cfg.model.init:
        init = cfg.resolve(cfg.model.init)
        if not Path(init).exists():
            raise ConfigError(f"model.init {init} does not exist (a folder written by save_pretrained / export)")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        if _init_kind(init, arch) == "dense":
            model = arch.load("from_dense")(init, model_class=model_cls)
        else:
            model = model_cls.from_pretrained(init)
    else:
        model = model_cls(arch.load("config").preset(cfg.model.preset, **cfg.model.overrides))
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
        if not arch.task_heads:
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


def save_model_dir(model: torch.nn.Module, path: Path, data: dict[str, TaskData], vocab: Path,
                   inherited: dict[str, Any] | None = None) -> None:
    """save_pretrained + task metadata + vocab, written to a temp dir and renamed (never half-written).

    `inherited`: task metadata of the checkpoint this run started from, so an adapted model can still
    predict the tasks it learnt before (their heads are in the weights)."""
    from skillnet.common.outputs import replace_dir
    from skillnet.export.card import finish_export
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
    # each task with the skills the model runs for it (an adaptation's new skill included), as config.json has
    tasks.update({n: {**d.meta(), "skills": list((model.config.tasks or {}).get(n, d.meta()["skills"]))}
                  for n, d in data.items()})
    meta = {"tasks": tasks, "vocab": "vocab.txt", "lowercase": True}
    (tmp / META_FILE).write_text(json.dumps(meta, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    save_tokenizer(tmp, vocab, lowercase=True)
    finish_export(model, tmp, final=path, own_tasks=list(data))  # default task (the run's own), labels, card
    replace_dir(tmp, path)


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
