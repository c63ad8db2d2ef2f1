"""The op `make setup`'s warm-up builds is the op the first launch loads (issue 57, item 6): a 2-rank DeepSpeed
launch right after `python -m skillnet.training.warmup` compiles nothing, in the same environment's extensions
folder. A rebuild showed as rank 1 waiting minutes on rank 0's build lock."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from skillnet.training.dist import extensions_dir
from skillnet.training.op_build import LAUNCH_OPS

from tests.fixtures.pretrain.helpers import REPO, free_port, subprocess_env

pytestmark = pytest.mark.slow  # a DeepSpeed launcher start-up (and the ops' build where setup has not run)

# What a rank of a training launch does to the ops: the project's distributed start-up (prepare_extensions, then
# DeepSpeed's process group, which loads the shared-memory collectives) and a ZeRO-2 engine with DeepSpeed's Adam.
RANK = """
import json, sys
import torch
import deepspeed
from skillnet.training.dist import init_distributed

init_distributed()
model = torch.nn.Linear(8, 8)
cfg = {"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2},
       "optimizer": {"type": "Adam", "params": {"lr": 1e-3}}}
engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
engine.backward(engine(torch.ones(1, 8)).sum())
engine.step()
print(json.dumps({"rank_ok": torch.distributed.get_rank(), "optimizer": type(opt.optimizer).__name__}), flush=True)
"""


def _build_state(d: Path) -> dict[str, object]:
    """Each op folder's build log and its objects' modification times: what any compilation changes."""
    return {op: {"log": (d / op / ".ninja_log").read_text() if (d / op / ".ninja_log").is_file() else None,
                 "mtimes": {f.name: f.stat().st_mtime_ns for f in sorted((d / op).glob("*.[os]*"))}}
            for op in LAUNCH_OPS}


def test_the_launch_after_the_warmup_builds_nothing(tmp_path: Path) -> None:
    env = subprocess_env()
    env.pop("TORCH_EXTENSIONS_DIR", None)  # the environment's own folder, as `make setup` and a user's launch use it
    w = subprocess.run([sys.executable, "-m", "skillnet.training.warmup"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=1200)
    status = json.loads(w.stdout.strip().splitlines()[-1])
    if any(str(v).startswith(("failed", "unavailable")) for k, v in status.items() if k != "event"):
        pytest.fail(f"the warm-up could not build the ops: {status}\n{w.stderr[-2000:]}")
    d = extensions_dir()
    before = _build_state(d)
    assert all(v["log"] for v in before.values()), f"the warm-up left no build in {d}: {before}"
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    r = subprocess.run(["deepspeed", "--num_gpus", "2", "--master_port", str(free_port()), str(script)], cwd=REPO,
                       env=env, capture_output=True, text=True, timeout=900, start_new_session=True)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert out.count('"rank_ok"') == 2, out[-4000:]
    assert _build_state(d) == before, f"the launch rebuilt an op in {d}:\n{out[-4000:]}"
    assert "Building extension module" not in out and "ninja" not in out.lower(), out[-4000:]
