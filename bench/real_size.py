"""Real-size bench: BERT-base and BART-base SkillNet through DeepSpeed on 2 CPU ranks.

For each configuration (architecture x sequence 128/512 x ZeRO-2 / ZeRO-3 / ZeRO-2 with CPU offload, plus
activation checkpointing at ZeRO-2), one 2-rank ``deepspeed`` launch of bench/real_size_rank.py, fp32,
micro-batch 2, 3 optimizer steps:

* SkillNet-BERT ``base`` (7 skills per layer): ``pretrain/run.py``'s sparse MLM+NSP pre-training, unchanged,
  on its synthetic corpus (full-length samples);
* SkillNet-BART ``base``: the fine-tuning ``Trainer`` on one generation task (``text_summarization``, 2 skills),
  source and target of the full sequence length (pre-training's ``--arch bart`` is dense BART).

Per rank it records the resident memory above the process baseline (taken after imports and the process group,
before the model; glibc's ``MALLOC_MMAP_THRESHOLD_=65536`` so freed blocks leave the resident set), the
engine's tensors by owner, the step time, and which skills each step moved. Then it compares the peak with
`experiments/memory.py`'s prediction for the same setup (``device="cpu"``: math attention, fp32 dropout
masks; offloaded states counted as they are on a CPU, in the same process), and the engine's bytes with the
model's terms one by one. One run (BERT, ZeRO-2, 128) is also exported (``export``, then ``export --plain
--task mlm``) and loaded by plain transformers in a process that cannot import SkillNet, which runs fill-mask.

    python bench/real_size.py                     # every configuration (about an hour on 2 cores)
    python bench/real_size.py --only bert-z2-128  # a subset (names: see --list)
    python bench/real_size.py --json --write      # + one JSON line last, docs/scale.md's 'real_size' section
    python bench/real_size.py --report-only --write   # the section from the measurements so far, no launch

Results accumulate in ``--work`` (default runs/real_size/results.json): a configuration measured before is
not run again unless ``--rerun``; ``--write`` writes every configuration in the file. Memory safety (a shared
machine): one launch at a time, each only when at least ``--min-free-gb`` is available.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

REPO = Path(__file__).resolve().parent.parent
DOC = "docs/scale.md"
MB = 1e6
TOLERANCE = 0.15
MICRO_BATCH = 2
BASELINE = 300e6  # a rank's resident bytes before the model (measured: 294-297 MB)
SPARE = 4e9  # kept free for the machine's other users (bert-z2off-512, ~20 GB forecast, left 2 GB: stopped by hand)
# BERT at 128: 3 steps, so that seed 0's objective draws (mlm, mlm, nsp) run both objectives; at 512 (minutes a
# step on 2 shared cores) and for BART (one task) 2 steps: the first warms up, the second is timed
STEPS = {"bert": 3, "bart": 2}


def steps(c: Config) -> int:
    return STEPS[c.arch] if c.seq <= 128 else 2
ZERO = {"z2": ("ds_configs/zero2.json", 2, False), "z3": ("ds_configs/zero3.json", 3, False),
        "z2off": ("ds_configs/zero2_offload.json", 2, True)}
# the SkillNet-BART task (2 skills per token: non_open_end + general; the memory model is compared on the same
# task, and the GPU tables take the task with the most skills, dialogue_generation's 4)
BART_TASK = "text_summarization"


@dataclass(frozen=True)
class Config:
    arch: str
    zero: str
    seq: int
    ckpt: bool = False

    @property
    def name(self) -> str:
        return f"{self.arch}-{self.zero}-{self.seq}" + ("-ckpt" if self.ckpt else "")


def configs() -> list[Config]:
    out = [Config(a, z, s) for a in ("bert", "bart") for s in (128, 512) for z in ZERO]
    # activation checkpointing's saving: the same ZeRO-2 runs with it on
    out += [Config(a, "z2", s, ckpt=True) for a in ("bert", "bart") for s in (128, 512)]
    return out


def _meminfo(key: str) -> int:
    from skillnet.experiments.memory import proc_bytes

    return proc_bytes(key, "/proc/meminfo")


def _available() -> int:
    return _meminfo("MemAvailable")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ds_json(c: Config, tmp: Path) -> Path:
    """The repository's ZeRO JSON with this bench's micro-batch."""
    ds = json.loads((REPO / ZERO[c.zero][0]).read_text())
    ds["train_micro_batch_size_per_gpu"] = MICRO_BATCH
    p = tmp / f"{c.zero}.json"
    p.write_text(json.dumps(ds))
    return p


def _rank_env() -> dict[str, str]:
    # The launcher re-executes python: the ranks import this checkout's skillnet through PYTHONPATH (as the
    # caller set it). The mmap threshold makes freed tensors leave the resident set (glibc's arenas keep
    # freed heap otherwise, and the high-water mark would hide every free).
    return {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0", "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false"}


def launch(c: Config, work: Path, timeout: float, min_free: float) -> dict[str, Any]:
    """One 2-rank run; its rank records, the command and the wall time (or why it did not run)."""
    # The memory model's own forecast for the two ranks (plus their baselines) must fit beside the machine's other
    # users: a launch that could not is not started (this machine's RAM is shared).
    tasks = ["mlm", "nsp"] if c.arch == "bert" else [BART_TASK]
    need = sum(predicted(c, tasks, r)["total"] for r in (0, 1)) + 2 * BASELINE
    total = _meminfo("MemTotal")
    if need + SPARE > total:
        return {"error": f"not run: the memory model predicts {need / 1e9:.1f} GB for the two ranks, and this "
                         f"{total / 1e9:.0f} GB machine keeps {SPARE / 1e9:.0f} GB for its other users"}
    waited = 0.0
    while _available() < min_free * 1e9:
        if waited > 600:
            return {"error": f"not run: less than {min_free} GB available for 10 minutes"}
        time.sleep(30)
        waited += 30
    run = work / c.name
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir(parents=True)
    ds = _ds_json(c, run)
    out = run / "probe"
    port = _free_port()
    cmd = ["nice", "-n", "10", "deepspeed", "--num_gpus", "2", "--master_port", str(port),
           "bench/real_size_rank.py", str(out)]
    if c.arch == "bert":
        cmd += ["bert", "pretrain/run.py", "--ds-config", str(ds), "--synthetic", "64", "--preset", "base",
                "--max-seq-len", str(c.seq), "--max-steps", str(steps(c)), "--log-every", "1", "--output-dir",
                str(run / "run"), "--overwrite", "--no-progress", "--no-tensorboard"]
    else:
        cmd += ["bart", "--preset", "base", "--task", BART_TASK, "--seq-len", str(c.seq), "--steps", str(steps(c)),
                "--ds-config", str(ds), "--output-dir", str(run / "run")]
    if c.ckpt:
        cmd.append("--gradient-checkpointing")
    t0 = time.time()
    (run / "launch.json").write_text(json.dumps({"cmd": _shown(cmd), "start": t0}))
    with open(run / "launch.log", "w") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=_rank_env(), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the session this launch started: launcher and its ranks
            proc.wait()
            _clean_shm()
            return {"error": f"not finished within {timeout:.0f} s (killed)", "cmd": _shown(cmd)}
    res: dict[str, Any] = {"cmd": _shown(cmd), "wall_s": round(time.time() - t0, 1), "shm_files": _drop_shm(port)}
    if rc != 0:
        _clean_shm()
        tail = (run / "launch.log").read_text(errors="replace")[-1500:]
        return {**res, "error": f"exit {rc}: {tail}"}
    res["ranks"] = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    return res


def collect(c: Config, work: Path) -> dict[str, Any] | None:
    """The records of a launch that finished without the driver waiting for it (a driver stopped while its
    launch ran on), from its launch.json and the ranks' files; None if there are none."""
    run = work / c.name
    files = [run / "probe" / f"rank{r}.json" for r in (0, 1)]
    if not ((run / "launch.json").is_file() and all(f.is_file() for f in files)):
        return None
    info = json.loads((run / "launch.json").read_text())
    port = int(info["cmd"].split("--master_port ")[1].split()[0])
    return {"cmd": info["cmd"], "wall_s": round(max(f.stat().st_mtime for f in files) - info["start"], 1),
            "ranks": [json.loads(f.read_text()) for f in files], "collected": True, "shm_files": _drop_shm(port)}


def _drop_shm(port: int) -> list[int]:
    """Sizes of the shared-memory allreduce buffers this launch's ranks left in /dev/shm (DeepSpeed does not
    remove them), which are then removed: they are this launch's alone (its port is in their names)."""
    files = sorted(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*"))
    sizes = [f.stat().st_size for f in files]
    for f in files:
        f.unlink(missing_ok=True)
    return sizes


def _shown(cmd: list[str]) -> str:
    return " ".join(cmd).replace(str(REPO) + "/", "").replace(sys.executable, "python")


def _clean_shm() -> None:
    # a killed run leaves DeepSpeed's shared-memory allreduce buffers behind
    subprocess.run(["find", "/dev/shm", "-name", "deepspeed_allreduce_buffer*", "-mmin", "+5", "-delete"],
                   check=False, capture_output=True)


# ------------------------------------------------------------------------------------------------ comparison
def category(owner: str) -> str:
    """Which memory-model term an engine tensor's owner is (the ZeRO optimizers' attribute names)."""
    if owner == "optimizer_state":
        return "moments"
    if "offload" in owner and owner != "offload_gradient_dict":
        return "offload"  # the compute-dtype partition and the staging buffers of ZeRO-2 offload
    if "ipg" in owner:
        return "buckets"
    if "grad" in owner:
        return "grads"
    if "fp32" in owner:
        return "master"
    return "params"


def predicted(c: Config, tasks: list[str], rank: int) -> dict[str, Any]:
    """The memory model's prediction for one rank of this run, on the objective of the run's steps with the
    largest peak."""
    from skillnet.experiments import memory as M

    base = M.deepspeed_setup(REPO / ZERO[c.zero][0], c.arch, "base", c.seq, world_size=2, micro_batch=MICRO_BATCH,
                             device="cpu", checkpointing=c.ckpt,
                             drift_reference=c.arch == "bert" and rank == 0)  # pretrain/run.py's rank 0
    best = max((M.predict(replace(base, objective=t)) for t in tasks), key=lambda r: r["peak"] + r["host"])
    # on a CPU the host bytes (offloaded states, the drift reference) live in the same process
    return {**best, "total": best["peak"] + best["host"]}


def _engine_terms(owners: dict[str, int]) -> dict[str, int]:
    out: dict[str, int] = {}
    for owner, b in owners.items():
        out[category(owner)] = out.get(category(owner), 0) + b
    return out


def summarize(c: Config, res: dict[str, Any]) -> dict[str, Any]:
    if "ranks" not in res:
        return {"name": c.name, "error": res.get("error", "?"), "cmd": res.get("cmd", "")}
    ranks = res["ranks"]
    tasks = sorted({t for r in ranks for s in r["steps"] for t in s["tasks"]})
    per_rank = []
    for i, r in enumerate(ranks):
        pred = predicted(c, tasks, i)
        st = pred["states"]
        model_terms = {"params": st["params"], "grads": st["grads"] + st["grads32"], "master": st["master"],
                       "moments": st["moments"], "buckets": st["buckets"], "host": st.get("host", 0)}
        if c.zero == "z2off":  # offloaded: the model's host bytes, split back (fp32 gradients on the host)
            from skillnet.experiments import memory as M

            extra = 4 * _part(c) + 2 * 4 * M.counts(c.arch, "base")["largest_param"]
            model_terms.update(master=4 * _part(c), moments=8 * _part(c), grads=model_terms["grads"] + 4 * _part(c),
                               offload=extra, host=model_terms["host"] - 16 * _part(c) - extra)
        above = max(s["peak"] for s in r["steps"]) - r["baseline"]
        # parameters, master weights and moments after the last step; gradients before the first optimizer step
        eng = _engine_terms(r["engine"])
        # (not read by the first runs of this bench, whose probe did not have it yet: shown as n/a)
        eng["grads"] = _engine_terms(r["engine_before_step"]).get("grads", 0) if "engine_before_step" in r else -1
        times = [s["seconds"] for s in r["steps"]]
        per_rank.append({
            "baseline_mb": round(r["baseline"] / MB), "peak_above_mb": round(above / MB),
            "init_above_mb": round((r["init"]["peak"] - r["baseline"]) / MB),
            "predicted_mb": round(pred["total"] / MB), "peak_at": pred["backward_peak_at"],
            "predicted_parts_mb": {**{k: round(v / MB) for k, v in model_terms.items()},
                                   "activations": round(pred["activations"] / MB),
                                   "step_temp": round(st["step_temp"] / MB)},
            "engine_mb": {k: round(v / MB) if v >= 0 else "n/a" for k, v in sorted(eng.items())},
            "engine_owners_mb": {k: round(v / MB, 1) for k, v in r["engine"].items()},
            "engine_before_step_mb": {k: round(v / MB, 1) for k, v in r.get("engine_before_step", {}).items()},
            "shmem_mb": round(max(s["shmem"] for s in r["steps"]) / MB, 3),
            "step_s": [round(t, 2) for t in times],
            "step_s_median_after_first": round(statistics.median(times[1:] or times), 2),
            "error": round(pred["total"] / above - 1, 3),
        })
    # sparse updates: a skill moved on some rank (ZeRO-3: each rank holds part of it) only if the step used it
    moved = [sorted({s for r in ranks for s in r["steps"][i]["moved"]}) for i in range(len(ranks[0]["steps"]))]
    used = [ranks[0]["steps"][i]["used"] for i in range(len(moved))]
    sparse_ok = all(set(m) <= set(u) for m, u in zip(moved, used))
    return {
        "name": c.name, "arch": c.arch, "zero": c.zero, "seq": c.seq, "ckpt": c.ckpt, "cmd": res["cmd"],
        "wall_s": res["wall_s"], "tasks": tasks, "ranks": per_rank,
        "steps": [{"tasks": ranks[0]["steps"][i]["tasks"], "used": used[i], "moved": moved[i]} for i in range(len(moved))],
        "sparse_ok": sparse_ok, "within": all(abs(r["error"]) <= TOLERANCE for r in per_rank),
    }


def _part(c: Config) -> int:
    from skillnet.experiments import memory as M

    return -(-M.counts(c.arch, "base")["total"] // 2)


# ------------------------------------------------------------------------------------------------ export check
def export_check(work: Path) -> dict[str, Any]:
    """Export the BERT ZeRO-2 seq-128 run, then its MLM task as a stock BertForMaskedLM, and run fill-mask on it
    in a process whose import path has no SkillNet."""
    run = work / "bert-z2-128" / "run"
    if not (run / "checkpoints").is_dir():
        return {"error": "no bert-z2-128 checkpoint (run that configuration first)"}
    env = {k: v for k, v in _rank_env().items() if k != "PYTHONPATH"}
    py = sys.executable
    steps = [
        [py, "-m", "skillnet.pretrain.export", "--checkpoint", str(run), "--out", str(run / "hf")],
        [py, "-m", "skillnet.pretrain.export", "--plain", "--task", "mlm", "--checkpoint", str(run / "hf"),
         "--out", str(run / "plain")],
    ]
    for cmd in steps:
        if (Path(cmd[-1]) / "config.json").is_file():  # exported by an earlier call
            continue
        r = subprocess.run(["nice", "-n", "10", *cmd], cwd=REPO, env=_rank_env(), capture_output=True, text=True,
                           timeout=1800)
        if r.returncode:
            return {"error": f"{_shown(cmd)}: exit {r.returncode}: {r.stderr[-800:]}"}
    probe = (
        "import json, sys\n"
        "from transformers import pipeline\n"
        "f = pipeline('fill-mask', model=sys.argv[1])\n"
        "top = f('今天天气很[MASK]。', top_k=3)\n"
        # stock code only: the model's class is transformers' own and no SkillNet module was imported
        "assert type(f.model).__module__.startswith('transformers.'), type(f.model).__module__\n"
        "assert not [m for m in sys.modules if m.startswith('skillnet')], 'skillnet imported'\n"
        "print(json.dumps({'class': type(f.model).__name__, 'params': f.model.num_parameters(),"
        " 'top': [t['token_str'] for t in top]}))\n"
    )
    with tempfile.TemporaryDirectory() as tmp:  # a cwd with no skillnet/ folder in it
        r = subprocess.run([py, "-c", probe, str(run / "plain")], cwd=tmp, env=env, capture_output=True, text=True,
                           timeout=600)
    if r.returncode:
        return {"error": f"fill-mask: {r.stderr[-800:]}"}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["commands"] = [_shown(c) for c in steps]
    return out


# ------------------------------------------------------------------------------------------------ the report
def render(results: dict[str, Any]) -> str:
    from skillnet.experiments.benchdoc import md_table

    summaries = {c.name: summarize(c, results["raw"][c.name]) for c in configs() if c.name in results["raw"]}
    done = [r for r in summaries.values() if "error" not in r]
    lines = [
        "## Real size on 2 CPU ranks: measured memory and step time",
        "",
        "Written by `python bench/real_size.py --json --write` (configurations measured by earlier calls are kept "
        "in runs/real_size/results.json and reported again). Each row is one 2-rank `deepspeed` launch on this "
        f"machine's CPU, fp32, micro-batch {MICRO_BATCH} per rank, {STEPS['bert']} optimizer steps (BERT at "
        "sequence 128) or 2 (BERT at 512, BART; the table's step time is the median after the first): "
        "SkillNet-BERT `base` "
        "(7 skills per layer) through `pretrain/run.py` (sparse MLM+NSP, synthetic full-length samples), "
        "SkillNet-BART `base` through the fine-tuning `Trainer` on one generation task "
        f"(`{BART_TASK}`, 2 skills per token, source and target of the full length). Peak = the rank's resident high-water mark "
        "during the steps minus its baseline (after the imports and the process group, before the model); "
        "predicted = `experiments/memory.py` for the same setup on a CPU (offloaded states included). "
        "Engine MB are the engine's own tensors (params / gradients / fp32 master / Adam moments / offload "
        "buffers: ZeRO-2 offload's compute-dtype partition and staging buffers), read after the last step, the "
        "gradients before the first optimizer step, next to the model's terms (its gradients: the partition on "
        "the device, plus the fp32 partition on the host under offload). Under fp32 ZeRO-2 the engine's gradient "
        "storages before the step (the parameters' own gradient tensors that the partition views) exceed the "
        "partition; the model counts the partition, which fills during the backward, and its flattened copy at the "
        "step (`experiments/memory.py`).",
        "",
    ]
    rows = []
    for r in done:
        for i, k in enumerate(r["ranks"]):
            e, p = k["engine_mb"], k["predicted_parts_mb"]
            rows.append([
                r["arch"], {"z2": "ZeRO-2", "z3": "ZeRO-3", "z2off": "ZeRO-2 offload"}[r["zero"]], r["seq"],
                "on" if r["ckpt"] else "off", i, ", ".join(r["tasks"]), k["baseline_mb"], k["peak_above_mb"],
                k["predicted_mb"], f"{100 * k['error']:+.1f}%",
                f"{e.get('params', 0)} / {e.get('grads', 0)} / {e.get('master', 0)} / {e.get('moments', 0)} / "
                f"{e.get('offload', 0)}",
                f"{p['params']} / {p['grads']} / {p['master']} / {p['moments']} / {p.get('offload', 0)}",
                k["step_s_median_after_first"], "yes" if r["sparse_ok"] else "**no**",
            ])
    lines.append(md_table(["model", "ZeRO", "seq", "ckpt", "rank", "objectives", "baseline MB", "peak MB",
                           "predicted MB", "error", "engine MB p/g/m/a/o", "model MB p/g/m/a/o", "step s",
                           "sparse ok"], rows))
    within = [r for r in done if r["within"]]
    lines += ["", f"Memory model within ±{TOLERANCE:.0%} of the measured peak: {len(within)} of {len(done)} "
                  "configurations" + (f" (outside: {', '.join(r['name'] for r in done if not r['within'])})"
                                       if len(within) < len(done) else "") + "."]
    saves = []
    for r in done:
        if r["ckpt"]:
            off = summaries.get(r["name"].removesuffix("-ckpt"))
            if off and "error" not in off:
                a, b = (max(k["peak_above_mb"] for k in x["ranks"]) for x in (off, r))
                t0, t1 = (statistics.median(k["step_s_median_after_first"] for k in x["ranks"]) for x in (off, r))
                kept = " / ".join(str(x["ranks"][0]["predicted_parts_mb"]["activations"]) for x in (off, r))
                at = " / ".join(x["ranks"][0]["peak_at"] for x in (off, r))
                saves.append([r["arch"], r["seq"], a, b, a - b, kept, at, f"{t1 / t0:.2f}"])
    if saves:
        lines += ["", "Activation checkpointing at base size (ZeRO-2, measured peak above baseline, the larger rank; "
                      "the model's activations kept for the backward and where it puts the peak, off / on: once the "
                      "activations shrink, the optimizer step bounds the peak; step times are on a shared machine):", "",
                  md_table(["model", "seq", "off MB", "on MB", "saved MB", "model activations MB off / on",
                            "model peak at off / on", "step time on/off"], saves)]
    if done:
        shm = max(k["shmem_mb"] for r in done for k in r["ranks"])
        sizes = sorted({b for c in configs() for b in results["raw"].get(c.name, {}).get("shm_files", [])})
        lines += ["", "DeepSpeed's shared-memory allreduce buffer (`/dev/shm/deepspeed_allreduce_buffer_*`, one per rank, "
                      f"{', '.join(f'{b / MB:.1f}' for b in sizes) or '?'} MB each as measured, created when the process "
                      "group starts, before the baseline; the bench removes them after each launch, DeepSpeed does not) "
                      "is not in the peaks above: with gloo "
                      f"the ranks never map it (their largest RssShmem in any step: {shm:.3f} MB). It does take host "
                      "memory, as tmpfs, outside every process."]
    broken = [r["name"] for r in done if not r["sparse_ok"]]
    lines += ["", "Sparse updates (`sparse ok`): in every step, were the skills whose weights changed on some rank (hash "
                  "of each rank's copy: the full tensor under ZeRO-2, the partition under ZeRO-3) among the skills the "
                  "step's objective activated, all others bit-identical? "
              + (f"Yes in every configuration ({len(done)})." if not broken else
                 f"No in {', '.join(broken)}: " + "; ".join(
                     f"step {i + 1} ({', '.join(st['tasks'])}) moved {', '.join(st['moved'])}, used "
                     f"{', '.join(st['used'])}" for r in done if not r["sparse_ok"]
                     for i, st in enumerate(r["steps"]) if not set(st["moved"]) <= set(st["used"])) + ".")]
    for name, old in results.get("superseded", {}).items():
        c = next(x for x in configs() if x.name == name)
        r = summarize(c, old)
        bad = [f"step {i + 1} ({', '.join(st['tasks'])}) moved {', '.join(st['moved'])} but used {', '.join(st['used'])}"
               for i, st in enumerate(r.get("steps", [])) if not set(st["moved"]) <= set(st["used"])]
        lines += ["", f"Superseded run of {name} ({old['note']}): sparse updates "
                      f"{'held' if not bad else 'broken: ' + '; '.join(bad)}; peak above baseline "
                      f"{', '.join(str(k['peak_above_mb']) for k in r.get('ranks', []))} MB (ranks 0, 1)."]
    ex = results.get("export")
    if ex:
        if "error" in ex:
            lines += ["", f"Export check: failed: {ex['error']}"]
        else:
            cmds = [x.replace(sys.executable, "python") for x in ex["commands"]]
            lines += ["", f"Export check (bert-z2-128): `{cmds[0]}`, then `{cmds[1]}`; stock "
                          f"transformers (no SkillNet module imported) loads a `{ex['class']}` of {ex['params'] / 1e6:.0f} M "
                          f"parameters and `pipeline('fill-mask')` on 今天天气很[MASK]。 returns {ex['top']} (after 3 steps "
                          "from random weights the words are noise: the check is that it loads and runs)."]
    for c in configs():
        if c.name not in results["raw"]:
            lines += ["", f"Not measured yet: {c.name} (`python bench/real_size.py --only {c.name} --write` measures it "
                          "and adds it here)."]
    failed = [r for r in summaries.values() if "error" in r]
    for r in failed:
        lines += ["", f"Not measured: {r['name']}: {r['error'][:300]}"]
    lines += ["", "Commands (each rank run by `deepspeed`; `python bench/real_size.py --only NAME` repeats one):", ""]
    lines += [f"- {r['name']}: `{r['cmd']}`" for r in done]
    lines += ["", results.get("machine", "")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="bench/real_size.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--only", nargs="+", help="configuration names (see --list)")
    p.add_argument("--list", action="store_true", help="print the configuration names and exit")
    p.add_argument("--report-only", action="store_true",
                   help="launch nothing: the report (and --write) from the measurements already in --work")
    p.add_argument("--rerun", action="store_true", help="measure again configurations already in the results")
    p.add_argument("--rerun-note", help="with --rerun: keep the earlier measurement in the report with this reason")
    p.add_argument("--work", type=Path, default=REPO / "runs" / "real_size", help="runs and results.json (default: runs/real_size)")
    p.add_argument("--timeout", type=float, default=1500, help="seconds per launch (default: %(default)s)")
    p.add_argument("--min-free-gb", type=float, default=14, help="launch only with this much memory available (default: %(default)s)")
    p.add_argument("--no-export", action="store_true", help="skip the export / fill-mask check")
    p.add_argument("--json", action="store_true", help="print one JSON line last")
    p.add_argument("--write", action="store_true", help=f"rewrite the 'real_size' section of {DOC}")
    a = p.parse_args(argv)
    todo = configs()
    if a.list:
        print("\n".join(c.name for c in todo))
        return 0
    if a.only:
        unknown = set(a.only) - {c.name for c in todo}
        if unknown:
            p.error(f"unknown configuration(s) {sorted(unknown)}; see --list")
        by_name = {c.name: c for c in todo}
        todo = [by_name[n] for n in dict.fromkeys(a.only)]  # in the order given: the most wanted first
    a.work.mkdir(parents=True, exist_ok=True)
    store = a.work / "results.json"
    # the raw rank records: the comparison is recomputed from them on every call (a corrected memory model
    # is compared with the same measurements)
    results: dict[str, Any] = json.loads(store.read_text()) if store.is_file() else {"raw": {}}
    for c in [] if a.report_only else todo:
        if "ranks" in results["raw"].get(c.name, {}) and not a.rerun:
            continue
        if a.rerun and a.rerun_note and "ranks" in results["raw"].get(c.name, {}):
            # the earlier measurement stays in the report, with why it was measured again
            results.setdefault("superseded", {})[c.name] = {**results["raw"][c.name], "note": a.rerun_note}
        found = None if a.rerun else collect(c, a.work)
        print(f"[real_size] {c.name} {'(collected)' if found else '...'}", file=sys.stderr, flush=True)
        results["raw"][c.name] = found or launch(c, a.work, a.timeout, a.min_free_gb)
        from skillnet.experiments.benchdoc import machine_line

        results["machine"] = machine_line()
        store.write_text(json.dumps(results, indent=1))
        r = summarize(c, results["raw"][c.name])
        if c.name == "bert-z2-128" and not a.no_export:
            results["export"] = export_check(a.work)
            store.write_text(json.dumps(results, indent=1))
        if c.name != "bert-z2-128":  # the checkpoints of a base run are ~5 GB: keep only the exported one
            shutil.rmtree(a.work / c.name / "run" / "checkpoints", ignore_errors=True)
        print(json.dumps({k: r.get(k) for k in ("name", "within", "sparse_ok", "error")}),
              file=sys.stderr, flush=True)
    if not a.no_export and "error" in results.get("export", {"error": ""}) and \
            (a.work / "bert-z2-128" / "run" / "checkpoints").is_dir():
        results["export"] = export_check(a.work)
        store.write_text(json.dumps(results, indent=1))
    body = render(results)
    print(body, end="")
    if a.write:
        from skillnet.experiments.benchdoc import write_section

        write_section(REPO / DOC, "real_size", body)
    if a.json:
        done = [r for r in (summarize(c, results["raw"][c.name]) for c in configs() if c.name in results["raw"])
                if "error" not in r]
        print(json.dumps({"configs": len(done), "within_15pct": sum(r["within"] for r in done),
                          "sparse_ok": all(r["sparse_ok"] for r in done),
                          "errors": {r["name"]: [k["error"] for k in r["ranks"]] for r in done}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
