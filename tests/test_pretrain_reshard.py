"""Resume on another number of ranks (a requeue onto more or fewer nodes), ZeRO-1, ZeRO-2 and ZeRO-3.

One run is saved on 2 ranks, continued on 1 rank, saved again and continued on 3 ranks
(tests/fixtures/pretrain/reshard_state.py). The global batch (12 samples) is kept, so every step reads the
same samples as the straight 2-rank run (in packed rows: each rank packs the samples it holds, so the rows
change with the world size while the samples do not); the optimizer state crosses each change bit for bit; sparse
updates still leave the skills a step does not use untouched; the losses follow the straight run.
The end-to-end case through `deepspeed pretrain/run.py` is in tests/test_pretrain_zero.py.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.fixtures.pretrain.helpers import REPO
from tests.fixtures.warm import launch_fixture

pytestmark = pytest.mark.slow

FIXTURE = "tests/fixtures/pretrain/reshard_state.py"
ACTIVE = {"mlm": ["s2", "s7"], "nsp": ["s1", "s3", "s7"]}
STEPS, MORE = 3, 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, default_shards: Path) -> Path:
    out = tmp_path_factory.mktemp("reshard")
    configs = []
    for stage in (1, 2, 3):
        ds = json.loads((REPO / "ds_configs" / f"zero{stage}.json").read_text())
        # 2 micro x 3 accumulation x 2 ranks = 12: on 1 rank 2 x 6, on 3 ranks 2 x 2.
        ds.update(train_micro_batch_size_per_gpu=2, gradient_accumulation_steps=3)
        path = out / f"zero{stage}.json"
        path.write_text(json.dumps(ds))
        configs.append(str(path))
    for phase, ranks in (("a", 2), ("b", 1), ("c", 3)):
        launch_fixture(FIXTURE, [str(default_shards), str(out), phase, *configs], nprocs=ranks, timeout=900)
    return out


def _steps(run: Path, phase: str) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """(rank 0's report, {step: {loss, objective, moved, samples: Counter over every rank}})."""
    files = sorted(run.glob(f"{phase}_rank*.json"))
    reports = [json.loads(f.read_text()) for f in files]
    assert len(reports) == reports[0]["world_size"]
    steps: dict[int, dict[str, Any]] = {}
    for rep in reports:
        for s in rep["steps"]:
            entry = steps.setdefault(s["step"], {**s, "samples": Counter()})
            entry["samples"].update(i for batch in s["samples"] for i in batch)
    return reports[0], steps


def _assert_same_state(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["state_steps"] == want["state_steps"] == [want["global_step"]]
    assert got["global_step"] == want["global_step"]
    assert got["groups"] == want["groups"], "param group settings (weight decay, lr, betas) changed"
    assert got["params"].keys() == want["params"].keys()
    for name, tensors in want["params"].items():
        for key, t in tensors.items():
            assert torch.equal(got["params"][name][key], t), f"{name} {key} differs after the load"


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_resume_on_another_world_size_keeps_state_samples_and_losses(runs: Path, stage: int) -> None:
    run = runs / f"zero{stage}"
    a, straight = _steps(run, "a")
    assert a["zero_stage"] == stage and sorted(straight) == list(range(1, STEPS + 2 * MORE + 1))
    # The checkpoint was converted once, next to it, and marked complete.
    assert (run / "a" / "checkpoints" / "universal" / f"step_{STEPS:08d}" / "complete").is_file()

    for phase, world, saved, first in (("b", 1, "a_saved", STEPS + 1), ("c", 3, "b_saved", STEPS + MORE + 1)):
        rep, steps = _steps(run, phase)
        assert rep["world_size"] == world and rep["zero_stage"] == stage
        loaded = torch.load(run / f"{phase}_loaded.pt", weights_only=False)
        assert loaded["micro_batch_size"] * loaded["grad_accum"] * world == 12, "the global batch is kept"
        _assert_same_state(loaded, torch.load(run / f"{saved}.pt", weights_only=False))
        assert sorted(steps) == list(range(first, first + MORE))
        for step, s in steps.items():
            ref = straight[step]
            # Exact data position: the same 12 samples, none repeated or skipped.
            assert s["samples"] == ref["samples"] and sum(s["samples"].values()) == 12, f"{phase} step {step}"
            assert s["loss"] == pytest.approx(ref["loss"], rel=1e-6), f"{phase} step {step}"
            # Sparse updates after the resume: exactly the step's skills moved.
            assert s["moved"] == ACTIVE[s["objective"]], f"{phase} step {step} ({s['objective']})"
        assert {s["objective"] for s in steps.values()} == {"mlm", "nsp"}
