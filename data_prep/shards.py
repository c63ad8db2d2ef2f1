"""Shard format: `<name>.bin` token ids, `<name>.idx` sentence/document boundaries, `manifest.json`.

    <name>.bin   raw little-endian token ids, uint16 if the vocab fits else uint32
    <name>.idx   b"SKNIDX01", uint64 n_tokens, n_sentences, n_documents,
                 uint64[n_sentences] cumulative token end of each sentence,
                 uint64[n_documents] cumulative sentence end of each document
    <name>.ww    (optional, --whole-word) np.packbits of a per-token "starts a word" flag
    <name>.json  the shard's record (counts, checksums, inputs); written last = the shard is finished
    manifest.json  all records + tokenizer fingerprint + build settings + bad-input report

Every file is written to `*.tmp` and renamed, so a crash never leaves a file that looks finished.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
from skillnet.common import files as fileio

FORMAT = "skillnet-shards"
FORMAT_VERSION = 1
IDX_MAGIC = b"SKNIDX01"
IDX_HEADER_BYTES = len(IDX_MAGIC) + 3 * 8


class ShardError(RuntimeError):
    """A shard directory is missing, truncated, corrupted or inconsistent; the message names the file."""


def atomic_write_json(path: Path, obj: dict) -> None:
    """The shard folder's JSON files (records, manifests; one space of indent). Each has one writer (the job
    of its shard, the merge), which first removes what a killed earlier write of the file left."""
    fileio.remove_temporaries(path)
    fileio.atomic_write_json(path, obj, indent=1)


class ShardWriter:
    """Streams one shard to temp files; `finish()` makes it visible atomically."""

    def __init__(self, out_dir: Path, name: str, dtype: np.dtype, whole_word: bool = False) -> None:
        self.out_dir, self.name, self.dtype = Path(out_dir), name, np.dtype(dtype)
        self.whole_word = whole_word
        p = self.out_dir / name
        self._paths = {k: Path(f"{p}.{k}.tmp") for k in ("bin", "sent", "doc", "ww")}
        self._f = {k: open(v, "wb") for k, v in self._paths.items() if k != "ww" or whole_word}  # noqa: SIM115
        self._h_bin = hashlib.sha256()
        self._h_ww = hashlib.sha256()
        self.n_tokens = 0
        self.n_sentences = 0
        self.n_documents = 0
        self._ww_carry = np.zeros(0, dtype=bool)

    def add(
        self,
        flat_ids: np.ndarray,
        sent_end: np.ndarray,
        doc_end: np.ndarray,
        word_start: np.ndarray | None = None,
    ) -> None:
        """flat_ids: tokens of whole documents; sent_end/doc_end: batch-local cumulative ends (tokens/sentences)."""
        b = np.ascontiguousarray(flat_ids, dtype=self.dtype).tobytes()
        self._h_bin.update(b)
        self._f["bin"].write(b)
        self._f["sent"].write((sent_end.astype(np.uint64) + np.uint64(self.n_tokens)).tobytes())
        self._f["doc"].write((doc_end.astype(np.uint64) + np.uint64(self.n_sentences)).tobytes())
        if self.whole_word:
            assert word_start is not None and len(word_start) == len(flat_ids)
            bits = np.concatenate([self._ww_carry, word_start.astype(bool)])
            keep = len(bits) - len(bits) % 8
            packed = np.packbits(bits[:keep]).tobytes()
            self._h_ww.update(packed)
            self._f["ww"].write(packed)
            self._ww_carry = bits[keep:]
        self.n_tokens += len(flat_ids)
        self.n_sentences += len(sent_end)
        self.n_documents += len(doc_end)

    def abort(self) -> None:
        for f in self._f.values():
            f.close()
        for p in self._paths.values():
            p.unlink(missing_ok=True)

    def finish(self, record: dict) -> dict:
        """Renames the shard into place and writes its record (the 'finished' marker) last."""
        if self.whole_word and len(self._ww_carry):
            packed = np.packbits(self._ww_carry).tobytes()
            self._h_ww.update(packed)
            self._f["ww"].write(packed)
        for f in self._f.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()
        p = self.out_dir / self.name
        idx_tmp = Path(f"{p}.idx.tmp")
        h_idx = hashlib.sha256()
        with open(idx_tmp, "wb") as out:
            header = (
                IDX_MAGIC
                + np.array([self.n_tokens, self.n_sentences, self.n_documents], dtype="<u8").tobytes()
            )
            out.write(header)
            h_idx.update(header)
            for k in ("sent", "doc"):
                with open(self._paths[k], "rb") as src:
                    while chunk := src.read(8 << 20):
                        out.write(chunk)
                        h_idx.update(chunk)
            out.flush()
            os.fsync(out.fileno())
        files = {
            "bin": {"bytes": self.n_tokens * self.dtype.itemsize, "sha256": self._h_bin.hexdigest()},
            "idx": {
                "bytes": IDX_HEADER_BYTES + 8 * (self.n_sentences + self.n_documents),
                "sha256": h_idx.hexdigest(),
            },
        }
        os.replace(self._paths["bin"], f"{p}.bin")
        os.replace(idx_tmp, f"{p}.idx")
        if self.whole_word:
            files["ww"] = {"bytes": (self.n_tokens + 7) // 8, "sha256": self._h_ww.hexdigest()}
            os.replace(self._paths["ww"], f"{p}.ww")
        for k in ("sent", "doc"):
            self._paths[k].unlink(missing_ok=True)
        record = {
            "name": self.name,
            **record,
            "num_tokens": self.n_tokens,
            "num_sentences": self.n_sentences,
            "num_documents": self.n_documents,
            "files": files,
        }
        atomic_write_json(record_path(self.out_dir, self.name), record)
        return record


def record_path(out_dir: Path, name: str) -> Path:
    return Path(out_dir) / f"{name}.json"


def shard_is_finished(out_dir: Path, name: str, expect: dict) -> dict | None:
    """The shard's record if it is complete and was built from the same unit and settings, else None."""
    rp = record_path(out_dir, name)
    if not rp.is_file():
        return None
    try:
        rec = json.loads(rp.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if any(rec.get(k) != v for k, v in expect.items()):
        return None
    for ext, meta in rec.get("files", {}).items():
        f = Path(out_dir) / f"{name}.{ext}"
        if not f.is_file() or f.stat().st_size != meta["bytes"]:
            return None
    return rec


# ---- reading ------------------------------------------------------------------------------------------


def load_manifest(shard_dir: str | os.PathLike) -> dict:
    d = Path(shard_dir)
    mp = d / "manifest.json"
    if not mp.is_file():
        parts = sorted(d.glob("manifest.part-*.json"))
        hint = (
            f" (found {len(parts)} per-job manifests: run `python -m skillnet.data_prep merge {d}`)" if parts else ""
        )
        raise ShardError(
            f"{mp}: no manifest; is this a shard directory built by `python -m skillnet.data_prep build`?{hint}"
        )
    try:
        m = json.loads(mp.read_text(encoding="utf-8"))
    except ValueError as e:
        raise ShardError(f"{mp}: not valid JSON ({e})") from e
    if m.get("format") != FORMAT or m.get("format_version") != FORMAT_VERSION:
        raise ShardError(
            f"{mp}: format {m.get('format')!r} v{m.get('format_version')!r}, expected {FORMAT!r} v{FORMAT_VERSION}"
        )
    return m


def verify_shard(shard_dir: Path, rec: dict, level: str = "full", tokenizer: dict | None = None) -> None:
    """Raises ShardError naming the file and the problem unless the shard is loadable.

    Every level checks that each file exists with its recorded size. level="full" also checks the
    sha256 and what a checksum recomputed after an edit would not catch: the `.idx` offsets are
    increasing and end with the `.bin`, and (given the manifest's `tokenizer`) every token id is below
    the vocab size, computed in the same pass over the `.bin` as its sha256.
    """
    for ext, meta in rec["files"].items():
        f = Path(shard_dir) / f"{rec['name']}.{ext}"
        if not f.is_file():
            raise ShardError(f"shard file missing: {f}")
        size = f.stat().st_size
        if size != meta["bytes"]:
            raise ShardError(
                f"shard file truncated or wrong size: {f} has {size} bytes, manifest says {meta['bytes']}"
            )
    if level != "full":
        return
    for ext, meta in rec["files"].items():
        f = Path(shard_dir) / f"{rec['name']}.{ext}"
        dtype = tokenizer["dtype"] if (ext == "bin" and tokenizer) else None
        digest, max_id = _sha256_and_max(f, dtype)
        if digest != meta["sha256"]:
            raise ShardError(f"shard file corrupted (sha256 mismatch): {f}")
        if max_id is not None:
            check_token_ids(f, max_id, int(tokenizer["vocab_size"]), dtype)  # type: ignore[index]
    sent_end, doc_end = read_idx(Path(shard_dir) / f"{rec['name']}.idx", rec)
    check_index(Path(shard_dir) / f"{rec['name']}.idx", sent_end, doc_end, int(rec["num_tokens"]))


def _sha256_and_max(path: Path, dtype: str | None, bufsize: int = 8 << 20) -> tuple[str, int | None]:
    """sha256 of a file and, for a token file, its largest id (one read of the file)."""
    h = hashlib.sha256()
    top = -1 if dtype else None
    with open(path, "rb") as f:
        while chunk := f.read(bufsize):  # bufsize is a multiple of every id width
            h.update(chunk)
            if dtype and chunk:
                top = max(top, int(np.frombuffer(chunk, dtype=dtype).max()))
    return h.hexdigest(), top


def check_token_ids(path: Path, max_id: int, vocab_size: int, dtype: str) -> None:
    """Raises ShardError naming the first token id >= vocab_size (found with one more pass, only then)."""
    if max_id < vocab_size:
        return
    toks = np.memmap(path, dtype=dtype, mode="r")
    pos = int(np.argmax(toks >= vocab_size))
    raise ShardError(
        f"{path}: token id {int(toks[pos])} at position {pos} >= vocab size {vocab_size} of the manifest's "
        f"tokenizer; the shard was edited or built with another vocab: rebuild it"
    )


def check_index(path: Path, sent_end: np.ndarray, doc_end: np.ndarray, n_tokens: int) -> None:
    """Raises ShardError unless sentence ends (tokens) and document ends (sentences) are strictly
    increasing and the last ones end the shard: every token in a sentence, every sentence in a document,
    nothing past the end of the `.bin`."""
    bin_name = path.with_suffix(".bin").name
    for what, ends, total, unit in (
        ("sentence", sent_end, n_tokens, "tokens"),
        ("document", doc_end, len(sent_end), "sentences"),
    ):
        e = np.asarray(ends).astype(np.int64)  # uint64 beyond 2**63 turns negative: caught below
        if len(e) == 0:
            if total:
                raise ShardError(f"{path}: no {what} ends for {total} {unit}")
            continue
        if e[0] <= 0:
            raise ShardError(f"{path}: {what} ends not increasing: the first one is {e[0]}")
        step = np.flatnonzero(np.diff(e) <= 0)
        if len(step):
            i = int(step[0])
            raise ShardError(
                f"{path}: {what} ends not increasing at {what} {i + 1} ({e[i]} then {e[i + 1]}); "
                f"the index was edited or is corrupt: rebuild the shard"
            )
        if e[-1] > total:
            where = f"past the end of {bin_name}" if what == "sentence" else "past the last sentence"
            raise ShardError(f"{path}: {what} ends point {where}: {e[-1]} > {total} {unit}")
        if e[-1] < total:
            raise ShardError(f"{path}: the last {what} ends at {e[-1]} but the shard has {total} {unit}")


def verify_dir(shard_dir: str | os.PathLike, level: str = "full", progress: bool = False) -> dict:
    m = load_manifest(shard_dir)
    recs = m["shards"]
    if progress:
        from tqdm import tqdm

        recs = tqdm(recs, desc="verify", unit="shard")
    for rec in recs:
        verify_shard(Path(shard_dir), rec, level, m["tokenizer"])
    return m


def read_idx(path: Path, rec: dict | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(sent_end[n_sentences], doc_end[n_documents]) as uint64 arrays (memory-mapped)."""
    with open(path, "rb") as f:
        head = f.read(IDX_HEADER_BYTES)
    if len(head) < IDX_HEADER_BYTES or head[:8] != IDX_MAGIC:
        raise ShardError(f"{path}: not a shard index (bad header)")
    n_tok, n_sent, n_doc = (int(x) for x in np.frombuffer(head[8:], dtype="<u8"))
    if rec is not None and (n_tok, n_sent, n_doc) != (
        rec["num_tokens"],
        rec["num_sentences"],
        rec["num_documents"],
    ):
        raise ShardError(f"{path}: header counts {(n_tok, n_sent, n_doc)} disagree with the manifest")
    if path.stat().st_size != IDX_HEADER_BYTES + 8 * (n_sent + n_doc):
        raise ShardError(f"{path}: truncated index")
    if n_sent + n_doc == 0:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint64)
    mm = np.memmap(path, dtype="<u8", mode="r", offset=IDX_HEADER_BYTES, shape=(n_sent + n_doc,))
    return mm[:n_sent], mm[n_sent:]


def open_tokens(shard_dir: Path, rec: dict, dtype: str) -> np.ndarray:
    f = Path(shard_dir) / f"{rec['name']}.bin"
    if rec["num_tokens"] == 0:
        return np.zeros(0, dtype=dtype)
    return np.memmap(f, dtype=dtype, mode="r", shape=(rec["num_tokens"],))


def read_word_starts(shard_dir: Path, rec: dict) -> np.ndarray | None:
    if "ww" not in rec["files"]:
        return None
    packed = np.fromfile(Path(shard_dir) / f"{rec['name']}.ww", dtype=np.uint8)
    return np.unpackbits(packed, count=rec["num_tokens"]).astype(bool)


def iter_documents_ids(shard_dir: str | os.PathLike) -> Iterator[list[np.ndarray]]:
    """Every document, in order, as a list of sentence token arrays (for tests and `show`; not fast)."""
    d = Path(shard_dir)
    m = load_manifest(d)
    for rec in m["shards"]:
        toks = open_tokens(d, rec, m["tokenizer"]["dtype"])
        sent_end, doc_end = read_idx(d / f"{rec['name']}.idx", rec)
        s_start = np.concatenate([[0], sent_end[:-1]]).astype(np.int64)
        d0 = 0
        for de in doc_end.astype(np.int64):
            yield [np.asarray(toks[s_start[s] : int(sent_end[s])]) for s in range(d0, de)]
            d0 = de


# ---- manifests -------------------------------------------------------------------------------------------


def assemble_manifest(header: dict, records: Sequence[dict]) -> dict:
    """The manifest, a pure function of build settings and shard records (so 1 job == M jobs + merge)."""
    from skillnet.data_prep.bad_input import BadInputReport

    recs = sorted(records, key=lambda r: r["unit"])
    bad = BadInputReport()
    for r in recs:
        bad.merge(r.get("bad_input", {}))
    totals = {
        k: sum(r[k] for r in recs) for k in ("num_tokens", "num_sentences", "num_documents", "input_bytes")
    }
    return {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        **header,
        "totals": totals,
        "bad_input": bad.to_json(),
        "shards": list(recs),
    }


def part_manifest_name(index: int, num: int) -> str:
    return f"manifest.part-{index:05d}-of-{num:05d}.json"


def merge_parts(shard_dir: str | os.PathLike, verify: str = "size") -> dict:
    """Checks the per-job manifests of a `--num-shards M` build and writes the joined manifest.json."""
    d = Path(shard_dir)
    parts = sorted(d.glob("manifest.part-*-of-*.json"))
    if not parts:
        raise ShardError(f"{d}: no per-job manifests (manifest.part-*-of-*.json) to merge")
    loaded = []
    for p in parts:
        try:
            loaded.append((p, json.loads(p.read_text(encoding="utf-8"))))
        except ValueError as e:
            raise ShardError(f"{p}: not valid JSON ({e})") from e
    num = loaded[0][1]["job"]["num_shards"]
    ref_header = {k: v for k, v in loaded[0][1].items() if k in ("tokenizer", "build", "plan")}
    seen_jobs: dict[int, Path] = {}
    for p, m in loaded:
        if m["job"]["num_shards"] != num:
            raise ShardError(f"{p}: built with --num-shards {m['job']['num_shards']}, {parts[0]} with {num}")
        for k in ("tokenizer", "build", "plan"):
            if m[k] != ref_header[k]:
                raise ShardError(
                    f"{p}: '{k}' differs from {parts[0]} (different tokenizer, settings or inputs)"
                )
        seen_jobs[m["job"]["shard_index"]] = p
    missing = sorted(set(range(num)) - set(seen_jobs))
    if missing:
        raise ShardError(
            f"{d}: missing per-job manifests for --shard-index {missing} of {num}; rerun those jobs"
        )
    records = [r for _, m in loaded for r in m["shards"]]
    units = sorted(r["unit"] for r in records)
    if units != list(range(ref_header["plan"]["num_units"])):
        raise ShardError(
            f"{d}: the jobs' shards do not cover units 0..{ref_header['plan']['num_units'] - 1} exactly once"
        )
    for r in records:
        verify_shard(d, r, verify, ref_header["tokenizer"])
    manifest = assemble_manifest(ref_header, records)
    atomic_write_json(d / "manifest.json", manifest)
    return manifest
