"""One command-line convention for every SkillNet tool.

* Options are spelt with dashes (``--output-dir``); the underscore spelling (``--output_dir``, as HF and
  DeepSpeed scripts write them) is accepted everywhere too, and so is ``--opt=value``.
* ``--help`` shows each option's default.
* ``prog`` (the usage line) is how the tool was actually started: ``python -m skillnet.finetune.run``, the
  console script ``skillnet-finetune``, or the script path ``pretrain/run.py``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from typing import IO, Any


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the description's line breaks and appends ``(default: ...)`` to an option's help when it has a
    default worth showing (not None, not a flag's False, not already mentioned)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "%(default)" in text or "default" in text.lower() or action.default in (None, False, argparse.SUPPRESS):
            return text
        if action.option_strings and action.nargs != 0:
            return f"{text} (default: %(default)s)"
        return text


def invocation(module: str) -> str:
    """How the running process was started, for the usage line; `module` is the tool's ``skillnet.*`` module
    (the answer when nothing better is known, e.g. when a test calls ``main()``)."""
    argv0 = sys.argv[0] if sys.argv else ""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    name = getattr(spec, "name", "") or ""
    if name.endswith(".__main__"):
        name = name[: -len(".__main__")]
    if name.startswith("skillnet.") or name.split(".")[0] in ("data_prep", "pretrain", "finetune", "training"):
        return f"python -m {name}"
    base = os.path.basename(argv0)
    if base.startswith("skillnet-"):
        return base
    if argv0.endswith(".py") and os.path.basename(os.path.dirname(os.path.abspath(argv0))) in module.split("."):
        rel = os.path.relpath(argv0)
        return rel if not rel.startswith("..") else argv0
    return f"python -m {module}"


class Parser(argparse.ArgumentParser):
    """argparse with the conventions above."""

    def __init__(self, module: str = "", **kw: Any) -> None:
        if module:  # sub-command parsers get their prog from argparse
            kw.setdefault("prog", invocation(module))
        kw.setdefault("formatter_class", HelpFormatter)
        super().__init__(**kw)

    def _options(self) -> set[str]:
        known = set()
        for a in self._actions:
            known.update(a.option_strings)
            if isinstance(a, argparse._SubParsersAction):
                for sub in a.choices.values():
                    known |= sub._options() if isinstance(sub, Parser) else {
                        s for b in sub._actions for s in b.option_strings}
        return known

    def _normalise(self, args: Sequence[str]) -> list[str]:
        known = self._options()
        out = []
        for tok in args:
            if tok == "--":
                out.extend(args[len(out):])
                break
            if tok.startswith("--") and "_" in tok:
                name, eq, value = tok.partition("=")
                alt = "--" + name[2:].replace("_", "-")
                if name not in known and alt in known:
                    tok = alt + eq + value
            out.append(tok)
        return out

    def parse_known_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> Any:  # type: ignore[override]
        if args is None:
            args = sys.argv[1:]
        return super().parse_known_args(self._normalise(list(args)), namespace)


@contextlib.contextmanager
def output_to(f: IO[str]) -> Iterator[None]:
    """Within the block, this process's whole output goes to the open file `f`, as a subprocess's does when
    started with its stdout and stderr on `f`: sys.stdout and sys.stderr, and file descriptors 1 and 2 too,
    for what bypasses those two (a library's log handler made with the process's first stderr, such as
    transformers' load report; C code). For a command run in a long-lived process (a worker, a reproduction)."""
    streams = [s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__) if s is not None]
    for s in streams:
        s.flush()
    f.flush()
    saved = [os.dup(1), os.dup(2)]
    try:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        with contextlib.redirect_stdout(f), contextlib.redirect_stderr(f):
            yield
    finally:
        for s in (*streams, f):
            s.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in saved:
            os.close(fd)
