"""scripts/reproduce.py: the stage plan and the report's completeness check (what CI's quick run relies on).
The quick run itself is CI's last step (`make reproduce-quick`), not a test: it takes ~8 minutes."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

import reproduce  # noqa: E402
from reproduce_report import Doc, build  # noqa: E402


def test_dry_run_lists_every_stage_command(tmp_path):
    r = subprocess.run([sys.executable, "scripts/reproduce.py", "--quick", "--out", str(tmp_path), "--dry-run"],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    for st in reproduce.STAGES:
        assert f") {st.name}:" in r.stdout
    assert "deepspeed --num_gpus 2 pretrain/run.py" in r.stdout
    assert "skillnet.finetune.compare" in r.stdout
    assert not (tmp_path / "stages" / "corpus.json").exists()  # a dry run records nothing as done


def test_problems_flag_empty_and_not_run_sections(tmp_path):
    d = Doc()
    d.h(1, "t")
    d.h(2, "filled")
    d.p("a number: 1.0")
    d.h(2, "empty")
    d.h(2, "pending")
    d.p("Not run yet (stage x).")
    d.img(tmp_path / "absent.png", "a picture")
    assert d.problems() == [f"picture missing: {tmp_path / 'absent.png'}", "section empty: empty",
                            "section not run: pending"]
    ok = Doc()
    ok.h(2, "filled")
    ok.table(["a"], [["1"]])
    assert ok.problems() == []


@pytest.mark.parametrize("part", ["nlu", "nlg", "all"])
def test_report_of_an_unfinished_run_is_incomplete(tmp_path, part):
    _, parts, names = reproduce.PARTS[part]
    stages = [s for s in reproduce.STAGES if s.name in names]
    path, problems = build(tmp_path, reproduce.PROFILES["quick"], stages, tmp_path / "r.md", "t", parts)
    assert path.is_file() and path.with_suffix(".html").is_file()
    assert any(p.startswith("section not run") for p in problems)
    assert "section not run: Where the papers' claims hold at this scale" in problems


def test_check_exits_nonzero_on_an_incomplete_report(tmp_path):
    r = subprocess.run([sys.executable, "scripts/reproduce.py", "--quick", "--out", str(tmp_path), "--stages",
                        "report", "--check", "--report", str(tmp_path / "r.md")],
                       cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1
    assert "error: report incomplete: section not run" in r.stderr
