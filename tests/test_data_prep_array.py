"""data_prep as a Slurm array job (scripts/slurm/data_prep_array.sbatch), run on this machine by
scripts/data_prep_array_local.sh exactly as Slurm runs it: the array's shards, merged and verified, are the
one-process build's, byte for byte, on the packaged real corpus."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.pretrain.helpers import REPO, subprocess_env

pytestmark = pytest.mark.slow  # ~20 s: four build processes and a merge on the packaged corpus


def _files(out: Path) -> dict[str, bytes]:
    """Every file of a shard folder but the array tasks' own manifests."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if not p.name.startswith("manifest.part")}


def _run(cmd: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600,
                          env={**subprocess_env(), "PYTHON": sys.executable, **env})


def test_the_array_job_builds_what_one_process_builds(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.txt"
    r = _run([sys.executable, "-m", "skillnet.data_prep", "sample-corpus", "--out", str(corpus), "--max-docs", "600"])
    assert r.returncode == 0, r.stderr[-2000:]
    unit = ["--unit-bytes", str(max(4096, corpus.stat().st_size // 7))]  # several units per task
    one = _run([sys.executable, "-m", "skillnet.data_prep", "build", str(corpus), "--out", str(tmp_path / "one"),
                "--no-progress", *unit])
    assert one.returncode == 0, one.stderr[-2000:]
    array = _run(["bash", "scripts/data_prep_array_local.sh", str(corpus), str(tmp_path / "array")],
                 JOBS="3", BUILD_ARGS=" ".join(unit))
    assert array.returncode == 0, array.stdout[-2000:] + array.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "array").glob("manifest.part-*")) == [
        f"manifest.part-{i:05d}-of-00003.json" for i in range(3)]
    assert _files(tmp_path / "one") == _files(tmp_path / "array")
    assert re.search(r"^ok: \d+ shards", array.stdout, re.M), array.stdout[-1000:]  # the merge stage verified


@pytest.mark.parametrize("env, message", [
    ({}, "not an array task"),
    ({"SLURM_ARRAY_TASK_ID": "1", "SLURM_ARRAY_TASK_COUNT": "2", "SLURM_ARRAY_TASK_MIN": "1",
      "SLURM_ARRAY_TASK_MAX": "2"}, "must be 0..N-1"),
])
def test_the_job_file_refuses_what_is_not_an_array_task_of_0_to_n(tmp_path: Path, env: dict, message: str) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    r = subprocess.run(["bash", "scripts/slurm/data_prep_array.sbatch", "in.txt", str(tmp_path / "o")], cwd=REPO,
                       capture_output=True, text=True, env={**clean, **env}, timeout=60)
    assert r.returncode == 2 and message in r.stderr and not (tmp_path / "o").exists()
