"""The multi-task methods compared in SkillNet-NLU §4.1 (Tables 3-5), the learnable skill combination
and BERT-PALs, as one registry: a method is a config value that picks a router (model/routers.py) and the
task extras (model/extras.py), and nothing else. Every router registered anywhere is also a method of its
own name (that router, no extras), so a new router is one class and one ``register_router`` line.

Every method starts from the same *reference* model: a SkillNet-BERT with the config's tasks and heads,
built from ``model.init`` (a SkillNet export as it is, a dense HF BERT with every skill a copy of its
FFN, or a preset with random weights drawn from the run's seed). A method then derives its model from
the reference by copying weights under a new config, so embeddings, attention, heads and FFN weights
start identical across methods and only what a method adds (a gate, a task-skill map, PALs) is new
(the router's ``derive`` says which config changes and new parameters; the extras add their own):

=================  ============================================================================
method             model derived from the reference
=================  ============================================================================
``skillnet``       the reference itself: each task runs its skills (Table 2), averaged (Eq. 1-2)
``dense_joint``    one FFN shared by all tasks = the reference's generic skill (router ``dense``, MT-DNN style)
``task_specific``  one dense model per task, each trained on its task alone (see ``run.py``)
``moe``            top-2 token gate over as many FFNs as there are skills; expert i = skill i (``topk``)
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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from skillnet.model.extras import EXTRAS
from skillnet.model.registry import ROUTERS, router_class

__all__ = ["METHODS", "Method", "derive_model", "method_names"]


@dataclass(frozen=True)
class Method:
    """A router (``config.router`` name and its settings) and the task extras (names in the extras
    registry, with their config settings). Everything else follows from those two."""

    name: str
    summary: str
    router: str
    router_settings: dict[str, Any] = field(default_factory=dict)
    # task extras, by their name in the extras registry
    extras: tuple[str, ...] = ()
    # one model per task, each trained alone (run.py loops over the tasks): a training regime, not a model
    per_task: bool = False

    @property
    def uses_task_skills(self) -> bool:
        """New skills, frozen old skills and skill ablations only make sense where tasks pick skills."""
        return router_class(self.router).uses_task_skills

    @property
    def own_lr_fragment(self) -> str | None:
        """Parameters (name fragment) that train with train.skill_map_lr in a group of their own."""
        return router_class(self.router).own_lr_params

    @property
    def zero_grad_fragments(self) -> tuple[str, ...]:
        """Parameters that can be in the graph with an all-zero gradient, which the optimizer must then
        check for (training/optim.py build_param_groups)."""
        return router_class(self.router).zero_grad_params

    @property
    def archs(self) -> tuple[str, ...]:
        """Architectures (model/spec.py) it is defined for: the router's and the extras' backbones."""
        types = router_class(self.router).model_types
        archs = ("bert", "bart") if types is None else tuple(t.removeprefix("skillnet-") for t in types)
        return ("bert",) if self.extras else archs  # task extras hook into SkillNet-BERT's layers

    def build(self, ref: Any) -> Any:
        """(reference model) -> this method's model; the reference already holds every task and head."""
        d = router_class(self.router).derive(ref.config, **self.router_settings)
        if d.changes == {"router": ref.config.router} and d.skill_source is None and not self.extras:
            return ref  # nothing to derive: the reference is the model
        changes, new_ok = dict(d.changes), d.new_params
        for name in self.extras:
            changes.update(_EXTRAS_SETTINGS[name](ref.config))
            new_ok = (*new_ok, f"{name}.")
        model = derive_model(ref, changes, skill_source=d.skill_source, new_ok=new_ok)
        router = model.base_model.router
        router.before_save(model.base_model)  # the plan, the counts and the exports read the config
        return model


def _pals_settings(cfg: Any) -> dict[str, Any]:
    from skillnet.model.config import SkillNetBertConfig

    return {"pals_dim": SkillNetBertConfig.pals_dim_for(cfg.hidden_size, cfg.pals_heads)}


# What each task extra sets in the config to be built (the extras registry builds it from there).
_EXTRAS_SETTINGS = {"pals": _pals_settings}
assert set(_EXTRAS_SETTINGS) <= set(EXTRAS)


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
    cfg.validate_skills()  # every family's layout and router checks; BERT's adds its heads and extras
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


_NAMED: dict[str, Method] = {m.name: m for m in (
    Method("skillnet", "SkillNet: each task runs its skills (Table 2), averaged", "task"),
    Method("dense_joint", "one dense encoder shared by all tasks, one head per task (MT-DNN)", "dense"),
    Method("task_specific", "one dense model per task, each trained alone", "dense", per_task=True),
    Method("moe", "top-2 token gate over as many FFNs as skills, load balancing, capacity", "topk"),
    Method("learnable", "skills of SkillNet, task-skill map learned (sigmoid similarity, threshold; "
           "straight-through estimator)", "learned"),
    # Eq. 6 exactly as the paper's Appendix C sets it: no gradient reaches the map in fp32 (see
    # model/routers.py), so this variant shows what the paper's estimator learns: the map stays where it started.
    Method("learnable_eq6", "learnable with Eq. 6 as written (sharpness 1e9: no gradient reaches the map)",
           "learned", {"learned_estimator": "eq6", "learned_sharpness": 1e9}),
    Method("pals", "dense encoder + a projected attention layer per task in every layer", "dense",
           extras=("pals",)),
)}


class _Methods(Mapping[str, Method]):
    """The named methods, then one method per registered router that no named method picks (its name, no
    extras): a router registered anywhere is a method of the fine-tuning CLI at once."""

    def _all(self) -> dict[str, Method]:
        picked = {m.router for m in _NAMED.values()}
        extra = {n: Method(n, f"router {n!r}: " + (cls.__doc__ or "").strip().split("\n")[0], n)
                 for n, cls in ROUTERS.items() if n not in picked and n not in _NAMED}
        return {**_NAMED, **extra}

    def __getitem__(self, name: str) -> Method:
        return self._all()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())


METHODS: Mapping[str, Method] = _Methods()


def method_names() -> list[str]:
    return list(METHODS)
