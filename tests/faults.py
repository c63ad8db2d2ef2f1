"""Fault injection for the stop-path tests: a SIGTERM at a chosen optimizer step, from the test side only.

    Trainer(model, source, cfg, callbacks=[SigtermAt(6)]).train()      # stops and checkpoints at step 6
    with every_trainer_gets(SigtermAt(12)):                           # a Trainer built inside a command
        run.main(argv)

Commands started as processes (the `deepspeed` launcher, warm ranks, scripts/measure_save_time.sh) run
tests/fixtures/pretrain/sigterm_run.py, which wraps `pretrain/run.py` the same way.
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
from collections.abc import Iterator
from typing import Any

from skillnet.training import Trainer, TrainerCallback
from skillnet.training.callbacks import TrainerState

__all__ = ["SigtermAt", "every_trainer_gets"]


class SigtermAt(TrainerCallback):
    """SIGTERM during optimizer step ``step``: every rank signals itself, or with ``group`` rank 0 signals its
    whole process group (the launcher included), as Slurm's scancel or time limit does.

    It fires from ``on_gradients``, the one hook inside a step, i.e. before that step's optimizer update rather
    than after it. The trainer's handler only sets a flag that the step's closing all-reduce reads, so the run
    still completes step ``step``, logs it and saves ``step_<step>`` as a real signal there would make it.
    """

    def __init__(self, step: int, group: bool = False) -> None:
        self.step = step
        self.group = group

    def on_train_start(self, trainer: TrainerState) -> None:
        # on_gradients only runs in a run that logs: without this the signal would silently never come.
        if trainer.cfg.log_every <= 0:
            raise ValueError("SigtermAt needs log_every > 0: on_gradients is not called otherwise")

    def on_gradients(self, trainer: TrainerState) -> dict[str, float]:
        # global_step still counts the finished steps here: the step being computed is the next one.
        if trainer.global_step + 1 == self.step:
            if not self.group:
                signal.raise_signal(signal.SIGTERM)
            elif trainer.is_main:
                os.killpg(os.getpgrp(), signal.SIGTERM)
        return {}


@contextlib.contextmanager
def every_trainer_gets(callback: TrainerCallback) -> Iterator[None]:
    """Within the block every Trainer built (e.g. by ``skillnet.pretrain.run.main``) gets ``callback`` after its
    own callbacks, so a command is faulted without a flag of its own."""
    init = Trainer.__init__

    @functools.wraps(init)
    def with_callback(self: Trainer, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        self.callbacks.append(callback)

    Trainer.__init__ = with_callback  # type: ignore[method-assign]
    try:
        yield
    finally:
        Trainer.__init__ = init  # type: ignore[method-assign]
