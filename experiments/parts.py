"""The reproduction in named parts along the stage graph, each short enough for one sitting (PART_LIMIT_S on the
2 cores the estimate is priced on), so that it can run on different machines and days and be committed as it
finishes (results/<profile>/<part>/, experiments/provenance.py).

A part is a group of consecutive stages; a group marked `by_seed` whose estimate exceeds the limit becomes one part
per seed of the profile (``nlu_main.seed0`` ...), each running that seed's runs only. The comparison of a split
stage is aggregated by the seed part that finds every seed's runs present (its own, and the others' restored from
their committed results).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from skillnet.experiments.profiles import Profile
from skillnet.experiments.stages import STAGES

# The protocol the parts were made under: a part recorded under another version is not the same experiment, and the
# report refuses to mix them (experiments/part_run.py rebuild_report). 1: the run committed before issue 55 (decisions on test,
# one pre-training run per model); 2: issue 55's protocol (decontaminated corpus, every choice on dev, realised
# budgets, replicated pre-training with a dense control, the bootstrap and Holm rule).
PROTOCOL_VERSION = 2

# One sitting: a laptop evening, a preemptible machine, a cluster job's limit (issue 56).
PART_LIMIT_S = 2.5 * 3600
# A group that can be cut by seed is cut above this: a part must leave its sitting room for set-up on a fresh machine
# and for the estimate's error (the first full-profile BERT pre-training stepped 0.20 s where the machine was quiet,
# against 0.15 s estimated), and seed parts can run side by side on different machines.
SPLIT_ABOVE_S = 1.25 * 3600


@dataclass(frozen=True)
class Group:
    name: str
    title: str
    stages: tuple[str, ...]
    by_seed: bool = False  # split into one part per seed when its estimate exceeds SPLIT_ABOVE_S (or the limit)


GROUPS: tuple[Group, ...] = (
    Group("data", "task data of both halves, the decontaminated corpus, the vocab over every task, shards",
          ("nlu_tasks", "nlg_tasks", "corpus", "vocab", "shards")),
    Group("bert_pt", "BERT pre-training: dense, then each seed's sparse run and its dense control",
          ("dense_pt", "sparse_pt", "dense_ctrl_pt")),
    Group("nlu_tune", "the NLU lr search on dev", ("nlu_tune",)),
    Group("nlu_loss_scale", "the NER loss-scale study, decided on dev", ("nlu_loss_scale",)),
    # Adaptation continues each seed's dev-selected model: in the same part, those exports (~9 MB each) need not be
    # committed, which keeps results/full under ~100 MB.
    Group("nlu_main", "NLU Table 3, and Table 5 from its dev-selected models", ("nlu_main", "nlu_adapt"), by_seed=True),
    Group("nlu_side", "NLU ablation and sampling alpha", ("nlu_ablate", "nlu_alpha")),
    Group("bart_pt", "BART denoising pre-training", ("bart_pt",)),
    Group("nlg_tune", "the NLG lr search on dev", ("nlg_tune",)),
    Group("nlg_main", "NLG Table 3, and Table 4 from its dev-selected models", ("nlg_main", "nlg_adapt"), by_seed=True),
    Group("nlg_side", "NLG sampling temperature", ("nlg_temp",)),
)

# What each stage reads from earlier stages (beyond its own folder): the edges of the stage graph that decide what a
# part needs from earlier parts.
READS: dict[str, tuple[str, ...]] = {
    "nlu_tasks": (), "nlg_tasks": (), "corpus": ("nlu_tasks", "nlg_tasks"), "vocab": ("corpus",),
    "shards": ("corpus", "vocab"),
    "dense_pt": ("shards",), "sparse_pt": ("shards", "dense_pt"), "dense_ctrl_pt": ("shards", "dense_pt"),
    # the lr search runs first; every later NLU table trains at the lr it chose (experiments/tune.py study_lrs)
    "nlu_tune": ("nlu_tasks", "sparse_pt", "dense_ctrl_pt"),
    "nlu_loss_scale": ("nlu_tasks", "sparse_pt", "dense_ctrl_pt", "nlu_tune"),
    "nlu_main": ("nlu_tasks", "sparse_pt", "dense_ctrl_pt", "nlu_tune", "nlu_loss_scale"),
    "nlu_ablate": ("nlu_tasks", "dense_pt", "nlu_tune", "nlu_loss_scale"),
    "nlu_alpha": ("nlu_tasks", "dense_pt", "nlu_tune", "nlu_loss_scale"),
    "nlu_adapt": ("nlu_tasks", "nlu_main", "dense_ctrl_pt", "nlu_tune", "nlu_loss_scale"),
    "bart_pt": ("shards",), "nlg_tune": ("nlg_tasks", "bart_pt"), "nlg_main": ("nlg_tasks", "bart_pt", "nlg_tune"),
    "nlg_temp": ("nlg_tasks", "bart_pt", "nlg_tune"), "nlg_adapt": ("nlg_tasks", "nlg_main", "nlg_tune"),
}


@dataclass(frozen=True)
class Part:
    name: str
    title: str
    stages: tuple[str, ...]
    group: str
    seed: int | None = None  # a per-seed part of a split group: that seed's runs only

    @property
    def split(self) -> bool:
        return self.seed is not None


def stage_estimates(p: Profile) -> dict[str, float]:
    """Each stage's estimated seconds on 2 cores (experiments/estimate.py); 0 for a stage it cannot price."""
    from skillnet.experiments.estimate import cpu_estimate

    return {k: v or 0.0 for k, v in cpu_estimate(p).items()}


def parts_of(p: Profile, limit_s: float = PART_LIMIT_S, est: dict[str, float] | None = None) -> list[Part]:
    """The parts of profile `p`, in the order they can run."""
    est = stage_estimates(p) if est is None else est
    out: list[Part] = []
    for g in GROUPS:
        if g.by_seed and len(p.seeds) > 1 and sum(est.get(s, 0.0) for s in g.stages) > min(limit_s, SPLIT_ABOVE_S):
            out += [Part(f"{g.name}.seed{k}", f"{g.title}, seed {k}", g.stages, g.name, k) for k in p.seeds]
        else:
            out.append(Part(g.name, g.title, g.stages, g.name))
    return out


def estimated_seconds(part: Part, p: Profile, est: dict[str, float] | None = None) -> float:
    """A part's estimate: its stages', a seed part's share of its split stages by the profile's seeds."""
    est = stage_estimates(p) if est is None else est
    total = sum(est.get(s, 0.0) for s in part.stages)
    return total / len(p.seeds) if part.split else total


def owner(parts: list[Part], stage: str) -> list[Part]:
    """The part(s) that run `stage` (every seed part of a split one)."""
    return [x for x in parts if stage in x.stages]


def needs(parts: list[Part], part: Part) -> list[Part]:
    """The earlier parts whose outputs `part` reads (READS), in order; the data part always (it is rebuilt
    locally and checked against the committed fingerprints)."""
    want: set[str] = {"data"}
    for st in part.stages:
        for dep in READS[st]:
            want |= {x.name for x in owner(parts, dep) if x.group != part.group}
    return [x for x in parts if x.name in want and x.name != part.name]


def find(parts: list[Part], name: str) -> Part:
    for x in parts:
        if x.name == name:
            return x
    raise KeyError(f"no part named {name!r}; parts: {', '.join(x.name for x in parts)}")


def check_groups() -> list[str]:
    """What is wrong with GROUPS against STAGES (each stage in exactly one group, in STAGES order)."""
    names = [s.name for s in STAGES]
    grouped = [s for g in GROUPS for s in g.stages]
    bad = []
    if sorted(grouped) != sorted(names):
        bad.append(f"stages grouped {sorted(set(grouped) ^ set(names))} differ from STAGES")
    if len(set(grouped)) != len(grouped):
        bad.append("a stage is in two groups")
    if set(READS) != set(names):
        bad.append(f"READS lacks {sorted(set(names) - set(READS))}")
    return bad


def status_of(part: Part, committed: dict[str, dict[str, Any]], p: Profile, profile_hash: str) -> str:
    """done, missing or stale (made under another protocol version or profile, or its recorded inputs differ from
    what the parts it read recorded as their outputs now)."""
    rec = committed.get(part.name)
    if rec is None:
        return "missing"
    if rec.get("protocol_version") != PROTOCOL_VERSION:
        return f"stale (protocol {rec.get('protocol_version')}, now {PROTOCOL_VERSION})"
    if rec.get("profile_hash") != profile_hash:
        return "stale (another profile)"
    outputs = {k: v for r in committed.values() for k, v in (r.get("outputs") or {}).items()}
    changed = [k for k, v in (rec.get("inputs") or {}).items() if k in outputs and outputs[k] != v]
    return f"stale (input {changed[0]} changed)" if changed else "done"


def list_parts(p: Profile, committed: dict[str, dict[str, Any]], profile_hash: str,
               limit_s: float = PART_LIMIT_S) -> str:
    """The `--list-parts` table: each part, its time (measured where committed, else estimated), status, needs."""
    est = stage_estimates(p)
    parts = parts_of(p, limit_s, est)
    rows = []
    for x in parts:
        rec = committed.get(x.name)
        t = f"{rec['wall_s'] / 3600:.2f} h measured" if rec and rec.get("wall_s") else \
            f"{estimated_seconds(x, p, est) / 3600:.2f} h estimated"
        rows.append((x.name, t, status_of(x, committed, p, profile_hash),
                     ", ".join(n.name for n in needs(parts, x)) or "-", " ".join(x.stages)))
    w = [max(len(r[i]) for r in rows + [("part", "time", "status", "needs", "stages")]) for i in range(4)]
    lines = [f"{'part':<{w[0]}}  {'time':<{w[1]}}  {'status':<{w[2]}}  {'needs':<{w[3]}}  stages"]
    lines += [f"{a:<{w[0]}}  {b:<{w[1]}}  {c:<{w[2]}}  {d:<{w[3]}}  {e}" for a, b, c, d, e in rows]
    return "\n".join(lines) + f"\n(limit per part: {limit_s / 3600:.2g} h on 2 cores)\n"
