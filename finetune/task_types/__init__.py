"""Task types as codecs: one `TaskCodec` per config ``type`` (encode, collate, decode, score), in a registry.

The registry is filled here, by name: each built-in codec is one module of this package and one entry in
`_BUILTINS`; a task type from outside the package is one `register` call before the config is read.
Everything else asks the registry: the config's checks (kinds, metrics, head options, architecture),
`TaskData`, the run and ``finetune.predict``. The codecs import neither the config nor the task data (they
read them through base.py's protocols), so none of them can import this registry half-filled.
"""

from __future__ import annotations

from .base import Encoded, TaskCodec, TaskSettings, TaskView
from .classification import ClassificationCodec
from .generation import GenerationCodec
from .matching import MatchingCodec
from .ner import NerCodec
from .regression import RegressionCodec
from .span import SpanCodec

__all__ = ["Encoded", "TaskCodec", "TaskSettings", "TaskView", "codec_for", "register", "task_types"]

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


def codec_for(task_type: str) -> TaskCodec:
    try:
        return _CODECS[task_type]
    except KeyError:
        raise KeyError(f"unknown task type {task_type!r}; valid: {', '.join(_CODECS)}") from None


def task_types() -> list[str]:
    return list(_CODECS)


_BUILTINS = (ClassificationCodec, GenerationCodec, MatchingCodec, NerCodec, RegressionCodec, SpanCodec)
for _codec in _BUILTINS:
    register(_codec())
