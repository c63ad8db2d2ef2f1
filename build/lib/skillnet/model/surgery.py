"""Skill surgery: dense BERT -> SkillNet, new skills, freezing, and moving one skill between models."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import BertConfig, PreTrainedModel

from .bert import SkillNetBertModel
from .config import SkillNetBertConfig

_FFN_KEY = re.compile(
    r"^encoder\.layer\.(?P<layer>\d+)\.(?P<mod>intermediate\.dense|output\.dense|output\.LayerNorm)\.(?P<p>weight|bias)$"
)
_SKILL_KEY = re.compile(r"\.skill_ffn\.skills\.(\d+)\.")
SKILL_FILE = "skill.safetensors"
MANIFEST_FILE = "manifest.json"


def encoder_of(model: nn.Module) -> SkillNetBertModel:
    if isinstance(model, SkillNetBertModel):
        return model
    enc = getattr(model, "bert", None)
    if not isinstance(enc, SkillNetBertModel):
        raise TypeError(
            f"{type(model).__name__} is not a SkillNet-BERT model (no SkillNetBertModel at .bert)"
        )
    return enc


# ---- dense -> SkillNet ---------------------------------------------------------------------------------
def _load_dense(
    dense: str | Path | nn.Module | dict,
) -> tuple[dict[str, torch.Tensor], dict[str, Any] | None]:
    if isinstance(dense, dict):
        return dense, None
    if isinstance(dense, nn.Module):
        cfg = dense.config.to_dict() if hasattr(dense, "config") else None
        return dense.state_dict(), cfg
    path = Path(dense)
    if not path.exists():
        raise FileNotFoundError(f"dense checkpoint {path} not found (a folder with config.json + weights)")
    files = sorted(path.glob("*.safetensors")) or sorted(path.glob("pytorch_model*.bin"))
    if not files:
        raise FileNotFoundError(f"no *.safetensors or pytorch_model*.bin in {path}")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)) if f.suffix == ".safetensors" else torch.load(f, map_location="cpu"))
    return state, BertConfig.from_pretrained(str(path)).to_dict()


def skillnet_from_dense(
    dense: str | Path | nn.Module | dict,
    config: SkillNetBertConfig | None = None,
    model_class: type[PreTrainedModel] = SkillNetBertModel,
    init_skills: Iterable[str] | None = None,
    **config_overrides: Any,
) -> PreTrainedModel:
    """Build a SkillNet-BERT whose skills are copies of a dense BERT's FFN (Appendix B).

    `dense`: an HF BERT folder, a ``BertModel``/``BertForPreTraining``, or a state dict. Embeddings,
    attention, LayerNorms, pooler (and ``cls.*`` heads if the target has them) are copied; in every skill
    layer each skill in `init_skills` (default: all) gets the dense FFN, the rest stay randomly initialised.
    """
    state, dense_cfg = _load_dense(dense)
    if config is None:
        if dense_cfg is None:
            raise ValueError("pass config= when converting from a bare state dict")
        keep = set(SkillNetBertConfig().to_dict()) - {"model_type", "architectures", "transformers_version"}
        config = SkillNetBertConfig(**{k: v for k, v in dense_cfg.items() if k in keep}, **config_overrides)
    elif config_overrides:
        raise ValueError("pass either config= or config overrides, not both")
    model = model_class(config)
    enc_prefix = "" if isinstance(model, SkillNetBertModel) else "bert."
    skill_layers = set(config.skill_layer_ids())
    targets = [config.skill_index(s) for s in (init_skills or config.skill_names)]

    mapped: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.endswith("position_ids"):
            continue
        bare = key[5:] if key.startswith("bert.") else key
        if not bare.startswith(("embeddings.", "encoder.", "pooler.")):
            if enc_prefix and key.startswith("cls."):
                mapped[key] = value  # BertForPreTraining heads share HF names
            continue
        m = _FFN_KEY.match(bare)
        per_skill = m is not None and (
            m["mod"] != "output.LayerNorm" or config.skill_layernorm == "per_skill"
        )
        if per_skill and int(m["layer"]) in skill_layers:
            # The dense FFN (and, for per-skill LayerNorm, the dense LayerNorm) becomes every skill's.
            for k in targets:
                mapped[f"{enc_prefix}encoder.layer.{m['layer']}.skill_ffn.skills.{k}.{m['mod']}.{m['p']}"] = (
                    value
                )
        else:
            mapped[enc_prefix + bare] = value
    result = model.load_state_dict(mapped, strict=False)
    if result.unexpected_keys:
        raise ValueError(
            f"dense checkpoint has weights with no place in SkillNet: {result.unexpected_keys[:8]}"
        )
    init_ids = set(targets)
    must_have = [
        k
        for k in result.missing_keys
        if k.startswith((enc_prefix + "embeddings", enc_prefix + "encoder"))
        and not _is_uninit_skill(k, init_ids)
    ]
    if must_have:
        raise ValueError(f"dense checkpoint lacks encoder weights: {must_have[:8]}")
    model.tie_weights()
    return model


def _is_uninit_skill(key: str, init_ids: set[int]) -> bool:
    m = _SKILL_KEY.search(key)
    return m is not None and int(m.group(1)) not in init_ids


# ---- skills as units ------------------------------------------------------------------------------------
def skill_parameters(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Skill name -> its parameters in every skill layer."""
    enc = encoder_of(model)
    out: dict[str, list[nn.Parameter]] = {}
    for name in enc.config.skill_names:
        out[name] = [p for s in enc.skill_modules(name) for p in s.parameters()]
    return out


def add_skill(
    model: nn.Module,
    name: str,
    init_from: str | None = "s7",
    description: str = "",
    tasks: Iterable[str] = (),
) -> int:
    """Add skill `name` to every skill layer (§3.4), initialised as a copy of `init_from` (None: random),
    and activate it for `tasks`. Returns its id. Build the optimizer after calling this."""
    enc = encoder_of(model)
    cfg = enc.config
    src = cfg.skill_index(init_from) if init_from is not None else None
    tasks = list(tasks)
    for t in tasks:
        cfg.task_skill_names(t)  # validates before anything changes
    new_id = cfg.add_skill(name, description)
    cfg.skills[new_id]["origin"] = f"copy of {init_from}" if init_from else "random init"
    for layer in enc.encoder.layer:
        if not layer.has_skills:
            continue
        bank = layer.skill_ffn.skills
        if src is not None:
            new = copy.deepcopy(bank[src])
        else:
            new = copy.deepcopy(bank[0])
            new.apply(enc._init_weights)
        for p in new.parameters():
            p.requires_grad_(True)
        bank.append(new)
    for t in tasks:
        if name not in cfg.tasks[t]:
            cfg.tasks[t].append(name)
    _sync_configs(model, cfg)
    return new_id


def _sync_configs(model: nn.Module, cfg: SkillNetBertConfig) -> None:
    # The wrapper and its encoder share one config object in practice; keep them equal if not.
    if getattr(model, "config", cfg) is not cfg:
        model.config.skills = cfg.skills
        model.config.tasks = cfg.tasks
        model.config.generic_skill = cfg.generic_skill


def freeze_skills(model: nn.Module, names: Iterable[str], frozen: bool = True) -> None:
    params = skill_parameters(model)
    for n in names:
        if n not in params:
            raise KeyError(f"unknown skill {n!r}; valid skills: {', '.join(params)}")
        for p in params[n]:
            p.requires_grad_(not frozen)


def tasks_using(config: SkillNetBertConfig, skill: str) -> list[str]:
    return [t for t in config.tasks if skill in config.task_skill_names(t)]


def export_skill(model: nn.Module, name: str, path: str | Path, origin: str | None = None) -> Path:
    """Write one skill's weights across all skill layers plus a manifest (name, origin, tasks, shapes)."""
    enc = encoder_of(model)
    cfg = enc.config
    k = cfg.skill_index(name)
    layer_ids = cfg.skill_layer_ids()
    tensors = {}
    for li, skill in zip(layer_ids, enc.skill_modules(name)):
        for pname, p in skill.named_parameters():
            tensors[f"layer.{li}.{pname}"] = p.detach().cpu().contiguous()
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / SKILL_FILE))
    manifest = {
        "name": name,
        "description": cfg.skills[k].get("description", ""),
        "origin": origin or cfg.skills[k].get("origin") or getattr(cfg, "_name_or_path", "") or "unknown",
        "tasks": tasks_using(cfg, name),
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "skill_layers": layer_ids,
        "skill_layernorm": cfg.skill_layernorm,
        "format_version": 1,
    }
    tmp = out / (MANIFEST_FILE + ".tmp")
    tmp.write_text(json.dumps(manifest, indent=2, ensure_ascii=False))
    tmp.replace(out / MANIFEST_FILE)
    return out


def import_skill(
    model: nn.Module,
    path: str | Path,
    name: str | None = None,
    tasks: Iterable[str] | None = None,
    replace: bool = False,
) -> int:
    """Load a skill written by `export_skill`. Adds it as a new skill (or overwrites an existing one with
    `replace=True`) and activates it for `tasks` (default: the manifest's tasks that this model knows)."""
    src = Path(path)
    if not (src / MANIFEST_FILE).exists() or not (src / SKILL_FILE).exists():
        raise FileNotFoundError(f"{src} is not an exported skill (needs {MANIFEST_FILE} and {SKILL_FILE})")
    manifest = json.loads((src / MANIFEST_FILE).read_text())
    enc = encoder_of(model)
    cfg = enc.config
    name = name or manifest["name"]
    for key in ("hidden_size", "intermediate_size", "skill_layers", "skill_layernorm"):
        mine = cfg.skill_layer_ids() if key == "skill_layers" else getattr(cfg, key)
        if manifest[key] != mine:
            raise ValueError(f"skill {name!r} from {src} has {key}={manifest[key]}, this model has {mine}")
    if tasks is None:
        tasks = [t for t in manifest.get("tasks", []) if t in cfg.tasks]
    if name in cfg.skill_names:
        if not replace:
            raise ValueError(f"skill {name!r} already exists; pass replace=True to overwrite it")
        k = cfg.skill_index(name)
        for t in tasks:
            if name not in cfg.tasks[t]:
                cfg.tasks[t].append(name)
    else:
        k = add_skill(model, name, init_from=None, description=manifest.get("description", ""), tasks=tasks)
    cfg.skills[k]["origin"] = manifest.get("origin", str(src))
    tensors = load_file(str(src / SKILL_FILE))
    with torch.no_grad():
        for li, skill in zip(cfg.skill_layer_ids(), enc.skill_modules(name)):
            for pname, p in skill.named_parameters():
                p.copy_(tensors[f"layer.{li}.{pname}"])
    return k
