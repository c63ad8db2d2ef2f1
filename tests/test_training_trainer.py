"""The generic Trainer in plain single-process mode on a toy multi-skill model."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from skillnet.training import Batch, BatchSource, SkillStatistics, TrainConfig, Trainer, TrainerCallback
from skillnet.training import checkpoint as ckpt_mod
from torch import nn

from tests.faults import SigtermAt
from tests.fixtures.pretrain.helpers import task_losses

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
        callbacks=[SkillStatistics(skill_params)],
    )
    res = tr.train()
    assert res.step == 30 and not res.stopped_by_signal
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    train = [r for r in lines if r["split"] == "train"]
    assert [r["step"] for r in train] == [5, 10, 15, 20, 25, 30]
    assert train[-1]["a/loss"] < train[0]["a/loss"]
    for key in ("a/loss", "a/acc", "b/loss", "lr", "grad_norm", "tokens_per_s", "skill_grad_norm/s0"):
        assert key in train[0], key
    assert not any("loss" in r for r in lines), "a loss averaged over tasks moves with the task draw"
    assert calls == [10, 20, 30]
    assert [r["probe"] for r in lines if r["split"] == "eval"] == [10.0, 20.0, 30.0]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    root = tmp_path / "checkpoints"
    assert (root / "latest").read_text().strip() == "step_00000030"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_00000020", "step_00000030"]  # keep_last=2


def test_skill_statistics_cover_only_the_steps_that_used_the_skill(tmp_path: Path) -> None:
    """Per-skill gradient norms: absent (not 0.0) for a skill no step of the window used, and the mean over
    the window's steps that used it, not the last micro-step's value (TensorBoard issue)."""
    def run(out: Path, log_every: int) -> list[dict[str, Any]]:
        model = ToyModel()
        skill_params = {f"s{i}": list(model.skills[i].parameters()) for i in range(3)}
        Trainer(model, ToySource(8, 1), _cfg(out, max_steps=6, log_every=log_every, tensorboard=False),
                callbacks=[SkillStatistics(skill_params)]).train()
        return [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines() if '"train"' in x]

    every = run(tmp_path / "every", 1)
    # step 1 trains task "b" (skills 1, 2): skill 0 has no statistic at all
    assert "skill_grad_norm/s0" not in every[0] and every[0]["skill_grad_norm/s2"] > 0
    assert "skill_grad_norm/s2" not in every[1] and every[1]["skill_grad_norm/s0"] > 0
    windows = run(tmp_path / "windows", 3)
    for w, steps in zip(windows, (every[0:3], every[3:6])):
        for s in ("s0", "s1", "s2"):
            vals = [r[f"skill_grad_norm/{s}"] for r in steps if f"skill_grad_norm/{s}" in r]
            assert w[f"skill_grad_norm/{s}"] == pytest.approx(sum(vals) / len(vals), rel=1e-5), (s, w["step"])
    # the realised task mix since the start, and the drift of each skill from the first weights
    assert windows[-1]["mix/a"] == pytest.approx(4 / 6) and windows[-1]["mix/b"] == pytest.approx(2 / 6)
    assert all(windows[-1][f"skill_drift/s{i}"] > 0 for i in range(3))


def test_skill_drift_is_measured_from_the_first_weights_across_a_resume(tmp_path: Path) -> None:
    def run(out: Path, *faults: TrainerCallback) -> dict[str, Any]:
        model = ToyModel()
        skill_params = {f"s{i}": list(model.skills[i].parameters()) for i in range(3)}
        Trainer(model, ToySource(8, 1), _cfg(out, max_steps=6, log_every=2, tensorboard=False, resume="auto"),
                callbacks=[SkillStatistics(skill_params), *faults]).train()
        return [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines() if '"train"' in x][-1]

    full = run(tmp_path / "full")
    assert run(tmp_path / "cut", SigtermAt(4))["step"] == 4  # stops and checkpoints at step 4
    cut = run(tmp_path / "cut")  # resumes at step 4
    assert cut["step"] == full["step"] == 6
    for i in range(3):
        assert cut[f"skill_drift/s{i}"] == pytest.approx(full[f"skill_drift/s{i}"], rel=1e-6)
    assert cut["mix/a"] == full["mix/a"]


class OutGradNorm(TrainerCallback):
    """A callback outside the trainer: the output layer's gradient norm on task "a" steps only."""

    def __init__(self) -> None:
        self.started_at: int | None = None

    def on_train_start(self, trainer: Trainer) -> None:
        self.started_at = trainer.global_step

    def on_gradients(self, trainer: Trainer) -> dict[str, float]:
        # Called before the optimizer step: global_step is still the 0-based index of this step, and
        # ToySource trains task "b" on the indices divisible by 3.
        if trainer.global_step % 3 == 0:
            return {}
        return {"out_grad_norm": float(trainer.module.out.weight.grad.norm())}

    def on_log(self, trainer: Trainer) -> dict[str, float]:
        return {"logged_at": float(trainer.global_step)}


def test_callbacks_add_statistics_to_a_generic_run(tmp_path: Path) -> None:
    def run(out: Path, log_every: int) -> tuple[OutGradNorm, list[dict[str, Any]]]:
        cb = OutGradNorm()
        Trainer(ToyModel(), ToySource(8, 1), _cfg(out, max_steps=6, log_every=log_every, tensorboard=False),
                callbacks=[cb]).train()
        return cb, [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines() if '"train"' in x]

    cb, every = run(tmp_path / "every", 1)
    assert cb.started_at == 0
    assert [("out_grad_norm" in r) for r in every] == [False, True, True, False, True, True]
    assert [r["logged_at"] for r in every] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    assert not any(k.startswith(("skill_grad_norm/", "skill_drift/")) for r in every for k in r)
    _, windows = run(tmp_path / "windows", 3)
    for w, steps in zip(windows, (every[1:3], every[4:6])):  # the mean over the steps that reported it
        mean = sum(r["out_grad_norm"] for r in steps) / 2
        assert w["out_grad_norm"] == pytest.approx(mean, rel=1e-5)


def test_tensorboard_gets_per_task_losses_not_the_mixed_one_and_the_config(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = ToyModel()
    Trainer(model, ToySource(8, 1), _cfg(tmp_path, max_steps=4, log_every=2), config_text='{"lr": 0.01}').train()
    ea = EventAccumulator(str(next((tmp_path / "tensorboard").glob("events.out.tfevents.*"))))
    ea.Reload()
    scalars = set(ea.Tags()["scalars"])
    assert {"train/a/loss", "train/b/loss", "train/mix/a"} <= scalars and "train/loss" not in scalars
    assert "config/text_summary" in ea.Tags()["tensors"]


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
        ToyModel(), ToySource(8, 1), _cfg(tmp_path / "r", max_steps=12, log_every=1), callbacks=[SigtermAt(5)]
    )
    res = first.train()
    assert res.stopped_by_signal and res.step == 5
    resumed_model = ToyModel()
    second = Trainer(
        resumed_model, ToySource(8, 1), _cfg(tmp_path / "r", max_steps=12, log_every=1, resume="auto")
    )
    assert second.train().step == 12
    ls = [task_losses(json.loads(x)) for x in (tmp_path / "s" / "log.jsonl").read_text().splitlines()]
    lr = [task_losses(json.loads(x)) for x in (tmp_path / "r" / "log.jsonl").read_text().splitlines()]
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


class CrashingSource(ToySource):
    """Dies like a killed process (no checkpoint, no cleanup) when it reaches micro-batch `crash_at`."""

    def __init__(self, micro_batch_size: int, grad_accum: int, crash_at: int) -> None:
        super().__init__(micro_batch_size, grad_accum)
        self.crash_at = crash_at

    def __next__(self) -> Batch:
        if self.micro == self.crash_at:
            raise KeyboardInterrupt("killed")
        return super().__next__()


def _log(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (path / "log.jsonl").read_text().splitlines()]


def test_log_after_kill_and_resume_holds_each_step_once(tmp_path: Path) -> None:
    """Killed at step 7, last checkpoint at step 4: steps 5-6 were logged, then replayed after the resume.
    The resumed run drops the lines past its checkpoint, so log.jsonl equals an uninterrupted run's."""
    Trainer(
        ToyModel(),
        ToySource(8, 1),
        _cfg(tmp_path / "s", max_steps=12, log_every=1, eval_every=3),
        evaluator=lambda m, s: {"probe": float(s)},
    ).train()
    run = tmp_path / "r"
    kw = dict(max_steps=12, log_every=1, eval_every=3, save_every=4, tensorboard=False)
    with pytest.raises(KeyboardInterrupt):
        Trainer(
            ToyModel(),
            CrashingSource(8, 1, crash_at=6),
            _cfg(run, **kw),
            evaluator=lambda m, s: {"probe": float(s)},
        ).train()
    assert [r["step"] for r in _log(run) if r["split"] == "train"] == [1, 2, 3, 4, 5, 6]
    with open(run / "log.jsonl", "a") as f:
        f.write('{"step": 7, "a/loss": 0.6')  # a line cut short by the kill
    Trainer(
        ToyModel(),
        ToySource(8, 1),
        _cfg(run, resume="auto", **kw),
        evaluator=lambda m, s: {"probe": float(s)},
    ).train()
    straight, resumed = _log(tmp_path / "s"), _log(run)
    key = lambda r: (r["split"], r["step"])  # noqa: E731
    assert [key(r) for r in resumed] == [key(r) for r in straight]
    assert [task_losses(r) for r in resumed] == [task_losses(r) for r in straight]


@pytest.mark.parametrize("save_every", [0, 3])
def test_a_run_resumed_from_its_final_checkpoint_evaluates_its_last_step_once(tmp_path: Path, save_every: int) -> None:
    """A run killed after its final checkpoint, before it wrote its results, is resumed by the rerun (as a
    comparison's rerun does). Its last step is evaluated once in all: its evaluator state and log.jsonl hold
    one dev point there, not two (a second point per task in the comparison's curves). save_every 0: the
    final checkpoint holds the final evaluation, which the resumed run does not repeat; 3: the last step
    was saved before the final evaluation, which the resumed run repeats in place of the earlier line."""
    calls: list[int] = []

    class Evaluator:
        def __init__(self) -> None:
            self.history: list[int] = []

        def __call__(self, model: Any, step: int) -> dict[str, float]:
            calls.append(step)
            self.history.append(step)
            return {"probe": float(step)}

        def state_dict(self) -> dict[str, Any]:
            return {"history": list(self.history)}

        def load_state_dict(self, s: dict[str, Any]) -> None:
            self.history = list(s["history"])

    def run(**kw: Any) -> Evaluator:
        ev = Evaluator()
        Trainer(ToyModel(), ToySource(8, 1), _cfg(tmp_path, max_steps=6, log_every=1, eval_every=2,
                                                  save_every=save_every, tensorboard=False, **kw),
                evaluator=ev, extra_state={"evaluator": ev}).train()
        return ev

    assert run().history == [2, 4, 6]
    resumed = run(resume="auto")
    assert resumed.history == [2, 4, 6]
    assert [r["step"] for r in _log(tmp_path) if r["split"] == "eval"] == [2, 4, 6]
    assert calls == ([2, 4, 6] if save_every == 0 else [2, 4, 6, 6])


def test_resume_auto_ignores_an_incomplete_checkpoint(tmp_path: Path) -> None:
    """A save cut short (no 'complete' marker) is never loaded: --resume auto takes the previous complete
    checkpoint, even when 'latest' names the incomplete one (its files half rewritten by another run)."""
    Trainer(ToyModel(), ToySource(8, 1), _cfg(tmp_path / "s", max_steps=16, log_every=1)).train()
    run = tmp_path / "r"
    kw = dict(max_steps=16, log_every=1, save_every=4, keep_last=3, tensorboard=False)
    Trainer(ToyModel(), ToySource(8, 1), _cfg(run, **kw), callbacks=[SigtermAt(12)]).train()
    root = run / "checkpoints"
    assert (root / "latest").read_text().strip() == "step_00000012"
    half = root / "step_00000012"
    marker = half / getattr(ckpt_mod, "COMPLETE_MARKER", "complete")
    marker.unlink(missing_ok=True)
    plain = half / "plain.pt"
    plain.write_bytes(plain.read_bytes()[: plain.stat().st_size // 2])  # being written when the run stopped
    probe = Trainer(ToyModel(), ToySource(8, 1), _cfg(run, **kw))
    assert probe.maybe_resume("auto") and probe.global_step == 8
    tr = Trainer(ToyModel(), ToySource(8, 1), _cfg(run, resume="auto", **kw))
    assert tr.train().step == 16
    straight = [task_losses(r) for r in _log(tmp_path / "s")]
    assert [task_losses(r) for r in _log(run)] == straight  # continued from step 8, exactly
    assert (root / "step_00000012" / "complete").is_file()  # saved again, completely, at step 12
    with pytest.raises(FileNotFoundError, match="incomplete checkpoint"):
        (root / "step_00000012" / "complete").unlink()
        tr.maybe_resume(str(root / "step_00000012"))


def test_rotation_counts_complete_checkpoints_only(tmp_path: Path) -> None:
    root = tmp_path / "checkpoints"
    for step in (4, 8, 12, 16, 20):
        (root / f"step_{step:08d}").mkdir(parents=True)
        if step != 12 and step != 20:
            ckpt_mod.mark_complete(root / f"step_{step:08d}", step)
    ckpt_mod.rotate(root, keep_last=2)
    # 12 was cut short (older than the newest complete: removed); 20 may still be being written: kept
    assert sorted(p.name for p in root.glob("step_*")) == ["step_00000008", "step_00000016", "step_00000020"]


@pytest.mark.slow  # keeps make test-fast under 3 min (measured 9-30 s on 2 loaded cores)
def test_a_run_waits_for_the_ranks_of_the_previous_run(tmp_path: Path) -> None:
    """A requeued run must not resume while the stopped run's ranks still write their checkpoint: it
    waits for them (run lock), then resumes from the checkpoint they finished."""
    import subprocess
    import sys
    import time

    run, other = tmp_path / "r", tmp_path / "other"
    kw = dict(max_steps=8, log_every=1, save_every=4, tensorboard=False)
    Trainer(ToyModel(), ToySource(8, 1), _cfg(run, **kw), callbacks=[SigtermAt(4)]).train()
    Trainer(ToyModel(), ToySource(8, 1), _cfg(other, **kw)).train()  # the checkpoint the old ranks finish
    root = run / "checkpoints"
    ready = tmp_path / "ready"
    # Stand-in for a rank of the stopped run: holds the run lock, then finishes a checkpoint of step 8.
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, shutil, sys, time\n"
            "from pathlib import Path\n"
            "from skillnet.training.checkpoint import mark_complete\n"
            "root, done, ready = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])\n"
            "f = open(root / '.run.lock', 'a+'); fcntl.flock(f, fcntl.LOCK_SH)\n"
            "ready.touch(); time.sleep(1.0)\n"
            "shutil.copytree(done, root / done.name)\n"
            "(root / done.name / 'complete').unlink(); mark_complete(root / done.name, 8)\n",
            str(root),
            str(other / "checkpoints" / "step_00000008"),
            str(ready),
        ]
    )
    try:
        while not ready.exists():
            assert child.poll() is None, "helper process died"
            time.sleep(0.01)
        tr = Trainer(ToyModel(), ToySource(8, 1), _cfg(run, resume="auto", **kw))
        res = tr.train()
    finally:
        child.wait(timeout=60)
    # Had it not waited, it would have resumed from step 4 and trained 4 steps.
    assert res.step == 8 and tr.global_step == 8
    assert [r["step"] for r in _log(run)] == [1, 2, 3, 4]  # nothing trained after the resume at 8


def test_an_overflowed_step_changes_nothing_and_the_run_goes_on(tmp_path: Path) -> None:
    """A step with non-finite gradients (fp16 overflow, one bad batch) is skipped as DeepSpeed's loss scaler
    skips it: weights, Adam moments, per-tensor step counts and the schedule stay as they were."""
    model = ToyModel()
    bad_step = 3

    def loss_fn(batch: Batch, out: Any) -> torch.Tensor:
        return out.loss * (float("inf") if tr.global_step + 1 == bad_step else 1.0)

    tr = Trainer(model, ToySource(8, 1), _cfg(tmp_path, max_steps=6, log_every=1, warmup_steps=10), loss_fn=loss_fn)
    for _ in range(bad_step - 1):
        tr.train_step()

    def snapshot() -> tuple[list[torch.Tensor], list[dict[str, Any]], float]:
        state = [{k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()} for s in tr.optimizer.state.values()]
        return [p.detach().clone() for p in model.parameters()], state, tr.scheduler.get_last_lr()[0]

    params, state, lr = snapshot()
    out = tr.train_step()
    assert out.step == bad_step and tr.skipped_steps == 1
    params2, state2, lr2 = snapshot()
    assert all(torch.equal(a, b) for a, b in zip(params, params2, strict=True))
    assert lr2 == lr
    for s, s2 in zip(state, state2, strict=True):
        assert s.keys() == s2.keys()
        for k in s:
            assert (torch.equal(s[k], s2[k]) if torch.is_tensor(s[k]) else s[k] == s2[k]), k
    tr.train_step()  # the next batch trains normally
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert any(not torch.equal(a, p) for a, p in zip(params, model.parameters(), strict=True))


def test_a_checkpoint_of_another_world_size_is_resharded_only_under_deepspeed_and_the_same_stage(
    tmp_path: Path,
) -> None:
    """What the universal-checkpoint path refuses before it converts anything (training/reshard.py)."""
    from skillnet.training.checkpoint import CheckpointManager

    tdir = tmp_path / "checkpoints" / "step_00000004"
    tdir.mkdir(parents=True)
    torch.save({"world_size": 2, "step": 4, "zero_stage": 2}, tdir / "trainer_rank0.pt")
    mgr = CheckpointManager(tmp_path, rank=0, world_size=1, keep_last=2)
    with pytest.raises(RuntimeError, match="only under DeepSpeed on both sides"):
        mgr.load(tdir, plain={})
    zero3 = SimpleNamespace(zero_optimization_stage=lambda: 3)
    with pytest.raises(RuntimeError, match="cannot change the ZeRO stage"):
        mgr.load(tdir, engine=zero3)
    torch.save({"world_size": 2, "step": 4}, tdir / "trainer_rank0.pt")  # written before the stage was saved
    with pytest.raises(RuntimeError, match="unknown"):
        mgr.load(tdir, engine=zero3)
    not_universal = SimpleNamespace(zero_optimization_stage=lambda: 2,
                                    _config=SimpleNamespace(load_universal_checkpoint=False))
    torch.save({"world_size": 2, "step": 4, "zero_stage": 2}, tdir / "trainer_rank0.pt")
    with pytest.raises(RuntimeError, match="load_universal"):
        mgr.load(tdir, engine=not_universal)
    assert not (tdir.parent / "universal").exists()  # nothing was converted


def test_a_source_that_cannot_follow_another_world_size_refuses_the_resume(tmp_path: Path) -> None:
    tdir = tmp_path / "checkpoints" / "step_00000004"
    tdir.mkdir(parents=True)
    for r in range(2):  # what a 2-rank ZeRO-2 save leaves (an intact checkpoint)
        torch.save({"world_size": 2, "step": 4, "zero_stage": 2}, tdir / f"trainer_rank{r}.pt")
        torch.save({}, tdir / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")
    torch.save({}, tdir / "mp_rank_00_model_states.pt")
    (tdir / "complete").write_text("{}")
    tr = Trainer(ToyModel(), ToySource(8, 1), _cfg(tmp_path, max_steps=1))
    with pytest.raises(RuntimeError, match="ToySource.*relaunch with 2 rank"):
        tr.maybe_resume("auto")


def test_compile_blocks_compiles_each_layer_in_place_and_keeps_the_names() -> None:
    """--compile: every block of the model's layer lists is compiled (not their own inner lists, e.g. a
    layer's skills), and the parameter names, which checkpoints and exports use, do not change."""
    from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining
    from skillnet.training.compile import compile_blocks

    model = SkillNetBertForPreTraining(SkillNetBertConfig.preset("tiny", vocab_size=1000))
    names = list(model.state_dict())
    assert compile_blocks(model) == model.config.num_hidden_layers
    assert list(model.state_dict()) == names
    compiled = [n for n, m in model.named_modules() if getattr(m, "_compiled_call_impl", None) is not None]
    assert compiled == [f"bert.encoder.layer.{i}.attention" for i in range(model.config.num_hidden_layers)]


def test_compile_compiles_once_per_shape_family_not_per_objective_or_row_count(default_shards: Path) -> None:
    """--compile: MLM and NSP (two skill sets) on packed batches whose row count changes every step compile
    one graph (the layers share it); padded rows are a second shape family, compiled once more. Counted with
    dynamo's own counters on the eager backend (the guards and recompiles are the backend's business of no
    one: inductor recompiles exactly where eager does)."""
    import torch._dynamo
    from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining
    from skillnet.pretrain.dataset import PretrainingDataset
    from skillnet.pretrain.objectives import ObjectiveSampler, PretrainBatchSource
    from skillnet.training.compile import compile_blocks
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    ds = PretrainingDataset(default_shards, max_seq_len=64, verify="size")
    model = SkillNetBertForPreTraining(SkillNetBertConfig.preset("tiny", vocab_size=ds.vocab_size))
    compile_blocks(model, backend="eager")

    def run(packing: bool, micro_batches: int) -> set[int]:
        src = PretrainBatchSource(ds, ObjectiveSampler(seed=0), 8, 1, packing=packing)
        rows, tasks = set(), set()
        for _ in range(micro_batches):
            b = next(src)
            model(task=b.task, **b.tensors).loss.backward()
            rows.add(b.tensors["input_ids"].shape[0])
            tasks.add(b.task)
        assert tasks == {"mlm", "nsp"}
        return rows

    assert len(run(True, 8)) >= 3  # several row counts, both objectives
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    run(False, 4)
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])
    torch._dynamo.reset()


def test_a_resume_with_another_lr_schedule_is_refused_or_applied_on_purpose(tmp_path: Path, capsys) -> None:
    """A larger --max-steps on resume moved the linear decay's end, so the LR jumped from ~0 back up without
    a word. Now that is refused with the jump named; with new_schedule it continues on the new curve and
    prints it."""
    from skillnet.training.checkpoint import ResumeError

    first = Trainer(ToyModel(), ToySource(8, 1), _cfg(tmp_path, max_steps=4, tensorboard=False))
    first.train()
    again = Trainer(ToyModel(), ToySource(8, 1), _cfg(tmp_path, max_steps=4, tensorboard=False, resume="auto"))
    assert again.maybe_resume("auto") and again.global_step == 4  # the same schedule resumes as before
    longer = Trainer(ToyModel(), ToySource(8, 1), _cfg(tmp_path, max_steps=8, tensorboard=False))
    with pytest.raises(ResumeError, match=r"decay end 4\).*decay end 8\).*at step 5 the LR moves from 0 to 0.005.*"
                       r"--new-schedule.*--max-steps 4"):
        longer.maybe_resume("auto")
    applied = Trainer(ToyModel(), ToySource(8, 1), _cfg(tmp_path, max_steps=8, tensorboard=False, new_schedule=True))
    capsys.readouterr()
    assert applied.maybe_resume("auto") and applied.global_step == 4
    assert "LR from here: step 5 0.005" in capsys.readouterr().out
    assert applied.base_optimizer.param_groups[0]["lr"] == pytest.approx(1e-2 * 4 / 8)
