"""Pre-training launched by torchrun (PyTorch's own launcher) as by DeepSpeed's (issue 50, item 10).

torchrun's agent hosts the rendezvous store on --master_port itself, so the launch's own "port is in use" check
(training/dist.py check_master_port) must leave that port to it. 2 CPU ranks: N steps, a SIGTERM, a resume to 2N
under torchrun again, the same losses and final weights as 2N straight (tests/test_pretrain_zero.py's check).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.pretrain.helpers import REPO, free_port, subprocess_env
from tests.fixtures.warm import launch_fixture
from tests.test_pretrain_zero import CPU_FP32, N, _args, _assert_same_run, _straight_and_split

pytestmark = pytest.mark.slow


def torchrun(script: str, args: list[str], nprocs: int = 2, timeout: int = 600,
             check: bool = True) -> subprocess.CompletedProcess[str]:
    """``torchrun --nproc_per_node N --master_port P script args`` (``python -m torch.distributed.run`` is the
    torchrun command) on CPU, in its own session."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nprocs), "--master_port",
           str(free_port()), script, *args]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=subprocess_env(),
                       start_new_session=True)
    if check:
        assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r


def test_a_torchrun_launch_trains_saves_and_resumes_exactly(default_shards: Path, tmp_path: Path) -> None:
    straight = tmp_path / "straight"
    launch_fixture("pretrain/run.py", _args(default_shards, straight, CPU_FP32, 2 * N))
    _, split, first = _straight_and_split(default_shards, tmp_path, CPU_FP32, group_signal=False, straight=straight,
                                          start=torchrun, resume=torchrun)
    assert "is in use" not in first.stderr
    assert '"world_size": 2' in first.stdout, first.stdout[-2000:]
    _assert_same_run(straight, split)
