"""Skill surgery: dense BERT/BART -> SkillNet, new skills, freezing, and moving one skill between models."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from skillnet.common.files import atomic_write_json
from torch import nn
from transformers import BartConfig, BertConfig, PreTrainedConfig, PreTrainedModel

from .bart import SkillNetBartConfig, SkillNetBartForConditionalGeneration, SkillNetBartModel
from .bert import SkillNetBertModel
from .config import SkillNetBertConfig
from .skill_ffn import SkillFFN

_FFN_KEY = re.compile(
    r"^encoder\.layer\.(?P<layer>\d+)\.(?P<mod>intermediate\.dense|output\.dense|output\.LayerNorm)\.(?P<p>weight|bias)$"
)
_BART_FFN_KEY = re.compile(
    r"^(?P<stack>encoder|decoder)\.layers\.(?P<layer>\d+)\.(?P<mod>fc1|fc2|final_layer_norm)\.(?P<p>weight|bias)$"
)
# HF BART FFN names -> the names inside a `Skill` (which follow HF BERT).
_BART_TO_SKILL = {"fc1": "intermediate.dense", "fc2": "output.dense", "final_layer_norm": "output.LayerNorm"}
_SKILL_KEY = re.compile(r"\.skill_ffn\.skills\.(\d+)\.")
SKILL_FILE = "skill.safetensors"
MANIFEST_FILE = "manifest.json"


SkillBase = SkillNetBertModel | SkillNetBartModel


def skill_base_of(model: nn.Module) -> SkillBase:
    """The SkillNet backbone of `model`: itself, its ``.bert`` (BERT) or its ``.model`` (BART)."""
    if isinstance(model, (SkillNetBertModel, SkillNetBartModel)):
        return model
    for attr in ("bert", "model"):
        base = getattr(model, attr, None)
        if isinstance(base, (SkillNetBertModel, SkillNetBartModel)):
            return base
    raise TypeError(
        f"{type(model).__name__} is not a SkillNet model "
        "(no SkillNetBertModel at .bert or SkillNetBartModel at .model)"
    )


def skill_banks(base: SkillBase) -> list[SkillFFN]:
    """The skill FFN bank of every skill layer of a SkillNet backbone."""
    if isinstance(base, SkillNetBartModel):
        return base.skill_banks()
    return [layer.skill_ffn for layer in base.encoder.layer if layer.has_skills]


# ---- dense -> SkillNet ---------------------------------------------------------------------------------
def _load_dense(
    dense: str | Path | nn.Module | dict,
    config_class: type[PreTrainedConfig] = BertConfig,
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
    return state, config_class.from_pretrained(str(path)).to_dict()


def _skillnet_config(
    config_class: type[PreTrainedConfig],
    dense_cfg: dict[str, Any] | None,
    config: PreTrainedConfig | None,
    overrides: dict[str, Any],
) -> Any:
    """The SkillNet config of a conversion: `config`, or the dense config's sizes plus `overrides`."""
    if config is not None:
        if overrides:
            raise ValueError("pass either config= or config overrides, not both")
        return config
    if dense_cfg is None:
        raise ValueError("pass config= when converting from a bare state dict")
    keep = set(config_class().to_dict()) - {"model_type", "architectures", "transformers_version"}
    return config_class(**{**{k: v for k, v in dense_cfg.items() if k in keep}, **overrides})


def _load_mapped(
    model: PreTrainedModel, mapped: dict[str, torch.Tensor], required: tuple[str, ...], init_ids: set[int]
) -> None:
    """Load `mapped` into `model`; every parameter under `required` must come from the checkpoint, except
    skills left to random init and weights tied to a loaded one (e.g. embeddings that safetensors
    dedups)."""
    result = model.load_state_dict(mapped, strict=False)
    if result.unexpected_keys:
        raise ValueError(
            f"dense checkpoint has weights with no place in SkillNet: {result.unexpected_keys[:8]}"
        )
    model.tie_weights()
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded = {id(params[k]) for k in mapped if k in params}
    must_have = [
        k
        for k in result.missing_keys
        if k.startswith(required)
        and not _is_uninit_skill(k, init_ids)
        and not (k in params and id(params[k]) in loaded)
    ]
    if must_have:
        raise ValueError(f"dense checkpoint lacks backbone weights: {must_have[:8]}")


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
    config = _skillnet_config(SkillNetBertConfig, dense_cfg, config, config_overrides)
    model = model_class(config)
    if isinstance(dense, (str, Path)):
        model.config._name_or_path = str(dense)  # save_pretrained carries the dense folder's tokenizer over
    enc_prefix = "" if isinstance(model, SkillNetBertModel) else "bert."
    skill_layers = set(config.skill_layer_ids())
    targets = [config.skill_index(s) for s in (init_skills or config.skill_names)]

    mapped: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if key.endswith("position_ids"):
            continue
        bare = key[5:] if key.startswith("bert.") else key
        if not bare.startswith(("embeddings.", "encoder.", "pooler.")):
            if enc_prefix and key.startswith("cls.") and hasattr(model, "cls"):
                mapped[key] = value  # BertForPreTraining heads share HF names; a multi-task model has none
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
    _load_mapped(model, mapped, (enc_prefix + "embeddings", enc_prefix + "encoder"), set(targets))
    return model


def skillnet_bart_from_dense(
    dense: str | Path | nn.Module | dict,
    config: SkillNetBartConfig | None = None,
    model_class: type[PreTrainedModel] = SkillNetBartForConditionalGeneration,
    init_skills: Iterable[str] | None = None,
    **config_overrides: Any,
) -> PreTrainedModel:
    """Build a SkillNet-BART whose skills are copies of a dense BART's FFNs (SkillNet-NLG Appendix C.1).

    `dense`: an HF BART folder, a ``BartModel``/``BartForConditionalGeneration``, or a state dict (then
    pass `config`). Sizes and token ids come from the dense config; `config_overrides` set the skill
    layout (``skill_layers=``, ``skill_layernorm=`` ...). In every skill layer each skill in
    `init_skills` (default: all) gets the layer's ``fc1``/``fc2`` (and its ``final_layer_norm`` with
    per-skill LayerNorm); the rest stay randomly initialised. Everything else, ``final_logits_bias``
    included, is copied.
    """
    state, dense_cfg = _load_dense(dense, BartConfig)
    config = _skillnet_config(SkillNetBartConfig, dense_cfg, config, config_overrides)
    model = model_class(config)
    if isinstance(dense, (str, Path)):
        model.config._name_or_path = str(dense)  # save_pretrained carries the dense folder's tokenizer over
    prefix = "" if isinstance(model, SkillNetBartModel) else "model."
    skill_layers = {
        "encoder": set(config.encoder_skill_layer_ids()), "decoder": set(config.decoder_skill_layer_ids())
    }
    per_skill_ln = config.skill_layernorm == "per_skill"
    targets = [config.skill_index(s) for s in (init_skills or config.skill_names)]

    mapped: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        bare = key[6:] if key.startswith("model.") else key
        if bare.endswith(".version"):
            continue  # fairseq-converted checkpoints carry these; HF ignores them too
        if not bare.startswith(("shared.", "encoder.", "decoder.")):
            if prefix and key in ("lm_head.weight", "final_logits_bias"):
                mapped[key] = value
            continue
        m = _BART_FFN_KEY.match(bare)
        to_skills = (
            m is not None
            and int(m["layer"]) in skill_layers[m["stack"]]
            and (m["mod"] != "final_layer_norm" or per_skill_ln)
        )
        if to_skills:
            for k in targets:
                skill = f"skill_ffn.skills.{k}.{_BART_TO_SKILL[m['mod']]}.{m['p']}"
                mapped[f"{prefix}{m['stack']}.layers.{m['layer']}.{skill}"] = value
        else:
            mapped[prefix + bare] = value
    _load_mapped(model, mapped, tuple(prefix + p for p in ("shared", "encoder", "decoder")), set(targets))
    return model


def _is_uninit_skill(key: str, init_ids: set[int]) -> bool:
    m = _SKILL_KEY.search(key)
    return m is not None and int(m.group(1)) not in init_ids


# ---- skills as units ------------------------------------------------------------------------------------
def skill_parameters(model: nn.Module) -> dict[str, list[nn.Parameter]]:
    """Skill name -> its parameters in every skill layer."""
    enc = skill_base_of(model)
    out: dict[str, list[nn.Parameter]] = {}
    for name in enc.config.skill_names:
        out[name] = [p for s in enc.skill_modules(name) for p in s.parameters()]
    return out


# add_skill's default source: the config's generic skill (s7 for BERT, general for BART).
GENERIC = "<generic>"


def add_skill(
    model: nn.Module,
    name: str,
    init_from: str | None = GENERIC,
    description: str = "",
    tasks: Iterable[str] = (),
) -> int:
    """Add skill `name` to every skill layer (§3.4), initialised as a copy of `init_from` (default: the
    generic skill; None: random), and activate it for `tasks`. Returns its id. Build the optimizer after
    calling this."""
    enc = skill_base_of(model)
    cfg = enc.config
    if init_from == GENERIC:
        init_from = cfg.generic_skill
        if init_from is None:
            raise ValueError("the config has no generic skill to copy: pass init_from= (a name or None)")
    src = cfg.skill_index(init_from) if init_from is not None else None
    tasks = list(tasks)
    for t in tasks:
        cfg.task_skill_names(t)  # validates before anything changes
    new_id = cfg.add_skill(name, description)
    cfg.skills[new_id]["origin"] = f"copy of {init_from}" if init_from else "random init"
    for bank in skill_banks(enc):
        new = copy.deepcopy(bank.skills[0 if src is None else src])
        for p in new.parameters():
            p.requires_grad_(True)
            # HF's init helpers skip tensors flagged as initialised; a random skill must be drawn anew.
            p._is_hf_initialized = False
        if src is None:
            new.apply(enc._init_weights)
        bank.skills.append(new)
    for t in tasks:
        if name not in cfg.tasks[t]:
            cfg.tasks[t].append(name)
    _sync_configs(model, cfg)
    return new_id


def _sync_configs(model: nn.Module, cfg: SkillNetBertConfig | SkillNetBartConfig) -> None:
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


def tasks_using(config: SkillNetBertConfig | SkillNetBartConfig, skill: str) -> list[str]:
    return [t for t in config.tasks if skill in config.task_skill_names(t)]


def _skill_layout(enc: SkillBase) -> tuple[list[str], dict[str, Any]]:
    """Tensor-name prefixes of one skill's layers (in `skill_modules` order), and the facts about them an
    importing model must share. SkillNet-BERT keeps its original format (``layer.{i}``)."""
    cfg = enc.config
    if isinstance(enc, SkillNetBartModel):
        labels = [f"encoder.{i}" for i in cfg.encoder_skill_layer_ids()]
        labels += [f"decoder.{i}" for i in cfg.decoder_skill_layer_ids()]
        sizes = {"hidden_size": cfg.d_model, "ffn_dims": [cfg.encoder_ffn_dim, cfg.decoder_ffn_dim]}
        layers: list = labels
    else:
        layers = cfg.skill_layer_ids()
        labels = [f"layer.{i}" for i in layers]
        sizes = {"hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size}
    return labels, {**sizes, "skill_layers": layers, "skill_layernorm": cfg.skill_layernorm}


def export_skill(model: nn.Module, name: str, path: str | Path, origin: str | None = None) -> Path:
    """Write one skill's weights across all skill layers plus a manifest (name, origin, tasks, shapes)."""
    enc = skill_base_of(model)
    cfg = enc.config
    k = cfg.skill_index(name)
    labels, facts = _skill_layout(enc)
    tensors = {}
    for label, skill in zip(labels, enc.skill_modules(name)):
        for pname, p in skill.named_parameters():
            tensors[f"{label}.{pname}"] = p.detach().cpu().contiguous()
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out / SKILL_FILE))
    manifest = {
        "name": name,
        "description": cfg.skills[k].get("description", ""),
        "origin": origin or cfg.skills[k].get("origin") or getattr(cfg, "_name_or_path", "") or "unknown",
        "tasks": tasks_using(cfg, name),
        **facts,
        "format_version": 1,
    }
    atomic_write_json(out / MANIFEST_FILE, manifest)
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
    enc = skill_base_of(model)
    cfg = enc.config
    name = name or manifest["name"]
    labels, facts = _skill_layout(enc)
    for key, mine in facts.items():
        if manifest.get(key) != mine:
            theirs = manifest.get(key)
            raise ValueError(f"skill {name!r} from {src} has {key}={theirs}, this model has {mine}")
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
        for label, skill in zip(labels, enc.skill_modules(name)):
            for pname, p in skill.named_parameters():
                p.copy_(tensors[f"{label}.{pname}"])
    return k
