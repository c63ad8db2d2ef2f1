"""Packed rows' attention off the variable-length kernel (model/attention.py): the samples gathered one per
row, in groups of similar size, each sample's queries over its own keys. Checked against each sample's
attention computed alone (its own slice of the row, SDPA), for encoder self-attention, a decoder's causal
self-attention and cross-attention between two packed sides, in values and in every gradient; and the rule
that picks it over the block-diagonal mask."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from skillnet.model import attention
from skillnet.model.attention import AttentionMask, attend

RTOL, ATOL = 1e-5, 2e-6


def _segments(lengths: list[list[int]], width: int) -> torch.Tensor:
    rows = []
    for row in lengths:
        seg = [k + 1 for k, n in enumerate(row) for _ in range(n)]
        rows.append(seg + [0] * (width - len(seg)))
    return torch.tensor(rows)


def _spans(seg_T: torch.Tensor) -> list[slice]:
    return [slice(int(i[0]), int(i[-1]) + 1) for k in range(1, int(seg_T.max()) + 1)
            for i in [torch.nonzero(seg_T == k).flatten()]]


def _alone(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, q_seg: torch.Tensor, k_seg: torch.Tensor,
           causal: bool) -> torch.Tensor:
    """Each sample's attention computed on its own slices only; padding queries left at 0."""
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        for sq, sk in zip(_spans(q_seg[b]), _spans(k_seg[b]), strict=True):
            out[b, :, sq] = F.scaled_dot_product_attention(q[b:b + 1, :, sq], k[b:b + 1, :, sk], v[b:b + 1, :, sk],
                                                           is_causal=causal)[0]
    return out


# Lengths spread over more than a factor 2, so several groups form, with one-token samples among them.
ENC = [[10, 30, 1, 5], [20, 2, 18]]
DEC = [[4, 15, 1, 3], [12, 1, 7]]


@pytest.mark.parametrize("which", ["encoder", "causal", "cross"])
def test_each_sample_attends_as_alone(which: str) -> None:
    torch.manual_seed(0)
    enc, dec = _segments(ENC, 48), _segments(DEC, 24)
    enc_mask, causal_mask, cross_mask = AttentionMask.packed_pair(enc, dec)
    mask, q_seg, k_seg = {"encoder": (enc_mask, enc, enc), "causal": (causal_mask, dec, dec),
                          "cross": (cross_mask, dec, enc)}[which]
    assert mask.per_sample_pays() and len(mask.sample_buckets()) > 1
    H, d = 3, 8
    q = torch.randn(2, H, q_seg.shape[1], d, requires_grad=True)
    k, v = (torch.randn(2, H, k_seg.shape[1], d, requires_grad=True) for _ in range(2))
    got = attend(q, k, v, mask, 0.0)
    want = _alone(q, k, v, q_seg, k_seg, which == "causal")
    real = (q_seg > 0)[:, None, :, None].expand_as(got)
    torch.testing.assert_close(got[real], want[real], rtol=RTOL, atol=ATOL)
    assert torch.all(got[~real] == 0)  # padding queries: never read
    grad = torch.randn_like(got) * real
    for a, b in zip(torch.autograd.grad(got, (q, k, v), grad), torch.autograd.grad(want, (q, k, v), grad),
                    strict=True):
        torch.testing.assert_close(a, b, rtol=RTOL, atol=ATOL)


def test_the_block_mask_path_agrees(monkeypatch: pytest.MonkeyPatch) -> None:
    """The two exact CPU paths give the same outputs at every real token (the switch for A/B measurements)."""
    torch.manual_seed(1)
    seg = _segments(ENC, 48)
    q, k, v = (torch.randn(2, 4, 48, 16) for _ in range(3))
    mask = AttentionMask.build(None, seg, torch.float32)
    per_sample = attend(q, k, v, mask, 0.0)
    assert mask.per_sample and mask._block is None  # the block mask is not built where it is not used
    monkeypatch.setattr(attention, "USE_PER_SAMPLE", False)
    mask = AttentionMask.build(None, seg, torch.float32)
    block = attend(q, k, v, mask, 0.0)
    assert not mask.per_sample and mask._block is not None
    real = (seg > 0)[:, None, :, None].expand_as(block)
    torch.testing.assert_close(per_sample[real], block[real], rtol=RTOL, atol=ATOL)


def test_groups_bound_each_samples_cost() -> None:
    """No sample of a group but the last computes more than BUCKET_RATIO times its own scores, at most
    MAX_BUCKETS groups form, and every real token is in exactly one group."""
    lengths = [[64], [40, 20], [33, 9, 9, 9], [5, 3, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]]
    seg = _segments(lengths, 64)
    buckets = AttentionMask.build(None, seg, torch.float32).sample_buckets()
    assert len(buckets) <= attention.MAX_BUCKETS
    tokens = torch.cat([b.tokens for b in buckets])
    assert sorted(tokens.tolist()) == torch.nonzero(seg.flatten() > 0).flatten().tolist()
    for b in buckets[:-1]:
        own = b.key_mask[:, 0, 0].sum(1)
        assert torch.all(b.width * b.key_width <= attention.BUCKET_RATIO * own * own)


def test_the_block_mask_runs_where_the_samples_rows_save_too_little() -> None:
    """One sample per full row, or a long sample beside a short one: the samples' own rows would compute
    (nearly) the block mask's scores and pay for the gathers on top, so the mask path runs."""
    for lengths in ([[32], [32]], [[30, 2], [32]]):
        assert not AttentionMask.build(None, _segments(lengths, 32), torch.float32).per_sample_pays(), lengths
    assert AttentionMask.build(None, _segments([[8, 8, 8, 8], [32]], 32), torch.float32).per_sample_pays()


def test_dropout_runs_on_the_samples_rows() -> None:
    """Training's attention dropout applies on the per-sample layout: outputs stay finite and differ from
    evaluation's."""
    torch.manual_seed(2)
    mask = AttentionMask.build(None, _segments(ENC, 48), torch.float32)
    q, k, v = (torch.randn(2, 2, 48, 8) for _ in range(3))
    train, evaluation = attend(q, k, v, mask, 0.5), attend(q, k, v, mask, 0.0)
    assert torch.isfinite(train).all() and not torch.allclose(train, evaluation)


def test_cross_attention_between_other_samples_takes_the_block_mask() -> None:
    """Decoder and encoder sides that do not hold the same (row, segment) samples cannot be paired by order:
    the block mask, which pairs them by row and segment id, runs (it errored or read across rows)."""
    enc = _segments([[2, 2], [3]], 4)  # samples (0,1) (0,2) (1,1)
    dec = _segments([[2], [1, 1]], 4)  # samples (0,1) (1,1) (1,2)
    _, _, cross = AttentionMask.packed_pair(enc, dec)
    assert not cross.per_sample
    q, k, v = torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8), torch.randn(2, 2, 4, 8)
    got = attend(q, k, v, cross, 0.0)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=cross.block_mask())
    real = (dec > 0)[:, None, :, None].expand_as(got)
    torch.testing.assert_close(got[real], want[real])


def test_a_packed_forward_builds_no_block_mask_it_does_not_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """SkillNet-BERT on packed rows that the samples' own rows serve never builds the [B, 1, T, T] mask (the
    task-extras hook read it on every forward); a model with PALs, which attend over it, still gets it."""
    from skillnet.model import SkillNetBertConfig, SkillNetBertForMultiTask
    from skillnet.training.packing import pack_rows

    from tests.test_packing import HEADS

    built = []
    real = AttentionMask.block_mask
    monkeypatch.setattr(AttentionMask, "block_mask", lambda self: built.append(1) or real(self))
    lens = torch.tensor([12, 9, 30, 7, 5, 16])
    mask = (torch.arange(32)[None, :] < lens[:, None]).long()
    padded = {"input_ids": torch.randint(1000, 5000, (6, 32)) * mask, "attention_mask": mask,
              "token_type_ids": torch.zeros(6, 32, dtype=torch.long)}
    packed, _ = pack_rows(padded, 0, row_len=96)
    for pals, want in ((False, 0), (True, 1)):
        built.clear()
        extra = {"pals_dim": 16, "pals_heads": 4} if pals else {}
        cfg = SkillNetBertConfig.preset("tiny", task_heads=HEADS, tasks={"a": ["s1", "s7"], "b": ["s2", "s7"]},
                                        **extra)
        with torch.no_grad():
            SkillNetBertForMultiTask(cfg).eval()(task="a", **packed)
        assert len(built) == want, (pals, built)
