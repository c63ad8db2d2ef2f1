"""One command-line convention for every tool (issue: consistent command lines): every option has help and
shows its default, the dash and underscore spellings are both accepted, and the usage line follows the
actual invocation."""

from __future__ import annotations

import argparse
import importlib
import subprocess
import sys

import pytest

from tests.fixtures.pretrain.helpers import REPO, subprocess_env

CLIS = ["skillnet.data_prep.__main__", "skillnet.data_prep.tasks.__main__", "skillnet.pretrain.run",
        "skillnet.pretrain.export", "skillnet.finetune.cli", "skillnet.finetune.predict", "skillnet.finetune.compare",
        "skillnet.finetune.report", "skillnet.training.warmup", "skillnet.experiments.memory"]


def _parsers(p: argparse.ArgumentParser):
    yield p
    for a in p._actions:
        if isinstance(a, argparse._SubParsersAction):
            for sub in a.choices.values():
                yield from _parsers(sub)


@pytest.mark.parametrize("module", CLIS)
def test_every_option_has_help_and_shows_its_default(module):
    parser = importlib.import_module(module).build_parser()
    for p in _parsers(parser):
        text = p.format_help()
        for a in p._actions:
            if not a.option_strings or a.help == argparse.SUPPRESS or isinstance(a, argparse._HelpAction):
                continue
            assert a.help and a.help.strip(), f"{p.prog}: {a.option_strings} has no help"
            assert all(not s.startswith("--") or "_" not in s for s in a.option_strings), (
                f"{p.prog}: {a.option_strings}: options are spelt with dashes")
            shown = a.default not in (None, False, argparse.SUPPRESS) and a.nargs != 0
            if shown:
                assert "default" in p._get_formatter()._format_action(a).lower(), (
                    f"{p.prog}: {a.option_strings} does not show its default {a.default!r}")
        assert "--" in text or not [a for a in p._actions if a.option_strings and a.help != argparse.SUPPRESS]


@pytest.mark.parametrize("module", CLIS)
def test_underscore_and_dash_spellings_parse_alike(module):
    parser = importlib.import_module(module).build_parser()
    for p in _parsers(parser):
        for a in p._actions:
            for s in a.option_strings:
                if s.startswith("--") and "-" in s[2:]:
                    under = "--" + s[2:].replace("-", "_")
                    assert p._normalise([under, "x"]) == [s, "x"]
                    assert p._normalise([f"{under}=x"]) == [f"{s}=x"]


def test_a_whole_command_line_with_underscores(tmp_path):
    from skillnet.finetune.cli import apply_overrides, build_parser
    from skillnet.finetune.config import FinetuneConfig

    from tests.test_finetune_e2e import tiny_config

    cfg = FinetuneConfig.from_dict(tiny_config(tmp_path))
    dash = apply_overrides(cfg, build_parser().parse_args(
        ["--config", "c", "--max-steps", "7", "--batch-size", "3", "--output-dir", "o", "--new-skill", "s8"]))
    under = apply_overrides(cfg, build_parser().parse_args(
        ["--config", "c", "--max_steps=7", "--batch_size", "3", "--output_dir", "o", "--new_skill", "s8"]))
    assert dash.to_dict() == under.to_dict() and under.train.max_steps == 7


@pytest.mark.parametrize("cmd,usage", [
    (["skillnet-finetune", "--help"], "usage: skillnet-finetune "),
    ([sys.executable, "-m", "skillnet.finetune.run", "--help"], "usage: python -m skillnet.finetune.run "),
    ([sys.executable, "pretrain/run.py", "--help"], "usage: pretrain/run.py "),
    ([sys.executable, "-m", "skillnet.data_prep", "build", "--help"], "usage: python -m skillnet.data_prep build "),
    (["skillnet-data", "build", "--help"], "usage: skillnet-data build "),
])
@pytest.mark.slow  # keeps make test-fast under 3 min (measured 9-30 s on 2 loaded cores)
def test_usage_line_follows_the_invocation(cmd, usage):
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, env=subprocess_env(), timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.startswith(usage), r.stdout[:200]
