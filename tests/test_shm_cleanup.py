"""DeepSpeed's CPU shared-memory allreduce creates one 66 MB /dev/shm/deepspeed_allreduce_buffer_* file per rank
and launch and never removes it; a day of CPU launches filled a 24 GB /dev/shm and got a process OOM-killed. The
trainer removes its rank's file once every rank has finished training."""

from __future__ import annotations

import glob
from pathlib import Path

import pytest

from tests.fixtures.pretrain.helpers import launch

pytestmark = pytest.mark.slow

PATTERN = "/dev/shm/deepspeed_allreduce_buffer_*"


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this OS")
def test_a_two_rank_launch_leaves_no_shared_memory_buffers(tmp_path: Path) -> None:
    before = set(glob.glob(PATTERN))
    launch("pretrain/run.py", ["--synthetic", "64", "--max-steps", "2", "--max-seq-len",
                               "32", "--no-progress", "--output-dir", str(tmp_path / "run"), "--ds-config",
                               "ds_configs/cpu_fp32.json"])
    assert set(glob.glob(PATTERN)) - before == set()
