"""`python -m skillnet.training.warmup` (run by `make setup`): builds DeepSpeed's JIT ops, never fails setup."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from skillnet.training import warmup

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # measured 19 s
def test_warmup_builds_or_reports_the_ops() -> None:
    r = subprocess.run(
        [sys.executable, "-m", "skillnet.training.warmup"], cwd=REPO, capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stderr[-2000:]
    status = json.loads(r.stdout.strip().splitlines()[-1])
    assert status["event"] == "deepspeed_warmup"
    assert set(warmup.OPS) <= set(status)


def test_a_failed_build_only_warns(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(warmup, "warm", lambda ops=warmup.OPS: {"FusedAdamBuilder": "failed: no compiler"})
    assert warmup.main([]) == 0
    assert "could not be built" in capsys.readouterr().err
    assert warmup.main(["--strict"]) == 1
