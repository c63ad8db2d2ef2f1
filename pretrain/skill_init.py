"""Where each skill of a sparse pre-training run started, checked against the run's own record.

    python -m skillnet.pretrain.skill_init RUN                      # RUN: a pretrain/run.py --output-dir
    python -m skillnet.pretrain.skill_init RUN --export RUN/hf      # also check the export's copies
    python -m skillnet.pretrain.skill_init RUN --dense DIR --json   # the dense folder moved; JSON out

One row per skill: where its weights at step 0 came from (a copy of the ``--init-from-dense`` FFN, or drawn at
random from ``--seed``), the largest absolute difference between those weights and the dense FFN they
would be a copy of, and what the export puts there (skills no objective trains become copies of the generic
skill, s7, unless ``--no-init-unused``). The weights at step 0 are the run's ``skill_init.safetensors``,
written by the trainer before the first step (``TrainConfig.skill_drift``; not under ZeRO-3). Its keys are
``<skill>/<n>``, ``n = P*i + j``: ``i`` counts the skill layers bottom to top, ``j`` the skill's tensors in
that layer (``intermediate.dense.weight``, ``intermediate.dense.bias``, ``output.dense.weight``,
``output.dense.bias``, then ``output.LayerNorm.weight`` and ``.bias`` with per-skill LayerNorm), ``P`` their
number (4 or 6). ``--json`` prints the same facts, the key of every tensor included.

Exit status: 0 when every claim holds (copies equal the dense FFN, random skills differ from it, the
export's copies equal their source), 1 when one does not, 2 when the run cannot be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

__all__ = ["SkillOrigin", "InitReport", "skill_init_report", "format_report", "main"]

INIT_FILE = "skill_init.safetensors"


@dataclass
class SkillOrigin:
    skill: str
    at_start: str  # where the step-0 weights came from
    copy: bool  # a copy of the dense FFN (else drawn at random)
    max_abs_diff: float | None  # step-0 weights against the dense FFN (None: no dense init)
    ok: bool
    at_export: str
    export_max_abs_diff: float | None = None  # the export's copy against its source (with --export)


@dataclass
class InitReport:
    run: str
    dense: str | None
    seed: int
    layers: list[str]  # the skill layers, bottom to top (n = P*i + j)
    tensors: list[str]  # the names j of one skill's tensors in one layer
    skills: list[SkillOrigin] = field(default_factory=list)
    export: str | None = None

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.skills)

    def keys(self, skill: str) -> dict[str, str]:
        """skill_init.safetensors key -> the tensor it holds."""
        p = len(self.tensors)
        return {f"{skill}/{p * i + j}": f"{layer}.{t}" for i, layer in enumerate(self.layers)
                for j, t in enumerate(self.tensors)}


class InitError(Exception):
    """The run cannot be read (one line)."""


def _layout(config_file: Path) -> tuple[Any, list[str], dict[str, list[str]]]:
    """(model config, skill layer labels, each skill's tensor names per layer), read from a model skeleton
    on the meta device: the order ``skill_parameters`` (and so skill_init.safetensors) uses."""
    from skillnet.export.hf_folder import checkpoint_kind
    from skillnet.model.spec import skillnet_family
    from skillnet.model.surgery import _skill_layout, skill_base_of

    raw = json.loads(config_file.read_text(encoding="utf-8"))
    try:
        kind = checkpoint_kind(raw)
    except ValueError as e:
        raise InitError(f"{config_file}: {e}") from None
    family = skillnet_family(raw.get("model_type"))
    if family is None or kind != family.model_type:
        raise InitError(f"{config_file.parent.parent.parent}: a dense run ({kind}) has no skills")
    cfg = family.load("config").from_json_file(str(config_file))
    with torch.device("meta"):
        model = family.load("pretraining_model")(cfg)
    base = skill_base_of(model)
    labels, _ = _skill_layout(base)
    names = {s: [n for n, _ in base.skill_modules(s)[0].named_parameters()] for s in cfg.skill_names}
    return cfg, labels, names


def _dense_tensor(state: dict[str, torch.Tensor], label: str, name: str, where: str) -> torch.Tensor:
    """The dense BERT's FFN tensor that a skill's ``<label>.<name>`` copies (HF BERT names, as a Skill's)."""
    layer = label.removeprefix("layer.")
    key = f"encoder.layer.{layer}.{name}"
    for k in (key, f"bert.{key}"):
        if k in state:
            return state[k]
    raise InitError(f"{where}: no {key} (is it the dense BERT this run was initialised from?)")


def _max_diff(a: list[torch.Tensor], b: list[torch.Tensor]) -> float:
    if any(x.shape != y.shape for x, y in zip(a, b)):
        return float("inf")
    return max(float((x.float() - y.float()).abs().max()) for x, y in zip(a, b))


def skill_init_report(run: str | Path, dense: str | Path | None = None,
                      export: str | Path | None = None) -> InitReport:
    """Each skill's origin at step 0 and at export, checked (module docstring)."""
    from safetensors.torch import load_file
    from skillnet.export.hf_folder import locate_checkpoint, unused_skill_sources
    from skillnet.model.surgery import _load_dense
    from skillnet.pretrain.archs import PRETRAIN_SKILLS

    run = Path(run)
    args_file = run / "run_args.json"
    if not args_file.is_file():
        raise InitError(f"{run}: no run_args.json (not a pretrain/run.py --output-dir)")
    args = json.loads(args_file.read_text(encoding="utf-8"))
    try:
        root, tag = locate_checkpoint(run)
    except FileNotFoundError as e:
        raise InitError(str(e)) from None
    cfg, labels, names = _layout(root / tag / "model_config.json")
    init_file = run / INIT_FILE
    if not init_file.is_file():
        raise InitError(f"{init_file} missing: the trainer writes it at step 0 unless --no-skill-drift or ZeRO-3")
    init = load_file(str(init_file))
    dense_dir = dense if dense is not None else args.get("init_from_dense")
    state = None
    if dense_dir is not None:
        if not Path(dense_dir).exists():
            raise InitError(f"dense folder {dense_dir} (--init-from-dense of the run, relative to where it was "
                            f"launched) not found: pass --dense DIR")
        try:
            state, _ = _load_dense(dense_dir)
        except FileNotFoundError as e:
            raise InitError(str(e)) from None
    at_export = unused_skill_sources(cfg)
    rep = InitReport(run=str(run), dense=None if dense_dir is None else str(dense_dir), seed=int(args.get("seed", 0)),
                     layers=labels, tensors=names[cfg.skill_names[0]], export=None if export is None else str(export))
    for s in cfg.skill_names:
        keys = list(rep.keys(s))
        if any(k not in init for k in keys) or f"{s}/{len(keys)}" in init:
            raise InitError(f"{init_file}: its {s}/* tensors do not fit the checkpoint's skill layout "
                            f"({len(labels)} layers x {len(rep.tensors)} tensors)")
        start = [init[k] for k in keys]
        copy = state is not None and s in PRETRAIN_SKILLS
        diff = None
        if state is not None:
            ref = [_dense_tensor(state, lab, t, str(dense_dir)) for lab in labels for t in names[s]]
            diff = _max_diff(start, ref)
        origin = (f"copy of the dense FFN ({dense_dir})" if copy else f"random (seed {rep.seed})")
        ok = diff is None or (diff == 0.0 if copy else diff > 0.0)
        exported = f"copy of {at_export[s]} (trained)" if s in at_export else "trained"
        rep.skills.append(SkillOrigin(s, origin, copy, diff, ok, exported))
    if export is not None:
        _check_export(rep, Path(export))
    return rep


def _check_export(rep: InitReport, folder: Path) -> None:
    """The export's record of its copies (export_info.json), each checked against its source's tensors."""
    from safetensors.torch import load_file
    from skillnet.model.surgery import _SKILL_KEY

    info_file, weights = folder / "export_info.json", folder / "model.safetensors"
    if not info_file.is_file() or not weights.is_file():
        raise InitError(f"{folder}: no export_info.json and model.safetensors (a python -m skillnet.pretrain.export "
                        f"--out folder)")
    copied = json.loads(info_file.read_text(encoding="utf-8")).get("skills_initialised_from") or {}
    skills = [s["name"] for s in json.loads((folder / "config.json").read_text(encoding="utf-8"))["skills"]]
    state = load_file(str(weights))
    by_skill: dict[int, dict[str, torch.Tensor]] = {}
    for k, v in state.items():
        m = _SKILL_KEY.search(k)
        if m is not None:
            by_skill.setdefault(int(m.group(1)), {})[_SKILL_KEY.sub(".skill_ffn.skills.*.", k)] = v
    for o in rep.skills:
        src = copied.get(o.skill)
        expected = o.at_export.startswith("copy of ")
        if src is None:
            o.at_export = "trained"
            if expected:
                o.at_export += " (not copied: exported with --no-init-unused)"
            continue
        dst_t, src_t = by_skill[skills.index(o.skill)], by_skill[skills.index(src)]
        o.at_export = f"copy of {src} (trained)"
        o.export_max_abs_diff = _max_diff([dst_t[k] for k in sorted(dst_t)], [src_t[k] for k in sorted(dst_t)])
        o.ok = o.ok and o.export_max_abs_diff == 0.0


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def format_report(rep: InitReport) -> str:
    p = len(rep.tensors)
    lines = [f"skills of {rep.run} at step 0 ({INIT_FILE}: key <skill>/<n>, n = {p}*i + j over the "
             f"{len(rep.layers)} skill layers i = {', '.join(rep.layers)}; j: {', '.join(rep.tensors)})"]
    head = ["skill", "at step 0", "max |diff| vs dense FFN", "check", "at export"]
    if rep.export is not None:
        head.append("max |diff| vs source")
    rows = []
    for o in rep.skills:
        check = "ok" if o.ok else "MISMATCH"
        if o.max_abs_diff is None:
            check += " (no dense FFN to compare)"
        elif o.copy:
            check += " (equal)" if o.max_abs_diff == 0.0 else " (a copy must be equal)"
        else:
            check += " (differs)" if o.max_abs_diff > 0.0 else " (random, yet equal to the dense FFN)"
        row = [o.skill, o.at_start, _num(o.max_abs_diff), check, o.at_export]
        if rep.export is not None:
            row.append(_num(o.export_max_abs_diff))
        rows.append(row)
    widths = [max(len(str(r[i])) for r in [head, *rows]) for i in range(len(head))]
    for r in [head, *rows]:
        lines.append("  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip())
    if rep.export is None:
        lines.append("at export: what python -m skillnet.pretrain.export writes by default; --export DIR checks a "
                     "written one")
    lines.append("all claims hold" if rep.ok else "some claims do not hold: see MISMATCH above")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    from skillnet.common.cli import Parser

    p = Parser("skillnet.pretrain.skill_init", description=__doc__)
    p.add_argument("run", help="a sparse pre-training run (pretrain/run.py --output-dir)")
    p.add_argument("--dense", help="the dense HF BERT folder the run was initialised from (default: the run's "
                   "--init-from-dense, as recorded in run_args.json)")
    p.add_argument("--export", help="an export of the run (python -m skillnet.pretrain.export --out): also check "
                   "that each skill it copied equals its source")
    p.add_argument("--json", action="store_true", help="print the report as one JSON object")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    try:
        rep = skill_init_report(a.run, dense=a.dense, export=a.export)
    except (InitError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if a.json:
        out = {**asdict(rep), "ok": rep.ok, "keys": {o.skill: rep.keys(o.skill) for o in rep.skills}}
        print(json.dumps(out, ensure_ascii=False))
    else:
        print(format_report(rep))
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
