"""Task types as codecs: one `TaskCodec` per config ``type`` (encode, collate, decode, score), in a registry.

Every module of this package registers the codecs it defines when it is imported, and the package imports
all of its modules, so a new built-in task type is one new module here; a task type from outside the
package is one `register` call before the config is read. Everything else asks the registry: the config's
checks (kinds, metrics, head options, architecture), `TaskData`, the run and ``finetune.predict``.
"""

from __future__ import annotations

import importlib
import pkgutil

from .base import Encoded, TaskCodec

__all__ = ["Encoded", "TaskCodec", "codec_for", "register", "task_types", "unregister"]

_CODECS: dict[str, TaskCodec] = {}


def register(codec: TaskCodec, *, replace: bool = False) -> TaskCodec:
    """Make ``codec`` the handler of task type ``codec.name``; returns it."""
    for attr in ("name", "head", "kinds", "metrics", "metric"):
        if not hasattr(codec, attr):
            raise TypeError(f"{type(codec).__name__}: a task codec needs a class attribute {attr!r}")
    if codec.metric not in codec.metrics:
        raise ValueError(f"task type {codec.name!r}: default metric {codec.metric!r} is not one of {codec.metrics}")
    if codec.name in _CODECS and not replace:
        raise ValueError(f"task type {codec.name!r} is already registered ({type(_CODECS[codec.name]).__name__})")
    _CODECS[codec.name] = codec
    return codec


def unregister(name: str) -> None:
    _CODECS.pop(name, None)


def codec_for(task_type: str) -> TaskCodec:
    try:
        return _CODECS[task_type]
    except KeyError:
        raise KeyError(f"unknown task type {task_type!r}; valid: {', '.join(_CODECS)}") from None


def task_types() -> list[str]:
    return list(_CODECS)


def _import_builtins() -> None:
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if not info.name.startswith("_"):
            importlib.import_module(f"{__name__}.{info.name}")


_import_builtins()
