"""Left-over /dev/shm allreduce buffers of killed CPU launches are removed when the next launch starts: one
66 MB buffer fills Docker's default 64 MB /dev/shm, and the next launch dies with a bus error."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from skillnet.training.dist import remove_stale_shared_memory

pytestmark = pytest.mark.skipif(not Path("/proc/self/maps").is_file() or not Path("/dev/shm").is_dir(),
                                reason="needs /dev/shm and /proc (Linux)")


def test_only_unmapped_old_buffers_of_this_user_are_removed(capsys: pytest.CaptureFixture[str]) -> None:
    tag = uuid.uuid4().hex[:8]
    paths = {k: Path(f"/dev/shm/deepspeed_allreduce_buffer_test{tag}{k}_127.0.0.1_1_0") for k in ("stale", "fresh", "live")}
    for p in paths.values():
        p.write_bytes(b"\0" * 4096)
    old = time.time() - 600
    for k in ("stale", "live"):
        os.utime(paths[k], (old, old))
    # a running launch: a process that maps its buffer (and was started long ago)
    live = subprocess.Popen([sys.executable, "-c", "import mmap, sys, time\n"
                             f"f = open({str(paths['live'])!r}, 'r+b'); m = mmap.mmap(f.fileno(), 0)\n"
                             "print('mapped', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert live.stdout is not None and live.stdout.readline().strip() == "mapped"
        removed = remove_stale_shared_memory()
        assert str(paths["stale"]) in removed and not paths["stale"].exists()
        assert paths["live"].exists() and paths["fresh"].exists()  # in use; just created by a launch starting now
        assert "removed" in capsys.readouterr().err
    finally:
        live.kill()
        live.wait()
        for p in paths.values():
            p.unlink(missing_ok=True)
