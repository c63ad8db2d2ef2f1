"""Every place the trainer reaches into DeepSpeed's internals, in one file (the lock of torch's JIT op builds,
which DeepSpeed's ops take, is training/op_build.py's).

Each patch below relies on private attributes or on the exact behaviour of one DeepSpeed release series and
names it (`Patch.written_for`). Where the installed DeepSpeed is another series, a patch that only saves time
is not applied (DeepSpeed's own code runs) and says so once on stderr; a patch that keeps training correct
refuses to run instead, since without it a run would silently be wrong. tests/test_deepspeed_patches.py
holds one test per patch that fails when DeepSpeed's behaviour under it changes; re-check each patch
against the new release before widening `written_for` (and pyproject's deepspeed pin with it).

* `clear_stale_gradients` (correctness): ZeRO-3's flat gradient buffer, and ZeRO-1/2's offloaded fp32
  gradient partition, keep the last gradient of a parameter the step did not reach.
* `device_overflow_guard` + `nonfinite_norm` (speed, bf16 on a GPU): DeepSpeed's per-tensor overflow check
  replaced by the optimizer's device-side skip of a non-finite step.
* `sync_free_clip`, `foreach_grad_norm` (speed, under that guard): ZeRO's clipping without a host read-back,
  and its gradient norm in one foreach kernel.
* `run_runner_with_node_launcher` + `run_node_launcher_waiting` (a stop's save, refused on another series):
  DeepSpeed's launcher that waits for the ranks' save on TERM/INT instead of killing them 30 s later
  (training/ds_launch.py is its command).
* `safe_checkpoint_loads` (refused on another series: loading would run code): DeepSpeed's checkpoint reads,
  which ask `torch.load` for full pickle, go through common/safe_load.py's weights-only rule.
"""

from __future__ import annotations

import contextlib
import math
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

__all__ = [
    "PATCHES",
    "Patch",
    "UnsupportedDeepSpeed",
    "clear_stale_gradients",
    "deepspeed_series",
    "device_overflow_guard",
    "foreach_grad_norm",
    "installed_series",
    "nonfinite_norm",
    "run_node_launcher_waiting",
    "run_runner_with_node_launcher",
    "safe_checkpoint_loads",
    "sync_free_clip",
]


class UnsupportedDeepSpeed(RuntimeError):
    """A correctness patch meets a DeepSpeed series it was not written for."""


@dataclass(frozen=True)
class Patch:
    name: str
    written_for: tuple[int, int]  # the (major, minor) series of `package` whose internals it was written against
    correctness: bool  # True: a run is wrong without it (refuse); False: it saves time (skip)
    package: str = "deepspeed"


STALE_GRADIENTS = Patch("clear_stale_gradients", (0, 19), correctness=True)
OVERFLOW_GUARD = Patch("device_overflow_guard", (0, 19), correctness=False)
SYNC_FREE_CLIP = Patch("sync_free_clip", (0, 19), correctness=False)
FOREACH_GRAD_NORM = Patch("foreach_grad_norm", (0, 19), correctness=False)
# Refused rather than skipped: DeepSpeed's own launcher would cut a stop's save at 30 s again, and a batch job
# requeued from its previous checkpoint says nothing of it.
LAUNCHER_WAITS = Patch("launcher_waits_for_ranks", (0, 19), correctness=True)
# Refused rather than skipped: another series may read its files some other way, and a planted pickle would run.
SAFE_LOADS = Patch("safe_checkpoint_loads", (0, 19), correctness=True)
PATCHES = (STALE_GRADIENTS, OVERFLOW_GUARD, SYNC_FREE_CLIP, FOREACH_GRAD_NORM, LAUNCHER_WAITS, SAFE_LOADS)

_warned: set[str] = set()


def deepspeed_series() -> tuple[int, int]:
    """The installed DeepSpeed's (major, minor)."""
    import deepspeed  # noqa: PLC0415

    major, minor = deepspeed.__version__.split(".")[:2]
    return int(major), int(minor)


def installed_series(package: str) -> tuple[int, int]:
    """The installed (major, minor) of `package` ("deepspeed" or "torch")."""
    if package == "deepspeed":
        return deepspeed_series()
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def _applies(patch: Patch) -> bool:
    """Whether `patch` may run on the installed package (see the module docstring for what happens if not)."""
    series = installed_series(patch.package)
    if series == patch.written_for:
        return True
    want, have = ".".join(map(str, patch.written_for)), ".".join(map(str, series))
    pkg = {"deepspeed": "DeepSpeed"}.get(patch.package, patch.package)
    if patch.correctness:
        raise UnsupportedDeepSpeed(
            f"training/deepspeed_patches.py {patch.name} was written for {pkg} {want}.x, installed is {have}: "
            f"re-check it against {have} (tests/test_deepspeed_patches.py) or install {patch.package} {want}.x")
    if patch.name not in _warned:
        _warned.add(patch.name)
        print(f"note: {pkg} {have} is not {want}.x, which {patch.name} was written for: "
              f"{pkg}'s own code runs there instead", file=sys.stderr)
    return False


def clear_stale_gradients(zero_optimizer: Any, zero_stage: int) -> None:
    """Zero the gradient buffers DeepSpeed does not clear between steps, before a step's backward passes.

    DeepSpeed 0.19's ZeRO-3 keeps every parameter's reduced gradient in one flat buffer and overwrites only
    the entries of parameters that get a gradient: without this, a skill this step does not use would be
    stepped again with the gradient of its last step (MaskedAdamW skips exact zeros). The same holds for
    ZeRO-1/2 with offload_optimizer: the fp32 gradient partition is a host buffer that keeps the last
    gradient of a parameter this step does not reach (found by bench/real_size.py)."""
    if zero_stage == 3:
        if _applies(STALE_GRADIENTS):
            zero_optimizer.grad_partitions_flat_buffer.zero_()
    elif zero_stage in (1, 2) and getattr(zero_optimizer, "cpu_offload", False) and _applies(STALE_GRADIENTS):
        for master in zero_optimizer.single_partition_of_fp32_groups:
            if master.grad is not None:
                master.grad.zero_()


def device_overflow_guard(ds_config: dict[str, Any], optimizer: Any) -> bool:
    """bf16 on a GPU: replace DeepSpeed's overflow check by the optimizer's device-side one (`ds_config` is
    edited; call before ``deepspeed.initialize``). True when the guard is on: the caller then points the
    optimizer's ``found_inf_fn`` at `nonfinite_norm` and applies `sync_free_clip` and `foreach_grad_norm`.

    DeepSpeed 0.19 checks every gradient tensor for inf/NaN before a bf16 step (``check_grad_overflow``,
    on by default): five small kernels per tensor and a host read-back, ~80 ms of a BERT-base step on an
    H100. The sync-free MaskedAdamW skips a step whose gradient norm is not finite on the device instead
    (weights and moments untouched, as DeepSpeed's check would leave them; the step count goes on). Only
    where that path runs (CUDA) and the JSON does not set ``bf16.check_grad_overflow`` itself."""
    bf16 = ds_config.get("bf16") or ds_config.get("bfloat16") or {}
    if not (bf16.get("enabled") and torch.cuda.is_available() and optimizer.sync_free(torch.device("cuda"))):
        return False
    offload = ((ds_config.get("zero_optimization") or {}).get("offload_optimizer") or {}).get("device", "none")
    if offload not in ("none", None):  # the optimizer steps CPU partitions: the count path, no device flag
        return False
    if "check_grad_overflow" in bf16 or not _applies(OVERFLOW_GUARD):
        return False
    bf16["check_grad_overflow"] = False
    return True


def nonfinite_norm(zero_optimizer: Any) -> torch.Tensor | None:
    """1.0 where DeepSpeed's global gradient norm of this step is inf/NaN (it reports those as -1), on the
    device; None if it keeps no norm. The guard's flag (`device_overflow_guard` checked the version)."""
    norm = getattr(zero_optimizer, "_global_grad_norm", None)
    if not isinstance(norm, torch.Tensor):
        return None
    return ((norm < 0) | ~torch.isfinite(norm)).float().reshape(())


def sync_free_clip(zero_optimizer: Any) -> None:
    """Gradient clipping under the device guard without a host read-back.

    DeepSpeed 0.19's ZeRO ``unscale_and_clip_grads`` asks ``bool(norm is invalid)`` on the host before it
    clips: one wait for the device per step, after which the GPU idles while the host issues the optimizer
    and the next forward. Here an invalid norm becomes inf on the device instead (DeepSpeed's own
    replacement), giving the same scale; the guard's found_inf then skips that step in the optimizer."""
    if not callable(getattr(zero_optimizer, "unscale_and_clip_grads", None)) or not _applies(SYNC_FREE_CLIP):
        return
    original = zero_optimizer.unscale_and_clip_grads

    def unscale_and_clip_grads(grad_groups_flat: list[Any], total_norm: Any) -> None:
        opt = zero_optimizer
        if not isinstance(total_norm, torch.Tensor) or opt.clip_grad <= 0.0:
            return original(grad_groups_flat, total_norm)
        bad = ~torch.isfinite(total_norm) | (total_norm < 0)
        norm = torch.where(bad, torch.full_like(total_norm, math.inf), total_norm)
        clip = torch.clamp(((norm / opt.loss_scale) + 1e-6) / opt.clip_grad, min=1.0)
        inv = 1.0 / (clip * opt.loss_scale)
        for grad in grad_groups_flat:
            for g in grad if isinstance(grad, list) else [grad]:
                g.data.mul_(inv)
        return None

    zero_optimizer.unscale_and_clip_grads = unscale_and_clip_grads


def foreach_grad_norm(zero_optimizer: Any) -> None:
    """ZeRO's global gradient norm in one foreach kernel instead of one norm per tensor.

    DeepSpeed 0.19's ``get_grad_norm_direct`` launches a norm (and a cast) for every gradient of the
    partition: a SkillNet-BERT-base step has ~500 of them, unused skills' zero-filled ones included, which
    keeps the host busier than the device. Same selection, same sum of squares, same all-reduces and the
    same -1 for inf/NaN; falls back to DeepSpeed's method where model or pipeline parallelism is on."""
    original = getattr(zero_optimizer, "get_grad_norm_direct", None)
    if not callable(original) or not _applies(FOREACH_GRAD_NORM):
        return
    from deepspeed import comm as dist  # noqa: PLC0415
    from deepspeed.runtime.utils import mask_nan_or_inf_with_val_inplace  # noqa: PLC0415
    from deepspeed.runtime.zero.utils import get_norm_dtype  # noqa: PLC0415

    def get_grad_norm_direct(gradients: list[torch.Tensor], params: list[Any], norm_type: float = 2) -> Any:
        opt = zero_optimizer
        if float(norm_type) != 2.0 or getattr(opt, "model_parallel_rank", 0) != 0 or any(
                getattr(p, "ds_pipe_replicated", False) for p in params):
            return original(gradients, params, norm_type)
        grads = [g for g in gradients if not getattr(g, "_zero_padding", False)][: len(params)]
        dtype = get_norm_dtype()
        if grads:
            norms = torch._foreach_norm([g.detach() for g in grads], 2, dtype=dtype)
            total = torch.stack(norms).pow(2).sum().float()
        else:
            total = torch.tensor(0.0, dtype=torch.float32, device=opt.device)
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=opt.dp_process_group)
        opt._model_parallel_all_reduce(tensor=total, op=dist.ReduceOp.SUM)
        total = total.pow(0.5)
        mask_nan_or_inf_with_val_inplace(total, device=opt.device)
        return total

    zero_optimizer.get_grad_norm_direct = get_grad_norm_direct


def safe_checkpoint_loads() -> contextlib.AbstractContextManager[None]:
    """A block in which DeepSpeed's checkpoint reads (its checkpoint engine's, the universal conversion's and
    load's, zero_to_fp32's) load weights only, as the project's own do. DeepSpeed 0.19 calls ``torch.load(...,
    weights_only=False)`` through the module's attribute at each of them, which `guard_torch_load` replaces."""
    from skillnet.common.safe_load import guard_torch_load  # noqa: PLC0415

    _applies(SAFE_LOADS)
    return guard_torch_load()


def run_node_launcher_waiting(argv: list[str], grace: float,
                              on_rank_failure: Callable[[list[Any]], Any] | None = None) -> None:
    """``python -m deepspeed.launcher.launch argv``, whose TERM/INT waits up to `grace` s for the ranks.

    DeepSpeed 0.19's per-node launcher forwards a stop signal to the ranks and SIGKILLs them 30 s later
    (``terminate_process_tree``), which cuts a longer checkpoint save. Under a scheduler that signals every
    process of a step the ranks got the signal themselves: here they are waited for and killed only past
    `grace`. A rank that fails on its own (no signal) still takes the others down DeepSpeed's way. Exits 0
    where DeepSpeed exits 1 after a signal although every rank returned 0. `on_rank_failure` gets the ranks'
    processes (``subprocess.Popen``, their environment as ``skillnet_env``) once, when one failed on its own."""
    _applies(LAUNCHER_WAITS)
    import psutil  # noqa: PLC0415  (DeepSpeed's own dependency)
    from deepspeed.launcher import launch  # noqa: PLC0415

    signalled: list[int] = []  # a stop signal that reached launch.main's handler (not a rank failure)
    original = launch.terminate_process_tree
    spawned: list[Any] = []  # the ranks, as launch.main starts them (it names only its last command on failure)
    real_popen = subprocess.Popen

    class Popen(real_popen):  # type: ignore[misc, valid-type]
        def __init__(self, cmd: Any, *a: Any, **kw: Any) -> None:
            super().__init__(cmd, *a, **kw)
            self.skillnet_env = kw.get("env")
            spawned.append(self)

    def terminate_process_tree(pid: int) -> None:
        if not signalled:  # a rank failed: DeepSpeed's way (TERM the rest, kill them 30 s later)
            if on_rank_failure is not None and spawned:
                on_rank_failure(list(spawned))
                spawned.clear()  # named once, before the first of the others is stopped
            original(pid)
            return
        # a stop signal: every rank got it as well; wait for them to save and exit, kill only past the grace
        proc = psutil.Process(pid)
        procs = [*proc.children(recursive=True), proc]
        _, alive = psutil.wait_procs(procs, timeout=grace)
        for p in alive:
            p.kill()

    real_signal = signal.signal

    def install(signum: int, handler: Any) -> Any:
        # launch.main calls its handler directly after a rank failure: only the signal's path is marked.
        if signum in (signal.SIGTERM, signal.SIGINT) and callable(handler):
            inner = handler

            def handler(s: int, frame: Any) -> None:
                signalled.append(s)
                inner(s, frame)

        return real_signal(signum, handler)

    launch.terminate_process_tree = terminate_process_tree
    launch.subprocess.Popen = Popen  # type: ignore[misc]
    signal.signal = install  # type: ignore[assignment]  # launch.main installs its handlers through this
    sys.argv = [launch.__file__, *argv]
    try:
        launch.main()
    except SystemExit as e:
        # launch.main exits 1 after a signal whatever its ranks returned; a clean stop (every rank 0) is 0
        if signalled and e.code == 1:
            raise SystemExit(0) from None
        raise
    finally:
        signal.signal = real_signal
        launch.terminate_process_tree = original
        launch.subprocess.Popen = real_popen  # type: ignore[misc]


def run_runner_with_node_launcher(argv: list[str], node_module: list[str]) -> None:
    """The ``deepspeed argv`` command, starting ``python -m *node_module <launch arguments>`` on this node in
    place of ``-m deepspeed.launcher.launch``, and outliving TERM/INT until that launcher exits.

    DeepSpeed 0.19's runner installs no signal handler without pdsh (``--no_ssh`` or one node), so a stop
    signal ends it at once (exit 143) while its ranks still save: a scheduler then sees the task gone. The
    node launcher (`run_node_launcher_waiting`) handles the signal; the runner only waits for it."""
    _applies(LAUNCHER_WAITS)
    from deepspeed.launcher import runner  # noqa: PLC0415

    real_popen = subprocess.Popen

    class Popen(real_popen):  # type: ignore[misc, valid-type]
        def __init__(self, cmd: Any, *a: Any, **kw: Any) -> None:
            if isinstance(cmd, list) and "deepspeed.launcher.launch" in cmd:
                i = cmd.index("deepspeed.launcher.launch")
                cmd = [*cmd[:i], *node_module, *cmd[i + 1:]]
            super().__init__(cmd, *a, **kw)

    runner.subprocess.Popen = Popen  # type: ignore[misc]
    # the node launcher handles the signal (it waits for the ranks); the runner only waits for it
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: None)
    sys.argv = ["deepspeed", *argv]
    try:
        runner.main()
    finally:
        runner.subprocess.Popen = real_popen  # type: ignore[misc]
