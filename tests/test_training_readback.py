"""A training step reads nothing back from the device: on a GPU every read-back (``.item()``, ``.tolist()``,
``bool(tensor)``, ``.cpu()``, ``float(tensor)``) waits for all the kernels queued before it, so the host
can no longer run ahead of the GPU. On a CPU nothing waits, so the test counts the calls themselves, with
the optimizer on its GPU path (``optim_impl="device"``): none in a step that does not log, one per logging
step (the window's sums, the gradient norm and the per-skill statistics together)."""

from __future__ import annotations

import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining, skill_parameters
from skillnet.pretrain.objectives import ObjectiveSampler, PretrainBatchSource
from skillnet.pretrain.synthetic import SyntheticPretrainingDataset
from skillnet.training import SkillStatistics, TrainConfig, Trainer

READS = ("item", "tolist", "__bool__", "cpu", "__float__", "__int__")


def _count_reads(monkeypatch: pytest.MonkeyPatch, trainer: Trainer) -> Counter:
    """Patch the read-back methods of torch.Tensor; count calls per (phase, step), phase 'step' inside
    train_step and 'log' inside the logging of a window."""
    counts: Counter = Counter()
    where: dict[tuple[str, int], list[str]] = {}
    phase: list[tuple[str, int]] = []

    for name in READS:
        orig = getattr(torch.Tensor, name)

        def patched(self: torch.Tensor, *a: Any, _orig: Any = orig, _name: str = name, **kw: Any) -> Any:
            if phase and not getattr(patched, "busy", False):
                counts[phase[-1]] += 1
                where.setdefault(phase[-1], []).append(f"{_name}: {traceback.format_stack(limit=4)[0].strip()}")
            return _orig(self, *a, **kw)

        monkeypatch.setattr(torch.Tensor, name, patched)

    def wrap(method: str, label: str, step_of: Any) -> None:
        orig = getattr(trainer, method)

        def run(*a: Any, **kw: Any) -> Any:
            phase.append((label, step_of()))
            try:
                return orig(*a, **kw)
            finally:
                phase.pop()

        monkeypatch.setattr(trainer, method, run)

    wrap("train_step", "step", lambda: trainer.global_step + 1)
    wrap("_flush_window", "log", lambda: trainer.global_step)
    counts.where = where  # type: ignore[attr-defined]
    return counts


@pytest.mark.parametrize("accum", [1, 2])
def test_a_training_step_reads_nothing_back_and_a_logging_step_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, accum: int
) -> None:
    torch.manual_seed(0)
    ds = SyntheticPretrainingDataset(512, vocab_size=1000, max_seq_len=32)
    cfg = SkillNetBertConfig.preset("tiny", vocab_size=1000, max_position_embeddings=64)
    model = SkillNetBertForPreTraining(cfg)
    source = PretrainBatchSource(ds, ObjectiveSampler(seed=0), 4, accum)
    train = TrainConfig(output_dir=str(tmp_path), max_steps=8, log_every=4, micro_batch_size=4, grad_accum=accum,
                        progress=False, tensorboard=False, optim_impl="device", max_grad_norm=1.0)
    trainer = Trainer(model, source, train, callbacks=[SkillStatistics(skill_parameters(model))])
    counts = _count_reads(monkeypatch, trainer)
    trainer.train()
    objectives = {source.sampler.choice(s) for s in range(8)}
    assert objectives == {"mlm", "nsp"}  # both objectives' steps (NSP: zero rows in the word embeddings)
    steps = {s: counts[("step", s)] for s in range(1, 9)}
    assert steps == dict.fromkeys(range(1, 9), 0), counts.where  # type: ignore[attr-defined]
    assert counts[("log", 4)] == 1 and counts[("log", 8)] == 1, counts.where  # type: ignore[attr-defined]
    logged = [line for line in (tmp_path / "log.jsonl").read_text().splitlines() if '"train"' in line]
    assert len(logged) == 2 and "skill_grad_norm/s7" in logged[0] and "grad_norm" in logged[0]
