"""A checkpoint that `complete` or `latest` names survives a machine crash (issue 58).

A simulated power loss: every fsync and rename of a save is recorded in order, and at each point of that record
the state a machine crash would leave is judged: a file's data is on disk once fsynced (or its fsynced
temporary renamed onto it), its name once its folder is fsynced after that. Whatever `latest` durably names must
then be complete and whole. A process crash at `complete` or at `latest` resumes exactly.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from skillnet.training import Trainer
from skillnet.training import checkpoint as ckpt_mod
from skillnet.training.checkpoint import CheckpointManager

from tests.test_training_trainer import ToyModel, ToySource, _cfg, _log, task_losses


class _Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, str, str]] = []

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        fsync, replace = os.fsync, os.replace

        def rec_fsync(fd: int) -> None:
            fsync(fd)
            self.events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"), ""))

        def rec_replace(src: Any, dst: Any, **kw: Any) -> None:
            replace(src, dst, **kw)
            self.events.append(("replace", os.path.realpath(src), os.path.realpath(dst)))

        monkeypatch.setattr(os, "fsync", rec_fsync)
        monkeypatch.setattr(os, "replace", rec_replace)


def _durable_after(events: list[tuple[str, str, str]], files: list[str]) -> tuple[set[str], set[str]]:
    """(files whose data is durable, files whose name is durable) after `events`."""
    data: set[str] = set()
    named: set[str] = set()
    synced_tmp: set[str] = set()
    for kind, a, b in events:
        if kind == "fsync":
            if os.path.isdir(a):
                named |= {f for f in data if os.path.dirname(f) == a}
            else:
                data.add(a)
                synced_tmp.add(a)
        else:  # a rename: the target gets the source's data; its new name needs its folder's fsync again
            named.discard(b)
            data.discard(b)
            if a in synced_tmp:
                data.add(b)
    return data & set(files), named & set(files)


class _FakeEngine:
    """Writes its files as DeepSpeed does: a plain open and write, no fsync."""

    def save_checkpoint(self, root: str, tag: str, **_: Any) -> None:
        for name in ("mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"):
            torch.save({"w": torch.ones(3)}, Path(root) / tag / name)


@pytest.mark.parametrize("engine", [False, True])
def test_nothing_latest_names_can_be_missing_after_a_power_loss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 engine: bool) -> None:
    rec = _Recorder()
    rec.install(monkeypatch)
    mgr = CheckpointManager(tmp_path, 0, 1, keep_last=2)
    model = torch.nn.Linear(2, 2)
    for step in (4, 8):
        if engine:
            mgr.save(step, {"step": step, "world_size": 1}, engine=_FakeEngine())
        else:
            mgr.save(step, {"step": step, "world_size": 1}, plain={"model": model})
    root = os.path.realpath(tmp_path / "checkpoints")
    latest = os.path.join(root, "latest")
    checked = 0
    for i in range(len(rec.events) + 1):  # a power loss after each recorded event
        prefix = rec.events[:i]
        renames = [j for j, e in enumerate(prefix) if e[0] == "replace" and e[2] == latest]
        if not renames:
            continue
        # `latest` survives only with root fsynced after its rename; else the previous one does
        durable = [j for j in renames if any(e == ("fsync", root, "") for e in prefix[j + 1:])]
        if not durable:
            continue
        tag = ("step_00000004", "step_00000008")[renames.index(durable[-1])]
        tdir = os.path.join(root, tag)
        files = [os.path.join(tdir, f) for f in os.listdir(tdir)]
        data, named = _durable_after(prefix, files)
        assert data == set(files) and named == set(files), (i, sorted(set(files) - (data & named)))
        tag_named = any(e == ("fsync", root, "") for e in prefix[: durable[-1]])
        assert tag_named and os.path.join(tdir, "complete") in files
        checked += 1
    assert checked > 0


class _Crash(BaseException):
    """A process dying at this point (nothing after it runs, no clean-up)."""


@pytest.mark.parametrize("at", ["complete", "latest"])
def test_a_crash_at_complete_or_latest_resumes_exactly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                       at: str) -> None:
    kw: dict[str, Any] = dict(max_steps=12, log_every=1, save_every=4, keep_last=3, tensorboard=False)
    straight = ToyModel()
    Trainer(straight, ToySource(8, 1), _cfg(tmp_path / "s", **kw)).train()
    run = tmp_path / "r"
    real_mark, real_write = ckpt_mod.mark_complete, ckpt_mod.atomic_write_text

    def mark(d: Path, step: int) -> None:
        if step == 8 and at == "complete":
            raise _Crash
        real_mark(d, step)

    def write(path: Any, text: str) -> None:
        if Path(path).name == "latest" and text.strip() == "step_00000008" and at == "latest":
            raise _Crash
        real_write(path, text)

    monkeypatch.setattr(ckpt_mod, "mark_complete", mark)
    monkeypatch.setattr(ckpt_mod, "atomic_write_text", write)
    with pytest.raises(_Crash):
        Trainer(ToyModel(), ToySource(8, 1), _cfg(run, **kw)).train()
    monkeypatch.undo()
    root = run / "checkpoints"
    assert (root / "latest").read_text().strip() == "step_00000004"
    assert (root / "step_00000008" / "complete").is_file() == (at == "latest")
    resumed = ToyModel()
    tr = Trainer(resumed, ToySource(8, 1), _cfg(run, resume="auto", **kw))
    assert tr.train().step == 12
    assert [task_losses(r) for r in _log(run)] == [task_losses(r) for r in _log(tmp_path / "s")]
    for a, b in zip(straight.parameters(), resumed.parameters(), strict=True):
        assert torch.equal(a, b)
    assert json.loads((root / "step_00000012" / "complete").read_text())["step"] == 12
