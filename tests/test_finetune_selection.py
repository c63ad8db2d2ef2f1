"""Checkpoint selection on dev (finetune/evaluation.py DevEvaluator): best mean or per-task score, the
generation distinct floor, NaN scores, and resuming a state saved before the floor existed."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from skillnet.finetune.config import TrainConfig
from skillnet.finetune.evaluation import DevEvaluator


class _Task:
    """A task whose dev scores at each evaluation come from a script."""

    def __init__(self, metric: str, script: list[dict[str, float]]) -> None:
        self.cfg = SimpleNamespace(metric=metric)
        self.records = {"dev": [None]}
        self.script = iter(script)

    def predict_split(self, model, split, bs):  # noqa: ANN001, ANN201
        return None

    def score(self, split, preds):  # noqa: ANN001, ANN201
        return next(self.script)


def _evaluate(scripts: dict[str, list[dict[str, float]]], **train: object) -> DevEvaluator:
    cfg = SimpleNamespace(train=TrainConfig(**train))
    source = SimpleNamespace(target_mix=dict, realised_mix=dict)
    data = {n: _Task("rouge_l" if "distinct" in s[0] else "accuracy", s) for n, s in scripts.items()}
    ev = DevEvaluator(cfg, data, source, out=None, vocab=None, is_main=False)  # type: ignore[arg-type]
    for step in range(1, len(next(iter(scripts.values()))) + 1):
        ev(torch.nn.Linear(1, 1), step * 100)
    return ev


GEN = [{"rouge_l": 30.0, "distinct": 20.0}, {"rouge_l": 25.0, "distinct": 95.0}, {"rouge_l": 28.0, "distinct": 60.0}]
CLS = [{"accuracy": 50.0}, {"accuracy": 50.0}, {"accuracy": 50.0}]


def test_without_a_floor_the_best_mean_wins():
    ev = _evaluate({"gen": GEN, "cls": CLS})
    assert ev.best_mean_step == 100 and ev.best_mean == pytest.approx(40.0)


def test_a_degenerate_checkpoint_loses_to_one_that_passes_the_floor():
    """Step 100 has the best score but gives one text for most inputs (20% distinct): with a 90% floor the
    step-200 checkpoint is chosen although its score is lower, and the later 60% one does not replace it."""
    ev = _evaluate({"gen": GEN, "cls": CLS}, select_min_distinct=90.0)
    assert ev.best_mean_step == 200 and ev.best_mean_ok
    ev = _evaluate({"gen": GEN, "cls": CLS}, select_min_distinct=90.0, selection="per_task")
    assert ev.best_step == {"gen": 200, "cls": 100}


def test_when_no_checkpoint_passes_the_floor_the_best_score_is_kept():
    ev = _evaluate({"gen": GEN}, select_min_distinct=99.0)
    assert ev.best_mean_step == 100 and not ev.best_mean_ok


def test_a_nan_score_never_wins():
    nan = [{"accuracy": math.nan}, {"accuracy": 40.0}, {"accuracy": math.nan}]
    assert _evaluate({"cls": nan}).best_mean_step == 200
    assert _evaluate({"cls": nan}, selection="per_task").best_step == {"cls": 200}


def test_a_state_from_before_the_floor_resumes_as_passing():
    ev = _evaluate({"cls": CLS[:1]})
    old = {k: v for k, v in ev.state_dict().items() if k not in ("best_ok", "best_mean_ok")}
    fresh = _evaluate({"cls": [{"accuracy": 0.0}]})
    fresh.load_state_dict(old)
    assert fresh.best_mean_ok and fresh.best_ok == {"cls": True}


def test_the_floor_is_a_percent():
    with pytest.raises(ValueError, match="select_min_distinct"):
        TrainConfig(select_min_distinct=120.0)
