"""`model/crf.crf_log_likelihood` (the NER head's loss, a log2(T)-step tree product) equals pytorch-crf's
``CRF.forward``, the reference implementation, in value and gradient, for every reduction, ragged prefix
masks, rows of one word, forbidden (-1e4) moves, both of its partition paths and half-precision emissions."""

from __future__ import annotations

import pytest
import torch
from skillnet.model import crf as fast
from torchcrf import CRF as ReferenceCRF


def _case(B: int, T: int, L: int, seed: int) -> tuple[ReferenceCRF, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    ref = ReferenceCRF(L, batch_first=True)
    with torch.no_grad():
        ref.transitions.copy_(torch.randn(L, L, generator=g) * 2)
        ref.transitions[0, L - 1] = -10000.0  # forbidden moves and starts, as the IOB2 constraint adds
        ref.transitions[L - 1, L - 1] = -10000.0
        ref.start_transitions.copy_(torch.randn(L, generator=g))
        ref.start_transitions[L - 1] = -10000.0
        ref.end_transitions.copy_(torch.randn(L, generator=g))
    em = (torch.randn(B, T, L, generator=g) * 3).requires_grad_()
    tags = torch.randint(0, L, (B, T), generator=g)
    n = torch.randint(1, T + 1, (B,), generator=g)
    n[0], n[-1] = 1, T - 1 if T > 1 else 1  # a one-word row; no row reaches T (trimmed positions)
    mask = torch.arange(T)[None] < n[:, None]
    return ref, em, tags, mask


def _reference64(ref: ReferenceCRF, em: torch.Tensor) -> tuple[ReferenceCRF, torch.Tensor]:
    ref64 = ReferenceCRF(ref.num_tags, batch_first=True).double()
    ref64.load_state_dict({k: v.double() for k, v in ref.state_dict().items()})
    return ref64, em.detach().double().requires_grad_()


def _grads(out: torch.Tensor, crf: ReferenceCRF, em: torch.Tensor) -> list[torch.Tensor]:
    params = [em, crf.start_transitions, crf.transitions, crf.end_transitions]
    return list(torch.autograd.grad(out.sum(), params, allow_unused=True, materialize_grads=True,
                                     retain_graph=True))


@pytest.mark.parametrize("reduction", ["none", "sum", "mean", "token_mean"])
@pytest.mark.parametrize("B,T,L", [(1, 1, 3), (3, 2, 5), (5, 37, 7), (4, 128, 9)])
@pytest.mark.parametrize("path", ["tree", "loop"])
def test_likelihood_and_gradients_equal_pytorch_crf(B: int, T: int, L: int, reduction: str, path: str,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Against pytorch-crf in float64 (the exact answer); fp32 may differ from it by no more than twice
    pytorch-crf's own fp32 rounding (the log-likelihood of 128 words here is ~2e4 in size)."""
    if path == "loop":
        monkeypatch.setattr(fast, "TREE_MAX_ELEMENTS", 0)
    ref, em, tags, mask = _case(B, T, L, seed=B * 1000 + T)
    ref64, em64 = _reference64(ref, em)
    exact = ref64(em64, tags, mask, reduction=reduction)
    ref32 = ref(em, tags, mask, reduction=reduction)
    got = fast.crf_log_likelihood(em, tags, mask, ref.start_transitions, ref.transitions, ref.end_transitions,
                                  reduction)
    assert got.dtype == torch.float32 and got.shape == exact.shape

    def close(a: torch.Tensor, ref32: torch.Tensor, exact: torch.Tensor, what: str) -> None:
        bound = 2 * (ref32.double() - exact).abs().max().item() + 1e-5 * (1 + exact.abs().max().item())
        err = (a.double() - exact).abs().max().item()
        assert err <= bound, f"{what}: off the float64 answer by {err:.3g}, pytorch-crf fp32 by {bound:.3g}"

    close(got, ref32, exact, "log-likelihood")
    names = ("emissions", "start", "transitions", "end")
    g_got = _grads(got, ref, em)
    for name, a, r, e in zip(names, g_got, _grads(ref32, ref, em), _grads(exact, ref64, em64)):
        close(a, r, e, f"d/d {name}")
    # masked-out positions get no gradient, as in pytorch-crf
    assert not g_got[0][~mask].any()


def test_the_tree_path_is_taken_for_a_typical_batch_and_the_loop_beyond_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    ref, em, tags, mask = _case(8, 64, 7, seed=1)
    calls = []
    for name in ("_log_partition_tree", "_log_partition_loop"):
        orig = getattr(fast, name)
        monkeypatch.setattr(fast, name, lambda *a, orig=orig, name=name: calls.append(name) or orig(*a))
    args = (em, tags, mask, ref.start_transitions, ref.transitions, ref.end_transitions)
    fast.crf_log_likelihood(*args)
    monkeypatch.setattr(fast, "TREE_MAX_ELEMENTS", 7 ** 3)  # below one pair of steps
    fast.crf_log_likelihood(*args)
    assert calls == ["_log_partition_tree", "_log_partition_loop"]


def test_half_precision_emissions_are_scored_in_fp32() -> None:
    ref, em, tags, mask = _case(4, 50, 7, seed=2)
    got = fast.crf_log_likelihood(em.detach().half(), tags, mask, ref.start_transitions, ref.transitions,
                                  ref.end_transitions, "none")
    ref64, em64 = _reference64(ref, em.detach().half().float())
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), ref64(em64, tags, mask, reduction="none"), rtol=1e-5, atol=1e-3)


def test_the_stand_in_module_matches_pytorch_crf_parameters_and_likelihood() -> None:
    for batch_first in (True, False):
        torch.manual_seed(3)
        ref = ReferenceCRF(6, batch_first=batch_first)
        torch.manual_seed(3)
        mine = fast.CRF(6, batch_first=batch_first)
        assert mine.state_dict().keys() == ref.state_dict().keys()
        for k, v in ref.state_dict().items():
            assert torch.equal(mine.state_dict()[k], v), k  # same names, same draws: old seeds hold
        _, em, tags, mask = _case(3, 9, 6, seed=4)
        if not batch_first:
            em, tags, mask = em.transpose(0, 1), tags.transpose(0, 1), mask.transpose(0, 1)
        torch.testing.assert_close(mine(em, tags, mask), ref(em, tags, mask), rtol=1e-5, atol=1e-3)


def test_float64_inputs_stay_float64() -> None:
    ref, em, tags, mask = _case(3, 20, 5, seed=5)
    ref64, em64 = _reference64(ref, em)
    got = fast.crf_log_likelihood(em64, tags, mask, ref64.start_transitions, ref64.transitions,
                                  ref64.end_transitions, "none")
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, ref64(em64, tags, mask, reduction="none"), rtol=1e-12, atol=1e-9)


def test_the_stand_in_module_refuses_masks_outside_its_definition() -> None:
    crf = fast.CRF(4, batch_first=True)
    em, tags = torch.randn(2, 5, 4), torch.zeros(2, 5, dtype=torch.long)
    with pytest.raises(ValueError, match="first timestep"):
        crf(em, tags, torch.tensor([[1, 1, 0, 0, 0], [0, 0, 0, 0, 0]], dtype=torch.bool))
    with pytest.raises(ValueError, match="prefix"):
        crf(em, tags, torch.tensor([[1, 1, 0, 1, 0], [1, 0, 0, 0, 0]], dtype=torch.bool))


def test_the_ner_heads_loss_is_pytorch_crfs_with_the_iob2_constraint() -> None:
    """The head's loss equals pytorch-crf's likelihood run with the constrained transition scores (what the
    head computed before), for both of its reductions."""
    from skillnet.model import SkillNetBertConfig
    from skillnet.model.heads import CRF_LOSS_REDUCTIONS, TokenCRFHead

    labels = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]
    cfg = SkillNetBertConfig.preset("tiny")
    torch.manual_seed(6)
    hidden = torch.randn(3, 12, cfg.hidden_size)
    word_mask = torch.ones(3, 12, dtype=torch.bool)
    word_mask[:, 0] = word_mask[0, 9:] = word_mask[1, 4:] = word_mask[2, 7] = False  # [CLS], padding, a "##" piece
    gold = torch.randint(0, 5, (3, 12))
    gold[:, 1] = 0  # valid IOB2 is not needed for a likelihood; a fixed start keeps it finite
    enc = type("Enc", (), {"last_hidden_state": hidden})()
    for reduction, torchcrf_name in CRF_LOSS_REDUCTIONS.items():
        head = TokenCRFHead(cfg, 5, 0.0, labels=labels, loss_reduction=reduction).eval()
        out = head(enc, {"labels": gold.masked_fill(~word_mask, -100), "word_mask": word_mask})
        em = head.classifier(hidden)
        rows = [[t for t in range(12) if word_mask[b, t]] for b in range(3)]
        n = max(map(len, rows))
        em_p = torch.stack([torch.cat([em[b, r], em.new_zeros(n - len(r), 5)]) for b, r in enumerate(rows)])
        tags_p = torch.stack([torch.cat([gold[b, r], gold.new_zeros(n - len(r))]) for b, r in enumerate(rows)])
        mask_p = torch.tensor([[k < len(r) for k in range(n)] for r in rows])
        want = -torch.func.functional_call(head.crf, head._transitions(), (em_p, tags_p),
                                           {"mask": mask_p, "reduction": torchcrf_name})
        torch.testing.assert_close(out.loss, want, rtol=1e-5, atol=1e-5)
