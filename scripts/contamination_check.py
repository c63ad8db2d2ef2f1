"""An independent check of how much dev and test text a reproduction's pre-training corpus holds verbatim.

    python scripts/contamination_check.py runs/reproduce-full [--min-chars 24]

Takes every distinct text field of at least --min-chars characters of every dev and test example of every
task under <folder>/tasks (every string in a record; a tagging record's tokens joined into its sentence), and
counts those that occur as a verbatim substring of <folder>/corpus/corpus.txt and of its held-out file. It
shares no code with the project's decontamination (data_prep/decontaminate.py): no normalisation, no n-grams,
plain `in`, so that it can disagree with it. Prints one line per task, then one JSON object last.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def strings(value: Any) -> Iterator[str]:
    """Every string inside a record's value (lists and objects walked)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        # a tagging record's tokens are characters: the text is their concatenation, not each character
        if value and all(isinstance(v, str) and len(v) <= 2 for v in value):
            yield "".join(value)
        else:
            for v in value:
                yield from strings(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from strings(v)


def pieces(tasks: Path, min_chars: int) -> dict[str, set[str]]:
    """task -> its distinct dev/test text fields of at least `min_chars` characters."""
    out: dict[str, set[str]] = {}
    for task_dir in sorted(p for p in tasks.iterdir() if (p / "task.json").is_file()):
        found: set[str] = set()
        for split in ("dev", "test"):
            f = task_dir / f"{split}.jsonl"
            if not f.is_file():
                continue
            for line in f.read_text(encoding="utf-8").splitlines():
                if line.strip():
                    rec = json.loads(line)
                    rec.pop("id", None)
                    found.update(s for s in strings(rec) if len(s) >= min_chars)
        out[task_dir.name] = found
    return out


def count(texts: dict[str, set[str]], corpus: str) -> dict[str, dict[str, int]]:
    return {t: {"pieces": len(s), "found": sum(1 for x in s if x in corpus)} for t, s in texts.items()}


def totals(texts: dict[str, set[str]], corpus: str) -> dict[str, Any]:
    # a piece that two tasks share (qa_match's and answer_select's answers) counts once here, once per task below
    every = set().union(*texts.values())
    k = sum(1 for x in every if x in corpus)
    return {"pieces": len(every), "found": k, "share": round(k / len(every), 4) if every else 0.0}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    ap.add_argument("folder", type=Path, help="a reproduction's --out folder (with corpus/ and tasks/)")
    ap.add_argument("--min-chars", type=int, default=24, help="shortest text field counted")
    a = ap.parse_args(argv)
    corpus_file, heldout_file = a.folder / "corpus" / "corpus.txt", a.folder / "corpus" / "heldout.txt"
    if not corpus_file.is_file() or not (a.folder / "tasks").is_dir():
        print(f"error: {a.folder} has no corpus/corpus.txt or tasks/: run the data stages first", file=sys.stderr)
        return 2
    t0 = time.time()
    texts = pieces(a.folder / "tasks", a.min_chars)
    result: dict[str, Any] = {"folder": str(a.folder), "min_chars": a.min_chars}
    for name, f in (("corpus", corpus_file), ("heldout", heldout_file)):
        if not f.is_file():
            continue
        text = f.read_text(encoding="utf-8")
        result[name] = {**totals(texts, text), "by_task": count(texts, text)}
    for task, v in result["corpus"]["by_task"].items():
        held = result.get("heldout", {}).get("by_task", {}).get(task, {}).get("found", 0)
        print(f"{task:<22} {v['found']:>6,} of {v['pieces']:>6,} dev/test texts in the corpus; {held:,} in held-out")
    c = result["corpus"]
    print(f"{'all (distinct)':<22} {c['found']:>6,} of {c['pieces']:>6,} ({c['share']:.2%})")
    result["seconds"] = round(time.time() - t0, 1)
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
