"""The generic Trainer in plain single-process mode on a toy multi-skill model."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from skillnet.training import Batch, BatchSource, TrainConfig, Trainer
from torch import nn

SKILLS = {"a": [0, 1], "b": [1, 2]}


class ToyModel(nn.Module):
    """Two tasks over three skill layers; task "a" uses skills 0,1 and task "b" skills 1,2."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(4, 16)
        self.skills = nn.ModuleList(nn.Linear(16, 16) for _ in range(3))
        self.out = nn.Linear(16, 3)

    def forward(self, task: str, x: torch.Tensor, labels: torch.Tensor) -> Any:
        h = torch.relu(self.inp(x))
        h = torch.stack([torch.tanh(self.skills[i](h)) for i in SKILLS[task]]).mean(0)
        logits = self.out(h)
        return SimpleNamespace(loss=nn.functional.cross_entropy(logits, labels), logits=logits)


class ToySource:
    """Micro-batch m = rows [m*B, (m+1)*B) of a fixed stream; task = pure function of the step."""

    def __init__(self, micro_batch_size: int, grad_accum: int) -> None:
        self.B, self.accum, self.micro = micro_batch_size, grad_accum, 0
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(4096, 4, generator=g)
        self.y = (self.x[:, 0] > 0).long() + (self.x[:, 1] > 0.5).long()

    def __iter__(self) -> ToySource:
        return self

    def __next__(self) -> Batch:
        step = self.micro // self.accum
        sl = slice((self.micro * self.B) % 4096, (self.micro * self.B) % 4096 + self.B)
        self.micro += 1
        return Batch("a" if step % 3 else "b", {"x": self.x[sl], "labels": self.y[sl]})

    def state_dict(self) -> dict[str, Any]:
        return {"micro": self.micro}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.micro = state["micro"]


def _cfg(tmp: Path, **kw: Any) -> TrainConfig:
    base = dict(
        output_dir=str(tmp),
        max_steps=30,
        lr=1e-2,
        log_every=5,
        micro_batch_size=8,
        grad_accum=1,
        progress=False,
        tensorboard=True,
    )
    base.update(kw)
    return TrainConfig(**base)


def test_toy_source_satisfies_the_protocol() -> None:
    assert isinstance(ToySource(2, 1), BatchSource)


def test_trainer_learns_logs_and_checkpoints(tmp_path: Path) -> None:
    model = ToyModel()
    calls: list[int] = []

    def evaluator(m: nn.Module, step: int) -> dict[str, float]:
        assert not m.training
        calls.append(step)
        return {"probe": float(step)}

    skill_params = {f"s{i}": list(model.skills[i].parameters()) for i in range(3)}
    tr = Trainer(
        model,
        ToySource(8, 1),
        _cfg(tmp_path, eval_every=10, save_every=10, keep_last=2),
        evaluator=evaluator,
        skill_params=skill_params,
    )
    res = tr.train()
    assert res.step == 30 and not res.stopped_by_signal
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["split"] == "train"]
    assert [r["step"] for r in train] == [5, 10, 15, 20, 25, 30]
    assert train[-1]["a/loss"] < train[0]["a/loss"]
    for key in ("loss", "a/loss", "a/acc", "b/loss", "lr", "grad_norm", "tokens_per_s", "skill_grad_norm/s0"):
        assert key in train[0], key
    assert calls == [10, 20, 30]
    assert [r["probe"] for r in lines if r["split"] == "eval"] == [10.0, 20.0, 30.0]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    root = tmp_path / "checkpoints"
    assert (root / "latest").read_text().strip() == "step_00000030"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_00000020", "step_00000030"]  # keep_last=2


def test_skill_grad_norms_are_zero_for_inactive_skills(tmp_path: Path) -> None:
    model = ToyModel()
    skill_params = {f"s{i}": list(model.skills[i].parameters()) for i in range(3)}
    tr = Trainer(model, ToySource(8, 1), _cfg(tmp_path, max_steps=3, log_every=1), skill_params=skill_params)
    tr.train()
    recs = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    step_b = recs[0]  # step 1 (index 0) trains task "b": skills 1, 2
    assert step_b["skill_grad_norm/s0"] == 0.0 and step_b["skill_grad_norm/s2"] > 0
    assert recs[1]["skill_grad_norm/s2"] == 0.0 and recs[1]["skill_grad_norm/s0"] > 0


def test_gradient_accumulation_equals_the_larger_batch(tmp_path: Path) -> None:
    ma, mb = ToyModel(), ToyModel()
    Trainer(ma, ToySource(8, 1), _cfg(tmp_path / "a", max_steps=2, log_every=0, tensorboard=False)).train()
    Trainer(
        mb,
        ToySource(4, 2),
        _cfg(tmp_path / "b", max_steps=2, log_every=0, tensorboard=False, micro_batch_size=4, grad_accum=2),
    ).train()
    for pa, pb in zip(ma.parameters(), mb.parameters()):
        torch.testing.assert_close(pa, pb, rtol=1e-5, atol=1e-6)


def test_sigterm_checkpoints_and_resume_is_exact(tmp_path: Path) -> None:
    straight = ToyModel()
    Trainer(straight, ToySource(8, 1), _cfg(tmp_path / "s", max_steps=12, log_every=1)).train()
    first = Trainer(
        ToyModel(), ToySource(8, 1), _cfg(tmp_path / "r", max_steps=12, log_every=1, sigterm_at_step=5)
    )
    res = first.train()
    assert res.stopped_by_signal and res.step == 5
    resumed_model = ToyModel()
    second = Trainer(
        resumed_model, ToySource(8, 1), _cfg(tmp_path / "r", max_steps=12, log_every=1, resume="auto")
    )
    assert second.train().step == 12
    ls = [json.loads(x)["loss"] for x in (tmp_path / "s" / "log.jsonl").read_text().splitlines()]
    lr = [json.loads(x)["loss"] for x in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
    assert lr == ls
    for pa, pb in zip(straight.parameters(), resumed_model.parameters()):
        assert torch.equal(pa, pb)


def test_resume_errors_are_clear(tmp_path: Path) -> None:
    tr = Trainer(ToyModel(), ToySource(8, 1), _cfg(tmp_path, max_steps=1))
    assert tr.maybe_resume("auto") is False  # nothing to resume yet: start fresh
    with pytest.raises(FileNotFoundError, match="not a checkpoint directory"):
        tr.maybe_resume(str(tmp_path / "nowhere"))


def test_request_stop_from_the_evaluator(tmp_path: Path) -> None:
    holder: dict[str, Trainer] = {}

    def evaluator(m: nn.Module, step: int) -> dict[str, float]:
        if step == 4:
            holder["t"].request_stop()
        return {}

    tr = Trainer(ToyModel(), ToySource(8, 1), _cfg(tmp_path, max_steps=20, eval_every=2), evaluator=evaluator)
    holder["t"] = tr
    res = tr.train()
    assert (res.step, res.stop_reason, res.stopped_by_signal) == (4, "requested", False)
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step_00000004"
