"""The reproduction stops before fine-tuning when a pre-trained model is below its accuracy floor."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from skillnet.experiments.profiles import PROFILES
from skillnet.experiments.runner import FLOORS, Runner, check_floor, last_logged


def _log(run: Path, accs: list[float], key: str = "denoise/acc") -> None:
    run.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": i + 1, key: a, "loss": 1.0, "split": "train"}) for i, a in enumerate(accs)]
    lines.insert(1, json.dumps({"step": 1, key: 0.99, "split": "eval"}))  # eval lines do not count
    (run / "log.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")


def test_last_logged_averages_the_last_training_windows(tmp_path: Path) -> None:
    _log(tmp_path, [0.1, 0.2, 0.3, 0.4, 0.5])
    assert last_logged(tmp_path / "log.jsonl", "denoise/acc") == pytest.approx(0.4)
    assert last_logged(tmp_path / "log.jsonl", "mlm/acc") is None
    assert last_logged(tmp_path / "missing.jsonl", "mlm/acc") is None


def test_a_bart_at_the_plateau_stops_the_full_profile(tmp_path: Path) -> None:
    r = Runner(tmp_path / "out", PROFILES["full"])
    r.stage = "bart_pt"
    _log(tmp_path / "pt_bart", [0.19, 0.2, 0.21])
    with pytest.raises(RuntimeError, match=r"denoising accuracy .* is 0\.200, below the floor 0\.5"):
        check_floor(r, tmp_path / "pt_bart")
    _log(tmp_path / "pt_bart", [0.6, 0.7, 0.8])
    rec = check_floor(r, tmp_path / "pt_bart")
    assert rec["floor_passed"] and rec["floor_value"] == pytest.approx(0.7)


def test_the_quick_profile_records_but_goes_on(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert not PROFILES["quick"].enforce_floors and PROFILES["full"].enforce_floors
    r = Runner(tmp_path / "out", PROFILES["quick"])
    r.stage = "dense_pt"
    _log(tmp_path / "pt", [0.05], key="mlm/acc")
    rec = check_floor(r, tmp_path / "pt")
    assert rec["floor_passed"] is False and rec["floor_enforced"] is False
    assert "below the floor" in capsys.readouterr().out


def test_every_pretraining_stage_has_a_floor() -> None:
    from skillnet.experiments.stages import STAGES

    assert {s.name for s in STAGES if s.name.endswith("_pt")} == set(FLOORS)
    assert dataclasses.is_dataclass(PROFILES["full"])


def test_tokens_seen_sums_each_windows_real_tokens_and_counts_a_relogged_step_once(tmp_path: Path) -> None:
    from skillnet.experiments.runner import tokens_seen

    rows = [(100, 2000.0, 0.5), (200, 1000.0, 0.5), (150, 1000.0, 0.5), (200, 3000.0, 0.5)]  # resumed at 100
    lines = [json.dumps({"step": s, "real_tokens_per_s": r, "seconds_per_step": t, "split": "train"})
             for s, r, t in rows]
    lines.append(json.dumps({"step": 200, "real_tokens_per_s": 9e9, "seconds_per_step": 9.0, "split": "eval"}))
    (tmp_path / "log.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    # windows 0-100, 100-150, 150-200: 100 steps x 1000 tokens, 50 x 500, 50 x 1500
    assert tokens_seen(tmp_path / "log.jsonl") == pytest.approx(100_000 + 25_000 + 75_000)
    assert tokens_seen(tmp_path / "missing.jsonl") is None
