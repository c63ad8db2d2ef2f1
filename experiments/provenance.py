"""A part's committed results (results/<profile>/<part>/): the files the report and later parts read, with only
relative paths inside, and a provenance record (provenance.json): where, when and how the part ran, and a
fingerprint of every input it read and every product it made.

Layout: ``<part>/files/<path relative to the reproduction folder>`` and ``<part>/provenance.json``. Text files
are stored with the reproduction folder's and the repository's absolute paths cut to relative ones; restoring
copies them back into a reproduction folder at any path (no file there is replaced).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import hashlib
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from skillnet.common.files import atomic_write_json
from skillnet.common.outputs import MARKER
from skillnet.data_prep.tasks.packaged import NO_REDISTRIBUTION
from skillnet.experiments.allocator import current
from skillnet.experiments.profiles import Profile
from skillnet.experiments.runner import REPO

PROVENANCE = "provenance.json"
SAMPLES_FILE = "samples.json"
FILES = "files"
TEXT_SUFFIXES = {".json", ".jsonl", ".md", ".txt", ".log", ".csv", ".py"}
# Weights and what loads them; never checkpoints or optimizer state.
EXPORT = ("*.safetensors", "config.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json",
          "tokenizer.json", "generation_config.json", "export_info.json", "*.py", "README.md")
_RUN = ("results.json", "example_stats.json", "log.jsonl", "samples.json", "finetune_config.json", "skill_map.json",
        "export/config.json")


def _run_files(cmp: str) -> list[str]:
    """A comparison's files: its table, pictures and marker, and each run's results (task-specific runs nest one
    folder per task). '{seed}' is a seed part's seed, else '*'."""
    runs = [f"{cmp}/*/seed{{seed}}/{f}" for f in _RUN] + [f"{cmp}/*/seed{{seed}}/*/{f}" for f in _RUN]
    return [f"{cmp}/comparison.json", f"{cmp}/comparison.md", f"{cmp}/*.png", f"{cmp}/{MARKER}", *runs]


def _export(d: str) -> list[str]:
    return [f"{d}/{pat}" for pat in EXPORT]


# What each stage commits, as glob patterns relative to the reproduction folder. The data stages' large products
# (tasks' training files, corpus, shards) are rebuilt by each machine and checked against their fingerprints.
KEEP: dict[str, list[str]] = {
    # task.json only: the texts are rebuilt and fingerprinted, and some are licensed for no redistribution (GPL)
    "nlu_tasks": ["tasks/*/task.json"], "nlg_tasks": [],
    "corpus": ["corpus/decontamination.json"], "vocab": ["vocab/*"],
    "shards": ["shards/manifest.json", "shards_heldout/manifest.json"],
    "dense_pt": ["pt_dense/log.jsonl", "pt_dense/heldout_mlm.json", *_export("pt_dense/hf")],
    "sparse_pt": ["pt_sparse/seed*/log.jsonl", "pt_sparse/seed*/heldout_mlm.json", *_export("pt_sparse/seed*/hf")],
    "dense_ctrl_pt": ["pt_dense_ctrl/seed*/log.jsonl", "pt_dense_ctrl/seed*/heldout_mlm.json",
                      *_export("pt_dense_ctrl/seed*/hf")],
    "bart_pt": ["pt_bart/log.jsonl", *_export("pt_bart/hf")],
    "nlu_loss_scale": ["loss_scale/loss_scale.json", "loss_scale/loss_scale.md", "loss_scale/configs/*",
                       *_run_files("loss_scale/*")],
    "nlu_tune": ["tune/nlu.json", *_run_files("compare/nlu_tune")],
    "nlg_tune": ["tune/nlg.json", *_run_files("compare/nlg_tune")],
    # Not the dev-selected weights that adaptation continues: it runs in the same part (experiments/parts.py). Their
    # config.json is kept: compare checks each row's initial model against it before it aggregates the seeds' runs.
    **{s: [*_run_files(f"compare/{s}"), *([f"compare/{s}/skillnet/seed{{seed}}/best/config.json"]
                                          if s.endswith("_main") else [])]
       for s in ("nlu_main", "nlu_ablate", "nlu_alpha", "nlu_adapt", "nlg_main", "nlg_temp", "nlg_adapt")},
}
# Every stage commits its record and config files too.
COMMON = ["stages/{stage}.json", "configs/{stage}.json", "configs/ds_{stage}.json"]

# The products later parts read, fingerprinted: name -> (stage, glob relative to the reproduction folder).
PRODUCTS: dict[str, tuple[str, str]] = {
    "tasks": ("nlu_tasks", "tasks/*/*.jsonl"), "corpus": ("corpus", "corpus/*.txt"), "vocab": ("vocab", "vocab/vocab.txt"),
    "shards": ("shards", "shards*/*.[bi][id][nx]"),  # the .bin/.idx files, not the manifest (it names its machine's paths)
    "pt_dense weights": ("dense_pt", "pt_dense/hf/*.safetensors"),
    "pt_bart weights": ("bart_pt", "pt_bart/hf/*.safetensors"),
}
SEEDED_PRODUCTS: dict[str, tuple[str, str]] = {  # '{seed}' per seed of the profile
    "pt_sparse seed{seed} weights": ("sparse_pt", "pt_sparse/seed{seed}/hf/*.safetensors"),
    "pt_dense_ctrl seed{seed} weights": ("dense_ctrl_pt", "pt_dense_ctrl/seed{seed}/hf/*.safetensors"),
}


def products(p: Profile) -> dict[str, tuple[str, str]]:
    out = dict(PRODUCTS)
    for name, (stage, pat) in SEEDED_PRODUCTS.items():
        out.update({name.format(seed=k): (stage, pat.format(seed=k)) for k in p.seeds})
    return out


def fingerprint(root: Path, pattern: str) -> str | None:
    """sha256 over the names (relative to `root`) and bytes of the files matching `pattern`; None when none does.
    nlg tasks and nlu tasks share one folder: `tasks/*/*.jsonl` covers both halves."""
    files = sorted(f for f in root.glob(pattern) if f.is_file() and not f.name.startswith("."))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.relative_to(root).as_posix().encode() + b"\0")
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def profile_hash(p: Profile) -> str:
    """What makes two runs the same experiment: every size and budget, not how many runs or threads at once."""
    d = {k: v for k, v in dataclasses.asdict(p).items() if k not in ("threads", "jobs", "in_process")}
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def machine_info() -> dict[str, Any]:
    import torch
    import transformers

    try:
        import deepspeed

        ds = deepspeed.__version__
    except Exception:  # noqa: BLE001 - a machine without DeepSpeed still records its fine-tuning parts
        ds = None
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "torch_threads": torch.get_num_threads(),
            "torch": torch.__version__, "transformers": transformers.__version__, "deepspeed": ds,
            "python": platform.python_version(), "os": platform.platform(),
            "allocator": current(), "ld_preload": os.environ.get("LD_PRELOAD")}


def commit() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return (head or "unknown") + ("+dirty" if dirty else "")


def relative_text(text: str, out: Path) -> str:
    """Absolute paths of the reproduction folder and the repository cut to relative ones."""
    for root, rel in ((str(out), "."), (str(REPO), ".")):
        text = text.replace(root + "/", "").replace(root, rel)
    return text.replace(sys.executable + " ", "python ")


def _keep(stage: str, seed: int | None) -> list[str]:
    s = "*" if seed is None else str(seed)
    return [pat.replace("{stage}", stage).replace("{seed}", s) for pat in [*COMMON, *KEEP.get(stage, [])]]


def restricted_tasks(out: Path) -> set[str]:
    """The tasks of reproduction folder `out` whose licence forbids redistribution (GPL-3.0 insuranceqa-data): no
    text of theirs is committed, not even the few test samples a generation run keeps."""
    return {f.parent.name for f in out.glob("tasks/*/task.json")
            if NO_REDISTRIBUTION in json.loads(f.read_text(encoding="utf-8")).get("license", "")}


def collect(out: Path, dest: Path, stages: list[str], seed: int | None = None,
            extra: list[str] = ()) -> list[dict[str, Any]]:
    """Copy what `stages` keep (KEEP, COMMON; `extra` patterns too) from `out` into `dest`/files, text with
    relative paths; return the files with their sizes. A seed part keeps its seed's runs only."""
    pats = [p for st in stages for p in _keep(st, seed)] + list(extra)
    files = sorted({f for pat in pats for f in out.glob(pat) if f.is_file()})
    root = dest / FILES
    listed = []
    restricted = restricted_tasks(out)
    for f in files:
        rel = f.relative_to(out)
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if f.name == SAMPLES_FILE and restricted:
            kept = {t: v for t, v in json.loads(f.read_text(encoding="utf-8")).items() if t not in restricted}
            target.write_text(relative_text(json.dumps(kept, ensure_ascii=False, indent=2) + "\n", out), encoding="utf-8")
        elif f.suffix in TEXT_SUFFIXES or f.name == MARKER:
            target.write_text(relative_text(f.read_text(encoding="utf-8", errors="replace"), out), encoding="utf-8")
        else:
            shutil.copyfile(f, target)
        listed.append({"path": rel.as_posix(), "bytes": target.stat().st_size})
    return listed


def restore(part_dir: Path, out: Path, skip: tuple[str, ...] = ()) -> int:
    """Copy a committed part's files into the reproduction folder `out` (an existing file is kept: the
    fingerprint check then compares it); an output marker gets its identity's paths made absolute again, as
    the command that checks it wrote them. Returns how many files were copied."""
    src = part_dir / FILES
    n = 0
    for f in sorted(src.rglob("*")):
        rel = f.relative_to(src).as_posix()
        if not f.is_file() or any(fnmatch.fnmatch(rel, s) for s in skip):
            continue
        target = out / rel
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if f.name == MARKER:
            rec = json.loads(f.read_text(encoding="utf-8"))
            rec["identity"] = {k: str(out / v) if isinstance(v, str) and v.endswith(".json") and not v.startswith("/")
                               else v for k, v in rec.get("identity", {}).items()}
            target.write_text(json.dumps(rec, indent=2, sort_keys=True) + "\n")
        else:
            shutil.copyfile(f, target)
        n += 1
    return n


def committed(results: Path) -> dict[str, dict[str, Any]]:
    """Every committed part's provenance record in `results`, by part name."""
    out = {}
    for f in sorted(results.glob(f"*/{PROVENANCE}")):
        try:
            out[f.parent.name] = json.loads(f.read_text(encoding="utf-8"))
        except ValueError:
            continue
    return out


def outputs_of(out: Path, p: Profile, stages: list[str]) -> dict[str, str]:
    """Fingerprints of the products `stages` made in `out` (products present only)."""
    return {name: fp for name, (st, pat) in products(p).items() if st in stages
            and (fp := fingerprint(out, pat)) is not None}


def mismatches(out: Path, p: Profile, recorded: dict[str, dict[str, Any]], read: list[str]) -> list[str]:
    """One line per product of the stages `read` whose fingerprint in `out` differs from the one a committed part
    recorded as its output (a product absent from `out` is not checked: the part that needs it says so)."""
    bad = []
    for part, rec in recorded.items():
        for name, fp in (rec.get("outputs") or {}).items():
            stage, pat = products(p).get(name, (None, ""))
            if stage not in read:
                continue
            now = fingerprint(out, pat)
            if now is not None and now != fp:
                bad.append(f"input {name} ({pat}) differs from what part {part} recorded: {now[:12]} here, "
                           f"{fp[:12]} committed")
    return bad


def write_provenance(dest: Path, rec: dict[str, Any]) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    atomic_write_json(dest / PROVENANCE, rec)


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def size_text(n: float) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"
