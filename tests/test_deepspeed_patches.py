"""training/deepspeed_patches.py: each patch of DeepSpeed internals against the DeepSpeed it was written for.

Every patch has a test here that fails when DeepSpeed's behaviour under it changes: the speed patches are
compared with DeepSpeed's own methods on the same inputs, and the patches that lean on private attributes or
config keys check that DeepSpeed still has them and still uses them as the patch assumes. The correctness
patch (`clear_stale_gradients`) is also exercised end to end by tests/test_optim_zero_stages.py
(``test_each_step_moves_exactly_the_skills_of_its_objective``: ZeRO-3 and ZeRO-2 offload, 2 ranks), which
fails without it. The launcher patches are exercised end to end by tests/test_ds_launch.py (a stop signal to
every process of the launch: the save completes before the launcher exits) and on a real Slurm by
tests/test_slurm_real.py.
"""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
import torch
from skillnet.training import deepspeed_patches as dsp
from torch import nn


def test_the_installed_deepspeed_is_the_series_every_patch_was_written_for() -> None:
    """A DeepSpeed (or torch) upgrade fails here first: re-check each patch (the tests below) before widening
    `written_for` and pyproject's pin. The op-build lock patch (training/op_build.py) is torch's."""
    from skillnet.training import op_build

    assert {(p.package, p.written_for) for p in dsp.PATCHES} == {
        (p.package, dsp.installed_series(p.package)) for p in dsp.PATCHES}
    assert dsp.installed_series("torch") == op_build.PATCH_WRITTEN_FOR


def test_torch_still_builds_ops_under_the_lock_the_op_build_patch_replaces() -> None:
    """training/op_build.py install_op_build_lock assumes torch 2.13's JIT build: DeepSpeed's OpBuilder.load goes through
    cpp_extension.load -> _jit_compile (module globals, so replacing them reaches it), which takes
    ``FileBaton(<build dir>/lock)``, builds when ``try_acquire`` succeeds and otherwise ``wait()``s and imports,
    and whose versioner builds only when a process first sees the op (``entries`` keyed by the op's name)."""
    from deepspeed.ops.op_builder.builder import OpBuilder
    from torch.utils import cpp_extension
    from torch.utils.file_baton import FileBaton

    assert "load" in OpBuilder.jit_load.__code__.co_names or "load" in inspect.getsource(OpBuilder.jit_load)
    load_src = inspect.getsource(cpp_extension.load)
    assert "_jit_compile(" in load_src
    jit = inspect.getsource(inspect.unwrap(cpp_extension._jit_compile))
    assert "FileBaton(os.path.join(build_directory, 'lock'))" in jit
    acquire = jit.index("baton.try_acquire()")
    assert acquire < jit.index("if version != old_version:", acquire) < jit.index("baton.wait()")
    assert "JIT_EXTENSION_VERSIONER.get_version(name)" in jit
    assert isinstance(cpp_extension.JIT_EXTENSION_VERSIONER.entries, dict)
    assert [*inspect.signature(FileBaton.__init__).parameters][:2] == ["self", "lock_file_path"]
    assert {"try_acquire", "wait", "release"} <= set(vars(FileBaton))


def test_another_series_skips_the_speed_patches_and_refuses_the_correctness_one(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    from skillnet.training.optim import MaskedAdamW

    monkeypatch.setattr(dsp, "deepspeed_series", lambda: (0, 99))
    monkeypatch.setattr(dsp, "_warned", set())
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    ds = {"bf16": {"enabled": True}}
    assert not dsp.device_overflow_guard(ds, MaskedAdamW([nn.Parameter(torch.ones(2))]))
    assert "check_grad_overflow" not in ds["bf16"]  # DeepSpeed's own check stays on
    own = SimpleNamespace(unscale_and_clip_grads=lambda *a: "deepspeed", get_grad_norm_direct=lambda *a: "deepspeed")
    dsp.sync_free_clip(own)
    dsp.foreach_grad_norm(own)
    assert own.unscale_and_clip_grads() == own.get_grad_norm_direct() == "deepspeed"
    assert "written for" in capsys.readouterr().err
    with pytest.raises(dsp.UnsupportedDeepSpeed, match="clear_stale_gradients.*0.19.*0.99"):
        dsp.clear_stale_gradients(SimpleNamespace(grad_partitions_flat_buffer=torch.ones(3)), 3)
    # a stage without the stale buffer needs no patch, whatever the series
    dsp.clear_stale_gradients(SimpleNamespace(cpu_offload=False), 2)
    with pytest.raises(dsp.UnsupportedDeepSpeed, match="launcher_waits_for_ranks.*0.19.*0.99"):
        dsp.run_runner_with_node_launcher(["script.py"], ["node"])
    with pytest.raises(dsp.UnsupportedDeepSpeed, match="launcher_waits_for_ranks.*0.19.*0.99"):
        dsp.run_node_launcher_waiting(["script.py"], 1.0)


def test_clear_stale_gradients_zeroes_the_buffers_deepspeed_keeps() -> None:
    """DeepSpeed 0.19 still keeps ZeRO-3's reduced gradients in one flat buffer (written per parameter that
    gets a gradient) and ZeRO-1/2 offload's fp32 partitions with a ``.grad`` of their own; the patch zeroes
    exactly those."""
    from types import SimpleNamespace

    from deepspeed.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    stage3 = inspect.getsource(DeepSpeedZeroOptimizer_Stage3)
    assert "self.grad_partitions_flat_buffer = " in stage3
    # the buffer is never zeroed by DeepSpeed itself between steps (else the patch is redundant: drop it)
    assert "grad_partitions_flat_buffer.zero_()" not in stage3
    stage12 = inspect.getsource(DeepSpeedZeroOptimizer)
    assert "self.cpu_offload = True" in stage12 and "self.single_partition_of_fp32_groups" in stage12
    flat = torch.ones(4)
    dsp.clear_stale_gradients(SimpleNamespace(grad_partitions_flat_buffer=flat), 3)
    assert not flat.any()
    masters = [torch.ones(2), torch.ones(2)]
    masters[0].grad = torch.ones(2)
    dsp.clear_stale_gradients(SimpleNamespace(cpu_offload=True, single_partition_of_fp32_groups=masters), 2)
    assert masters[0].grad is not None and not masters[0].grad.any() and masters[1].grad is None
    kept = torch.ones(2)
    kept.grad = torch.ones(2)
    dsp.clear_stale_gradients(SimpleNamespace(cpu_offload=False, single_partition_of_fp32_groups=[kept]), 2)
    assert kept.grad.all()  # no offload: DeepSpeed's own buffers are cleared by DeepSpeed


def test_deepspeed_still_reads_the_bf16_overflow_key_and_reports_a_bad_norm_as_the_guard_reads_it() -> None:
    """The guard turns off ``bf16.check_grad_overflow`` (on by default) and reads ``_global_grad_norm`` of
    the ZeRO optimizer's step: both as in DeepSpeed 0.19."""
    from deepspeed.runtime.engine import DeepSpeedEngine
    from deepspeed.runtime.precision_config import DeepSpeedBF16Config
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    assert DeepSpeedBF16Config().check_grad_overflow is True
    assert DeepSpeedBF16Config(check_grad_overflow=False).check_grad_overflow is False
    assert "bfloat16_config.check_grad_overflow" in inspect.getsource(DeepSpeedEngine)
    step = inspect.getsource(DeepSpeedZeroOptimizer.step)
    assert "self._global_grad_norm = " in step and "if self.check_grad_overflow" in step


def test_bf16_deepspeed_overflow_check_moves_to_the_device(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a GPU, DeepSpeed's per-tensor bf16 overflow check (a host read-back per step) is replaced by the
    optimizer's device-side skip of a non-finite step; an explicit JSON setting and CPU runs keep it."""
    from types import SimpleNamespace

    from skillnet.training.deepspeed_patches import device_overflow_guard, nonfinite_norm
    from skillnet.training.optim import MaskedAdamW

    opt = MaskedAdamW([nn.Parameter(torch.ones(2))])
    ds = {"bf16": {"enabled": True}}
    assert not device_overflow_guard(ds, opt) and "check_grad_overflow" not in ds["bf16"]  # no CUDA here
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert device_overflow_guard(ds, opt) and ds["bf16"]["check_grad_overflow"] is False
    explicit = {"bf16": {"enabled": True, "check_grad_overflow": True}}
    assert not device_overflow_guard(explicit, opt) and explicit["bf16"]["check_grad_overflow"] is True
    assert not device_overflow_guard({"fp16": {"enabled": True}}, opt)
    assert not device_overflow_guard({"bf16": {"enabled": True}}, MaskedAdamW([nn.Parameter(torch.ones(2))],
                                                                                impl="count"))
    # DeepSpeed reports an inf/NaN norm as -1
    for norm, flag in ((torch.tensor(3.0), 0.0), (torch.tensor(-1.0), 1.0), (torch.tensor(float("nan")), 1.0)):
        assert float(nonfinite_norm(SimpleNamespace(_global_grad_norm=norm))) == flag
    assert nonfinite_norm(SimpleNamespace()) is None
    # the optimizer applies the guard and counts the skip, with nothing read back
    p = nn.Parameter(torch.ones(3))
    guarded = MaskedAdamW([{"params": [p], "check_zeros": True}], impl="device")
    guarded.found_inf_fn = lambda: torch.ones(())
    p.grad = torch.ones(3)
    guarded.step()
    assert torch.equal(p.detach(), torch.ones(3))
    offload = {"bf16": {"enabled": True}, "zero_optimization": {"offload_optimizer": {"device": "cpu"}}}
    assert not device_overflow_guard(offload, opt)  # CPU partitions step on the count path


@pytest.mark.parametrize("norm", [0.5, 3.0, -1.0, float("inf"), float("nan")])
def test_sync_free_clip_scales_as_deepspeeds_and_reads_nothing_back(norm: float) -> None:
    """Under the device guard, ZeRO's clipping runs without DeepSpeed's host check of the norm: the same
    scale for a finite norm and for DeepSpeed's invalid ones (-1 sentinel, inf, NaN), and no read-back."""
    from types import SimpleNamespace

    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
    from skillnet.training.deepspeed_patches import sync_free_clip

    def grads() -> list[torch.Tensor]:
        return [torch.full((4,), 2.0), torch.arange(3.0)]

    for loss_scale in (1.0, 8.0):
        ref, mine = grads(), grads()
        ds = SimpleNamespace(clip_grad=1.0, loss_scale=loss_scale, device="cpu")
        DeepSpeedZeroOptimizer.unscale_and_clip_grads(ds, [ref[0], [ref[1]]], torch.tensor(norm))
        opt = SimpleNamespace(clip_grad=1.0, loss_scale=loss_scale,
                              unscale_and_clip_grads=lambda *a: pytest.fail("DeepSpeed's own method ran"))
        sync_free_clip(opt)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.Tensor, "__bool__", lambda self: pytest.fail("read back to the host"))
            mp.setattr(torch.Tensor, "item", lambda self: pytest.fail("read back to the host"))
            opt.unscale_and_clip_grads([mine[0], [mine[1]]], torch.tensor(norm))
        for a, b in zip(ref, mine):
            torch.testing.assert_close(b, a, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("bad", [None, float("inf"), float("nan")])
def test_foreach_grad_norm_equals_deepspeeds(monkeypatch: pytest.MonkeyPatch, bad: float | None) -> None:
    """ZeRO's global gradient norm from one foreach kernel: DeepSpeed's value (padding tensors skipped as it
    skips them, -1 for inf/NaN), through the same all-reduces."""
    from types import SimpleNamespace

    import deepspeed.comm as dist
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
    from skillnet.training.deepspeed_patches import foreach_grad_norm

    reduced: list[str] = []
    monkeypatch.setattr(dist, "all_reduce", lambda tensor, op=None, group=None, **kw: reduced.append("dp"))
    torch.manual_seed(0)
    grads = [torch.randn(7), torch.randn(3, 4).to(torch.bfloat16), torch.zeros(5), torch.randn(2)]
    pad = torch.ones(4)
    pad._zero_padding = True
    if bad is not None:
        grads[1][0, 0] = bad
    params = [torch.empty(g.shape) for g in grads]

    def fake() -> SimpleNamespace:
        return SimpleNamespace(model_parallel_rank=0, dp_process_group=None, device="cpu",
                               _model_parallel_all_reduce=lambda tensor, op: reduced.append("mp"))

    ref_opt = fake()
    ref = DeepSpeedZeroOptimizer.get_grad_norm_direct(ref_opt, [grads[0], pad, *grads[1:]], params)
    opt = fake()
    opt.get_grad_norm_direct = lambda *a, **k: pytest.fail("DeepSpeed's own method ran")
    foreach_grad_norm(opt)
    calls = len(reduced)
    mine = opt.get_grad_norm_direct([grads[0], pad, *grads[1:]], params)
    assert reduced[calls:] == reduced[:calls] == ["dp", "mp"]
    torch.testing.assert_close(mine, ref, rtol=1e-6, atol=0)
    if bad is not None:
        assert float(mine) == -1.0


def test_deepspeeds_node_launcher_still_kills_after_30_s_through_the_hooks_the_patch_replaces(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`run_node_launcher_waiting` relies on DeepSpeed 0.19's ``deepspeed.launcher.launch``: its own
    ``terminate_process_tree`` TERMs a rank's tree and SIGKILLs it 30 s later (else the patch is redundant),
    ``main`` installs its TERM/INT handler through ``signal.signal`` and ends the ranks through the module's
    ``terminate_process_tree`` (the two hooks the patch replaces), calls that handler directly after a rank
    failure (not through a signal, which is how the patch tells the two apart), and exits 1 after a signal."""
    import signal
    import subprocess
    import sys

    import psutil
    from deepspeed.launcher import launch

    waits: list[tuple[float | None, list[int | None]]] = []
    wait_procs = psutil.wait_procs

    def recorded(procs: list[psutil.Process], timeout: float | None = None) -> tuple[list, list]:
        gone, alive = wait_procs(procs, timeout=timeout)
        waits.append((timeout, [p.returncode for p in gone]))  # psutil reaps the rank: its status is here
        return gone, alive

    monkeypatch.setattr(psutil, "wait_procs", recorded)
    rank = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        launch.terminate_process_tree(rank.pid)
        assert waits == [(30, [-signal.SIGTERM])]
    finally:
        rank.kill()
        rank.wait()
    main = inspect.getsource(launch.main)
    assert "signal.signal(signal.SIGTERM, sigkill_handler)" in main
    assert "signal.signal(signal.SIGINT, sigkill_handler)" in main
    assert "terminate_process_tree(process.pid)" in main
    assert "last_return_code = process.returncode" in main and "sigkill_handler(signal.SIGTERM, None)" in main
    handler = main[main.index("def sigkill_handler"):main.index("signal.signal(signal.SIGINT")]
    assert "sys.exit(last_return_code)" in handler and "sys.exit(1)" in handler


def test_deepspeeds_runner_starts_the_node_launcher_the_patch_replaces_and_leaves_the_signals_alone(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`run_runner_with_node_launcher` relies on DeepSpeed 0.19's runner on the batch-scheduler path
    (``--hostfile --no_ssh --node_rank``): it starts ``python -m deepspeed.launcher.launch ...`` through
    ``subprocess.Popen`` (which the patch swaps for the given module) and installs no TERM/INT handler of its
    own (the patch's, which outlives the signal, stays). Nothing is started here: the Popen only records."""
    import signal
    import subprocess
    import sys

    started: list[list[str]] = []

    class Recorder:
        returncode = 0

        def __init__(self, cmd: list[str], *a: object, **kw: object) -> None:
            started.append(cmd)

        def wait(self, timeout: float | None = None) -> int:
            return 0

    monkeypatch.setattr(subprocess, "Popen", Recorder)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node0 slots=1\nnode1 slots=1\n")
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        dsp.run_runner_with_node_launcher(
            ["--hostfile", str(hostfile), "--no_ssh", "--node_rank", "1", "--master_addr", "10.0.0.1",
             "--master_port", "29500", "rank.py", "--flag"], ["skillnet.node", "--mark"])
        after = {s: signal.getsignal(s) for s in before}
    finally:
        for s, h in before.items():
            signal.signal(s, h)
    assert subprocess.Popen is Recorder  # the patch put DeepSpeed's Popen back
    assert len(started) == 1, started
    cmd = started[0]
    assert cmd[:5] == [sys.executable, "-u", "-m", "skillnet.node", "--mark"], cmd
    assert "--node_rank=1" in cmd and "--master_addr=10.0.0.1" in cmd and cmd[-2:] == ["rank.py", "--flag"]
    assert all(getattr(h, "__module__", None) == dsp.__name__ for h in after.values()), after
