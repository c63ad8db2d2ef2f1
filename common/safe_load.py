"""Reading ``torch.save`` files without running code that the user did not ask for.

A ``.pt`` file is a pickle, and unpickling can call any function it names (a shell command, say): a run
folder shared in a lab, or a checkpoint downloaded "to continue training", would run its author's code on
export or resume. So every checkpoint read of the project (its own ``torch.load`` calls and, through
`guard_torch_load`, DeepSpeed's) loads with ``weights_only=True``: tensors, containers and plain values, plus
`ALLOWED_GLOBALS`, the few other types this project and DeepSpeed themselves write into checkpoints. A file
that needs anything else is refused with `UntrustedCheckpointError`, one line naming the file and the global.

``--trust-checkpoint`` (export, pre-training and fine-tuning resume, and so the reshard of a resume) sets
`trust_checkpoints`: such a file then loads as pickle, with a warning naming what it calls. Only for files whose
origin one trusts as one trusts code one runs.

The allowlist holds names, not objects: a type is imported only when a file asks for it (this module sits
below every folder and imports none of them, nor DeepSpeed, up front).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import pickle
import re
import sys
from collections.abc import Callable, Iterator
from typing import IO, Any

__all__ = [
    "ALLOWED_GLOBALS",
    "TRUST_FLAG",
    "UntrustedCheckpointError",
    "add_trust_flag",
    "check_file",
    "guard_torch_load",
    "load",
    "trust_checkpoints",
    "trusted",
]

TRUST_FLAG = "--trust-checkpoint"

# What real runs write beyond what torch allows by default, found on real checkpoints of this code (plain,
# ZeRO-2 and ZeRO-3, 1 and 2 ranks; tests/test_safe_load.py checks each against a fresh save):
ALLOWED_GLOBALS = frozenset({
    # the trainer state's NumPy RNG stream (np.random.get_state(): an array of uint32) and NumPy scalars
    "numpy.ndarray",
    "numpy.dtype",
    "numpy.core.multiarray._reconstruct",
    "numpy._core.multiarray._reconstruct",
    "numpy.core.multiarray.scalar",
    "numpy._core.multiarray.scalar",
    # a dtype's class is built while unpickling (the static read sees only numpy.dtype)
    *(f"numpy.dtypes.{k}DType" for k in ("Bool", "Int8", "Int16", "Int32", "Int64", "UInt8", "UInt16", "UInt32",
                                          "UInt64", "Float16", "Float32", "Float64")),
    # DeepSpeed's optimizer partitions: the ZeRO stage, its loss scaler (fp32/bf16: static; fp16: dynamic) and,
    # ZeRO-1/2, where each parameter sits in the flat partition
    "deepspeed.runtime.zero.config.ZeroStageEnum",
    "deepspeed.runtime.fp16.loss_scaler.LossScaler",
    "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
    "deepspeed.utils.tensor_fragment.fragment_address",
    # DeepSpeed's model states may carry the launcher's parsed arguments
    "argparse.Namespace",
    "collections.OrderedDict",
})

_TRUST = False
_warned: set[str] = set()


class UntrustedCheckpointError(ValueError):
    """A checkpoint file needs a global outside `ALLOWED_GLOBALS`; refused unless trusted (one-line message)."""


def trust_checkpoints(on: bool = True) -> None:
    """Load files that need globals outside the allowlist in this process (``--trust-checkpoint``)."""
    global _TRUST
    _TRUST = on


def trusted() -> bool:
    return _TRUST


def _trusting(trust: bool | None) -> bool:
    return trusted() if trust is None else trust


class _TrustAction(argparse.Action):
    # Acting at parse time lets every command (and every rank, which parses its own argv) take the flag
    # without threading it through the trainer's config: it is a decision about files, not a training setting.
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, True)
        trust_checkpoints(True)


def add_trust_flag(parser: Any) -> None:
    """Add ``--trust-checkpoint`` to `parser` (an ArgumentParser or an argument group)."""
    parser.add_argument(
        TRUST_FLAG, action=_TrustAction, nargs=0, default=False,
        help="load checkpoint files even if they need Python globals outside what SkillNet and DeepSpeed write "
        "(a pickle can then run any code: only for files whose origin you trust; docs/safety.md)")


def _name(f: Any) -> str:
    if isinstance(f, str | os.PathLike):
        return os.fspath(f)
    return str(getattr(f, "name", f"<{type(f).__name__}>"))


def _globals_in(f: str | os.PathLike[str] | IO[bytes]) -> list[str]:
    """Every global the pickle of `f` names outside torch's default allowlist (a static read: nothing runs)."""
    import torch  # noqa: PLC0415

    try:
        found = torch.serialization.get_unsafe_globals_in_checkpoint(f)
    except (ValueError, RuntimeError, pickle.UnpicklingError):  # not a zip archive: the weights-only load judges
        return []
    finally:
        if hasattr(f, "seek"):
            f.seek(0)
    return sorted(found)


def _refusal(name: str, glob: str) -> UntrustedCheckpointError:
    return UntrustedCheckpointError(
        f"{name}: refused to load: it needs {glob}, which no SkillNet or DeepSpeed checkpoint holds (unpickling "
        f"it could run code); if you trust where the file came from, rerun with {TRUST_FLAG}")


def _warn_trusted(name: str, unsafe: list[str]) -> None:
    if name not in _warned:
        _warned.add(name)
        print(f"warning: {name}: loading it with {TRUST_FLAG} although it needs {', '.join(unsafe)} (outside what "
              f"SkillNet writes): its pickle may run code", file=sys.stderr, flush=True)


def check_file(f: str | os.PathLike[str], *, trust: bool | None = None) -> None:
    """Refuse `f` (`UntrustedCheckpointError`) if its pickle names a global outside the allowlist, unless trusted
    (then say so once). Cheap: reads the pickle only, not the tensors."""
    unsafe = [g for g in _globals_in(f) if g not in ALLOWED_GLOBALS]
    if unsafe:
        if _trusting(trust):
            _warn_trusted(_name(f), unsafe)
        else:
            raise _refusal(_name(f), unsafe[0])


def _resolve(names: list[str]) -> list[Callable[..., Any]]:
    out = []
    for full in names:
        module, _, attr = full.rpartition(".")
        try:
            out.append(getattr(importlib.import_module(module), attr))
        except (ImportError, AttributeError):  # this NumPy spelling does not exist here: the file cannot need it
            continue
    return out


_UNSUPPORTED = re.compile(r"GLOBAL ([\w.]+)|got <class '([\w.]+)'>")


def load(f: str | os.PathLike[str] | IO[bytes], *, trust: bool | None = None, map_location: Any = "cpu",
         _torch_load: Callable[..., Any] | None = None, **kw: Any) -> Any:
    """``torch.load(f)`` that runs no code: weights only, plus the allowlisted globals the file names. A file
    that needs more is refused (`UntrustedCheckpointError`), or, trusted (`trust`, default: `trusted()`),
    loaded as pickle with a warning. ``kw`` goes to torch.load (``mmap``, ...)."""
    import torch  # noqa: PLC0415

    torch_load = _torch_load or torch.load
    kw.pop("weights_only", None)
    name = _name(f)
    found = _globals_in(f)
    unsafe = [g for g in found if g not in ALLOWED_GLOBALS]
    if unsafe:
        if not _trusting(trust):
            raise _refusal(name, unsafe[0])
        _warn_trusted(name, unsafe)
        return torch_load(f, map_location=map_location, weights_only=False, **kw)
    # Types built while unpickling are not in `found`: allow every listed one whose module is loaded already
    # (NumPy always is; DeepSpeed's when DeepSpeed reads its own files), importing only what the file names.
    loaded = [g for g in ALLOWED_GLOBALS if g.rpartition(".")[0] in sys.modules]
    with torch.serialization.safe_globals(_resolve(sorted({*found, *loaded}))):
        try:
            return torch_load(f, map_location=map_location, weights_only=True, **kw)
        except pickle.UnpicklingError as e:  # a global the static read could not see (built while unpickling)
            if _trusting(trust):
                _warn_trusted(name, ["a global built while unpickling"])
                if hasattr(f, "seek"):
                    f.seek(0)
                return torch_load(f, map_location=map_location, weights_only=False, **kw)
            m = _UNSUPPORTED.search(str(e))
            raise _refusal(name, (m.group(1) or m.group(2)) if m else "a global outside the allowlist") from None


@contextlib.contextmanager
def guard_torch_load(*, trust: bool | None = None) -> Iterator[None]:
    """Within the block every ``torch.load`` (DeepSpeed's checkpoint reads included, which ask for
    ``weights_only=False``) goes through `load`. Only for code that calls ``torch.load`` as the module's
    attribute (training/deepspeed_patches.py gates it by DeepSpeed series)."""
    import torch  # noqa: PLC0415

    original = torch.load

    def guarded(f: Any, map_location: Any = None, *args: Any, **kw: Any) -> Any:
        if args:  # pickle_module: a caller that brings its own unpickler is not a checkpoint read we know
            raise TypeError("guarded torch.load takes f and map_location positionally, the rest by keyword")
        kw.pop("pickle_module", None)
        return load(f, trust=trust, map_location=map_location, _torch_load=original, **kw)

    torch.load = guarded
    try:
        yield
    finally:
        torch.load = original
