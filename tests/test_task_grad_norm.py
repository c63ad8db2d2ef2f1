"""Per-task gradient normalisation, a fine-tuning option beside the NER head's loss_reduction (issue 49, item 2):
train.task_grad_norm "off" (the default: training as before) or "ema" (each task's loss scaled before backward
by mean-over-tasks(EMA of grad norm) / its own EMA; training/task_balance.py)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from skillnet.training import Batch, DsConfigError, TrainConfig, Trainer
from skillnet.training.config import lr_lambda
from skillnet.training.optim import MaskedAdamW, build_param_groups
from skillnet.training.reshard import read_trainer_state
from skillnet.training.task_balance import EMA_DECAY, TASK_GRAD_NORMS, EmaTaskGradNorm, build_task_balance
from torch import nn

B_SCALE = 10.0  # task "b"'s loss is task "a"'s kind of loss times this (as NER's per-word loss is ~10x smaller)


class SharedModel(nn.Module):
    """Both tasks run the same network on the same kind of data: their gradients differ only by the loss scale
    the test puts on them."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))

    def forward(self, task: str, x: torch.Tensor, labels: torch.Tensor) -> Any:
        logits = self.net(x)
        return SimpleNamespace(loss=nn.functional.cross_entropy(logits, labels), logits=logits)


class TwoTaskSource:
    """Micro-batch m = rows [8m, 8m+8) of a fixed stream; its task ("a" twice, then "b") is a function of m."""

    def __init__(self) -> None:
        self.micro = 0
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(2048, 4, generator=g)
        self.y = (self.x[:, 0] > 0).long() + (self.x[:, 1] > 0.5).long()

    def __iter__(self) -> TwoTaskSource:
        return self

    def __next__(self) -> Batch:
        start = (self.micro * 8) % 2048
        task = "b" if self.micro % 3 == 2 else "a"
        self.micro += 1
        return Batch(task, {"x": self.x[start:start + 8], "labels": self.y[start:start + 8]})

    def state_dict(self) -> dict[str, Any]:
        return {"micro": self.micro}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.micro = state["micro"]


def scaled_b(batch: Batch, out: Any) -> torch.Tensor:
    return out.loss * (B_SCALE if batch.task == "b" else 1.0)


def _cfg(tmp: Path, **kw: Any) -> TrainConfig:
    return TrainConfig(**{"output_dir": str(tmp), "max_steps": 100, "lr": 1e-3, "micro_batch_size": 8,
                          "grad_accum": 1, "progress": False, "tensorboard": False, "skill_drift": False, **kw})


def _trainer(tmp: Path, loss_fn: Any = scaled_b, **kw: Any) -> Trainer:
    return Trainer(SharedModel(), TwoTaskSource(), _cfg(tmp, **kw), loss_fn=loss_fn)


def _steps(trainer: Trainer, n: int) -> list[dict[str, Any]]:
    """n optimizer steps: each step's task, its logged loss, grad_scale (None when not logged) and norm."""
    rows = []
    for _ in range(n):
        out = trainer.train_step()
        task = next(k for k in out.sums if k.endswith("/loss")).removesuffix("/loss")
        num, den = out.sums[f"{task}/loss"]
        gs = out.sums.get(f"{task}/grad_scale")
        rows.append({"task": task, "loss": num / den, "grad_scale": None if gs is None else gs[0] / gs[1],
                     "grad_norm": out.grad_norm})
    return rows


def _weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in trainer.module.state_dict().items()}


def test_the_option_is_a_train_setting_with_off_as_default_and_every_value_has_an_implementation() -> None:
    field = TrainConfig.__dataclass_fields__["task_grad_norm"]
    assert TrainConfig().task_grad_norm == "off"
    assert set(field.metadata["choices"]) == set(TASK_GRAD_NORMS)
    assert TrainConfig.from_json(TrainConfig(task_grad_norm="ema").to_json()).task_grad_norm == "ema"
    with pytest.raises(ValueError, match="task_grad_norm='l2'; valid: off, ema"):
        TrainConfig(task_grad_norm="l2")


def test_off_trains_exactly_as_a_plain_adamw_loop_and_as_a_config_without_the_option(tmp_path: Path) -> None:
    """"off" builds nothing: the same losses and bit-identical weights as the config that does not name the
    option, and as a hand-written loop of the plain path (backward, clip, MaskedAdamW step, LR step)."""
    steps = 6
    default = _trainer(tmp_path / "default")
    off = _trainer(tmp_path / "off", task_grad_norm="off")
    assert default.task_balance is None and off.task_balance is None and "task_grad_norm" not in off.extra_state
    rows_default, rows_off = _steps(default, steps), _steps(off, steps)
    assert [r["loss"] for r in rows_default] == [r["loss"] for r in rows_off]
    assert all(r["grad_scale"] is None for r in rows_off)  # nothing logged either

    model, source, cfg = SharedModel().to(off.device), TwoTaskSource(), off.cfg
    opt = MaskedAdamW(build_param_groups(model, cfg.weight_decay), lr=cfg.lr, betas=cfg.betas, eps=cfg.eps,
                      masked=cfg.sparse_updates, impl=cfg.optim_impl)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(cfg))
    losses = []
    for _ in range(steps):
        batch = next(source).to(off.device)
        loss = scaled_b(batch, model(task=batch.task, **batch.tensors))
        loss.backward()
        losses.append(float(loss.detach()))
        norm = torch.nn.utils.clip_grad_norm_(list(model.parameters()), cfg.max_grad_norm)
        if opt.sync_free(norm.device):  # CUDA: the trainer's step without a host read-back
            opt.step(found_inf=(~torch.isfinite(norm)).float())
        else:
            opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
    assert losses == pytest.approx([r["loss"] for r in rows_off], rel=0, abs=0)
    for name, w in model.state_dict().items():
        assert torch.equal(w, off.module.state_dict()[name]), name
        assert torch.equal(w, default.module.state_dict()[name]), name


def test_the_factor_follows_its_formula_step_by_step() -> None:
    """s = 1 on a task's first step and while fewer than two tasks are measured; then mean(EMA) / EMA_task,
    the EMA taking the measured norm divided by the step's s; a non-finite or zero norm is left out."""
    bal = EmaTaskGradNorm()
    loss = torch.tensor(2.0)
    assert bal.scale("a", loss) == (loss, 1.0)
    bal.observe(2.0)
    assert bal.scale("a", loss)[1] == 1.0  # one task measured
    bal.observe(torch.tensor(4.0))  # a device tensor, as the sync-free path returns it
    ema_a = EMA_DECAY * 2.0 + (1 - EMA_DECAY) * 4.0
    assert bal.ema == {"a": pytest.approx(ema_a)}
    assert bal.scale("b", loss)[1] == 1.0  # b's first step
    bal.observe(20.0)
    mean = (ema_a + 20.0) / 2
    assert bal.factor("a") == pytest.approx(mean / ema_a) and bal.factor("b") == pytest.approx(mean / 20.0)
    scaled, s = bal.scale("b", loss)
    assert s == pytest.approx(mean / 20.0) and float(scaled) == pytest.approx(2.0 * s)
    bal.observe(s * 30.0)  # the step's measured norm is its unscaled norm (30) times s
    assert bal.ema["b"] == pytest.approx(EMA_DECAY * 20.0 + (1 - EMA_DECAY) * 30.0)
    before = dict(bal.ema)
    for bad in (math.inf, math.nan, 0.0):
        bal.scale("a", loss)
        bal.observe(bad)
    assert bal.ema == before


def test_ema_gives_a_10x_larger_loss_a_10x_smaller_factor_and_evens_the_scaled_norms(tmp_path: Path) -> None:
    """Both tasks are the same problem, b's loss times 10. Off: b's gradient norm is several times a's. Ema,
    after 12 warm-up steps (each task measured a few times): b's mean grad_scale over a's lies within a factor 2
    of 1/10, the EMAs' ratio within a factor 2 of 10, and the median scaled gradient norm (the logged one, before
    clipping) of b's steps over a's lies within [0.5, 2]."""
    warm, n = 12, 48

    def by_task(rows: list[dict[str, Any]], key: str) -> dict[str, list[float]]:
        return {t: [float(r[key]) for r in rows[warm:] if r["task"] == t] for t in ("a", "b")}

    off = by_task(_steps(_trainer(tmp_path / "off"), n), "grad_norm")
    assert statistics.median(off["b"]) / statistics.median(off["a"]) > 5  # the imbalance the option is for

    trainer = _trainer(tmp_path / "ema", task_grad_norm="ema")
    rows = _steps(trainer, n)
    assert [r["grad_scale"] for r in rows[:3]] == [1.0, 1.0, 1.0]  # a, a (one task measured), b's first
    scales, norms = by_task(rows, "grad_scale"), by_task(rows, "grad_norm")
    ratio = statistics.fmean(scales["b"]) / statistics.fmean(scales["a"])
    assert 1 / (2 * B_SCALE) < ratio < 2 / B_SCALE, ratio
    ema = trainer.task_balance.ema  # type: ignore[union-attr]
    assert B_SCALE / 2 < ema["b"] / ema["a"] < 2 * B_SCALE
    balance = statistics.median(norms["b"]) / statistics.median(norms["a"])
    assert 0.5 < balance < 2, balance


def test_the_logged_loss_is_the_unscaled_one(tmp_path: Path) -> None:
    """lr 0 keeps the weights, so each step's loss can be recomputed afterwards from its batch: the logged
    <task>/loss must equal it while the step's grad_scale is far from 1."""
    trainer = _trainer(tmp_path, task_grad_norm="ema", lr=0.0)
    rows = _steps(trainer, 12)
    replay = TwoTaskSource()
    far = 0
    for r in rows:
        batch = next(replay).to(trainer.device)
        with torch.no_grad():
            expected = float(scaled_b(batch, trainer.module(task=batch.task, **batch.tensors)))
        assert r["loss"] == pytest.approx(expected, rel=1e-6), r
        far += abs(math.log(r["grad_scale"])) > math.log(2)
    assert far >= 6  # most steps carry a factor, so a scaled loss would show


def test_the_ema_state_survives_save_and_resume(tmp_path: Path) -> None:
    """A run resumed from step 8's checkpoint takes the same factors, norms and weights as the run that went
    on: its first step's factor is the EMA's, not a fresh start's 1."""
    first = _trainer(tmp_path / "run", task_grad_norm="ema", max_steps=16)
    _steps(first, 8)
    ckpt = first.save_checkpoint()
    went_on = _steps(first, 8)
    assert went_on[0]["grad_scale"] != 1.0

    resumed = _trainer(tmp_path / "resumed", task_grad_norm="ema", max_steps=16)
    assert resumed.maybe_resume(ckpt)
    saved = read_trainer_state(Path(ckpt))["extra"]["task_grad_norm"]["ema"]
    assert set(saved) == {"a", "b"} and resumed.task_balance.ema == saved  # type: ignore[union-attr]
    again = _steps(resumed, 8)
    assert [r["grad_scale"] for r in again] == [r["grad_scale"] for r in went_on]
    assert [r["grad_norm"] for r in again] == [r["grad_norm"] for r in went_on]
    for name, w in first.module.state_dict().items():
        assert torch.equal(w, resumed.module.state_dict()[name]), name


def test_where_ema_cannot_work_it_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="task_grad_norm ema needs grad_accum 1"):
        TrainConfig(task_grad_norm="ema", grad_accum=2)
    from skillnet.finetune.config import ConfigError, FinetuneConfig

    task = {"name": "t", "type": "classification", "train": "t.jsonl", "skills": ["s1", "s7"]}
    with pytest.raises(ConfigError, match="train: task_grad_norm ema needs grad_accum 1"):
        FinetuneConfig.from_dict({"tasks": [task], "train": {"task_grad_norm": "ema", "grad_accum": 4}})
    # accumulation implied by batch_size over micro_batch_size: refused with the config
    with pytest.raises(ValueError, match=r"needs grad_accum 1 .*got 2"):
        _trainer(tmp_path, task_grad_norm="ema", grad_accum=None, batch_size=16)

    fp32_no_zero = SimpleNamespace(zero_optimization_stage=lambda: 0, fp16_enabled=lambda: False,
                                   bfloat16_enabled=lambda: False, get_global_grad_norm=lambda: None)
    with pytest.raises(DsConfigError, match="keeps no global gradient norm"):
        build_task_balance(_cfg(tmp_path, task_grad_norm="ema"), fp32_no_zero)
    zero2 = SimpleNamespace(**{**fp32_no_zero.__dict__, "zero_optimization_stage": lambda: 2})
    bal = build_task_balance(_cfg(tmp_path, task_grad_norm="ema"), zero2)
    assert bal is not None and build_task_balance(_cfg(tmp_path), zero2) is None
    no_norm = SimpleNamespace(**{**zero2.__dict__, "optimizer": SimpleNamespace(compute_grad_norm=False)})
    with pytest.raises(DsConfigError, match="computes no global gradient norm .*compute_grad_norm false"):
        build_task_balance(_cfg(tmp_path, task_grad_norm="ema"), no_norm)  # at start, not at the first step
    assert build_task_balance(_cfg(tmp_path), no_norm) is None  # off needs no norm
    bal.scale("a", torch.tensor(1.0))
    with pytest.raises(DsConfigError, match="reported no gradient norm"):
        bal.observe(None)  # an engine that still reports none at a step


def test_the_finetune_command_shows_the_option_with_its_default(capsys: pytest.CaptureFixture[str]) -> None:
    from skillnet.finetune import cli

    with pytest.raises(SystemExit):
        cli.build_parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--task-grad-norm {off,ema} per-task gradient normalisation" in text
    assert "(default: the config's train.task_grad_norm, else off)" in text


DS_RUN = """
import json, sys
from skillnet.training import DsConfigError, TrainConfig, Trainer
from tests.test_task_grad_norm import SharedModel, TwoTaskSource, _steps, scaled_b

out, zero2, zero0, no_norm = sys.argv[1:5]
common = dict(max_steps=9, lr=1e-3, progress=False, tensorboard=False, skill_drift=False, task_grad_norm="ema")
t = Trainer(SharedModel(), TwoTaskSource(), TrainConfig(output_dir=out + "/z2", ds_config=zero2, **common),
            loss_fn=scaled_b)
rows = _steps(t, 9)


def refusal(name, ds):
    try:
        Trainer(SharedModel(), TwoTaskSource(), TrainConfig(output_dir=out + "/" + name, ds_config=ds, **common))
        return None
    except DsConfigError as e:
        return str(e)


print("RESULT " + json.dumps({"rows": rows, "zero": t.zero_stage, "refused": refusal("z0", zero0),
                              "refused_no_norm": refusal("no_norm", no_norm)}))
"""


def test_deepspeed_reads_the_engines_norm_and_refuses_an_engine_without_one(tmp_path: Path) -> None:
    """One rank of ZeRO-2 (CPU fp32, its own process: DeepSpeed initialises torch.distributed) takes the factors
    and norms the plain path takes, from engine.get_global_grad_norm(); fp32 without ZeRO keeps no norm, nor does
    ZeRO with compute_grad_norm false: both are refused at start (building the Trainer), in one line."""
    import subprocess
    import sys

    from tests.fixtures.pretrain.helpers import REPO, subprocess_env

    base = json.loads((REPO / "ds_configs" / "cpu_fp32.json").read_text())
    zero2, zero0, no_norm = tmp_path / "zero2.json", tmp_path / "zero0.json", tmp_path / "no_norm.json"
    zero2.write_text(json.dumps(base))
    zero0.write_text(json.dumps({**base, "zero_optimization": {"stage": 0}}))
    # DeepSpeed takes compute_grad_norm false only without clipping
    no_norm.write_text(json.dumps({**base, "gradient_clipping": 0.0,
                                   "zero_optimization": {**base["zero_optimization"], "compute_grad_norm": False}}))
    env = {k: v for k, v in subprocess_env().items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}
    r = subprocess.run([sys.executable, "-c", DS_RUN, str(tmp_path), str(zero2), str(zero0), str(no_norm)], cwd=REPO,
                       env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(next(x for x in r.stdout.splitlines() if x.startswith("RESULT "))[7:])
    assert got["zero"] == 2
    plain = _steps(_trainer(tmp_path / "plain", task_grad_norm="ema", max_steps=9), 9)
    assert [x["task"] for x in got["rows"]] == [x["task"] for x in plain]
    for key in ("grad_scale", "grad_norm"):
        assert [x[key] for x in got["rows"]] == pytest.approx([x[key] for x in plain], rel=1e-5), key
    assert any(abs(x["grad_scale"] - 1) > 0.5 for x in got["rows"])
    assert "keeps no global gradient norm (fp32 without ZeRO)" in (got["refused"] or "")
    assert "computes no global gradient norm (zero_optimization.compute_grad_norm false)" in (
        got["refused_no_norm"] or "")


def test_the_loss_scale_study_runs_the_ema_arm_beside_a_reduction(tmp_path: Path) -> None:
    """`--arms token_mean token_mean+ema`: one compare each, the second with train.task_grad_norm ema (its runs
    log every task's grad_scale, which leaves 1 once the tasks are measured), the first as before (no key in its
    config, no grad_scale logged); the table names both arms and their paired difference."""
    from skillnet.experiments import loss_scale

    from tests.test_finetune_e2e import tiny_config

    d = tiny_config(tmp_path / "unused")
    d["train"].update(max_steps=6, eval_every=6, log_every=1)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(d), encoding="utf-8")
    out = tmp_path / "study"
    assert loss_scale.main(["--config", str(cfg), "--arms", "token_mean", "token_mean+ema", "--methods", "dense_joint",
                            "--seeds", "0", "--out", str(out), "--threads", "1"]) == 0
    for arm, norm in (("token_mean", None), ("token_mean+ema", "ema")):
        ran = json.loads((out / "configs" / f"{arm}.json").read_text())
        assert next(t for t in ran["tasks"] if t["name"] == "ner")["head"] == {"loss_reduction": "token_mean"}
        assert ran["train"].get("task_grad_norm") == norm
        log = [json.loads(x) for x in (out / arm / "dense_joint" / "seed0" / "log.jsonl").read_text().splitlines()]
        scales = [v for r in log for k, v in r.items() if k.endswith("/grad_scale")]
        if norm is None:
            assert scales == []
        else:
            assert {k.split("/")[0] for r in log for k in r if k.endswith("/grad_scale")} == {"sentiment", "ner",
                                                                                             "qa_match"}
            # by the definition, whatever order the sampler draws the tasks in: a step's factor is 1 exactly when
            # it is its task's first step or fewer than two tasks were measured before it (log_every 1: one
            # step, one task per row)
            steps = [(k.split("/")[0], v) for r in log for k, v in r.items() if k.endswith("/grad_scale")]
            assert len(steps) == len([r for r in log if any(k.endswith("/grad_scale") for k in r)]) == 6
            seen: set[str] = set()
            for task, v in steps:
                if task not in seen or len(seen) < 2:
                    assert v == 1.0, steps
                else:
                    assert abs(v - 1) > 1e-3, steps
                seen.add(task)
            assert any(v != 1.0 for _, v in steps), steps
    assert "`token_mean+ema` minus `token_mean`" in (out / "loss_scale.md").read_text()
    res = json.loads((out / "loss_scale.json").read_text())
    assert set(res["scores"]["dense_joint"]) == {"token_mean", "token_mean+ema"}


def test_the_study_names_each_configs_arm_and_refuses_ema_with_accumulation(tmp_path: Path,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    from skillnet.experiments import loss_scale

    assert loss_scale.ARMS == ["token_mean", "sentence_mean", "token_mean+ema", "sentence_mean+ema"]
    cfg = {"tasks": [{"name": "ner", "type": "ner"}], "train": {"task_grad_norm": "ema", "lr": 1e-3}}
    assert loss_scale.config_arm(cfg) == "sentence_mean+ema"  # the default reduction; a Table 3 run with ema is reused for that arm only
    plain = loss_scale.with_arm(cfg, "sentence_mean")
    assert plain["train"] == {"lr": 1e-3} and loss_scale.config_arm(plain) == "sentence_mean"
    assert loss_scale.config_arm(loss_scale.with_arm(plain, "sentence_mean+ema")) == "sentence_mean+ema"
    path = tmp_path / "cfg.json"
    ner = {"name": "ner", "type": "ner", "train": "t.jsonl", "skills": ["s2", "s7"]}
    # accumulation given, or implied by batch_size over micro_batch_size: refused before any arm runs
    for train, accum in (({"grad_accum": 2}, 2), ({"batch_size": 16, "micro_batch_size": 8}, 2)):
        path.write_text(json.dumps({"tasks": [ner], "train": train}))
        with pytest.raises(SystemExit):
            loss_scale.main(["--config", str(path), "--arms", "token_mean", "token_mean+ema", "--out",
                             str(tmp_path / "o")])
        err = capsys.readouterr().err
        assert "arm token_mean+ema: " in err and f"task_grad_norm ema needs grad_accum 1 (a step's gradient norm " \
               f"is then one task's), got {accum}" in err, err
        assert not (tmp_path / "o" / "token_mean").exists()


def test_a_finetune_run_from_before_the_option_is_still_this_configurations_run(tmp_path: Path) -> None:
    """The run folder's identity leaves task_grad_norm out while it is off, so an unfinished run written before
    the option existed resumes; a run with ema is another configuration."""
    from skillnet.common.outputs import MARKER, OutputError
    from skillnet.finetune.cli import claim_run_dir
    from skillnet.finetune.config import FinetuneConfig

    from tests.test_finetune_e2e import tiny_config

    out = tmp_path / "run"
    cfg = FinetuneConfig.from_dict(tiny_config(out))
    assert claim_run_dir(cfg, None, False) is None  # new folder, marked
    marker = json.loads((out / MARKER).read_text())
    assert "task_grad_norm" not in marker["identity"]["train"]  # what a run from before the option recorded
    (out / "checkpoints").mkdir()
    assert claim_run_dir(cfg, None, False) == "auto"
    ema = FinetuneConfig.from_dict(tiny_config(out, train={**tiny_config(out)["train"], "task_grad_norm": "ema"}))
    with pytest.raises(OutputError, match=r"other settings \(train\)"):
        claim_run_dir(ema, None, False)
