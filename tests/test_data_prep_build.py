"""data_prep: corpus -> shards round trip, determinism (workers, cluster jobs), restart, bad input, corruption."""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import zstandard
from skillnet.data_prep.bad_input import BadInputError
from skillnet.data_prep.build import BuildConfig, build
from skillnet.data_prep.shards import ShardError, iter_documents_ids, merge_parts, verify_dir
from skillnet.data_prep.tokenizer import TokenizerError, load_tokenizer, train_wordpiece

FIX = Path(__file__).parent / "fixtures" / "data_prep"
REPO = Path(__file__).resolve().parents[1]

ZH = [
    "我们今天去北京参观博物馆",
    "博物馆里有很多古代文物",
    "你想一起去吗",
    "中国的经济发展很快",
    "人民生活水平不断提高",
    "保险公司会根据合同支付赔偿金",
    "如果你有问题请联系客服",
    "这是一个事实",
]
EN = [
    "the weather is nice today",
    "we will visit the museum",
    "insurance pays when the policy is active",
    "read the contract carefully",
    "are you coming",
]
ENDS = ["。", "！", "？"]


def make_docs(n: int, seed: int = 0) -> list[list[str]]:
    """Documents as lists of sentences (Chinese and English), from a fixed word list (no [UNK])."""
    rng = np.random.default_rng(seed)
    docs = []
    for _ in range(n):
        sents = []
        for _ in range(int(rng.integers(1, 6))):
            if rng.random() < 0.7:
                sents.append(ZH[rng.integers(len(ZH))] + ENDS[rng.integers(3)])
            else:
                sents.append(EN[rng.integers(len(EN))].capitalize() + ".")
        docs.append(sents)
    return docs


def write_corpus(d: Path, n_files: int = 4, docs_per_file: int = 30) -> list[tuple[str, list[str]]]:
    """Plain, gzip, zstd and JSONL files; returns (text, sentences) of all documents in sorted-file order."""
    d.mkdir(parents=True, exist_ok=True)
    by_name = {}
    for i in range(n_files):
        # Sentences run together in every other file, except that an English one starts after a space, as
        # English text does: "coming.Is" reads as a dotted name, not two sentences (data_prep/sentences.py).
        docs = [(" ".join(s) if i % 2 else "".join((" " if j and x.isascii() else "") + x for j, x in enumerate(s)),
                 s) for s in make_docs(docs_per_file, seed=i)]
        body = "\n".join(t for t, _ in docs) + "\n"
        kind = i % 4
        name = f"f{i}." + ["txt", "txt.gz", "txt.zst", "jsonl"][kind]
        if kind == 0:
            (d / name).write_text(body, encoding="utf-8")
        elif kind == 1:
            (d / name).write_bytes(gzip.compress(body.encode()))
        elif kind == 2:
            (d / name).write_bytes(zstandard.ZstdCompressor().compress(body.rstrip("\n").encode()))
        else:
            (d / name).write_text(
                "".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t, _ in docs), encoding="utf-8"
            )
        by_name[name] = docs
    return [doc for name in sorted(by_name) for doc in by_name[name]]


def cfg(inputs: list[str], out: Path, **kw) -> BuildConfig:
    return BuildConfig(inputs=inputs, out=str(out), progress=False, **kw)


def shard_bytes(out: Path) -> dict[str, bytes]:
    """Every file of a shard directory except per-job manifests (what must be identical)."""
    return {p.name: p.read_bytes() for p in sorted(out.iterdir()) if not p.name.startswith("manifest.part")}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> tuple[Path, list]:
    d = tmp_path_factory.mktemp("corpus")
    return d, write_corpus(d)


def test_roundtrip_text_documents_sentences(corpus, tmp_path):
    d, docs = corpus
    m = build(cfg([str(d / "*")], tmp_path / "out", unit_bytes=1500))
    tok = load_tokenizer()
    got = list(iter_documents_ids(tmp_path / "out"))
    assert len(m["shards"]) > 2  # small units: packing and splitting are both exercised
    assert len(got) == len(docs) == m["totals"]["num_documents"]
    for (text, sents), g in zip(docs, got):
        assert tok.decode(np.concatenate(g)) == tok.normalize(text)
        assert [tok.decode(s) for s in g] == [tok.normalize(s) for s in sents]
    assert m["bad_input"]["counts"] == {}
    assert m["tokenizer"]["dtype"] == "uint16" and m["tokenizer"]["fingerprint"] == tok.fingerprint
    assert (tmp_path / "out" / "shard-000000.bin").stat().st_size == 2 * m["shards"][0]["num_tokens"]


def test_fixture_files_and_blank_line_mode(tmp_path):
    m = build(cfg([str(FIX / "zh_en.txt"), str(FIX / "docs.jsonl")], tmp_path / "a"))
    docs = list(iter_documents_ids(tmp_path / "a"))
    # 3 JSONL records + 5 non-empty lines; the blank line is an empty document, counted not hidden
    assert m["totals"]["num_documents"] == 8
    assert m["bad_input"]["counts"] == {"empty_document": 1}
    assert [len(x) for x in docs[:4]] == [
        2,
        1,
        2,
        3,
    ]  # docs.jsonl sorts first: "这是..。它有..。" = 2 sentences
    mb = build(cfg([str(FIX / "blank_docs.txt")], tmp_path / "b", doc_separator="blank"))
    docs = list(iter_documents_ids(tmp_path / "b"))
    tok = load_tokenizer()
    assert mb["totals"]["num_documents"] == 3
    assert [len(x) for x in docs] == [2, 1, 2]
    assert tok.decode(np.concatenate(docs[2])) == tok.normalize(
        "Third document, first line. Third document, second line?"
    )


@pytest.mark.parametrize("kind", ["txt", "jsonl"])
def test_byte_range_split_loses_and_duplicates_nothing(tmp_path, kind):
    docs = make_docs(200, seed=7)
    lines = ["".join(s) for s in docs]
    p = tmp_path / f"big.{kind}"
    body = lines if kind == "txt" else [json.dumps({"text": x}, ensure_ascii=False) for x in lines]
    p.write_text("\n".join(body) + "\n", encoding="utf-8")
    whole = build(cfg([str(p)], tmp_path / "whole"))
    for ub in (311, 4096):  # odd sizes cut lines and multi-byte characters
        split = build(cfg([str(p)], tmp_path / f"s{ub}", unit_bytes=ub))
        assert len(split["shards"]) == -(-p.stat().st_size // ub)
        assert split["totals"]["num_documents"] == len(docs) == whole["totals"]["num_documents"]
        a = [np.concatenate(x) for x in list(iter_documents_ids(tmp_path / "whole"))]
        b = [np.concatenate(x) for x in list(iter_documents_ids(tmp_path / f"s{ub}"))]
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_workers_1_vs_2_identical(corpus, tmp_path):
    d, _ = corpus
    build(cfg([str(d / "*")], tmp_path / "w1", unit_bytes=1500, workers=1))
    build(cfg([str(d / "*")], tmp_path / "w2", unit_bytes=1500, workers=2))
    assert shard_bytes(tmp_path / "w1") == shard_bytes(tmp_path / "w2")


def test_one_job_vs_three_jobs_plus_merge_identical(corpus, tmp_path):
    d, _ = corpus
    build(cfg([str(d / "*")], tmp_path / "one", unit_bytes=1500))
    for i in range(3):
        build(cfg([str(d / "*")], tmp_path / "three", unit_bytes=1500, num_shards=3, shard_index=i))
        if i < 2:
            with pytest.raises(ShardError, match="missing per-job manifests"):
                merge_parts(tmp_path / "three")
    merge_parts(tmp_path / "three", verify="full")
    assert shard_bytes(tmp_path / "one") == shard_bytes(tmp_path / "three")


def test_merge_rejects_parts_with_other_settings(corpus, tmp_path):
    import shutil

    from skillnet.common.outputs import OutputError

    d, _ = corpus
    build(cfg([str(d / "*")], tmp_path / "o", unit_bytes=1500, num_shards=2, shard_index=0))
    job1 = cfg([str(d / "*")], tmp_path / "o", unit_bytes=1500, num_shards=2, shard_index=1, lowercase=False)
    with pytest.raises(OutputError, match="other settings"):  # a job of another build is refused at once
        build(job1)
    # ... and if its parts are built elsewhere and copied in, merge still catches them
    build(cfg([str(d / "*")], tmp_path / "elsewhere", unit_bytes=1500, num_shards=2, shard_index=1, lowercase=False))
    for f in (tmp_path / "elsewhere").glob("*"):
        if f.name != ".skillnet_output.json" and not (tmp_path / "o" / f.name).exists():
            shutil.copy2(f, tmp_path / "o" / f.name)
    with pytest.raises(ShardError, match="differs"):
        merge_parts(tmp_path / "o")


def _cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "skillnet.data_prep", *args], capture_output=True, text=True,
        env={**os.environ, **(env or {})}, cwd=REPO
    )


@pytest.mark.slow  # 6-12 s (subprocesses): among the slowest, kept out of make test-fast (3 min)
def test_killed_build_reruns_to_identical_result(corpus, tmp_path):
    d, _ = corpus
    ref, out = tmp_path / "ref", tmp_path / "out"
    common = [str(d / "*"), "--unit-bytes", "1500", "--no-progress"]
    assert _cli("build", *common, "--out", str(ref)).returncode == 0
    # Hard exit (like SIGKILL: no cleanup) after shard 0 is finished, in the middle of shard 1.
    r = subprocess.run([sys.executable, str(REPO / "tests/fixtures/data_prep_fail_at.py"), "1:0", "build", *common,
                        "--out", str(out)], capture_output=True, text=True, cwd=REPO)
    assert r.returncode == 17
    assert (out / "shard-000000.json").is_file() and not (out / "shard-000001.json").exists()
    assert not (out / "manifest.json").exists()
    # a half-written shard 1 that looks finished to a careless reader: redone, not trusted
    (out / "shard-000001.bin").write_bytes(b"\x00\x01" * 7)
    finished_mtime = (out / "shard-000000.bin").stat().st_mtime_ns
    r = _cli("build", *common, "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert (out / "shard-000000.bin").stat().st_mtime_ns == finished_mtime  # skipped, not redone
    assert not list(out.glob("*.tmp"))
    assert shard_bytes(ref) == shard_bytes(out)


@pytest.mark.slow  # 6-12 s (subprocesses): among the slowest, kept out of make test-fast (3 min)
def test_sigkilled_build_reruns_to_identical_result(tmp_path):
    docs = make_docs(3000, seed=11)
    (tmp_path / "c.txt").write_text("\n".join("".join(s) for s in docs) + "\n", encoding="utf-8")
    common = [str(tmp_path / "c.txt"), "--unit-bytes", "3000", "--no-progress"]
    ref, out = tmp_path / "ref", tmp_path / "out"
    assert _cli("build", *common, "--out", str(ref)).returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "skillnet.data_prep", "build", *common, "--out", str(out), "--workers", "2"],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.time() + 60
    while len(list(out.glob("shard-*.json"))) < 3 and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    proc.kill()  # SIGKILL mid-build: no cleanup handler runs
    proc.wait()
    import psutil

    orphans = _orphans(out)  # its pool workers, killed too (else they would race the rerun)
    for child in orphans:
        child.kill()
    psutil.wait_procs(orphans, timeout=10)
    assert not (out / "manifest.json").exists() and len(list(out.glob("shard-*.json"))) < 60  # really mid-way
    r = _cli("build", *common, "--out", str(out), "--workers", "2")
    assert r.returncode == 0, r.stderr
    assert shard_bytes(ref) == shard_bytes(out)


def _orphans(out: Path) -> list:
    """Pool workers of a killed build that may still be running (they would keep writing)."""
    import psutil

    me = psutil.Process()
    found = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if p.pid != me.pid and str(out) in " ".join(p.info["cmdline"] or []):
                found.append(p)
        except psutil.Error:
            pass
    return found


def test_corrupted_or_truncated_shard_fails_at_load_naming_it(corpus, tmp_path):
    from skillnet.pretrain.dataset import PretrainingDataset

    d, _ = corpus
    out = tmp_path / "out"
    build(cfg([str(d / "*")], out, unit_bytes=1500))
    PretrainingDataset(out)  # loads fine
    victim = out / "shard-000002.bin"
    raw = bytearray(victim.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    victim.write_bytes(bytes(raw))
    with pytest.raises(ShardError, match=r"corrupted.*shard-000002\.bin"):
        PretrainingDataset(out)
    r = _cli("verify", str(out))
    assert r.returncode == 2 and "shard-000002.bin" in r.stderr
    victim.write_bytes(bytes(raw[:-2]))
    with pytest.raises(ShardError, match=r"truncated.*shard-000002\.bin"):
        PretrainingDataset(out, verify="size")
    (out / "shard-000001.idx").write_bytes((out / "shard-000001.idx").read_bytes()[:-8])
    with pytest.raises(ShardError, match=r"shard-000001\.idx"):
        verify_dir(out, "size")


def write_bad_inputs(d: Path) -> None:
    d.mkdir()
    good = "好的文档。\n"
    (d / "a_text.txt").write_bytes(
        good.encode()
        + b"bad \xff\xfe utf8\n"
        + b"nul \x00 byte\n"
        + b"\n"
        + b"   \n"
        + ("长" * 10).encode()
        + b"\n"
    )
    with open(d / "b_long.txt", "wb") as f:  # a single 50 MB line between two good ones
        f.write(good.encode())
        chunk = ("一" * (1 << 18)).encode()
        for _ in range(50 * (1 << 20) // len(chunk)):
            f.write(chunk)
        f.write(b"\n" + good.encode())
    (d / "c_binary.txt").write_bytes(
        np.random.default_rng(0).integers(0, 256, 20000, dtype=np.uint8).tobytes()
    )
    (d / "d.jsonl").write_text(
        '{"text": "好。"}\n{not json}\n{"body": "x"}\n{"text": ""}\n\n', encoding="utf-8"
    )
    gz = gzip.compress(("好的文档。\n" * 2000).encode())
    (d / "e_trunc.txt.gz").write_bytes(gz[: len(gz) // 2])


def test_every_bad_input_kind_is_counted_and_strict_fails(tmp_path):
    write_bad_inputs(tmp_path / "in")
    m = build(cfg([str(tmp_path / "in" / "*")], tmp_path / "out", max_doc_bytes=1 << 20))
    c = m["bad_input"]["counts"]
    assert c == {
        "invalid_utf8": 1,
        "nul_bytes": 1,
        "empty_document": 4,
        "too_long": 1,
        "binary_file": 1,
        "bad_json": 1,
        "missing_text_field": 1,
        "corrupt_compressed": 1,
    }
    assert m["bad_input"]["bytes"]["too_long"] >= 50_000_000  # counted whole, though never held in memory
    ex = m["bad_input"]["examples"]
    assert re.search(r"a_text\.txt:2:5$", ex["invalid_utf8"][0])  # line 2, column of the bad byte
    assert re.search(r"a_text\.txt:3:5$", ex["nul_bytes"][0])
    assert re.search(r"b_long\.txt:2$", ex["too_long"][0])
    assert re.search(r"d\.jsonl:2:2$", ex["bad_json"][0])
    assert re.search(r"d\.jsonl:3: no string field 'text'$", ex["missing_text_field"][0])
    assert [re.sub(r".*/", "", e) for e in ex["empty_document"]] == ["a_text.txt:4", "a_text.txt:5", "d.jsonl:4"]
    # good documents around the bad ones are all kept: 2 in a, 2 in b, 1 in d, and some before the gzip cut
    assert m["totals"]["num_documents"] > 5
    r = _cli(
        "build",
        str(tmp_path / "in" / "a_text.txt"),
        "--out",
        str(tmp_path / "s"),
        "--strict",
        "--no-progress",
    )
    assert r.returncode == 2 and "a_text.txt:2" in r.stderr and "invalid_utf8" in r.stderr
    with pytest.raises(BadInputError):
        build(cfg([str(tmp_path / "in" / "c_binary.txt")], tmp_path / "s2", strict=True))


def test_tokenizer_fingerprint_default_vocab_and_training(tmp_path, monkeypatch):
    import importlib.util

    a, b = load_tokenizer(), load_tokenizer(lowercase=False)
    assert a.vocab_size == 21128 and a.fingerprint != b.fingerprint
    assert a.encode_batch(["。"])[0] == [a.vocab.index("。")]  # vocab lines map to the tokenizer's ids
    vocab = train_wordpiece(
        (" ".join(s) for s in make_docs(300)), tmp_path / "v", vocab_size=300, min_frequency=1
    )
    t = load_tokenizer(vocab)
    assert t.vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] and t.fingerprint != a.fingerprint
    (tmp_path / "c.txt").write_text("我们今天去北京。\n", encoding="utf-8")
    m = build(cfg([str(tmp_path / "c.txt")], tmp_path / "o", vocab=str(vocab)))
    assert m["tokenizer"]["fingerprint"] == t.fingerprint
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *x: None if n == "cn_clip" else real(n, *x))
    with pytest.raises(TokenizerError, match="cn_clip"):
        load_tokenizer()


@pytest.mark.slow  # 6-12 s (subprocesses): among the slowest, kept out of make test-fast (3 min)
def test_cli_help_and_train_tokenizer(tmp_path):
    r = _cli("build", "--help")
    assert r.returncode == 0 and "--num-shards" in r.stdout and "--workers" in r.stdout
    r = _cli(
        "train-tokenizer",
        str(FIX / "zh_en.txt"),
        "--out",
        str(tmp_path / "v"),
        "--vocab-size",
        "200",
        "--min-frequency",
        "1",
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "v" / "vocab.txt").is_file()
    r = _cli("build", str(tmp_path / "nothing*.txt"), "--out", str(tmp_path / "o"))
    assert r.returncode == 2 and "matches no file" in r.stderr


def test_whole_word_flags_follow_jieba(tmp_path):
    (tmp_path / "c.txt").write_text("我们今天去北京参观博物馆。\n", encoding="utf-8")
    m = build(cfg([str(tmp_path / "c.txt")], tmp_path / "o", whole_word=True))
    from skillnet.data_prep.shards import read_word_starts

    ws = read_word_starts(tmp_path / "o", m["shards"][0])
    import jieba

    words = list(jieba.cut("我们今天去北京参观博物馆。"))
    expect = np.concatenate([[True] + [False] * (len(w) - 1) for w in words])
    assert ws.tolist() == expect.tolist()


ENGLISH = ("Use sys.argv to read the arguments. Mr. Smith paid 3.14 dollars, e.g. for tea at J. Doe's. "
           "See Fig. 2 and the U.S. office etc. for more. It works... Really? Yes.")
ENGLISH_SENTENCES = ["Use sys.argv to read the arguments.", "Mr. Smith paid 3.14 dollars, e.g. for tea at J. Doe's.",
                     "See Fig. 2 and the U.S. office etc. for more.", "It works...", "Really?", "Yes."]


def _sentences(out: Path) -> list[list[str]]:
    tok = load_tokenizer()
    return [[tok.decode(s) for s in doc] for doc in iter_documents_ids(out)]


def test_english_full_stops_that_end_no_sentence(tmp_path):
    """Dotted names, decimals, abbreviations and initials keep a sentence whole (data_prep/sentences.py); a
    Chinese corpus builds byte for byte as with the token rule alone (`--sentence-split punct`)."""
    tok = load_tokenizer()
    (tmp_path / "en.txt").write_text(ENGLISH + "\nApple Inc. Sells phones.\n", encoding="utf-8")
    build(cfg([str(tmp_path / "en.txt")], tmp_path / "auto"))
    got = _sentences(tmp_path / "auto")
    assert got[0] == [tok.decode(tok.encode_batch_flat([s])[0]) for s in ENGLISH_SENTENCES]
    assert len(got[1]) == 2  # "Inc." is no abbreviation by default ...
    build(cfg([str(tmp_path / "en.txt")], tmp_path / "abbr", abbreviations=("inc",)))
    assert len(_sentences(tmp_path / "abbr")[1]) == 1  # ... unless named
    build(cfg([str(tmp_path / "en.txt")], tmp_path / "punct", sentence_split="punct"))
    assert len(_sentences(tmp_path / "punct")[0]) == 14  # every "." not before a digit ends one: fragments
    zh = "他用了sys.argv。我们今天去北京。Mr. Wang说：好！价格是3.14元。\n中国的经济发展很快。你想一起去吗？\n"
    (tmp_path / "zh.txt").write_text(zh * 20, encoding="utf-8")
    for mode in ("auto", "punct"):
        build(cfg([str(tmp_path / "zh.txt")], tmp_path / f"zh_{mode}", sentence_split=mode))
    assert len(_sentences(tmp_path / "zh_auto")[0]) == 6  # a document with CJK keeps the token rule
    for name in ("shard-000000.bin", "shard-000000.idx"):
        assert (tmp_path / "zh_auto" / name).read_bytes() == (tmp_path / "zh_punct" / name).read_bytes()
