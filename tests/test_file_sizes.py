"""The size rule: no library file over 600 lines.

A file that grows past it is split along a seam (a concern of its own with its own module), not cut at line
600: the rule exists so that one file can be read whole, and a module is found by its name. tests/, bench/
and docs/ are outside the library (a test file reads as a list of cases; the docs are prose).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LIMIT = 600
OUTSIDE = ("tests", "bench", "docs")
# Code a reader opens: Python, and the shell and Slurm job files the README tells them to run.
SUFFIXES = (".py", ".sh", ".sbatch")


def _library_files(root: Path) -> list[Path]:
    try:
        # tracked files and new ones git does not ignore: runs/, build/ and caches are not the library
        listed = subprocess.run(
            ["git", "ls-files", "-co", "--exclude-standard"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        listed = [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()]
    return [
        root / name for name in sorted(listed)
        if name.endswith(SUFFIXES) and name.split("/")[0] not in OUTSIDE and (root / name).is_file()
    ]


def _over(root: Path) -> list[str]:
    out = []
    for path in _library_files(root):
        with path.open("rb") as f:
            n = sum(1 for _ in f)
        if n > LIMIT:
            out.append(f"{path.relative_to(root)}: {n} lines")
    return out


def test_no_library_file_over_600_lines() -> None:
    assert _library_files(REPO), "no library file found: the listing is broken, not the rule kept"
    assert _over(REPO) == [], f"over {LIMIT} lines (split along a seam): {_over(REPO)}"


def test_the_rule_catches_a_long_file_and_ignores_tests(tmp_path: Path) -> None:
    (tmp_path / "model").mkdir()
    (tmp_path / "tests").mkdir()
    (tmp_path / "model" / "ok.py").write_text("x = 1\n" * LIMIT)
    (tmp_path / "model" / "long.py").write_text("x = 1\n" * (LIMIT + 1))
    (tmp_path / "tests" / "test_long.py").write_text("x = 1\n" * (LIMIT + 50))
    assert _over(tmp_path) == [f"model/long.py: {LIMIT + 1} lines"]
