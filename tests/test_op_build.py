"""training/op_build.py: the route a launch takes past a dead op build's lock (issue 59, item 5).

Prebuilt ops (DeepSpeed installed with them compiled in) need no patch: DeepSpeed imports them and torch's JIT
build, and its lock, never run. Elsewhere the lock patch is the fallback (tests/test_op_build_lock.py kills builds
at random points under it); on a torch series it was not written for, the launch says once how to clear a lock.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch
from skillnet.training import op_build

from tests.fixtures.pretrain.helpers import REPO, subprocess_env

# What a DeepSpeed installed with DS_BUILD_SHM_COMM=1 DS_BUILD_FUSED_ADAM=1 records and carries: the ops listed as
# installed for this accelerator and torch series, each importable under its builder's module name. Then a launch
# (prepare_extensions, as every rank runs it) and the op's load, with a killed build's lock in the way.
PREBUILT_LAUNCH = """
import sys, types
import deepspeed.git_version_info as g
import torch
from deepspeed.accelerator import get_accelerator

acc = get_accelerator()
g.installed_ops.update(deepspeed_shm_comm=True, fused_adam=True)
g.accelerator_name = acc._name
g.torch_info["version"] = ".".join(torch.__version__.split(".")[:2])
builder = acc.create_op_builder("ShareMemCommBuilder")
sys.modules[builder.absolute_name()] = types.ModuleType(builder.absolute_name())

from skillnet.training.dist import prepare_extensions
from skillnet.training.op_build import guard_op_builds
from torch.utils import cpp_extension

d = prepare_extensions()
print("route", guard_op_builds(d), flush=True)
print("patched", getattr(cpp_extension._jit_compile, "_skillnet_op_lock", False), flush=True)
builder.load(verbose=False)
print("loaded", flush=True)
"""


def test_prebuilt_ops_load_past_a_killed_builds_lock_without_the_patch(tmp_path: Path) -> None:
    """A killed build's lock (torch's own, fresh: the patch too would wait on it for 10 minutes) does not stop a
    launch whose ops are prebuilt, and nothing of torch is patched."""
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir()
    lock.write_text("")
    env = {**subprocess_env(), "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", PREBUILT_LAUNCH], cwd=REPO, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    said = [ln for ln in r.stdout.splitlines() if not ln.startswith("[")]  # DeepSpeed's own log lines aside
    assert said == ["route prebuilt", "patched False", "loaded"], (r.stdout, r.stderr[-2000:])
    assert lock.exists()  # not taken over, not waited on: never looked at


def test_the_patch_is_the_fallback_where_the_ops_are_not_prebuilt(monkeypatch: pytest.MonkeyPatch) -> None:
    assert not op_build.prebuilt(["no_such_op"])  # a real answer: this DeepSpeed lists no such op
    installed: list[bool] = []
    monkeypatch.setattr(op_build, "install_op_build_lock", lambda: installed.append(True) or True)
    monkeypatch.setattr(op_build, "prebuilt", lambda ops: False)
    assert op_build.guard_op_builds("/ext") == "patched" and installed == [True]
    monkeypatch.setattr(op_build, "prebuilt", lambda ops: True)
    assert op_build.guard_op_builds("/ext") == "prebuilt" and installed == [True]  # not installed again


def test_another_torch_series_says_once_in_one_line_how_to_clear_a_dead_lock(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    monkeypatch.setattr(op_build, "_noticed", [])
    monkeypatch.setattr(op_build, "prebuilt", lambda ops: False)
    assert not op_build.install_op_build_lock()
    assert op_build.guard_op_builds("/ext/py311") == "unguarded"
    assert op_build.guard_op_builds("/ext/py311") == "unguarded"
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err  # one line, once
    assert "torch 2.99" in err and "rm -f /ext/py311/*/lock" in err and "waits on forever" in err
