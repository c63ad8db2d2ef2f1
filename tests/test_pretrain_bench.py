"""bench/pretrain.py runs and prints its JSON keys last (no timing assertions)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_prints_the_issue_keys_as_last_line() -> None:
    r = subprocess.run(
        [
            sys.executable,
            "bench/pretrain.py",
            "--preset",
            "tiny",
            "--seq",
            "32",
            "--batch",
            "4",
            "--reps",
            "1",
            "--peak_size",
            "512",
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("skillnet_over_dense", "mfu", "matmul_peak_gflops"):
        assert isinstance(res[key], float) and res[key] > 0, key
    assert "skillnet_over_dense" in r.stdout and "MFU" in r.stdout  # the readable table precedes the JSON
