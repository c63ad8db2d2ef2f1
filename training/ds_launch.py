"""DeepSpeed's launcher (`deepspeed ...`, same arguments) with a stop path that fits a batch scheduler.

    python -m skillnet.training.ds_launch --hostfile H --no_ssh --node_rank 0 --master_addr A --master_port P \\
        pretrain/run.py ...

DeepSpeed 0.19's own launcher ends a stop early on two levels, both of which cut a checkpoint that takes
longer to write:

- the `deepspeed` command (runner.py) has no SIGTERM handler with --no_ssh: it dies at once (exit 143),
  so srun sees the task gone while its ranks still save;
- its per-node `deepspeed.launcher.launch` forwards SIGTERM to the ranks and SIGKILLs them 30 s later.

Under Slurm every process of a step receives the scheduler's SIGTERM itself (proctrack sends it to the whole
step), so the ranks need nothing forwarded: here both levels wait for the ranks instead, up to
SKILLNET_STOP_GRACE seconds (default 3600: in practice Slurm's KillWait after the time limit bounds it), and
only then kill them. A rank that fails on its own (not a signal) still takes the others down as before: the
launcher terminates them with DeepSpeed's 30 s grace. Exit status: the ranks' (0 when every rank stopped
cleanly on the signal and saved).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

__all__ = ["main"]

_NODE = "--skillnet-node"  # marks the per-node launcher this module starts in place of DeepSpeed's
_signalled: list[int] = []  # the signal a scheduler/user sent (not a rank failure)


def _grace() -> float:
    return float(os.environ.get("SKILLNET_STOP_GRACE", "3600"))


def _node_main(argv: list[str]) -> None:
    """deepspeed.launcher.launch with a TERM/INT that waits for the ranks (they were signalled too)."""
    import psutil  # noqa: PLC0415  (DeepSpeed's own dependency)
    from deepspeed.launcher import launch  # noqa: PLC0415

    original = launch.terminate_process_tree

    def terminate_process_tree(pid: int) -> None:
        if not _signalled:  # a rank failed: DeepSpeed's way (TERM the rest, kill them 30 s later)
            original(pid)
            return
        # A stop signal: every rank got it as well; wait for them to save and exit, kill only past the grace.
        proc = psutil.Process(pid)
        procs = [*proc.children(recursive=True), proc]
        _, alive = psutil.wait_procs(procs, timeout=_grace())
        for p in alive:
            p.kill()

    launch.terminate_process_tree = terminate_process_tree
    real_signal = signal.signal

    def install(signum: int, handler: Any) -> Any:
        if signum in (signal.SIGTERM, signal.SIGINT) and callable(handler):
            inner = handler

            def handler(s: int, frame: Any) -> None:  # noqa: ANN001
                _signalled.append(s)
                inner(s, frame)

        return real_signal(signum, handler)

    signal.signal = install  # type: ignore[assignment]  # launch.main installs its handlers through this
    sys.argv = [launch.__file__, *argv]
    try:
        launch.main()
    except SystemExit as e:
        # launch.py exits 1 after a signal whatever its ranks returned; a clean stop (every rank 0) is 0.
        if _signalled and e.code == 1:
            raise SystemExit(0) from None
        raise


def _runner_main(argv: list[str]) -> None:
    """DeepSpeed's runner, starting this module's per-node launcher, and waiting for it on TERM/INT."""
    from deepspeed.launcher import runner  # noqa: PLC0415

    real_popen = subprocess.Popen

    class Popen(real_popen):  # type: ignore[misc, valid-type]
        def __init__(self, cmd: Any, *a: Any, **kw: Any) -> None:
            if isinstance(cmd, list) and "deepspeed.launcher.launch" in cmd:
                i = cmd.index("deepspeed.launcher.launch")
                cmd = [*cmd[:i], "skillnet.training.ds_launch", _NODE, *cmd[i + 1:]]
            super().__init__(cmd, *a, **kw)

    runner.subprocess.Popen = Popen  # type: ignore[misc]
    # The node launcher handles the signal (it waits for the ranks); the runner only waits for it.
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: None)
    sys.argv = ["deepspeed", *argv]
    runner.main()


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [_NODE]:
        _node_main(args[1:])
    else:
        _runner_main(args)


if __name__ == "__main__":
    main()
