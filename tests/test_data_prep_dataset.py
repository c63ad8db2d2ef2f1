"""pretrain.dataset.PretrainingDataset over data_prep shards: determinism, NSP pairs, MLM statistics."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from skillnet.data_prep.build import BuildConfig, build
from skillnet.data_prep.shards import iter_documents_ids
from skillnet.data_prep.tokenizer import load_tokenizer
from skillnet.pretrain.dataset import PretrainingDataset, TokenizerMismatchError

from tests.test_data_prep_build import make_docs


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("ds")
    docs = make_docs(400, seed=3)
    (d / "c.txt").write_text("\n".join(" ".join(s) for s in docs) + "\n", encoding="utf-8")
    build(BuildConfig(inputs=[str(d / "c.txt")], out=str(d / "out"), unit_bytes=6000, progress=False))
    return d / "out"


def test_contract_keys_shapes_and_specials(shards):
    ds = PretrainingDataset(shards, max_seq_len=32)
    tok = load_tokenizer()
    assert (ds.vocab_size, ds.pad_id, ds.cls_id, ds.sep_id, ds.mask_id) == (
        tok.vocab_size,
        tok.pad_id,
        tok.cls_id,
        tok.sep_id,
        tok.mask_id,
    )
    assert ds.num_samples == len(ds) > 400  # some documents span several windows
    m = ds.batch([0, 1, 2], epoch=0, objective="mlm")
    assert set(m) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    n = ds.batch([0, 1, 2], epoch=0, objective="nsp")
    assert set(n) == {"input_ids", "token_type_ids", "attention_mask", "next_sentence_label"}
    for b in (m, n):
        assert all(t.dtype == torch.long and t.shape[0] == 3 for t in b.values())
        assert b["input_ids"].shape == (3, 32)
        assert (b["input_ids"][:, 0] == ds.cls_id).all()
    with pytest.raises(ValueError, match="objective"):
        ds.batch([0], 0, "sop")


def test_windows_cover_every_token_once(shards):
    ds = PretrainingDataset(shards, max_seq_len=32)
    b = ds.batch(range(ds.num_samples), epoch=0, objective="mlm")
    orig = torch.where(b["labels"] >= 0, b["labels"], b["input_ids"])
    body = [row[1 : int(a.sum()) - 1] for row, a in zip(orig.numpy(), b["attention_mask"].numpy())]
    docs = [np.concatenate(d) for d in list(iter_documents_ids(shards))]
    assert np.array_equal(np.concatenate(body), np.concatenate(docs))


def test_deterministic_in_seed_epoch_index_objective(shards):
    ds = PretrainingDataset(shards, max_seq_len=32, seed=5)
    again = PretrainingDataset(shards, max_seq_len=32, seed=5)  # e.g. another rank or a resumed run
    for obj in ("mlm", "nsp"):
        a = ds.batch([7, 3, 11], 2, obj)
        b = again.batch([11, 7], 2, obj)  # batch composition and order do not matter
        for k in a:
            assert torch.equal(a[k][0], b[k][1]) and torch.equal(a[k][2], b[k][0])
    x, y = ds.batch(range(64), 0, "mlm"), ds.batch(range(64), 1, "mlm")
    assert not torch.equal(x["input_ids"], y["input_ids"])  # dynamic masking: a new mask each epoch
    z = PretrainingDataset(shards, max_seq_len=32, seed=6).batch(range(64), 0, "mlm")
    assert not torch.equal(x["labels"], z["labels"])


def test_mlm_masking_statistics(shards):
    ds = PretrainingDataset(shards, max_seq_len=64)
    bs = [ds.batch(range(ds.num_samples), e, "mlm") for e in range(4)]
    ids, labels, attn = (torch.cat([b[k] for b in bs]) for k in ("input_ids", "labels", "attention_mask"))
    cand = attn.bool().clone()
    cand[:, 0] = False
    cand[torch.arange(len(ids)), attn.sum(1) - 1] = False  # [SEP]
    sel = labels >= 0
    assert not (sel & ~cand).any()  # never [CLS]/[SEP]/[PAD]
    rate = sel.sum().item() / cand.sum().item()
    n = sel.sum().item()
    assert n > 2000 and abs(rate - 0.15) < 0.01
    masked = (ids[sel] == ds.mask_id).float().mean().item()
    kept = (ids[sel] == labels[sel]).float().mean().item()
    assert abs(masked - 0.8) < 0.03 and abs(kept - 0.1) < 0.03  # the rest (~10%) random tokens
    assert (ids[~sel & cand] == torch.where(labels >= 0, labels, ids)[~sel & cand]).all()
    assert (sel.sum(1) >= 1).all()


def _occurrences(hay: bytes, needle: np.ndarray) -> list[int]:
    """Token positions where `needle` occurs in the corpus (`hay` = uint32 bytes of all tokens)."""
    pat, out, i = needle.astype("<u4").tobytes(), [], hay.find(needle.astype("<u4").tobytes())
    while i >= 0:
        if i % 4 == 0:
            out.append(i // 4)
        i = hay.find(pat, i + 1)
    return out


def test_nsp_pairs_half_true_next_half_other_document(shards):
    """A ends and B starts at a sentence boundary inside a document; true B continues A, a random B
    comes from another document; A + B fit max_seq_len - 3."""
    ds = PretrainingDataset(shards, max_seq_len=32)
    docs = list(iter_documents_ids(shards))
    flat = np.concatenate([np.concatenate(d) for d in docs]).astype(np.int64)
    hay = flat.astype("<u4").tobytes()
    sent_len = [len(s) for d in docs for s in d]
    sent_end = set(np.cumsum(sent_len).tolist())
    doc_end = np.cumsum([sum(map(len, d)) for d in docs])
    internal = sent_end - set(doc_end.tolist())  # sentence boundaries strictly inside a document
    doc_of = lambda pos: int(np.searchsorted(doc_end, pos, side="right"))  # noqa: E731

    b = ds.batch(range(ds.num_samples), 0, "nsp")
    lab = b["next_sentence_label"].numpy()
    assert abs(lab.mean() - 0.5) < 0.08
    for i in range(ds.num_samples):
        row, tt = b["input_ids"][i].numpy(), b["token_type_ids"][i].numpy()
        n = int(b["attention_mask"][i].sum())
        seps = np.flatnonzero(row[:n] == ds.sep_id)
        assert len(seps) == 2 and seps[1] == n - 1
        a_, b_ = row[1 : seps[0]], row[seps[0] + 1 : n - 1]
        assert len(a_) >= 1 and len(b_) >= 1 and n <= 32
        assert (tt[: seps[0] + 1] == 0).all() and (tt[seps[0] + 1 : n] == 1).all()
        # A: text of one document ending at a sentence boundary inside it
        a_docs = {
            doc_of(x)
            for x in _occurrences(hay, a_)
            if x + len(a_) in internal and doc_of(x) == doc_of(x + len(a_))
        }
        assert a_docs, f"sample {i}: A does not end at a sentence boundary inside a document"
        # B: starts at a sentence boundary inside a document, stays in that document
        b_at = [x for x in _occurrences(hay, b_) if x in internal and doc_of(x) == doc_of(x + len(b_) - 1)]
        assert b_at, f"sample {i}: B does not start at a sentence boundary inside a document"
        if lab[i] == 0:  # B continues A in the same document
            assert any(
                x - len(a_) >= 0
                and np.array_equal(flat[x - len(a_) : x], a_)
                and doc_of(x - len(a_)) == doc_of(x)
                for x in b_at
            ), i
        else:
            assert {doc_of(x) for x in b_at} != a_docs or len(a_docs) > 1, i
    assert ds.batch(range(ds.num_samples), 1, "nsp")["next_sentence_label"].tolist() != lab.tolist()


def test_nsp_needs_documents_of_two_sentences(tmp_path):
    (tmp_path / "c.txt").write_text("一句话的文档。\n另一句话的文档。\n第三个文档。\n", encoding="utf-8")
    build(BuildConfig(inputs=[str(tmp_path / "c.txt")], out=str(tmp_path / "o"), progress=False))
    ds = PretrainingDataset(tmp_path / "o", max_seq_len=32)
    ds.batch([0, 1], 0, "mlm")  # MLM is fine
    with pytest.raises(ValueError, match="NSP needs at least 2 documents of 2 or more sentences"):
        ds.batch([0, 1], 0, "nsp")


def test_whole_word_masking_masks_whole_words(tmp_path):
    docs = make_docs(200, seed=9)
    (tmp_path / "c.txt").write_text("\n".join("".join(s) for s in docs) + "\n", encoding="utf-8")
    build(
        BuildConfig(
            inputs=[str(tmp_path / "c.txt")], out=str(tmp_path / "o"), whole_word=True, progress=False
        )
    )
    ds = PretrainingDataset(tmp_path / "o", max_seq_len=48, whole_word_mask=True)
    b = ds.batch(range(ds.num_samples), 0, "mlm")
    from skillnet.data_prep.shards import load_manifest, read_word_starts

    m = load_manifest(tmp_path / "o")
    ws = np.concatenate([read_word_starts(tmp_path / "o", r) for r in m["shards"]])
    word_id = np.cumsum(ws) - 1
    sel, attn = (b["labels"] >= 0).numpy(), b["attention_mask"].numpy()
    body_sel = np.concatenate([s[1 : int(a.sum()) - 1] for s, a in zip(sel, attn)])
    assert body_sel.size == word_id.size
    # a word is fully selected or not at all, except a word cut in two by a window boundary
    frac = np.bincount(word_id, weights=body_sel) / np.bincount(word_id)
    lens = attn.sum(1) - 2
    cut = np.cumsum(lens)[:-1]
    crossing = set(word_id[cut][word_id[cut] == word_id[cut - 1]].tolist())
    partial = set(np.flatnonzero((frac > 0) & (frac < 1)).tolist())
    assert (frac == 1).sum() > 50 and (np.bincount(word_id)[frac == 1] > 1).sum() > 20
    assert partial <= crossing
    assert abs(body_sel.mean() - 0.15) < 0.03


def test_tokenizer_fingerprint_mismatch_is_a_clear_error(shards):
    ok = load_tokenizer().fingerprint
    PretrainingDataset(shards, expected_fingerprint=ok, verify="size")
    with pytest.raises(TokenizerMismatchError, match="built with tokenizer"):
        PretrainingDataset(shards, expected_fingerprint=load_tokenizer(lowercase=False).fingerprint)
