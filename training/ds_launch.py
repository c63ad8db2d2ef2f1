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
cleanly on the signal and saved). Both levels are patches of DeepSpeed's launcher, which live with the other
patches of DeepSpeed internals in training/deepspeed_patches.py (refused on a DeepSpeed series they were not
written for); this module is the command and its stop grace.
"""

from __future__ import annotations

import os
import shlex
import sys

from .deepspeed_patches import run_node_launcher_waiting, run_runner_with_node_launcher
from .rank_death import LAUNCHER_NAMES_ENV, RESUME_ENV, report_dead_rank

__all__ = ["main"]

_NODE = "--skillnet-node"  # marks the per-node launcher this module starts in place of DeepSpeed's


def _grace() -> float:
    return float(os.environ.get("SKILLNET_STOP_GRACE", "3600"))


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [_NODE]:
        os.environ[LAUNCHER_NAMES_ENV] = "1"  # its ranks leave the dead on this node to report_dead_rank
        run_node_launcher_waiting(args[1:], _grace(), on_rank_failure=report_dead_rank)
    else:
        # what a dead rank's line tells to rerun (a job script sets its own); the node launcher inherits it
        os.environ.setdefault(RESUME_ENV, shlex.join([sys.executable, "-m", "skillnet.training.ds_launch", *args]))
        run_runner_with_node_launcher(args, ["skillnet.training.ds_launch", _NODE])


if __name__ == "__main__":
    main()
