from __future__ import annotations

import os
from pathlib import Path

import pytest

# Nothing in the test suite may reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# What a launcher sets, and what a DeepSpeed run started in this process without one sets for itself
# (training/dist.py one_rank_without_launcher): a test that runs such a command in-process must not hand them
# to the commands later tests start, which would take themselves for rank 0 of a launch on a taken port.
_LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@pytest.fixture(autouse=True)
def _launch_environment_stays_with_its_test():
    before = {k: os.environ.get(k) for k in _LAUNCH_VARS}
    yield
    for k, v in before.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(scope="session")
def default_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The default tiny shards of tests/fixtures/pretrain/helpers.py (`build_shards` with no options: the real
    data_prep CLI), built once per session for the test files that read them (they never write there)."""
    from tests.fixtures.pretrain.helpers import build_shards

    return build_shards(tmp_path_factory.mktemp("pt_shards_default"))


@pytest.fixture(scope="session")
def pt_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny sparse pre-training (`python pretrain/run.py ...`, started warm: tests/fixtures/warm.py) and its
    export, shared by the files that read it (HF pipelines, plain exports)."""
    from skillnet.export.hf_folder import export

    from tests.fixtures.warm import launch_fixture

    tmp = tmp_path_factory.mktemp("pt")
    launch_fixture("pretrain/run.py", ["--synthetic", "64", "--preset", "tiny", "--max_steps", "2", "--output_dir",
                                       str(tmp / "run"), "--no_progress", "--no_tensorboard"], nprocs=0, timeout=600)
    return export(tmp / "run", tmp / "hf")


@pytest.fixture(scope="session")
def gen_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny SkillNet-BART fine-tuning run (tests/test_finetune_generation.py's config), read-only for its users."""
    from skillnet.finetune import run as run_cli
    from skillnet.finetune.config import FinetuneConfig

    from tests.test_finetune_generation import gen_config

    out = tmp_path_factory.mktemp("gen") / "gen"
    run_cli.run(FinetuneConfig.from_dict(gen_config(out)), tensorboard=False, progress=False)
    return out


# `slow` means over this many seconds as measured (setup + call); `make test-fast` leaves those out.
SLOW_SECONDS = 20.0
_unmarked_slow: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when in ("setup", "call") and "slow" not in report.keywords:
        _unmarked_slow[report.nodeid] = _unmarked_slow.get(report.nodeid, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Name the tests that took longer than `slow` allows without the mark, so the marks follow the
    measured times (a loaded machine can push a test over: a hint, not a failure)."""
    over = sorted(((t, n) for n, t in _unmarked_slow.items() if t > SLOW_SECONDS), reverse=True)
    if over:
        terminalreporter.write_sep("-", f"over {SLOW_SECONDS:.0f} s without the slow mark")
        for t, n in over:
            terminalreporter.write_line(f"{t:7.1f}s {n}")
