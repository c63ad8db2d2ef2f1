"""Packed encoder-decoder rows (training/packing.py `pack_pairs`, model/bart.py, model/attention.py): several
samples per row on both sides, sample k of a row being segment k of the encoder and of the decoder, give
every sample exactly what it gets alone in its own padded row.

Equality is checked in fp32 with dropout off, to 1e-5 relative / 5e-6 absolute (the two layouts sum the same
numbers in another order): the loss, the logits at every label position of every sample, and every
parameter's gradient, for BART denoising under every router (a token gate with a binding capacity
included), for rows of several tasks, and for generation fine-tuning's batches. A leak across samples
(cross-attention reading another sample's encoder tokens, a decoder reading the previous sample) moves
another sample's logits: the leakage test checks that none does.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from skillnet.model import SkillNetBartConfig, SkillNetBartForConditionalGeneration
from skillnet.model.routers import router_class
from skillnet.pretrain.denoising import DenoisingDataset
from skillnet.training.packing import pack_pairs, pack_where_it_pays, plan_rows

RTOL, ATOL = 1e-5, 5e-6
ROUTERS = {"task": {}, "dense": {}, "topk": {"moe_capacity_factor": 0.5}}  # every router BART has
NO_DROPOUT = dict(dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)


def _model(vocab: int, router: str = "task", **kw: object) -> SkillNetBartForConditionalGeneration:
    base = SkillNetBartConfig.preset("tiny", vocab_size=vocab, **NO_DROPOUT, **kw)
    if router != "task":
        changes = router_class(router).derive(base, **ROUTERS[router]).changes
        base = SkillNetBartConfig.preset("tiny", vocab_size=vocab, **NO_DROPOUT, **{**kw, **changes})
    torch.manual_seed(0)
    return SkillNetBartForConditionalGeneration(base).train()


@pytest.fixture(scope="module")
def data(default_shards: Path) -> DenoisingDataset:
    return DenoisingDataset(default_shards, max_seq_len=64, verify="size")


def _padded(data: DenoisingDataset, n: int = 16) -> dict[str, torch.Tensor]:
    idx = np.random.default_rng(3).choice(len(data), n, replace=False).tolist()
    b = data.batch(idx, 0)
    # as fine-tuning builds them: each side padded to its longest sample
    S, T = int(b["attention_mask"].sum(1).max()), int((b["labels"] != -100).sum(1).max())
    return {"input_ids": b["input_ids"][:, :S].contiguous(), "attention_mask": b["attention_mask"][:, :S].contiguous(),
            "labels": b["labels"][:, :T].contiguous()}


def _run(model: torch.nn.Module, batch: dict[str, torch.Tensor], task: object = "text_summarization"
         ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
    model.zero_grad()
    out = model(**batch, task=task)
    out.loss.backward()
    return out.loss.detach(), out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()
                                                     if p.grad is not None}


def _label_logits_padded(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return logits[labels != -100]  # sample by sample, position by position


def _label_logits_packed(logits: torch.Tensor, packed: dict[str, torch.Tensor]) -> torch.Tensor:
    return logits.flatten(0, 1)[packed["decoder_token_order"]]  # the samples' order


def _assert_equal_per_sample(model: torch.nn.Module, padded: dict, packed: dict, task_p: object = "text_summarization",
                             task_k: object = "text_summarization") -> None:
    loss_p, logits_p, g_p = _run(model, padded, task_p)
    loss_k, logits_k, g_k = _run(model, packed, task_k)
    assert loss_k.item() == pytest.approx(loss_p.item(), rel=RTOL, abs=ATOL)
    torch.testing.assert_close(_label_logits_packed(logits_k, packed),
                               _label_logits_padded(logits_p, padded["labels"]), rtol=RTOL, atol=ATOL)
    assert g_k.keys() == g_p.keys()
    for name in g_p:
        torch.testing.assert_close(g_k[name], g_p[name], rtol=RTOL, atol=ATOL, msg=name)


# ---- the layout ----------------------------------------------------------------------------------------
def test_pair_rows_fit_both_sides_and_start_each_decoder_input_afresh(data: DenoisingDataset) -> None:
    padded = _padded(data)
    packed, rows = pack_pairs(padded, data.pad_id, data.sep_id, row_len=64, decoder_row_len=64)
    lens = np.stack([padded["attention_mask"].sum(1).numpy(), (padded["labels"] != -100).sum(1).numpy()], 1)
    assert sorted(i for r in rows for i in r) == list(range(len(lens)))
    assert len(rows) < len(lens)  # rows of several samples
    for r, samples in enumerate(rows):
        assert lens[samples, 0].sum() <= 64 and lens[samples, 1].sum() <= 64
        dseg, eseg = packed["decoder_segment_ids"][r], packed["segment_ids"][r]
        for k, b in enumerate(samples, start=1):
            at = torch.nonzero(dseg == k).flatten()
            assert len(at) == lens[b, 1] and int((eseg == k).sum()) == lens[b, 0]
            dec_in = packed["decoder_input_ids"][r, at]
            # the sample's decoder input is its own target shifted right behind the start token
            assert dec_in[0].item() == data.sep_id
            target = padded["labels"][b, : lens[b, 1]]
            assert torch.equal(dec_in[1:], target[:-1]) and torch.equal(packed["labels"][r, at], target)
            assert torch.equal(packed["decoder_position_ids"][r, at], torch.arange(lens[b, 1]))
    two_sided = plan_rows(lens, (64, 64))
    assert rows == two_sided
    with pytest.raises(ValueError, match="lengths per sample"):
        plan_rows(lens, 64)


def test_pairs_pack_only_where_it_saves_slots(data: DenoisingDataset) -> None:
    padded = _padded(data)
    packed = pack_where_it_pays(padded, data.pad_id, decoder_start_id=data.sep_id, row_len=64, decoder_row_len=64)
    assert "decoder_segment_ids" in packed
    n_src, n_tgt = int(padded["attention_mask"][0].sum()), int((padded["labels"][0] != -100).sum())
    one = {"input_ids": padded["input_ids"][:1, :n_src], "attention_mask": padded["attention_mask"][:1, :n_src],
           "labels": padded["labels"][:1, :n_tgt]}  # a sample alone, no padding: nothing to win
    assert pack_where_it_pays(one, data.pad_id, decoder_start_id=data.sep_id) is one
    # the same sample padded to the batch's widths packs into one row trimmed to it (rounded up to 8)
    padded_one = {k: v[:1] for k, v in padded.items()}
    trimmed = pack_where_it_pays(padded_one, data.pad_id, decoder_start_id=data.sep_id)
    assert trimmed["input_ids"].shape[1] == -(-n_src // 8) * 8 and trimmed["labels"].shape[1] == -(-n_tgt // 8) * 8


# ---- exactness -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("router", sorted(ROUTERS))
def test_packed_denoising_equals_padded_per_sample(data: DenoisingDataset, router: str) -> None:
    model = _model(data.vocab_size, router)
    padded = _padded(data)
    packed, _ = pack_pairs(padded, data.pad_id, model.config.decoder_start_token_id, row_len=64, decoder_row_len=64)
    _assert_equal_per_sample(model, padded, packed)


def test_a_token_gate_needs_the_samples_order_in_both_stacks(data: DenoisingDataset) -> None:
    """The check above can fail: without each stack's token order a binding capacity drops other tokens."""
    model = _model(data.vocab_size, "topk")
    padded = _padded(data)
    packed, _ = pack_pairs(padded, data.pad_id, model.config.decoder_start_token_id, row_len=64, decoder_row_len=64)
    with torch.no_grad():
        want = model(**padded, task="text_summarization").loss.item()
        for drop in ("token_order", "decoder_token_order"):
            layout_order = {k: v for k, v in packed.items() if k != drop}
            assert model(**layout_order, task="text_summarization").loss.item() != pytest.approx(want, rel=RTOL)


def test_rows_of_several_tasks(data: DenoisingDataset) -> None:
    """Generation fine-tuning's mixed-task rows: a packed row holds one task, whose skills it runs."""
    model = _model(data.vocab_size)
    padded = _padded(data, 24)
    tasks = ["text_summarization" if i % 3 else "dialogue_generation" for i in range(24)]
    packed, rows = pack_pairs(padded, data.pad_id, model.config.decoder_start_token_id, groups=tasks,
                              row_len=64, decoder_row_len=64)
    assert all(len({tasks[i] for i in r}) == 1 for r in rows)
    _assert_equal_per_sample(model, padded, packed, tasks, [tasks[r[0]] for r in rows])


def _leaks(data: DenoisingDataset) -> tuple[float, float]:
    """(how far the changed sample's own logits move, how far any other sample's do) when one sample's
    encoder tokens change."""
    model = _model(data.vocab_size).eval()
    padded = _padded(data, 24)
    packed, rows = pack_pairs(padded, data.pad_id, model.config.decoder_start_token_id, row_len=128,
                              decoder_row_len=128)
    r = next(i for i, row in enumerate(rows) if len(row) >= 3)  # a sample with neighbours on both sides
    changed = {k: v.clone() for k, v in packed.items()}
    at = packed["segment_ids"][r] == 2
    changed["input_ids"][r, at] = (changed["input_ids"][r, at] + 7) % data.vocab_size
    with torch.no_grad():
        before = model(**packed, task="text_summarization").logits
        after = model(**changed, task="text_summarization").logits
    dseg = packed["decoder_segment_ids"]
    moved = (before - after).abs().amax(-1)
    others = dseg > 0
    others[r] &= dseg[r] != 2
    return float(moved[r][dseg[r] == 2].max()), float(moved[others].max())


@pytest.mark.parametrize("per_sample", [True, False], ids=["samples_rows", "block_mask"])
def test_no_sample_reads_another(data: DenoisingDataset, per_sample: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Change one sample's encoder tokens: its own logits move, no other sample's do, on either CPU path of
    the attention seam (the samples' own rows, the block mask)."""
    from skillnet.model import attention
    from skillnet.model.attention import AttentionMask

    monkeypatch.setattr(attention, "USE_PER_SAMPLE", per_sample)
    real, paths = AttentionMask.packed_pair, []

    def watched(enc: torch.Tensor, dec: torch.Tensor) -> tuple[AttentionMask, AttentionMask, AttentionMask]:
        masks = real(enc, dec)
        paths.extend(m.per_sample for m in masks)
        return masks

    monkeypatch.setattr(AttentionMask, "packed_pair", staticmethod(watched))
    own, others = _leaks(data)
    assert paths and all(p == per_sample for p in paths), paths
    assert own > 1e-4, "the changed sample's own logits did not move"
    assert others == 0, "a sample's encoder leaked into other samples"


def test_the_leak_check_sees_a_cross_attention_that_reads_every_sample(data: DenoisingDataset,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The check above can fail: a cross-attention over the whole encoder row moves the neighbours."""
    from skillnet.model.attention import AttentionMask

    real = AttentionMask.packed_pair

    def leaky(enc: torch.Tensor, dec: torch.Tensor) -> tuple[AttentionMask, AttentionMask, AttentionMask]:
        e, d, _ = real(enc, dec)
        return e, d, AttentionMask.build((enc > 0).long(), None, torch.float32)

    monkeypatch.setattr(AttentionMask, "packed_pair", staticmethod(leaky))
    assert _leaks(data)[1] > 1e-4


# ---- generation fine-tuning ----------------------------------------------------------------------------
def test_generation_finetuning_packs_its_training_rows_with_equal_loss_and_gradients() -> None:
    """The fine-tuning source packs a generation task's batches (both sides, rows of max_seq_len source and
    max_target_len target slots) where that saves slots: the same loss, label logits and gradients as the
    padded batch, the same data order and state, and both sides counted as real tokens."""
    from skillnet.data_prep.tokenizer import load_tokenizer
    from skillnet.finetune.build import build_model
    from skillnet.finetune.config import FinetuneConfig
    from skillnet.finetune.samplers import SamplerConfig, build_sampler
    from skillnet.finetune.source import MultiTaskBatchSource
    from skillnet.finetune.tasks import TaskData

    from tests.test_finetune_generation import gen_config

    d = gen_config(Path("unused"))
    for t in d["tasks"]:  # rows that several of the fixtures' short examples fit
        t.update(max_seq_len=96, max_target_len=64)
    cfg = FinetuneConfig.from_dict(d)
    tok = load_tokenizer(None)
    data = {t.name: TaskData(t, cfg, tok) for t in cfg.tasks}
    sizes = {n: d.num_train_rows() for n, d in data.items()}

    def source(packing: bool) -> MultiTaskBatchSource:
        return MultiTaskBatchSource(data, build_sampler(SamplerConfig(kind="proportional"), sizes, seed=2), 9,
                                    seed=2, packing=packing)

    plain, packed = source(False), source(True)
    model, _ = build_model(cfg, data)
    for module in model.modules():  # dropout off: the two layouts would draw different masks
        module.train(False)
    seen = set()
    for _ in range(6):
        a, b = next(plain), next(packed)
        assert a.task == b.task and a.decoder and b.decoder
        assert a.num_tokens() == b.num_tokens() > int(a.tensors["attention_mask"].sum())  # both sides count
        if "decoder_segment_ids" in b.tensors:
            seen.add(a.task)
            assert b.num_slots() < a.num_slots()
            _assert_equal_per_sample(model, a.tensors, b.tensors, a.task, b.task)
        else:  # did not pay (the fixtures' near-equal lengths): rows of the task's limits are exact all the same
            forced, rows = pack_pairs(a.tensors, tok.pad_id, tok.sep_id, row_len=96, decoder_row_len=64)
            assert len(rows) < len(a.tensors["input_ids"])
            _assert_equal_per_sample(model, a.tensors, forced, a.task, a.task)
    assert seen
    assert packed.state_dict() == plain.state_dict()


def test_causal_and_cross_attention_over_the_real_tokens_on_cuda() -> None:
    """The variable-length flash kernel, with separate query and key boundaries for cross-attention and a
    causal window for the decoder, equals the masked path (sm80+, bf16)."""
    if not torch.cuda.is_available():
        pytest.skip("CUDA: not run on this machine")
    from skillnet.model.attention import AttentionMask, attend, varlen_available

    enc = torch.tensor([[1] * 100 + [2] * 300 + [0] * 112, [1] * 512], device="cuda")
    dec = torch.tensor([[1] * 40 + [2] * 150 + [0] * 66, [1] * 200 + [0] * 56], device="cuda")
    _, causal, cross = AttentionMask.packed_pair(enc, dec)
    q = torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(2, 4, 512, 64, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    if not varlen_available(q, 0.0):
        pytest.skip("no variable-length kernel on this card (pre-sm80): the masked path runs")
    real = (dec > 0)[:, None, :, None].expand_as(q)
    for mask, keys, values in ((cross, k, v), (causal, q.clone(), q.clone())):
        fast = attend(q, keys, values, mask, 0.0)
        ref = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask.additive)
        torch.testing.assert_close(fast[real], ref[real], rtol=2e-2, atol=2e-2)
