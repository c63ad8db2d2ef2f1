"""bench/allocator.py: the arms' environments, the summary by hand, and a smoke run of its JSON (one repetition of
one step: the real measurement needs a quiet machine)."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from skillnet.experiments.allocator import TUNED, allocator_env, reexec_with

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("bench_allocator", REPO / "bench" / "allocator.py")
bench = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench)


def test_each_arm_is_an_environment():
    assert allocator_env("glibc") == {}
    assert allocator_env("glibc-tuned") == {"MALLOC_MMAP_THRESHOLD_": str(1 << 30), "MALLOC_TRIM_THRESHOLD_": str(1 << 30)}
    tc = allocator_env("tcmalloc")
    assert tc is None or (Path(tc["LD_PRELOAD"]).is_file() and "tcmalloc" in tc["LD_PRELOAD"])
    with pytest.raises(ValueError, match="unknown allocator"):
        allocator_env("nope")
    reexec_with("glibc", [])  # the default never re-executes: returns


def test_summary_by_hand():
    runs = {"glibc": [{"step_s": 0.5, "user_s": 3.0, "sys_s": 1.0, "minflt_per_step": 10},
                      {"step_s": 0.7, "user_s": 3.0, "sys_s": 3.0, "minflt_per_step": 30},
                      {"step_s": 0.6, "user_s": 4.0, "sys_s": 2.0, "minflt_per_step": 20}]}
    s = bench.summarise(runs)["glibc"]
    assert s["step_s"] == 0.6  # the median
    assert s["sys_share"] == round(6.0 / 16.0, 4)  # kernel seconds over all CPU seconds
    assert s["minflt_per_step"] == 20


def test_smoke_run_prints_the_ratio_of_default_over_best(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("# x\n\n<!-- bench:allocator:begin -->\nold\n<!-- bench:allocator:end -->\n")
    r = subprocess.run([sys.executable, "bench/allocator.py", "--reps", "1", "--steps", "1", "--warmup", "0",
                        "--kinds", "bart", "--arms", "glibc", "glibc-tuned", "--json", "--write", str(doc)], cwd=REPO,
                       capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    arms = res["bart"]["arms"]
    assert set(arms) == {"glibc", "glibc-tuned"} and res["env"]["glibc-tuned"] == TUNED
    best = min(arms.values(), key=lambda v: v["step_s"])["step_s"]
    assert res["step_s_default_over_best_allocator"]["bart"] == round(arms["glibc"]["step_s"] / best, 3)
    assert all(0.0 <= v["sys_share"] <= 1.0 for v in arms.values())
    written = doc.read_text()  # the figures the docs quote are the bench's own
    assert "old" not in written and "| bart | glibc-tuned |" in written
    assert f"bart {res['step_s_default_over_best_allocator']['bart']}" in written


def test_glibc_tuned_applies_in_process_without_replacing_the_caller():
    # The reproduction's default: a caller in-process (a test calling main) must survive it, and the commands it
    # starts must inherit it. Before, it re-executed `python -m skillnet.experiments ARGV` in place of the caller.
    code = ("import os; from skillnet.experiments.allocator import reexec_with, current; "
            "reexec_with('glibc-tuned', ['--no-such-flag']); "
            "print(current(), os.environ['MALLOC_MMAP_THRESHOLD_'], os.environ['MALLOC_TRIM_THRESHOLD_'])")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "SKILLNET_ALLOCATOR"))}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split() == ["glibc-tuned", str(1 << 30), str(1 << 30)]
