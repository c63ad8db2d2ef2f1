"""Where a training step spends its time: torch.profiler over a window of steps of a real run.

``TrainConfig.profile_steps = [first, last]`` (``--profile-steps 20:25`` on the command lines) records
steps first..last on every rank and writes, per rank, ``<output_dir>/profile/``:

- ``trace_rank{r}.json``: a Chrome/Perfetto trace (open it in https://ui.perfetto.dev);
- ``summary_rank{r}.txt``: the window's wall time per step, the device's busy time per step (the sum of
  its kernels' times: a busy share far below 1 means the device waits for the host), and the operators
  ranked by device time and by host time.

The window's first step should come after the warm-up (allocator, autotuning, compile), e.g. 20:25.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

__all__ = ["StepProfiler"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class StepProfiler:
    """Records the steps ``first..last`` (1-based optimizer steps); the trainer calls ``before(step)`` and
    ``after(step)`` around each step. A no-op outside the window."""

    def __init__(self, steps: list[int], out_dir: str | Path, rank: int, device: torch.device) -> None:
        self.first, self.last = steps
        self.out_dir, self.rank, self.device = Path(out_dir), rank, device
        self._prof: Any = None
        self._t0 = 0.0
        self.done = False

    def before(self, step: int) -> None:
        if step != self.first or self.done:
            return
        acts = [torch.profiler.ProfilerActivity.CPU]
        if self.device.type == "cuda":
            acts.append(torch.profiler.ProfilerActivity.CUDA)
        _sync(self.device)  # the window starts with an idle device: earlier steps' kernels are not counted
        self._prof = torch.profiler.profile(activities=acts)
        self._prof.__enter__()
        self._t0 = time.perf_counter()

    def after(self, step: int) -> None:
        if self._prof is None or step != self.last:
            return
        _sync(self.device)
        wall = time.perf_counter() - self._t0
        prof, self._prof = self._prof, None
        prof.__exit__(None, None, None)
        self.done = True
        self.out_dir.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(self.out_dir / f"trace_rank{self.rank}.json"))
        (self.out_dir / f"summary_rank{self.rank}.txt").write_text(self.summary(prof, wall), encoding="utf-8")

    def summary(self, prof: Any, wall: float) -> str:
        n = self.last - self.first + 1
        events = prof.key_averages()
        on_device = self.device.type == "cuda"
        lines = [f"steps {self.first}..{self.last} on rank {self.rank}: {1e3 * wall / n:.2f} ms wall per step"]
        if on_device:
            # Kernels only: an operator's device time is its kernels' time again, so counting both doubles it.
            from torch.autograd import DeviceType  # noqa: PLC0415

            busy = sum(e.self_device_time_total for e in events if e.device_type == DeviceType.CUDA) / 1e6
            lines.append(
                f"device busy {1e3 * busy / n:.2f} ms per step = {busy / wall:.1%} of the wall time "
                "(far below 100%: the device waits for the host or a read-back)"
            )
            lines += ["", "by device time:", events.table(sort_by="self_device_time_total", row_limit=30)]
        lines += ["", "by host time:", events.table(sort_by="self_cpu_time_total", row_limit=30)]
        return "\n".join(lines) + "\n"
