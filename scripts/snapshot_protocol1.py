"""Keep the committed protocol-1 run's numbers before a rebuilt report overwrites them (issue 56).

    python scripts/snapshot_protocol1.py [--commit COMMIT] [--out results/protocol1/tables.json]

Reads docs/report.md, docs/comparison.md and docs/nlg.md as they are at COMMIT (default HEAD; `git show
COMMIT:path`, so a working tree already rebuilt does not matter) and writes their results tables (mean and std of
every row and task), the claims with their verdicts, and the budgets the report states, with the commit they came
from. The report's "What changed since the last committed run" section (experiments/report_changes.py) reads it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from skillnet.experiments.report_protocol import PROTOCOL as PROTOCOL_HEADING
from skillnet.experiments.report_snapshot import snapshot

REPO = Path(__file__).resolve().parents[1]
MAIN = "docs/report.md"
HALVES = {"nlu": "docs/comparison.md", "nlg": "docs/nlg.md"}  # the same run's half reports (PARTS in stages.py)
PROTOCOL = 1  # experiments/parts.py PROTOCOL_VERSION of the run these files show


def git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, check=True).stdout


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--commit", default="HEAD", help="the commit whose docs/ to read (default HEAD)")
    p.add_argument("--out", type=Path, default=REPO / "results" / "protocol1" / "tables.json")
    a = p.parse_args(argv)
    try:
        commit = git("rev-parse", "--verify", f"{a.commit}^{{commit}}").strip()
        main_text = git("show", f"{commit}:{MAIN}")
        halves = {part: (path, git("show", f"{commit}:{path}")) for part, path in HALVES.items()}
    except subprocess.CalledProcessError as e:
        print(f"error: {' '.join(e.cmd)}: {e.stderr.strip()}", file=sys.stderr)
        return 1
    if f"## {PROTOCOL_HEADING}" in main_text:  # protocol 2 wrote that section; protocol 1 had none
        print(f"error: {MAIN} at {commit[:12]} is already a protocol-2 report; pass --commit, the last commit whose "
              f"docs are protocol 1's (`git log -- {MAIN}`)", file=sys.stderr)
        return 1
    snap = snapshot((MAIN, main_text), halves, commit, PROTOCOL)
    if snap["profile"] != "full":  # the committed docs are the full profile's; anything else is not that run
        print(f"error: {MAIN} at {commit[:12]} is of profile {snap['profile']!r}, not 'full'", file=sys.stderr)
        return 1
    # the commit that wrote each file: COMMIT may be any later one that left them as they were
    snap["written_in"] = {f: git("log", "-1", "--format=%H", commit, "--", f).strip() for f in snap["files"]}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(snap, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    rows = sum(len(t["rows"]) for t in snap["tables"].values())
    print(f"{a.out}: {len(snap['tables'])} tables ({rows} rows), {len(snap['claims'])} claims, "
          f"{len(snap['budgets'])} budgets from {commit[:12]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
