"""`deepspeed pretrain/run.py --ds_config ds_configs/zero2.json`, then `export`: the folder passes the
fill-mask and feature-extraction rows of tests/test_hf_pipelines.py in an environment that cannot see the project.

The two runs' ranks start warm (tests/fixtures/warm.py: the environment DeepSpeed's launcher gives each rank,
without its ~20 s start-up); the `deepspeed` command itself is run in tests/test_pretrain_zero.py (a SIGTERM to
the whole launch, a killed rank, two nodes) and tests/test_pretrain_dense_bart.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from tests.fixtures.pretrain.helpers import REPO, subprocess_env
from tests.fixtures.warm import launch_fixture
from tests.test_hf_pipelines import _mlm_reference, run_plain

pytestmark = pytest.mark.slow


def test_zero2_pretraining_requeued_on_one_rank_exports_for_fill_mask_and_features(tmp_path, default_shards):
    """Trained on 2 ranks to step 12, stopped (SIGTERM), requeued on 1 rank to step 24: every step reads
    16 samples, none twice within an epoch, and the export of the resharded run serves transformers."""
    shards = default_shards
    run = tmp_path / "run"
    args = ["--ds_config", "ds_configs/zero2.json", "--shards", str(shards), "--preset", "tiny",
            "--max_seq_len", "32", "--max_steps", "24", "--lr", "5e-3", "--log_every", "4",
            "--output_dir", str(run), "--no_progress", "--no_tensorboard", "--log_samples"]
    # the SIGTERM at step 12 comes from the test side (tests/faults.py): run.py has no flag for it
    first = launch_fixture("tests/fixtures/pretrain/sigterm_run.py", ["--sigterm-at-step", "12", *args])
    assert '"stopped_by_signal": true' in first.stdout
    second = launch_fixture("pretrain/run.py", args, nprocs=1)
    assert "global batch 16 kept as micro-batch 8 x accumulation 2 x 1 rank(s)" in second.stdout, second.stdout
    assert '"world_size": 1' in second.stdout and '"grad_accum": 2' in second.stdout
    per_step: dict[int, list[int]] = {}
    epochs: dict[int, list[int]] = {}
    for f in sorted(run.glob("samples_rank*.jsonl")):
        for line in f.read_text().splitlines():
            rec = json.loads(line)
            per_step.setdefault(rec["step"], []).extend(rec["indices"])
            epochs.setdefault(rec["epoch"], []).extend(rec["indices"])
    assert sorted(per_step) == list(range(1, 25)) and all(len(v) == 16 for v in per_step.values())
    assert all(len(v) == len(set(v)) for v in epochs.values()), "a sample read twice"
    r = subprocess.run([sys.executable, "-m", "skillnet.pretrain.export", "--checkpoint", str(run),
                        "--out", str(tmp_path / "hf")], cwd=REPO, capture_output=True, text=True, timeout=600,
                       env=subprocess_env())
    assert r.returncode == 0, r.stderr[-2000:]
    folder = tmp_path / "hf"
    text = "技能[MASK]。"  # a word of the training corpus, masked
    ids, logits, hidden = _mlm_reference(folder, text)
    res = run_plain(folder, r"""
fill = pipeline("fill-mask", model=folder, trust_remote_code=True)
res["top"] = [r["token"] for r in fill("技能[MASK]。", top_k=3)]
fe = pipeline("feature-extraction", model=folder, trust_remote_code=True)
res["features"] = fe("技能[MASK]。")[0]
""")
    assert res["top"] == logits[ids.index(103)].topk(3).indices.tolist()
    torch.testing.assert_close(torch.tensor(res["features"]), hidden, rtol=1e-4, atol=1e-4)

