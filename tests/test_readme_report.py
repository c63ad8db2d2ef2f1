"""The README's claims about the committed report stay true.

The report records the sizes it ran (its "What this run cut" section, written from the profile by
experiments/report.py); `make reproduce` runs the profile its command line picks. Where the two agree, the
README may say `make reproduce` rewrites the report at its size. Where they differ (the profile grew and the
rerun has not landed), the README must not say so: it names the commit the committed report came from and
the sizes that report ran, so a reader knows which numbers stand behind it.
"""

from __future__ import annotations

import re
import shlex
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from skillnet.experiments.__main__ import build_parser
from skillnet.experiments.profiles import PROFILES, Profile

REPO = Path(__file__).resolve().parents[1]
SAME_SIZE_CLAIM = "at the size of the committed results"

# field of Profile <- how the report's first section states it (experiments/report.py `cuts`)
_RECORDED = {
    "dense_pt_steps": r"Pre-training: (\d+) dense steps",
    "sparse_pt_steps": r"then (\d+) sparse steps",
    "nlu_steps": r"- Fine-tuning: (\d+) steps of batch \d+ on at most \d+ training examples per task \(paper",
    "bart_pt_steps": r"BART pre-training: (\d+) denoising steps",
    "nlg_steps": r"- Fine-tuning: (\d+) steps of batch \d+ on at most \d+ training examples per task, peak lr",
}


def recorded_profile(report: str) -> tuple[str, dict[str, int]]:
    name = re.search(r"\(profile `(\w+)`\)", report)
    assert name, "the report does not name its profile"
    sizes = {}
    for field, pattern in _RECORDED.items():
        m = re.search(pattern, report)
        assert m, f"the report does not record {field} ({pattern})"
        sizes[field] = int(m.group(1))
    return name.group(1), sizes


def make_reproduce_profile(makefile: str) -> Profile:
    line = next(ln for ln in makefile.splitlines() if "scripts/reproduce.py" in ln and "--quick" not in ln)
    args = build_parser().parse_args(shlex.split(line.split("scripts/reproduce.py", 1)[1]))
    return PROFILES["quick" if args.quick else args.profile]


def problems(readme: str, report: str, runs: Profile, report_commit: str | None) -> list[str]:
    """What the README says wrongly about the committed report, given the profile `make reproduce` runs and the
    commit that last wrote the report (None where git cannot say)."""
    text = " ".join(readme.split())
    name, sizes = recorded_profile(report)
    differ = {f: v for f, v in sizes.items() if getattr(runs, f) != v}
    if name == runs.name and not differ:
        return []
    out = []
    if SAME_SIZE_CLAIM in text:
        out.append(f"README claims `make reproduce` runs {SAME_SIZE_CLAIM}, but the report ran profile {name} "
                   f"with {sizes} and make reproduce runs {runs.name} with "
                   f"{ {f: getattr(runs, f) for f in differ} }")
    named = re.search(r"committed report is an earlier `(\w+)` profile's, from commit ([0-9a-f]{7,40})", text)
    if not named:
        return [*out, "README does not say which profile and commit the committed report came from"]
    if named.group(1) != name:
        out.append(f"README names profile {named.group(1)} for the report, which ran {name}")
    if report_commit is not None and not report_commit.startswith(named.group(2)):
        out.append(f"README names commit {named.group(2)}; docs/report.md was last written by {report_commit[:7]}")
    for field, v in differ.items():
        if f"{v:,}" not in text:
            out.append(f"README does not state the report's {field} ({v:,})")
    return out


def _last_commit(path: str) -> str | None:
    try:
        out = subprocess.run(["git", "log", "-1", "--format=%H", "--", path], cwd=REPO, capture_output=True,
                             text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return out or None


def test_readme_says_which_profile_the_committed_report_ran() -> None:
    runs = make_reproduce_profile((REPO / "Makefile").read_text())
    assert problems((REPO / "README.md").read_text(), (REPO / "docs/report.md").read_text(), runs,
                    _last_commit("docs/report.md")) == []


REPORT = """Written by `scripts/reproduce.py` (profile `full`) from the outputs of its stages.
- Pre-training: 4000 dense steps of 32 sequences (one process), then 500 sparse steps of 2 x 32 sequences
- Fine-tuning: 2400 steps of batch 8 on at most 4000 training examples per task (paper: full datasets)
- BART pre-training: 1600 denoising steps of 2 x 16 sequences
- Fine-tuning: 800 steps of batch 16 on at most 3000 training examples per task, peak lr 0.002
"""


@pytest.mark.parametrize("readme, expected", [
    ("`make reproduce` runs the same stages at the size of the committed results.", [SAME_SIZE_CLAIM, "does not say"]),
    ("the committed report is an earlier `full` profile's, from commit abc1234: 4,000 dense, 2,400 NLU", []),
    ("the committed report is an earlier `full` profile's, from commit abc1234: 4,000 dense steps", ["nlu_steps"]),
    ("the committed report is an earlier `full` profile's, from commit def5678: 4,000, 2,400", ["abc1234"]),
])
def test_problems_catches_a_stale_claim(readme: str, expected: list[str]) -> None:
    grown = replace(PROFILES["full"], dense_pt_steps=8000, sparse_pt_steps=500, nlu_steps=4800, bart_pt_steps=1600,
                    nlg_steps=800)
    found = problems(readme, REPORT, grown, "abc1234" + "0" * 33)
    assert len(found) == len(expected) and all(e in f for e, f in zip(expected, found, strict=True)), found


def test_no_problem_when_the_profile_is_the_reports() -> None:
    same = replace(PROFILES["full"], dense_pt_steps=4000, sparse_pt_steps=500, nlu_steps=2400, bart_pt_steps=1600,
                   nlg_steps=800)
    assert problems(f"runs the stages {SAME_SIZE_CLAIM}.", REPORT, same, None) == []
