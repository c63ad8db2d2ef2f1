"""A process crash at any point of a 2-rank DeepSpeed save resumes exactly, under ZeRO-2, ZeRO-3 and ZeRO-2 with the
optimizer offloaded to the CPU (issue 58, item 5).

tests/test_durable_save.py checks the save's order of writes in one process, with a toy model and a fake engine; here
real ranks of `pretrain/run.py` (2 warm ranks, tests/fixtures/warm.py; gloo on CPU, fp32) save every 2 steps, and
one of them SIGKILLs itself in the save of step 4 (tests/fixtures/pretrain/crash_run.py):

    complete   rank 0, every rank's files written and fsynced, `complete` not yet written
    latest     rank 0, `complete` written, `latest` still naming step 2
    rank1      rank 1, half of its ZeRO optimizer partition on disk (a file cut short), its other files not written

The same command run again resumes from the newest checkpoint that carries its `complete` marker (step 2, or step 4
for `latest`: `complete` decides, not `latest`), and finishes with what an uninterrupted run of the same 6 steps
logged and saved, bit for bit: every logged loss, learning rate and gradient norm, and every tensor of every file of
the final checkpoint (the fp32 weights and Adam moments of each rank's partition, the module weights, the scheduler,
each rank's RNG streams and data position). No tolerance is needed: both runs do the same fp32 operations in the same
order on the same single-threaded CPU ranks, and the resumed one starts from the exact saved state.
"""

from __future__ import annotations

import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from skillnet.common.safe_load import load as safe_load
from skillnet.training.checkpoint import checkpoint_problem, tag_for_step

from tests.fixtures.pretrain.crash_run import POINTS
from tests.fixtures.pretrain.helpers import read_log
from tests.fixtures.warm import launch_fixture

pytestmark = pytest.mark.slow

STEPS, SAVE_EVERY, CRASH_STEP = 6, 2, 4
CRASH_RUN = "tests/fixtures/pretrain/crash_run.py"
# The shipped configs as a user passes them (micro batch 8 per rank, fp32): each run also checks they resume.
CONFIGS = {"zero2": "ds_configs/zero2.json", "zero3": "ds_configs/zero3.json",
           "zero2_offload": "ds_configs/zero2_offload.json"}
LOGGED = ("lr", "grad_norm")  # besides every <objective>/loss


def _args(out: Path, config: str) -> list[str]:
    # 64 synthetic samples, 16 per step: the data wraps into its second epoch before the end.
    return ["--ds_config", config, "--synthetic", "64", "--preset", "tiny", "--max_seq_len", "32",
            "--max_steps", str(STEPS), "--save_every", str(SAVE_EVERY), "--lr", "5e-3", "--log_every", "1",
            "--output_dir", str(out), "--no_progress", "--no_tensorboard"]


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """The uninterrupted run of each config (run once, when a test first asks for it)."""
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            out = tmp_path_factory.mktemp(f"straight_{name}") / "run"
            launch_fixture("pretrain/run.py", _args(out, CONFIGS[name]))
            done[name] = out
        return done[name]

    return get


def _leaves(obj: Any, at: str = "") -> Iterator[tuple[str, Any]]:
    """Every tensor, array and number in a loaded checkpoint file, by its path. Strings are left out: they name
    the run's own folder (the trainer's saved config) and DeepSpeed's version, not state."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{at}/{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _leaves(v, f"{at}/{i}")
    elif isinstance(obj, (torch.Tensor, np.ndarray, int, float)):  # bool is an int
        yield at, obj
    elif obj is not None and not isinstance(obj, str):
        yield from _leaves(getattr(obj, "__dict__", {}), f"{at}.{type(obj).__name__}")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and np.array_equal(a, b)
    return type(a) is type(b) and a == b


# Python's and NumPy's global generators: no run seeds them (each process starts them from the OS: Python's again in
# a forked rank) and nothing in training draws from them, so two fault-free runs save different states there.
# What a resume must do with them, carry the saved state on, is checked by _assert_streams_carried_on instead.
UNSEEDED = ("/rng/python/", "/rng/numpy/")


def _assert_same_final_checkpoint(ref: Path, run: Path) -> int:
    """Every file of the final checkpoint holds the same tensors and numbers in both runs (but the UNSEEDED
    streams); returns how many tensors were compared."""
    tag = tag_for_step(STEPS)
    a_dir, b_dir = ref / "checkpoints" / tag, run / "checkpoints" / tag
    names = sorted(p.name for p in a_dir.glob("*.pt"))
    assert names == sorted(p.name for p in b_dir.glob("*.pt"))
    assert any("optim_states" in n for n in names) and "trainer_rank1.pt" in names, names
    tensors = 0
    for name in names:
        a, b = dict(_leaves(safe_load(a_dir / name))), dict(_leaves(safe_load(b_dir / name)))
        assert a.keys() == b.keys(), (name, sorted(a.keys() ^ b.keys())[:10])
        differ = [k for k in a if not _same(a[k], b[k]) and not k.startswith(UNSEEDED)]
        assert not differ, f"{name}: differs at {differ[:10]}"
        tensors += sum(isinstance(v, torch.Tensor) for v in a.values())
    return tensors


def _unseeded(tdir: Path) -> list[dict[str, Any]]:
    return [{k: v for k, v in _leaves(safe_load(tdir / f"trainer_rank{r}.pt")) if k.startswith(UNSEEDED)}
            for r in (0, 1)]


def _assert_streams_carried_on(saved: list[dict[str, Any]], final: list[dict[str, Any]]) -> None:
    """Each rank's UNSEEDED streams in the final checkpoint are those of the checkpoint it resumed from (nothing
    drew from them since): the resume restored them rather than keeping the new process's own."""
    for r, (a, b) in enumerate(zip(saved, final, strict=True)):
        assert a and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a), f"rank {r}"


def _logged(out: Path) -> list[dict[str, float]]:
    return [{k: v for k, v in r.items() if k == "step" or k in LOGGED or k.endswith("/loss")} for r in read_log(out)]


def _assert_crashed_at(point: str, root: Path, ref_root: Path) -> None:
    """What the crash left: the state a requeued job finds (``ref_root``: the uninterrupted run's checkpoints)."""
    step2, step4 = root / tag_for_step(SAVE_EVERY), root / tag_for_step(CRASH_STEP)
    assert (root / "latest").read_text().strip() == step2.name  # `latest` is never ahead of the crash
    assert checkpoint_problem(step2) is None
    whole = {p.name for p in (ref_root / step4.name).iterdir()}  # every file of a finished save of step 4
    if point == "latest":
        assert {p.name for p in step4.iterdir()} == whole
        assert checkpoint_problem(step4) is None  # whole and marked: only `latest` was not moved on
        return
    assert not (step4 / "complete").exists()
    if point == "complete":  # every rank's files there and whole, only the marker missing
        assert {p.name for p in step4.iterdir()} == whole - {"complete"}
        assert all(zipfile.is_zipfile(f) for f in step4.glob("*.pt"))
        assert str(checkpoint_problem(step4)).startswith("incomplete checkpoint")
    else:  # rank 1 died writing its optimizer partition: the file is cut short on disk
        (shard,) = step4.glob("zero_pp_rank_1_*optim_states.pt")
        assert shard.stat().st_size > 0 and not zipfile.is_zipfile(shard)


@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("config", list(CONFIGS))
def test_a_crash_in_a_zero_save_resumes_exactly(config: str, point: str, tmp_path: Path,
                                                straight: Callable[[str], Path]) -> None:
    ref = straight(config)
    out = tmp_path / "run"
    crashed = launch_fixture(CRASH_RUN, ["--crash-at", point, "--crash-step", str(CRASH_STEP),
                                         *_args(out, CONFIGS[config])], check=False)
    assert crashed.returncode != 0, crashed.stdout[-3000:]
    assert '"event": "end"' not in crashed.stdout  # no rank finished: the run died in the save of step 4
    root = out / "checkpoints"
    _assert_crashed_at(point, root, ref / "checkpoints")
    assert max(int(r["step"]) for r in read_log(out)) == CRASH_STEP

    resumed = tag_for_step(CRASH_STEP if point == "latest" else SAVE_EVERY)
    saved_streams = _unseeded(root / resumed)
    again = launch_fixture("pretrain/run.py", _args(out, CONFIGS[config]))
    assert f"resumed from {root / resumed} at step" in again.stdout, again.stdout[-3000:]
    if point != "latest":  # the cut save is named, not silently taken or silently dropped
        assert f"skipped {tag_for_step(CRASH_STEP)} (no 'complete' marker" in again.stdout
    assert (root / "latest").read_text().strip() == tag_for_step(STEPS)

    logged, expected = _logged(out), _logged(ref)
    assert [r["step"] for r in expected] == list(range(1, STEPS + 1))
    assert logged == expected  # each step once (the crashed run's lines past the resume point were dropped)
    assert _assert_same_final_checkpoint(ref, out) > 0
    _assert_streams_carried_on(saved_streams, _unseeded(root / tag_for_step(STEPS)))
