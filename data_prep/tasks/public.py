"""Converters from the public formats of the paper's datasets into the task schema.

- CLUE-style JSON lines (ChnSentiCorp, TNEWS, AFQMC, OCNLI and any single/pair classification file),
- CMRC 2018 (SQuAD v1 style JSON),
- BIO-tagged NER files, CoNLL style (`char tag` per line, blank line between sentences), as MSRA/OntoNotes.

Each converter takes `inputs`: either {split: path} (the dataset's own splits, kept as they are) or
{"all": path} (one file, split deterministically by a hash of each record's key).
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .schema import SPLITS, TaskDataError, TaskSpec, _Bad, infer_label_list, iter_jsonl, validate_record
from .splits import DEFAULT_RATIOS, Converted, assign_splits, cap, finalize

Record = dict[str, Any]


@dataclass(frozen=True)
class CluePreset:
    kind: str
    text_field: str
    label_field: str
    text_pair_field: str | None = None
    drop_labels: tuple[str, ...] = ()
    id_field: str | None = "id"


CLUE_PRESETS: dict[str, CluePreset] = {
    "chnsenticorp": CluePreset("single", "sentence", "label"),
    "tnews": CluePreset("single", "sentence", "label_desc"),
    "afqmc": CluePreset("pair", "sentence1", "label", "sentence2"),
    # OCNLI marks items without annotator majority with "-": they have no gold label.
    "ocnli": CluePreset("pair", "sentence1", "label", "sentence2", drop_labels=("-",)),
    "clue-single": CluePreset("single", "sentence", "label"),
    "clue-pair": CluePreset("pair", "sentence1", "label", "sentence2"),
}


def _split_inputs(inputs: dict[str, str | Path] | str | Path) -> dict[str, Path]:
    if isinstance(inputs, (str, Path)):
        return {"all": Path(inputs)}
    bad = [k for k in inputs if k not in (*SPLITS, "all", "unlabelled")]
    if bad:
        raise ValueError(f"unknown split name(s) {bad}; use train, dev, test, unlabelled or all")
    if "all" in inputs and len(inputs) > 1:
        raise ValueError("give either one input for 'all' (split by hash) or inputs per split, not both")
    return {k: Path(v) for k, v in inputs.items()}


def _arrange(per_input: dict[str, list[Record]], key: Callable[[Record], str], *, seed: int,
             ratios: Sequence[float], max_examples: int | None,
             max_eval_examples: int | None) -> dict[str, list[Record]]:
    if "all" in per_input:
        by_split: dict[str, list[Record]] = assign_splits(per_input["all"], key, seed, ratios)
    else:
        by_split = dict(per_input)
    return finalize(by_split, key, seed=seed, max_examples=max_examples, max_eval_examples=max_eval_examples)


def _fail_or_count(path: Path, line: int, bad: _Bad, skip_bad: bool, stats: Counter[str]) -> None:
    if not skip_bad:
        raise TaskDataError(path, line, bad.msg)
    stats[bad.key] += 1


def convert_clue(inputs: dict[str, str | Path] | str | Path, preset: str = "clue-single", *, name: str | None = None,
                 text_field: str | None = None, text_pair_field: str | None = None,
                 label_field: str | None = None, drop_labels: Sequence[str] | None = None,
                 keep_unlabelled: bool = False, skip_bad: bool = False, seed: int = 0,
                 ratios: Sequence[float] = DEFAULT_RATIOS, max_examples: int | None = None,
                 max_eval_examples: int | None = None) -> Converted:
    """CLUE-style JSON lines -> `single` or `pair` classification.

    Records whose label is in `drop_labels` (OCNLI's "-") are dropped and counted. Records without a label
    (CLUE test files) are dropped and counted, or with `keep_unlabelled` go to the `unlabelled` split.
    """
    if preset not in CLUE_PRESETS:
        raise ValueError(f"unknown CLUE preset {preset!r}; valid: {', '.join(CLUE_PRESETS)}")
    p = CLUE_PRESETS[preset]
    tf, lf = text_field or p.text_field, label_field or p.label_field
    pf = text_pair_field or p.text_pair_field
    drop = set(drop_labels if drop_labels is not None else p.drop_labels)
    stats: Counter[str] = Counter()
    per_input: dict[str, list[Record]] = {}
    unlabelled: list[Record] = []
    for split, path in _split_inputs(inputs).items():
        recs: list[Record] = []
        for line, obj in iter_jsonl(path):
            try:
                if isinstance(obj, _Bad):
                    raise obj
                if not isinstance(obj, dict):
                    raise _Bad("wrong type", f"expected a JSON object, got {type(obj).__name__}")
                label = obj.get(lf)
                if label is not None and str(label) in drop:
                    stats[f"dropped label {label!r}"] += 1
                    continue
                rec: Record = {}
                raw_id = obj.get(p.id_field) if p.id_field else None
                rec["id"] = f"{split}-{raw_id}" if raw_id is not None else f"{split}-{line}"
                for src, dst in ((tf, "text"), (pf, "text_pair")):
                    if src is None:
                        continue
                    if src not in obj:
                        raise _Bad("missing field", f"missing field '{src}' (→ '{dst}')")
                    rec[dst] = obj[src]
                if label is None or label == "":
                    rec = validate_record(rec, p.kind, require_labels=False)
                    rec.pop("label", None)
                    stats["unlabelled"] += 1
                    if keep_unlabelled or split == "unlabelled":
                        unlabelled.append(rec)
                    continue
                rec["label"] = str(label) if isinstance(label, int) and not isinstance(label, bool) else label
                recs.append(validate_record(rec, p.kind))
            except _Bad as b:
                _fail_or_count(path, line, b, skip_bad, stats)
        if split != "unlabelled":
            per_input[split] = recs
    # The label list comes from all labelled records before any cap, so a small slice keeps every class.
    labels = infer_label_list(p.kind, (r["label"] for recs in per_input.values() for r in recs))
    key = lambda r: r["text"] + "\x00" + r.get("text_pair", "")  # noqa: E731
    splits = _arrange(per_input, key, seed=seed, ratios=ratios, max_examples=max_examples,
                      max_eval_examples=max_eval_examples)
    if unlabelled:
        splits["unlabelled"] = cap(unlabelled, max_eval_examples, key, seed)
    spec = TaskSpec(name=name or preset, kind=p.kind, label_list=labels, source=f"CLUE-style JSON lines ({preset})")
    return Converted(spec, splits, stats)


def convert_squad(inputs: dict[str, str | Path] | str | Path, *, name: str = "cmrc2018", skip_bad: bool = False,
                  seed: int = 0, ratios: Sequence[float] = DEFAULT_RATIOS, max_examples: int | None = None,
                  max_eval_examples: int | None = None) -> Converted:
    """CMRC 2018 / SQuAD v1 JSON (`data[].paragraphs[].qas[]`) -> `span` records.

    An answer whose `answer_start` does not point at its text is re-anchored to the occurrence of the text
    nearest to the given offset (counted as `answer re-anchored`); an answer whose text is not in the context
    is dropped (`answer not in context`); a question left with no answer is dropped (`question without
    answer`). Duplicate answers (CMRC dev lists up to 3, often equal) are kept once.
    """
    stats: Counter[str] = Counter()
    per_input: dict[str, list[Record]] = {}
    for split, path in _split_inputs(inputs).items():
        try:
            text = Path(path).read_text(encoding="utf-8-sig")
            raw = json.loads(text)
        except FileNotFoundError:
            raise TaskDataError(path, 0, "file not found") from None
        except UnicodeDecodeError as e:
            raise TaskDataError(path, 1, f"invalid UTF-8 at byte {e.start}") from None
        except json.JSONDecodeError as e:
            raise TaskDataError(path, e.lineno, f"invalid JSON: {e.msg} at column {e.colno}") from None
        data = raw.get("data") if isinstance(raw, dict) else None
        if not isinstance(data, list):
            raise TaskDataError(path, 1, "not SQuAD-style JSON: expected an object with a 'data' array")
        recs: list[Record] = []
        for ai, article in enumerate(data):
            for pi, para in enumerate(article.get("paragraphs", []) if isinstance(article, dict) else []):
                where = f"data[{ai}].paragraphs[{pi}]"
                context = para.get("context") if isinstance(para, dict) else None
                if not isinstance(context, str) or not context.strip():
                    _fail_or_count(path, _line_of(text, para), _Bad("missing field", f"{where}: missing or empty 'context'"),
                                   skip_bad, stats)
                    continue
                for qi, qa in enumerate(para.get("qas", [])):
                    try:
                        recs.append(_squad_qa(qa, context, f"{where}.qas[{qi}]", split, stats))
                    except _Bad as b:
                        # SQuAD JSON is usually one line: point at the record by its JSON path instead.
                        _fail_or_count(path, _line_of(text, qa), b, skip_bad, stats)
        per_input[split] = recs
    seen: Counter[str] = Counter(r["id"] for recs in per_input.values() for r in recs)
    for split, recs in per_input.items():
        for r in recs:
            if seen[r["id"]] > 1:  # the same id in two files (or twice in one): the split tells them apart
                r["id"] = f"{split}-{r['id']}"
                stats["id shared, prefixed by its split"] += 1
    splits = _arrange(per_input, lambda r: r["id"], seed=seed, ratios=ratios, max_examples=max_examples,
                      max_eval_examples=max_eval_examples)
    return Converted(TaskSpec(name=name, kind="span", source="SQuAD-style JSON (CMRC 2018)"), splits, stats)


def _line_of(text: str, obj: Any) -> int:
    """Best-effort line of a JSON object inside a pretty-printed file: where its id or question is."""
    if isinstance(obj, dict):
        for k in ("id", "question", "context"):
            v = obj.get(k)
            if isinstance(v, str) and v:
                i = text.find(json.dumps(v, ensure_ascii=False))
                if i < 0:
                    i = text.find(json.dumps(v))
                if i >= 0:
                    return text.count("\n", 0, i) + 1
    return 1


def _squad_qa(qa: Any, context: str, where: str, split: str, stats: Counter[str]) -> Record:
    if not isinstance(qa, dict):
        raise _Bad("wrong type", f"{where}: expected an object")
    q = qa.get("question")
    if not isinstance(q, str) or not q.strip():
        raise _Bad("missing field", f"{where}: missing or empty 'question'")
    qid = qa.get("id", where)
    answers: list[dict[str, Any]] = []
    for a in qa.get("answers", []) or []:
        text = a.get("text") if isinstance(a, dict) else None
        start = a.get("answer_start", -1) if isinstance(a, dict) else -1
        if not isinstance(text, str) or not text.strip():
            stats["empty answer"] += 1
            continue
        if not isinstance(start, int) or start < 0 or context[start:start + len(text)] != text:
            # Offsets in CMRC are occasionally off by a few characters (or -1): re-anchor to the nearest hit.
            hits = [i for i in range(len(context)) if context.startswith(text, i)]
            if not hits:
                stats["answer not in context"] += 1
                continue
            start = min(hits, key=lambda i: abs(i - (start if isinstance(start, int) else 0)))
            stats["answer re-anchored"] += 1
        if any(x["text"] == text and x["start"] == start for x in answers):
            continue
        answers.append({"text": text, "start": start})
    if not answers:
        raise _Bad("question without answer", f"{where} (id {qid}): no answer found in its context")
    # the dataset's own id, as given (a question without one is named by its split and JSON path)
    rec: Record = {"id": str(qid) if "id" in qa else f"{split}-{where}", "context": context, "question": q,
                   "answers": answers}
    return validate_record(rec, "span")


# ------------------------------------------------------------------------------------------- CoNLL NER

def to_bio(tags: list[str]) -> list[str]:
    """Normalise BIOES / BMES / IOB1 tags to strict BIO (IOB2): S-→B-, E-/M-→I-, and an I- that does not
    continue an entity of its type becomes B-."""
    out: list[str] = []
    prev = "O"
    for t in tags:
        if t in ("O", "o", "-"):
            t = "O"
        else:
            pre, _, typ = t.partition("-")
            if not typ:
                raise _Bad("invalid BIO tag", f"tag {t!r} is neither O nor PREFIX-TYPE")
            pre = pre.upper()
            if pre == "S":
                pre = "B"
            elif pre in ("E", "M"):
                pre = "I"
            elif pre not in ("B", "I"):
                raise _Bad("invalid BIO tag", f"tag {t!r}: unknown prefix {pre!r} (expected B/I/E/S/M)")
            if pre == "I" and (prev == "O" or prev[2:] != typ):
                pre = "B"
            t = f"{pre}-{typ}"
        out.append(t)
        prev = t
    return out


def read_conll(path: str | Path, *, skip_bad: bool = False, stats: Counter[str] | None = None,
               id_prefix: str = "") -> list[Record]:
    """CoNLL-style BIO file: one `token tag` per line (whitespace or tab separated; the tag is the last
    column, the token the first), a blank line between sentences, `-DOCSTART-` lines ignored."""
    stats = stats if stats is not None else Counter()
    path = Path(path)
    if not path.exists():
        raise TaskDataError(path, 0, "file not found")
    out: list[Record] = []
    tokens: list[str] = []
    tags: list[str] = []
    start_line = 0
    bad: tuple[int, _Bad] | None = None

    def flush() -> None:
        nonlocal tokens, tags, bad
        if tokens or bad:
            try:
                if bad is not None:
                    raise bad[1]
                rec = {"id": f"{id_prefix}{path.name}:{start_line}", "tokens": tokens, "labels": to_bio(tags)}
                out.append(validate_record(rec, "tagging"))
            except _Bad as b:
                _fail_or_count(path, bad[0] if bad else start_line, b, skip_bad, stats)
        tokens, tags, bad = [], [], None

    with open(path, "rb") as f:
        for line_no, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8-sig" if line_no == 1 else "utf-8").rstrip("\r\n")
            except UnicodeDecodeError as e:
                bad = bad or (line_no, _Bad("invalid UTF-8", f"invalid UTF-8 at byte {e.start}"))
                continue
            if not line.strip():
                flush()
                continue
            if line.startswith("-DOCSTART-"):
                continue
            cols = line.split()
            if not tokens and bad is None:
                start_line = line_no
            if len(cols) < 2:
                bad = bad or (line_no, _Bad("wrong type", f"expected 'token tag', got {line.strip()!r}"))
                continue
            tokens.append(cols[0])
            tags.append(cols[-1])
        flush()
    return out


def convert_conll(inputs: dict[str, str | Path] | str | Path, *, name: str = "ner", skip_bad: bool = False,
                  seed: int = 0, ratios: Sequence[float] = DEFAULT_RATIOS, max_examples: int | None = None,
                  max_eval_examples: int | None = None) -> Converted:
    """BIO-tagged NER files (CoNLL style) -> `tagging` records (tags normalised to BIO, see `to_bio`)."""
    stats: Counter[str] = Counter()
    per_input = {split: read_conll(path, skip_bad=skip_bad, stats=stats, id_prefix=f"{split}-")
                 for split, path in _split_inputs(inputs).items()}
    labels = infer_label_list("tagging", (r["labels"] for recs in per_input.values() for r in recs))
    splits = _arrange(per_input, lambda r: "".join(r["tokens"]), seed=seed, ratios=ratios,
                      max_examples=max_examples, max_eval_examples=max_eval_examples)
    return Converted(TaskSpec(name=name, kind="tagging", label_list=labels, source="CoNLL-style BIO file"),
                     splits, stats)
