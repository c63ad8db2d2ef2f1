"""The test launcher (tests/fixtures/warm.py) cleans up after the ranks it forks."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.fixtures.warm import launch_fixture


@pytest.mark.skipif(not Path("/dev/shm").is_dir(), reason="no /dev/shm on this OS")
def test_a_warm_launch_leaves_no_shared_memory_buffer() -> None:
    """Each CPU rank that communicates through DeepSpeed gets a 66 MB /dev/shm buffer that only the trainer's
    end unlinks; fixture scripts that stop earlier (and killed ranks) left theirs, ~3 GB of RAM per full test
    run. The launcher removes the buffers of its launch's port when the ranks have ended."""
    res = launch_fixture("tests/fixtures/shm_allreduce.py", [], nprocs=2, timeout=300)
    ports = set(re.findall(r"port (\d+) sum 2", res.stdout))
    assert len(ports) == 1, res.stdout[-2000:]
    port = ports.pop()
    assert sorted(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_{port}_*")) == []


def test_a_warm_launch_removes_its_log_folder(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each launch keeps its ranks' logs in a temporary folder until it has read them; ~180 of them were
    left in /tmp after one test run."""
    import tests.fixtures.warm as warm

    made: list[str] = []
    real = warm.tempfile.mkdtemp

    def recording_mkdtemp(*args: object, **kwargs: object) -> str:
        made.append(real(*args, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    monkeypatch.setattr(warm.tempfile, "mkdtemp", recording_mkdtemp)
    res = launch_fixture("tests/fixtures/shm_allreduce.py", [], nprocs=2, timeout=300)
    assert "sum 2" in res.stdout and len(made) == 1
    assert not Path(made[0]).exists()
