"""Objective sampler and pre-training batch source: pure in (seed, step), rank-consistent, resumable."""

from __future__ import annotations

import pytest
import torch
from skillnet.pretrain.objectives import ObjectiveSampler, PretrainBatchSource
from skillnet.pretrain.synthetic import SyntheticPretrainingDataset


def test_sampler_is_pure_and_fair() -> None:
    a, b = ObjectiveSampler(seed=3), ObjectiveSampler(seed=3)
    draws = [a.choice(s) for s in range(4000)]
    assert draws == [b.choice(s) for s in range(4000)]  # another "rank" / another run
    assert [a.choice(s) for s in range(3999, -1, -1)] == draws[::-1]  # no hidden state
    frac = draws.count("mlm") / len(draws)
    assert 0.47 < frac < 0.53
    assert draws != [ObjectiveSampler(seed=4).choice(s) for s in range(4000)]


def test_sampler_weights_mode_and_state() -> None:
    w = ObjectiveSampler(seed=0, weights=(3.0, 1.0))
    frac = sum(w.choice(s) == "mlm" for s in range(4000)) / 4000
    assert 0.72 < frac < 0.78
    both = ObjectiveSampler(mode="both")
    assert [both.choice(7, k) for k in range(4)] == ["mlm", "nsp", "mlm", "nsp"]
    restored = ObjectiveSampler()
    restored.load_state_dict(w.state_dict())
    assert [restored.choice(s) for s in range(50)] == [w.choice(s) for s in range(50)]
    with pytest.raises(ValueError, match="mode"):
        ObjectiveSampler(mode="alternate")


def _sources(world: int, mbs: int = 2, accum: int = 2, n: int = 64) -> list[PretrainBatchSource]:
    ds = SyntheticPretrainingDataset(n, vocab_size=1024, max_seq_len=16)
    return [
        PretrainBatchSource(ds, ObjectiveSampler(seed=1), mbs, accum, r, world, seed=5) for r in range(world)
    ]


def test_ranks_read_disjoint_slices_of_one_global_batch_with_the_same_objective() -> None:
    srcs = _sources(world=2)
    for micro in range(40):  # crosses epochs: 64 // 8 = 8 steps per epoch
        pos = [s.position(micro) for s in srcs]
        assert pos[0][:3] == pos[1][:3]
        assert not set(pos[0][3]) & set(pos[1][3])
    batches = [next(s) for s in srcs]
    assert batches[0].task == batches[1].task
    # One epoch visits every sample exactly once across ranks and micro-batches.
    seen = [i for s in srcs for m in range(8 * 2) for i in s.position(m)[3]]
    assert sorted(seen) == list(range(64))


def test_source_resumes_at_the_exact_position() -> None:
    a = _sources(world=1)[0]
    for _ in range(5):
        next(a)
    state = a.state_dict()
    expect = [next(a) for _ in range(6)]
    b = _sources(world=1)[0]
    b.load_state_dict(state)
    got = [next(b) for _ in range(6)]
    for x, y in zip(expect, got):
        assert x.task == y.task
        for k in x.tensors:
            assert torch.equal(x.tensors[k], y.tensors[k])
    other = _sources(world=2)[0]
    with pytest.raises(ValueError, match="geometry"):
        other.load_state_dict(state)


def test_source_errors_are_clear() -> None:
    ds = SyntheticPretrainingDataset(10, vocab_size=1024, max_seq_len=16)
    with pytest.raises(ValueError, match="fewer than one global batch"):
        PretrainBatchSource(ds, ObjectiveSampler(), 4, 2, 0, 2)
    with pytest.raises(ValueError, match="multiple of 2"):
        PretrainBatchSource(ds, ObjectiveSampler(mode="both"), 1, 3, 0, 1)


def test_synthetic_batches_match_the_dataset_contract() -> None:
    ds = SyntheticPretrainingDataset(32, vocab_size=1024, max_seq_len=16)
    mlm = ds.batch([0, 5], 0, "mlm")
    assert set(mlm) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    assert (mlm["labels"] != -100).any() and mlm["input_ids"].shape == (2, 16)
    nsp = ds.batch([0, 5], 0, "nsp")
    assert set(nsp) == {"input_ids", "token_type_ids", "attention_mask", "next_sentence_label"}
    assert torch.equal(ds.batch([3], 1, "nsp")["input_ids"], ds.batch([3], 1, "nsp")["input_ids"])


def test_source_resumes_on_another_geometry_with_the_same_global_batch() -> None:
    """A requeue onto another number of ranks: step s reads the same samples whatever the split."""
    before = _sources(world=2, mbs=2, accum=3, n=60)  # global batch 12, 5 steps per epoch
    for _ in range(4 * 3):  # 4 steps, across ranks
        for s in before:
            next(s)
    state = before[0].state_dict()
    straight = _sources(world=2, mbs=2, accum=3, n=60)

    def step_samples(srcs: list[PretrainBatchSource], step: int) -> list[int]:
        accum = srcs[0].grad_accum
        return sorted(i for s in srcs for m in range(step * accum, (step + 1) * accum) for i in s.position(m)[3])

    for world, mbs, accum in ((1, 2, 6), (3, 2, 2), (4, 1, 3), (6, 2, 1)):
        after = _sources(world=world, mbs=mbs, accum=accum, n=60)
        for s in after:
            s.load_state_dict(state)
            assert s.micro == 4 * accum
        for step in range(4, 12):  # crosses the epoch boundary at step 5 and 10
            got = step_samples(after, step)
            assert got == step_samples(straight, step) and len(set(got)) == 12, (world, step)
        batches = [next(s) for s in after]
        assert {b.task for b in batches} == {ObjectiveSampler(seed=1).choice(4)}
    for bad in (_sources(world=2, mbs=2, accum=2, n=60)[0], _sources(world=2, mbs=2, accum=3, n=60)[0]):
        if bad.global_batch == 12:
            bad.seed = 6
        with pytest.raises(ValueError, match="same global batch and seed"):
            bad.load_state_dict(state)


def test_mlm_batches_carry_their_predicted_positions_and_the_model_gives_the_same_loss() -> None:
    """The loader finds the MLM positions on the host, so the model need not ask the device to count them:
    the positions are exactly the labelled ones, and the loss, logits and metrics equal the mask path's."""
    import torch
    from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining
    from skillnet.pretrain.objectives import ObjectiveSampler, PretrainBatchSource
    from skillnet.pretrain.synthetic import SyntheticPretrainingDataset

    src = PretrainBatchSource(SyntheticPretrainingDataset(64, vocab_size=1000, max_seq_len=32), ObjectiveSampler(seed=0),
                             4, 1)
    torch.manual_seed(0)
    model = SkillNetBertForPreTraining(SkillNetBertConfig.preset("tiny", vocab_size=1000)).eval()
    seen = set()
    for _ in range(8):
        b = next(src)
        seen.add(b.task)
        if b.task != "mlm":
            assert "mlm_positions" not in b.tensors
            continue
        pos = b.tensors["mlm_positions"]
        assert torch.equal(pos, b.tensors["labels"].reshape(-1).ne(-100).nonzero().view(-1)) and pos.numel() > 0
        fast = model(task="mlm", **b.tensors)
        ref = model(task="mlm", **{k: v for k, v in b.tensors.items() if k != "mlm_positions"})
        torch.testing.assert_close(fast.logits, ref.logits, rtol=0, atol=0)
        torch.testing.assert_close(fast.loss, ref.loss, rtol=0, atol=0)
        assert fast.metrics["mlm_count"] == ref.metrics["mlm_count"]
        assert int(fast.metrics["mlm_correct"]) == int(ref.metrics["mlm_correct"])
    assert seen == {"mlm", "nsp"}
