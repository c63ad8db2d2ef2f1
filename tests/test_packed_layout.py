"""The packed layout as one type (model/packed.py `PackedLayout`): training/packing.py builds it, the batch carries
it under its field names, and the model takes it back out, typed, at its entry. Packed equals unpacked through
the type, for the encoder (SkillNet-BERT) and both sides of SkillNet-BART, in fp32 with dropout off."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from skillnet.model import (
    SkillNetBartConfig,
    SkillNetBartForConditionalGeneration,
    SkillNetBertConfig,
    SkillNetBertForMultiTask,
)
from skillnet.model.packed import PackedLayout
from skillnet.training.packing import pack_pairs, pack_rows

RTOL, ATOL = 1e-5, 5e-6


def _padded(B: int = 10, W: int = 24, seed: int = 0) -> dict[str, torch.Tensor]:
    rng = np.random.default_rng(seed)
    lens = rng.integers(3, W + 1, B)
    real = torch.from_numpy(np.arange(W)[None, :] < lens[:, None]).long()
    ids = torch.from_numpy(rng.integers(5, 90, (B, W))) * real
    return {"input_ids": ids, "attention_mask": real, "token_type_ids": torch.zeros_like(ids)}


def test_the_batch_carries_the_layout_under_its_field_names_and_gives_it_back() -> None:
    packed, _ = pack_rows(_padded(), 0, row_len=48, unpack=True)
    names = {f.name for f in dataclasses.fields(PackedLayout)}
    assert names <= set(packed)
    batch = dict(packed)
    layout = PackedLayout.take(batch)
    assert layout is not None and not names & set(batch)  # taken out: the rest is the model's usual inputs
    assert layout.to_batch().keys() == names
    for name, value in layout.to_batch().items():
        assert torch.equal(value, packed[name])


def test_a_padded_batch_has_no_layout_and_half_a_layout_is_refused() -> None:
    padded = _padded()
    assert PackedLayout.take(dict(padded)) is None
    packed, _ = pack_rows(padded, 0, row_len=48)
    packed.pop("position_ids")
    with pytest.raises(ValueError, match="position_ids beside segment_ids"):
        PackedLayout.take(packed)


def test_packed_equals_unpacked_through_the_type_bert() -> None:
    torch.manual_seed(0)
    cfg = SkillNetBertConfig.preset("tiny", vocab_size=100, hidden_dropout_prob=0.0,
                                    attention_probs_dropout_prob=0.0,
                                    task_heads={"a": {"type": "classification", "num_labels": 2}},
                                    tasks={"a": ["s1", "s7"]})
    bert = SkillNetBertForMultiTask(cfg).eval().bert
    padded = _padded()
    packed, rows = pack_rows(padded, 0, row_len=48)
    assert len(rows) < len(padded["input_ids"])
    layout = PackedLayout.take(packed)
    assert layout is not None
    with torch.no_grad():
        want = bert(**padded, task="a")
        got = bert(**packed, task="a", packed=layout)  # the typed value, not the batch's keys
    real = padded["attention_mask"].flatten().bool()
    torch.testing.assert_close(got.last_hidden_state.flatten(0, 1)[layout.token_order],
                               want.last_hidden_state.flatten(0, 1)[real], rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(got.pooler_output, want.pooler_output, rtol=RTOL, atol=ATOL)


def test_packed_equals_unpacked_through_the_type_bart() -> None:
    torch.manual_seed(0)
    cfg = SkillNetBartConfig.preset("tiny", vocab_size=200, dropout=0.0, attention_dropout=0.0,
                                    activation_dropout=0.0)
    model = SkillNetBartForConditionalGeneration(cfg).eval()
    src = _padded(8, 20, seed=1)
    tgt = _padded(8, 12, seed=2)
    padded = {"input_ids": src["input_ids"], "attention_mask": src["attention_mask"],
              "labels": tgt["input_ids"].masked_fill(tgt["attention_mask"] == 0, -100)}
    packed, rows = pack_pairs(padded, cfg.pad_token_id, cfg.decoder_start_token_id, row_len=40, decoder_row_len=24)
    assert len(rows) < 8
    enc, dec = PackedLayout.take(packed), PackedLayout.take(packed, "decoder_")
    assert enc is not None and dec is not None and enc.cls_positions is None
    with torch.no_grad():
        want = model(**padded, task="text_summarization")
        got = model(**packed, task="text_summarization", packed=enc, decoder_packed=dec)
    assert got.loss.item() == pytest.approx(want.loss.item(), rel=RTOL)
    torch.testing.assert_close(got.logits.flatten(0, 1)[dec.token_order], want.logits[padded["labels"] != -100],
                               rtol=RTOL, atol=ATOL)
    with pytest.raises(ValueError, match="the decoder's layout"):
        model.model(**{k: v for k, v in packed.items() if k != "labels"}, task="text_summarization", packed=enc)
