"""The multi-task methods compared in skillnet-nlu.md §4.1 (Tables 3-5), the learnable skill combination
and BERT-PALs, as one registry: a method is a config value that picks a router and the task extras.

Every method starts from the same *reference* model: a SkillNet-BERT with the config's tasks and heads,
built from ``model.init`` (a SkillNet export as it is, a dense HF BERT with every skill a copy of its
FFN, or a preset with random weights drawn from the run's seed). A method then derives its model from
the reference by copying weights under a new config, so embeddings, attention, heads and FFN weights
start identical across methods and only what a method adds (a gate, a task-skill map, PALs) is new:

=================  ============================================================================
method             model derived from the reference
=================  ============================================================================
``skillnet``       the reference itself: each task runs its skills (Table 2), averaged (Eq. 1-2)
``dense_joint``    one FFN shared by all tasks = the reference's generic skill (MT-DNN style)
``task_specific``  one dense model per task, each trained on its task alone (see ``run.py``)
``moe``            top-2 token gate over as many FFNs as there are skills; expert i = skill i
``learnable``      the skills of the reference, a learned task-skill map (router ``learned``)
``learnable_eq6``  the same with Eq. 6 as written (sharpness 1e9), which passes no gradient to the map
``pals``           ``dense_joint`` plus a projected attention layer per task in every layer
=================  ============================================================================

The generic skill is the one trained on every pre-training objective and, in a model built from a
dense BERT, equal to the dense FFN: so ``dense_joint`` from a dense BERT is exactly that BERT, and it
gives the same outputs as ``skillnet`` built from it while every skill is still a copy.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["METHODS", "Method", "derive_model", "method_names"]


@dataclass(frozen=True)
class Method:
    name: str
    summary: str
    # (reference model) -> this method's model; the reference already holds every task and head.
    build: Callable[[Any], Any]
    # new skills, frozen old skills and skill ablations only make sense where tasks pick skills.
    uses_task_skills: bool = False
    # one model per task, each trained alone (run.py loops over the tasks).
    per_task: bool = False
    # parameters (name fragment) that train with train.skill_map_lr in a group of their own.
    own_lr_fragment: str | None = None
    # architectures it is defined for (finetune/archs.py): the learned map and PALs are BERT-only here
    archs: tuple[str, ...] = ("bert", "bart")
    # parameters (name fragments) that can be in the graph with an all-zero gradient, which the optimizer
    # must then check for (training/optim.py build_param_groups): MoE experts whose tokens all miss the loss
    zero_grad_fragments: tuple[str, ...] = ()


def _generic_index(cfg: Any) -> int:
    if cfg.generic_skill is None:
        raise ValueError("dense-FFN methods take the reference's generic skill as the shared FFN, "
                         "but the model has no generic_skill")
    return cfg.skill_index(cfg.generic_skill)


_DENSE_SKILL = [{"name": "shared", "description": "one FFN shared by all tasks"}]


def derive_model(ref: Any, changes: dict[str, Any], *, skill_source: list[int] | None = None,
                 new_ok: tuple[str, ...] = ()) -> Any:
    """A model of ``ref``'s class with ``ref``'s config plus ``changes``, whose weights are ref's.

    skill_source[k]: which skill of ``ref`` the new skill k copies (None: the same skills).
    new_ok: name fragments of parameters that are new
    in the derived model (a gate, a map, PALs) and keep their fresh initialisation.
    """
    cfg = copy.deepcopy(ref.config)
    for k, v in changes.items():
        setattr(cfg, k, copy.deepcopy(v))
    # BERT's config checks heads and methods too; BART's checks its skill layout
    (cfg.validate_skills if hasattr(cfg, "validate_skills") else cfg.validate_skill_layout)()
    model = type(ref)(cfg)
    state: dict[str, torch.Tensor] = {}
    for key, value in ref.state_dict().items():
        if ".skill_ffn.skills." in key and skill_source is not None:
            head, rest = key.split(".skill_ffn.skills.", 1)
            k_old, tail = rest.split(".", 1)
            for k_new, src in enumerate(skill_source):
                if src == int(k_old):
                    state[f"{head}.skill_ffn.skills.{k_new}.{tail}"] = value
            continue
        state[key] = value
    missing, unexpected = model.load_state_dict(state, strict=False)
    bad_missing = [k for k in missing if not any(f in k for f in new_ok)]
    if unexpected or bad_missing:
        raise RuntimeError(f"deriving the {changes} model: weights do not fit "
                           f"(missing {bad_missing[:4]}, unexpected {unexpected[:4]})")
    return model


def _skillnet(ref: Any) -> Any:
    return ref


def _dense_joint(ref: Any, new_ok: tuple[str, ...] = (), **extra: Any) -> Any:
    cfg = ref.config
    tasks = {t: ["shared"] for t in cfg.tasks}
    return derive_model(ref, {"skills": copy.deepcopy(_DENSE_SKILL), "tasks": tasks, "generic_skill": None, **extra},
                        skill_source=[_generic_index(cfg)], new_ok=new_ok)


def _moe(ref: Any) -> Any:
    return derive_model(ref, {"router": "topk", "moe_top_k": min(2, ref.config.num_skills)}, new_ok=(".gate.",))


def _learnable(ref: Any, **changes: Any) -> Any:
    model = derive_model(ref, {"router": "learned", **changes}, new_ok=("skill_map.",))
    model.bert.sync_learned_map()  # the plan, the counts and the exports read the map from the config
    return model


def _learnable_eq6(ref: Any) -> Any:
    # Eq. 6 exactly as the paper's Appendix C sets it: no gradient reaches the map in fp32 (see routers.py),
    # so this variant shows what the paper's estimator learns: the map stays where it started.
    return _learnable(ref, learned_estimator="eq6", learned_sharpness=1e9)


def _pals(ref: Any) -> Any:
    from skillnet.model.config import SkillNetBertConfig

    d_m = SkillNetBertConfig.pals_dim_for(ref.config.hidden_size, ref.config.pals_heads)
    return _dense_joint(ref, pals_dim=d_m, new_ok=("pals.",))


METHODS: dict[str, Method] = {m.name: m for m in (
    Method("skillnet", "SkillNet: each task runs its skills (Table 2), averaged", _skillnet, uses_task_skills=True),
    Method("dense_joint", "one dense encoder shared by all tasks, one head per task (MT-DNN)", _dense_joint),
    Method("task_specific", "one dense model per task, each trained alone", _dense_joint, per_task=True),
    Method("moe", "top-2 token gate over as many FFNs as skills, load balancing, capacity", _moe,
           zero_grad_fragments=(".skill_ffn.skills.",)),
    Method("learnable", "skills of SkillNet, task-skill map learned (sigmoid similarity, threshold; "
           "straight-through estimator)", _learnable, own_lr_fragment="skill_map.", archs=("bert",)),
    Method("learnable_eq6", "learnable with Eq. 6 as written (sharpness 1e9: no gradient reaches the map)",
           _learnable_eq6, own_lr_fragment="skill_map.", archs=("bert",)),
    Method("pals", "dense encoder + a projected attention layer per task in every layer", _pals, archs=("bert",)),
)}


def method_names() -> list[str]:
    return list(METHODS)

