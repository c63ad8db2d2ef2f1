"""Doc sections written by the benches that measure them, and paired ratios."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from skillnet.experiments.benchdoc import paired_ratio, replace_section, write_section

REPO = Path(__file__).resolve().parents[1]
BENCHES = ["skill_ffn", "data_prep", "pretrain", "optim", "generate", "data_prep_scale", "shape_sweep", "real_size"]


def test_paired_ratio_is_the_median_of_per_repetition_ratios() -> None:
    # Repetition 1 ran under load that slowed both arms tenfold: its ratio is still 2.
    assert paired_ratio([2.0, 20.0, 2.2], [1.0, 10.0, 1.0], "x") == {"x": 2.0, "x_min": 2.0, "x_max": 2.2}
    # Load that hits one arm only shows as a wide range, not as a shifted median.
    r = paired_ratio([1.0, 1.0, 5.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0, 5.0], "y")
    assert r == {"y": 1.0, "y_min": 0.2, "y_max": 5.0}
    with pytest.raises(ValueError, match="equally many"):
        paired_ratio([1.0], [1.0, 2.0], "z")


def test_replace_section_keeps_the_prose_around_it() -> None:
    text = "intro\n<!-- bench:a:begin -->\nold\n<!-- bench:a:end -->\noutro\n"
    assert replace_section(text, "a", "new\n") == "intro\n<!-- bench:a:begin -->\nnew\n<!-- bench:a:end -->\noutro\n"
    with pytest.raises(ValueError, match="expected one"):
        replace_section("no markers", "a", "x")
    with pytest.raises(ValueError, match="expected one"):
        replace_section(text + text, "a", "x")


def test_write_section_refuses_a_file_without_markers(tmp_path: Path) -> None:
    p = tmp_path / "doc.md"
    p.write_text("hand-written prose\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="expected one"):
        write_section(p, "a", "x")
    assert p.read_text(encoding="utf-8") == "hand-written prose\n"
    with pytest.raises(SystemExit, match="no such file"):
        write_section(tmp_path / "missing.md", "a", "x")


_HELP = r"""
import contextlib, io, json, runpy, sys
out = {}
for name in sys.argv[1:]:
    buf, code = io.StringIO(), None
    sys.argv = [f"bench/{name}.py", "--help"]
    with contextlib.redirect_stdout(buf):
        try:
            runpy.run_path(f"bench/{name}.py", run_name="__main__")
        except SystemExit as e:
            code = e.code
    out[name] = [code, buf.getvalue()]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def bench_help() -> dict[str, list]:
    """Every bench's `--help`, run as its own __main__ in one interpreter (one torch import for all)."""
    names = [*BENCHES, "init_sweep"]
    r = subprocess.run([sys.executable, "-c", _HELP, *names], cwd=REPO, capture_output=True, text=True,
                       timeout=300, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # ~15 s for all of them (one interpreter): kept out of make test-fast
@pytest.mark.parametrize("name", [*BENCHES, "init_sweep"])
def test_every_bench_offers_write(bench_help: dict[str, list], name: str) -> None:
    code, text = bench_help[name]
    assert code in (0, None), text[-2000:]
    assert "--write" in text and "default:" in text


@pytest.mark.parametrize("name", BENCHES)
def test_each_bench_section_exists_in_its_doc(name: str) -> None:
    text = (REPO / "bench" / f"{name}.py").read_text(encoding="utf-8")
    doc = text.split('DOC = "', 1)[1].split('"', 1)[0]
    body = (REPO / doc).read_text(encoding="utf-8")
    assert f"<!-- bench:{name}:begin -->" in body and f"<!-- bench:{name}:end -->" in body


def test_the_init_sweep_writes_one_section_per_probe() -> None:
    body = (REPO / "docs" / "model.md").read_text(encoding="utf-8")
    for probe in ("bart", "bert"):
        assert f"<!-- bench:init_sweep_{probe}:begin -->" in body and f"<!-- bench:init_sweep_{probe}:end -->" in body


@pytest.mark.slow  # ~9 s
def test_skill_ffn_write_fills_its_section_and_nothing_else(tmp_path: Path) -> None:
    doc = tmp_path / "speed.md"
    doc.write_text("# Speed\n\n<!-- bench:skill_ffn:begin -->\nstale\n<!-- bench:skill_ffn:end -->\n\ntail\n",
                   encoding="utf-8")
    r = subprocess.run([sys.executable, "bench/skill_ffn.py", "--shapes", "small", "--ks", "1,2", "--reps", "2",
                        "--write", str(doc), "--json"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    out = doc.read_text(encoding="utf-8")
    assert "stale" not in out and out.startswith("# Speed\n") and out.endswith("\ntail\n")
    assert "| small | 2 |" in out and "bench/skill_ffn.py --reps 2 --ks 1,2 --shapes small" in out
    res = json.loads(r.stdout.strip().splitlines()[-1])
    assert res["fused_over_dense_min"] <= res["fused_over_dense"] <= res["fused_over_dense_max"]
