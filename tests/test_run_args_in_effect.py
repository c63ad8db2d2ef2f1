"""run_args.json records the settings in effect (issue 57): a BART run given none of the noise or batch flags
recorded ``mask_ratio``, ``poisson_lambda`` and ``micro_batch_size`` as null, while 0.3, 3.0 and the resolved
micro-batch ran (printed on stdout only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a BART pre-training step in-process


def test_bart_run_args_hold_the_values_in_effect(default_shards: Path, tmp_path: Path) -> None:
    from skillnet.pretrain.archs import MASK_RATIO, POISSON_LAMBDA
    from skillnet.pretrain.run import main

    out = tmp_path / "bart"
    assert main(["--arch", "bart", "--shards", str(default_shards), "--preset", "tiny", "--max_seq_len", "32",
                 "--max_steps", "1", "--output_dir", str(out), "--no_progress", "--no_tensorboard"]) == 0
    rec = json.loads((out / "run_args.json").read_text(encoding="utf-8"))
    assert (rec["mask_ratio"], rec["poisson_lambda"]) == (MASK_RATIO, POISSON_LAMBDA)
    for k in ("micro_batch_size", "grad_accum", "lr", "warmup_steps", "packing", "max_steps"):
        assert rec[k] is not None, k
    assert rec["segments"][0]["args"]["micro_batch_size"] == rec["micro_batch_size"]
    # what stays null is what the run did not use or leaves off by design: no flag of the trainer among them
    from skillnet.pretrain.options import FLAGS

    assert not [k for k in FLAGS if rec.get(k) is None and k != "profile_steps"], rec  # no profiling: off
    assert rec["data_workers"] == 0  # the CPU default, resolved at launch
