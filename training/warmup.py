"""Pre-build DeepSpeed's JIT C++ ops so the first training launch does not stall for minutes.

    python -m skillnet.training.warmup            # called by `make setup`; seconds when already cached

On a CPU machine DeepSpeed compiles ``deepspeed_shm_comm`` (intra-node collectives) and ``fused_adam``
into a folder of this Python environment's own (~/.cache/skillnet/torch_extensions/py<ver>-<env>, or
TORCH_EXTENSIONS_DIR; training/dist.py's prepare_extensions) on first use (1.5-6 min on 2 cores); on GPU machines it builds the
accelerator's variants. A build killed midway (Ctrl-C here) leaves no lock that blocks the next one
(training/op_build.py, through prepare_extensions). A build failure only warns (exit code 0): training still works where DeepSpeed
falls back, and setup must not fail on machines without a compiler.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings

from skillnet.common.cli import Parser
from skillnet.training.op_build import LAUNCH_OPS

OPS = tuple(LAUNCH_OPS.values())


def warm(ops: tuple[str, ...] = OPS) -> dict[str, str]:
    """Build/load each op; returns {op: "ok" | "unavailable" | "failed: <reason>"}."""
    status: dict[str, str] = {}
    try:
        from deepspeed.accelerator import get_accelerator
    except Exception as e:  # noqa: BLE001  (any import problem is a warning here)
        return {"deepspeed": f"failed: {type(e).__name__}: {e}"}
    acc = get_accelerator()
    for name in ops:
        t0 = time.time()
        try:
            builder = acc.create_op_builder(name)
            if builder is None or not builder.is_compatible(verbose=False):
                status[name] = "unavailable"
                continue
            builder.load(verbose=False)
            status[name] = f"ok ({time.time() - t0:.1f}s)"
        except Exception as e:  # noqa: BLE001
            status[name] = f"failed: {type(e).__name__}: {str(e)[:200]}"
    return status


def build_parser() -> Parser:
    p = Parser("skillnet.training.warmup", description=__doc__)
    p.add_argument(
        "--strict", action="store_true", help="exit 1 if an op fails to build (default: warn only)"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    os.environ.setdefault("DS_BUILD_OPS", "0")
    from skillnet.training.dist import prepare_extensions

    print(f"building into {prepare_extensions()}", file=sys.stderr)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        status = warm()
    print(json.dumps({"event": "deepspeed_warmup", **status}))
    failed = [k for k, v in status.items() if v.startswith("failed")]
    if failed:
        print(
            f"warning: DeepSpeed ops {failed} could not be built; the first DeepSpeed launch will retry "
            f"(or fail) then. Plain `python pretrain/run.py` does not need them.",
            file=sys.stderr,
        )
        return 1 if args.strict else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
