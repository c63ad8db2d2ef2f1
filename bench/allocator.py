"""Step time under each memory allocator: glibc's default against tcmalloc (LD_PRELOAD of Debian's
libtcmalloc-minimal4), jemalloc where installed, and glibc with its mmap and trim thresholds raised
(MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_, no install). Why: experiments/allocator.py.

Two steps at the full profile's sizes (experiments/profiles.py), each forward + backward + MaskedAdamW on one
thread (the reproduction runs two fine-tuning runs at once, one thread each):

* bert: a SkillNet-BERT fine-tuning step, NER (a CRF head), batch nlu_batch x 128 tokens;
* bart: a SkillNet-BART generation fine-tuning step, batch nlg_batch, 64 source and 64 target tokens, the LM
  head over the vocab at every target position (the large blocks glibc hands back to the kernel).

Each (arm, repetition) is a fresh interpreter started under the arm's environment; the arms alternate within a
repetition and their order rotates between repetitions, so the load of a shared machine hits them alike. Per arm:
the median over repetitions of the mean step time, and the share of its CPU time spent in the kernel (``sys``),
with minor page faults per step. ``step_s_default_over_best_allocator``: glibc's step time over the fastest arm's
(1.0 when glibc is the fastest), per step kind. On a loaded machine the differences drown: measure on a quiet one.

    python bench/allocator.py --json                  # all arms, 5 repetitions, JSON as the last line
    python bench/allocator.py --reps 1 --steps 2      # a smoke test
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from skillnet.experiments.allocator import allocator_env
from skillnet.experiments.profiles import PROFILES

# The compact vocab of the last full run (docs/report.md: the bert-base-chinese entries its corpus and tasks use).
FULL_VOCAB = 8365
ARMS = ("glibc", "tcmalloc", "jemalloc", "glibc-tuned")
KINDS = ("bert", "bart")
DOC = str(Path(__file__).resolve().parents[1] / "docs" / "reproduce.md")


def _model_step(kind: str, vocab: int) -> Any:
    """A closure running one training step of `kind` at the full profile's sizes."""
    import torch
    from skillnet.model import (
        NLG_TASKS,
        SkillNetBartConfig,
        SkillNetBartForConditionalGeneration,
        SkillNetBertConfig,
        SkillNetBertForMultiTask,
    )
    from skillnet.training.optim import MaskedAdamW, build_param_groups

    full = PROFILES["full"]
    torch.manual_seed(0)
    if kind == "bert":
        cfg = SkillNetBertConfig.preset("tiny", **{**full.bert, "vocab_size": vocab},
                                        task_heads={"ner": {"type": "token_crf", "num_labels": 7}})
        model = SkillNetBertForMultiTask(cfg).train()
        b, n = full.nlu_batch, min(128, cfg.max_position_embeddings)
        ids = torch.randint(5, vocab, (b, n))
        batch = {"task": "ner", "input_ids": ids, "attention_mask": torch.ones_like(ids),
                 "labels": torch.randint(0, 7, (b, n))}
    else:
        task = next(iter(NLG_TASKS))
        cfg = SkillNetBartConfig.preset("tiny", **{**full.bart, "vocab_size": vocab}, tasks=dict(NLG_TASKS))
        model = SkillNetBartForConditionalGeneration(cfg).train()
        b = full.nlg_batch
        src, tgt = torch.randint(5, vocab, (b, 64)), torch.randint(5, vocab, (b, 64))
        batch = {"task": task, "input_ids": src, "attention_mask": torch.ones_like(src), "labels": tgt}
    opt = MaskedAdamW(build_param_groups(model, weight_decay=0.01), lr=1e-4)

    def step() -> None:
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def child(kind: str, steps: int, warmup: int, threads: int, vocab: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(threads)
    step = _model_step(kind, vocab)
    for _ in range(warmup):
        step()
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    for _ in range(steps):
        step()
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    user, sys_s = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    return {"step_s": wall / steps, "user_s": user, "sys_s": sys_s, "minflt_per_step": (r1.ru_minflt - r0.ru_minflt) / steps}


def run_arm(arm: str, env: dict[str, str], a: argparse.Namespace, kind: str) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", kind, "--steps", str(a.steps), "--warmup", str(a.warmup),
           "--threads", str(a.threads), "--vocab", str(a.vocab)]
    p = subprocess.run(cmd, env={**os.environ, **env}, capture_output=True, text=True, timeout=3600)
    if p.returncode != 0:
        raise RuntimeError(f"arm {arm} ({kind}) failed: {p.stderr.strip().splitlines()[-1:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out = {}
    for arm, rs in runs.items():
        cpu = sum(r["user_s"] + r["sys_s"] for r in rs)
        out[arm] = {"step_s": round(statistics.median(r["step_s"] for r in rs), 5),
                    "step_s_all": [round(r["step_s"], 5) for r in rs],
                    "sys_share": round(sum(r["sys_s"] for r in rs) / cpu, 4) if cpu else None,
                    "minflt_per_step": round(statistics.median(r["minflt_per_step"] for r in rs), 1)}
    return out


def write_doc(a: argparse.Namespace, res: dict[str, Any]) -> None:
    from skillnet.experiments.benchdoc import machine_line, md_table, write_section

    cmd = (f"`python bench/allocator.py --reps {a.reps} --steps {a.steps} --warmup {a.warmup} --threads {a.threads} "
           f"--write`")
    rows = [(kind, arm, f"{v['step_s'] * 1e3:.1f}", f"{v['sys_share']:.1%}", f"{v['minflt_per_step']:,.0f}",
             f"{res[kind]['arms']['glibc']['step_s'] / v['step_s']:.3f}" if "glibc" in res[kind]["arms"] else "-")
            for kind in a.kinds for arm, v in res[kind]["arms"].items()]
    body = "\n\n".join([
        f"{cmd} (medians of {a.reps} repetitions, a fresh interpreter per arm each). {machine_line()}",
        md_table(["step", "allocator", "ms/step", "kernel share of CPU time", "page faults/step",
                  "speed-up over glibc's default"], rows),
        "`step_s_default_over_best_allocator`: " + ", ".join(
            f"{k} {v}" for k, v in res["step_s_default_over_best_allocator"].items())
        + (f". Not installed here: {', '.join(res['not_installed'])}." if res["not_installed"] else "."),
    ])
    write_section(a.write, "allocator", body)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS, help="allocators to compare")
    p.add_argument("--kinds", nargs="+", default=list(KINDS), choices=KINDS, help="steps to time")
    p.add_argument("--reps", type=int, default=5, help="repetitions (a fresh interpreter per arm each)")
    p.add_argument("--steps", type=int, default=30, help="timed steps per repetition")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--threads", type=int, default=1, help="torch threads of each step")
    p.add_argument("--vocab", type=int, default=FULL_VOCAB, help="vocab size (logit width)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--write", nargs="?", const=DOC, metavar="MD",
                   help=f"rewrite the 'allocator' section of this Markdown file (default: {DOC})")
    p.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    for name in ("reps", "steps", "threads", "vocab"):
        if getattr(a, name) < 1:
            p.error(f"--{name} must be at least 1")
    if a.child:
        print(json.dumps(child(a.child, a.steps, a.warmup, a.threads, a.vocab)))
        return 0
    envs = {arm: env for arm in a.arms if (env := allocator_env(arm)) is not None}
    absent = [arm for arm in a.arms if arm not in envs]
    res: dict[str, Any] = {"arms": list(envs), "not_installed": absent, "reps": a.reps, "steps": a.steps,
                           "threads": a.threads, "vocab": a.vocab, "env": envs}
    ratio: dict[str, float] = {}
    for kind in a.kinds:
        runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in envs}
        order = list(envs)
        for rep in range(a.reps):
            for arm in order[rep % len(order):] + order[:rep % len(order)]:
                runs[arm].append(run_arm(arm, envs[arm], a, kind))
        s = summarise(runs)
        best = min(s, key=lambda arm: s[arm]["step_s"])
        res[kind] = {"arms": s, "best": best}
        if "glibc" in s:
            ratio[kind] = round(s["glibc"]["step_s"] / s[best]["step_s"], 3)
        print(f"{kind}: " + "; ".join(f"{arm} {v['step_s'] * 1e3:.1f} ms/step, sys {v['sys_share']:.1%}, "
                                      f"{v['minflt_per_step']:.0f} faults/step" for arm, v in s.items())
              + f"; best {best}", flush=True)
    res["step_s_default_over_best_allocator"] = ratio
    if absent:
        print(f"not installed: {', '.join(absent)}", flush=True)
    if a.write:
        write_doc(a, res)
    if a.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
