"""`skillnet-reproduce --part NAME` (one part of experiments/parts.py), `--list-parts`, `--report RESULTS` (the
report rebuilt from committed parts alone), and the per-cell comparison of a user's own run with the committed
one. What a part commits and how it is fingerprinted: experiments/provenance.py."""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from skillnet.experiments import provenance as pv
from skillnet.experiments.allocator import current
from skillnet.experiments.parts import PROTOCOL_VERSION, Part, find, needs, parts_of, status_of
from skillnet.experiments.profiles import Profile
from skillnet.experiments.runner import Runner, Stage
from skillnet.experiments.stages import STAGES


class PartError(RuntimeError):
    """A part cannot run or a report cannot be rebuilt: one line for the user."""


def _stage(name: str) -> Stage:
    return next(s for s in STAGES if s.name == name)


def seed_stage(st: Stage, seed: int) -> Stage:
    """`st` restricted to one seed's runs, recorded as `<stage>.seed<k>` (its comparison is aggregated later)."""
    def fn(r: Runner) -> dict[str, Any]:
        r.only_seeds = [seed]
        try:
            return st.fn(r)
        finally:
            r.only_seeds = None

    return Stage(f"{st.name}.seed{seed}", f"{st.title}, seed {seed}", fn)


def _closure(stages: tuple[str, ...]) -> set[str]:
    from skillnet.experiments.parts import READS

    seen: set[str] = set()
    todo = list(stages)
    while todo:
        s = todo.pop()
        for d in READS[s]:
            if d not in seen:
                seen.add(d)
                todo.append(d)
    return seen


def prepare(part: Part, parts: list[Part], p: Profile, out: Path, results: Path) -> dict[str, dict[str, Any]]:
    """Check what `part` needs is committed and of this protocol and profile, and restore it (and the part's own
    committed files, and its sibling seed parts') into `out`. Returns the committed records."""
    rec = pv.committed(results)
    phash = pv.profile_hash(p)
    need = needs(parts, part)
    missing = [x.name for x in need if x.name != "data" and x.name not in rec]
    if missing:
        raise PartError(f"part {part.name} needs part(s) {', '.join(missing)} committed in {results} first: run "
                        f"`skillnet-reproduce --profile {p.name} --part {missing[0]}`")
    bad = [f"{x.name}: {st}" for x in need if x.name in rec
           and (st := status_of(x, rec, p, phash)) != "done" and not st.startswith("stale (input")]
    if bad:
        raise PartError(f"part {part.name} needs part(s) made under another protocol or profile ({'; '.join(bad)}): "
                        "rerun them")
    siblings = [x for x in parts if x.group == part.group]
    for x in [*need, *siblings]:
        if x.name in rec and x.name != "data":  # the data part is rebuilt here and checked against its record
            pv.restore(results / x.name, out)
    return rec


def check_inputs(part: Part, p: Profile, out: Path, rec: dict[str, dict[str, Any]], own: bool = False) -> None:
    """Refuse, naming the input, when a product the part reads (`own`: or made, where it was committed before)
    differs from what a committed part recorded."""
    read = _closure(part.stages) | (set(part.stages) if own else set())
    recorded = {k: v for k, v in rec.items() if own or k != part.name}
    bad = pv.mismatches(out, p, recorded, sorted(read))
    before = rec.get(part.name, {}).get("inputs") or {}
    now = {name: pv.fingerprint(out, pat) for name, (_, pat) in pv.products(p).items() if name in before}
    bad += [f"input {k} differs from what part {part.name} recorded when it ran: {(v or '')[:12]} here, "
            f"{before[k][:12]} committed" for k, v in now.items() if v is not None and v != before[k]]
    if bad:
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise PartError(f"part {part.name} refuses to go on: {bad[0]}{more}; a model or data set that differs is "
                        "another experiment (delete this folder's copy to take the committed one, or rerun the part "
                        "that made it)")


# The reproduction's stage loop (experiments/__main__.py `_run_stages`: records, sittings, heartbeat), passed in by
# its caller: this module sits below __main__ in the import graph.
StageLoop = Callable[..., int]


def run_part(a: argparse.Namespace, p: Profile, name: str, out: Path, results: Path, lock_fd: int | None,
             _run_stages: StageLoop) -> int:
    """Run part `name` in `out` and commit it to `results`/<name>."""
    parts = parts_of(p, limit_s(a))
    try:
        part = find(parts, name)
    except KeyError as e:
        raise PartError(str(e.args[0])) from None
    rec = prepare(part, parts, p, out, results)
    need = needs(parts, part)
    print(f"[part] {part.name}: {part.title}; needs {', '.join(x.name for x in need) or 'nothing'}; allocator "
          f"{current()}", flush=True)
    started, t0 = pv.now(), time.time()
    r = Runner(out, p, dry_run=a.dry_run, lock_fd=lock_fd)
    try:
        sub = argparse.Namespace(**{**vars(a), "stages": [], "redo": list(a.redo)})
        data = [_stage(s) for s in parts[0].stages] if part.name != "data" else []
        if data and _run_stages(sub, r, p, out, Path(), (), [], data):  # the data every part reads, rebuilt here
            return 1
        if not a.dry_run:
            check_inputs(part, p, out, rec)
        own = [seed_stage(_stage(s), part.seed) if part.split else _stage(s) for s in part.stages]
        if _run_stages(sub, r, p, out, Path(), (), [], own):
            return 1
        if not a.dry_run:
            check_inputs(part, p, out, rec, own=True)
        aggregated = aggregate_if_complete(sub, r, p, out, part, _run_stages)
    finally:
        r.close()
    if a.dry_run:
        return 0
    commit_part(part, p, out, results, need, started, time.time() - t0, aggregated)
    return 0


def aggregate_if_complete(a: argparse.Namespace, r: Runner, p: Profile, out: Path, part: Part,
                          _run_stages: StageLoop) -> bool:
    """A seed part: when every seed's record is there, the stage once more over all seeds (every run is done, so
    compare only aggregates); True when it did."""
    if not part.split or a.dry_run:
        return False
    if not all((out / "stages" / f"{s}.seed{k}.json").is_file() for s in part.stages for k in p.seeds):
        print(f"[part] {part.name}: the other seeds' parts are not all committed; their comparison is aggregated "
              "by the last of them", flush=True)
        return False
    return _run_stages(a, r, p, out, Path(), (), [], [_stage(s) for s in part.stages]) == 0


def commit_part(part: Part, p: Profile, out: Path, results: Path, need: list[Part], started: str, secs: float,
                aggregated: bool) -> None:
    dest = results / part.name
    if (dest / pv.FILES).exists():
        shutil.rmtree(dest / pv.FILES)
    names = [f"{s}.seed{part.seed}" for s in part.stages] if part.split else list(part.stages)
    stages = list(part.stages)
    files = pv.collect(out, dest, stages, part.seed, extra=[f"stages/{n}.json" for n in names])
    if aggregated:  # the comparison over every seed, made here
        files += pv.collect(out, dest, [], None, extra=[f"stages/{s}.json" for s in part.stages]
                            + [f"compare/{s}/{f}" for s in part.stages for f in ("comparison.json", "comparison.md",
                                                                                    "*.png")])
    records = {n: json.loads(f.read_text()) for n in names if (f := out / "stages" / f"{n}.json").is_file()}
    outputs = pv.outputs_of(out, p, stages)
    if part.split:
        outputs = {k: v for k, v in outputs.items() if f"seed{part.seed} " in k}
    read = _closure(part.stages)
    inputs = {k: fp for k, (st, pat) in pv.products(p).items() if st in read and st not in stages
              and (fp := pv.fingerprint(out, pat))}
    prev = pv.committed(results).get(part.name) or {}
    rec = {"part": part.name, "title": part.title, "stages": stages, "seed": part.seed,
           "protocol_version": PROTOCOL_VERSION, "profile": p.name, "profile_hash": pv.profile_hash(p),
           "seeds": [part.seed] if part.split else p.seeds, "commit": pv.commit(),
           "started": prev.get("started", started), "finished": pv.now(),
           "wall_s": round(sum(v.get("seconds", 0.0) for v in records.values()), 1),
           "this_sitting_s": round(secs, 1), "stage_seconds": {n: v.get("seconds") for n, v in records.items()},
           "machine": pv.machine_info(), "needs": [x.name for x in need], "inputs": inputs, "outputs": outputs,
           "files": files, "bytes": sum(f["bytes"] for f in files)}
    pv.write_provenance(dest, rec)
    print(f"[part] {part.name} committed to {dest}: {len(files)} files, {pv.size_text(rec['bytes'])}", flush=True)


# ------------------------------------------------------------------------------------ the report from results
def parts_rows(rec: dict[str, dict[str, Any]], parts: list[Part]) -> tuple[list[list[str]], list[str]]:
    """The report's table of parts, and the parts made under another protocol version."""
    rows, other = [], []
    names = [x.name for x in parts]
    for name in names + sorted(set(rec) - set(names)):  # and parts split at another --part-limit
        r = rec.get(name)
        if r is None:
            rows.append([name, "-", "-", "-", "not run"])
            continue
        m = r.get("machine") or {}
        v = r.get("protocol_version")
        mark = "" if v == PROTOCOL_VERSION else f" **protocol {v}, not {PROTOCOL_VERSION}: not this report's**"
        if mark:
            other.append(name)
        rows.append([name, str(r.get("commit")), f"{m.get('cpu')} ({m.get('cores')} cores, {m.get('torch_threads')} "
                     f"threads, torch {m.get('torch')})", f"{(r.get('wall_s') or 0) / 3600:.2f} h",
                     f"{r.get('finished', '')[:10]}{mark}"])
    return rows, other


def rebuild_report(p: Profile, results: Path, docs: Path, allow_mixed: bool = False,
                   limit: float | None = None) -> list[str]:
    """docs/report.md, comparison.md and nlg.md (and their pictures) from the committed parts in `results` alone:
    restored into a temporary folder, read by the report builder, then removed. Returns the problems."""
    from skillnet.experiments.report import build
    from skillnet.experiments.stages import PARTS

    rec = pv.committed(results)
    if not rec:
        raise PartError(f"--report {results}: no committed part (no */{pv.PROVENANCE})")
    parts = parts_of(p) if limit is None else parts_of(p, limit)
    rows, other = parts_rows(rec, parts)
    if other and not allow_mixed:
        raise PartError(f"--report {results}: part(s) {', '.join(other)} were made under another protocol version "
                        f"than {PROTOCOL_VERSION}; rerun them (or --allow-mixed-protocols to build a report that "
                        "marks them)")
    problems: list[str] = []
    with tempfile.TemporaryDirectory(prefix="skillnet_report_") as tmp:
        out = Path(tmp)
        for name in rec:
            pv.restore(results / name, out)
        split_seconds(out, parts)
        for key, title in (("all", "SkillNet reproduction"),
                           ("nlu", "SkillNet-NLU and its baselines on packaged Chinese tasks"),
                           ("nlg", "SkillNet-NLG on packaged Chinese generation tasks")):
            doc_name, halves, stage_names = PARTS[key]
            title += " (laptop scale, CPU)" if p.name != "scale" else " (GPU scale)"
            _, probs = build(out, p, [s for s in STAGES if s.name in stage_names], docs / doc_name, title, halves,
                             source=str(results), parts_table=rows)
            problems += [f"{doc_name}: {x}" for x in probs]
    return problems


def split_seconds(out: Path, parts: list[Part]) -> None:
    """A split stage's record times its aggregation only: add its seed parts' seconds, for the wall-time table
    (whatever --part-limit split it)."""
    for st in {s for x in parts for s in x.stages}:
        f = out / "stages" / f"{st}.json"
        seeds = [json.loads(g.read_text()) for g in sorted((out / "stages").glob(f"{st}.seed*.json"))]
        if f.is_file() and seeds:
            rec = json.loads(f.read_text())
            rec["seconds"] = round(rec.get("seconds", 0.0) + sum(x.get("seconds", 0.0) for x in seeds), 1)
            f.write_text(json.dumps(rec, indent=2) + "\n")


# ------------------------------------------------------------------------------------ yours beside the committed
def cells(cmp: dict[str, Any]) -> dict[tuple[str, str], tuple[float, float]]:
    """(row, task or 'average') -> (mean, std) of a comparison.json."""
    out = {}
    for m, row in (cmp.get("methods") or {}).items():
        for t, v in {**(row.get("tasks") or {}), "average": row.get("average") or {}}.items():
            if isinstance(v.get("mean"), (int, float)):
                out[(m, t)] = (float(v["mean"]), float(v.get("std") or 0.0))
    return out


def beside_committed(out: Path, results: Path) -> list[str]:
    """Per table cell of every comparison in `out`, the user's score beside the committed one (any part's)."""
    lines = []
    for f in sorted((out / "compare").glob("*/comparison.json")):
        theirs = sorted(results.glob(f"*/{pv.FILES}/compare/{f.parent.name}/comparison.json"))
        if not theirs:
            continue
        mine, ref = cells(json.loads(f.read_text())), cells(json.loads(theirs[0].read_text()))
        for key in sorted(set(mine) & set(ref)):
            (a, sa), (b, sb) = mine[key], ref[key]
            lines.append(f"{f.parent.name:<11} {key[0]:<18} {key[1]:<22} yours {a:6.2f} ± {sa:5.2f}   committed "
                         f"{b:6.2f} ± {sb:5.2f}   {a - b:+6.2f}")
    return lines


def print_beside_committed(out: Path, results: Path) -> None:
    lines = beside_committed(out, results)
    if lines:
        print(f"[reproduce] your scores beside the committed ones ({results}):", flush=True)
        print("\n".join(lines), flush=True)


def limit_s(a: argparse.Namespace) -> float:
    from skillnet.experiments.parts import PART_LIMIT_S

    return PART_LIMIT_S if getattr(a, "part_limit", None) is None else a.part_limit * 3600


def default_results(p: Profile) -> Path:
    from skillnet.experiments.runner import REPO

    return REPO / "results" / p.name
