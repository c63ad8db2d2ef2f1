"""The per-tokenizer cache of word pieces gives what the tokenizer gives, stays bounded, and is not
changed by the codecs that read it."""

from __future__ import annotations

import pytest
from skillnet.data_prep.tokenizer import load_tokenizer
from skillnet.finetune.task_types import base


@pytest.fixture()
def tok():
    t = load_tokenizer()
    base.piece_cache(t).clear()
    yield t
    base.piece_cache(t).clear()


def test_cached_pieces_equal_a_fresh_encode(tok) -> None:
    texts = ["保险怎么理赔", "Hello world 123", "保险怎么理赔", "", "寿险和重疾险"]
    want = [(e.ids, e.offsets) for e in tok.backend.encode_batch(texts, add_special_tokens=False)]
    assert base.pieces(tok, texts) == want
    assert base.pieces(tok, texts) == want  # second call served from the cache
    assert len(base.piece_cache(tok)) == 4  # one entry per distinct text
    assert base.piece_ids(tok, texts[:2]) == [w[0] for w in want[:2]]


def test_the_cache_stops_growing_at_its_cap(tok, monkeypatch) -> None:
    monkeypatch.setattr(base, "PIECE_CACHE_MAX", 3)
    texts = ["一", "二", "三", "四", "五"]
    want = [(e.ids, e.offsets) for e in tok.backend.encode_batch(texts, add_special_tokens=False)]
    assert base.pieces(tok, texts[:2]) == want[:2]
    assert base.pieces(tok, texts) == want  # over the cap: answered, not stored
    assert set(base.piece_cache(tok)) == {"一", "二"}


def test_pair_does_not_change_the_cached_lists(tok) -> None:
    (a, _), (b, _) = base.pieces(tok, ["保险怎么理赔保险怎么理赔", "理赔需要什么材料理赔需要什么材料"])
    before = (list(a), list(b))
    base.pair(tok, a, b, 12)
    assert (a, b) == before
    assert base.pieces(tok, ["保险怎么理赔保险怎么理赔"])[0][0] == before[0]


def test_two_loads_of_one_vocab_share_the_cache(tok) -> None:
    base.pieces(tok, ["保险"])
    assert "保险" in base.piece_cache(load_tokenizer())
