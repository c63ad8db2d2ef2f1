"""The NER head's CRF only outputs valid IOB2: ``I-X`` follows ``B-X`` or ``I-X`` and never starts a
sentence. The constraint comes from the head spec's label list."""

from __future__ import annotations

import itertools

import pytest
import torch
from skillnet.model import SkillNetBertConfig, SkillNetBertForMultiTask
from skillnet.model.heads import CRF_LOSS_REDUCTIONS, TokenCRFHead, iob2_allowed_transitions

LABELS = ["O", "B-PER", "I-PER", "B-ORG", "I-ORG"]


def _move_ok(prev: str, tag: str) -> bool:
    return not tag.startswith("I-") or prev in ("B-" + tag[2:], tag)


def _valid(tags: list[str]) -> bool:
    return all(_move_ok(p, t) for p, t in zip(["O", *tags], tags))


def _head(labels=LABELS) -> TokenCRFHead:
    cfg = SkillNetBertConfig.preset("tiny")
    head = TokenCRFHead(cfg, len(LABELS), 0.0, labels=labels)
    with torch.no_grad():
        # Transitions that reward exactly the invalid moves: an unconstrained Viterbi follows them.
        for i, j in itertools.product(range(len(LABELS)), repeat=2):
            head.crf.transitions[i, j] = 3.0 if not _move_ok(LABELS[i], LABELS[j]) else -1.0
        head.crf.start_transitions.copy_(torch.tensor([0.0, 0.0, 5.0, 0.0, 5.0]))
    return head


def test_allowed_transitions_follow_iob2():
    start, trans = iob2_allowed_transitions(LABELS)
    assert start.tolist() == [True, True, False, True, False]
    for i, j in itertools.product(range(len(LABELS)), repeat=2):
        assert bool(trans[i, j]) == _move_ok(LABELS[i], LABELS[j]), (LABELS[i], LABELS[j])


def test_viterbi_is_the_best_valid_sequence():
    torch.manual_seed(0)
    head = _head()
    em = torch.randn(4, 5, len(LABELS)) * 2
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 1, 1, 0]], dtype=torch.bool)
    decoded = head.viterbi(em, mask)
    st, tr, en = head.crf.start_transitions, head.crf.transitions, head.crf.end_transitions
    for b, tags in enumerate(decoded):
        n = int(mask[b].sum())
        assert len(tags) == n
        assert _valid([LABELS[t] for t in tags])

        def score(seq, b=b):
            s = st[seq[0]] + em[b, 0, seq[0]] + en[seq[-1]]
            return s + sum(tr[seq[k - 1], seq[k]] + em[b, k, seq[k]] for k in range(1, len(seq)))

        # brute force over every valid sequence of this length
        best = max((seq for seq in itertools.product(range(len(LABELS)), repeat=n)
                    if _valid([LABELS[t] for t in seq])), key=lambda seq: float(score(seq)))
        assert tags == list(best)


def test_unconstrained_head_matches_pytorch_crf():
    torch.manual_seed(1)
    head = _head(labels=None)  # no label list (an old head spec): nothing to constrain
    em = torch.randn(3, 6, len(LABELS))
    mask = torch.ones(3, 6, dtype=torch.bool)
    mask[1, 4:] = False
    assert head.viterbi(em, mask) == head.crf.decode(em, mask=mask)


def test_model_predictions_are_valid_bio_and_training_is_constrained():
    torch.manual_seed(0)
    heads = {"ner": {"type": "token_crf", "num_labels": len(LABELS), "labels": LABELS}}
    m = SkillNetBertForMultiTask(SkillNetBertConfig.preset("tiny", task_heads=heads)).eval()
    h = m.heads["ner"]
    with torch.no_grad():
        h.crf.transitions.fill_(0.0)
        h.crf.transitions[0, 2] = h.crf.transitions[3, 2] = h.crf.transitions[1, 4] = 8.0  # O->I-PER etc.
        h.crf.start_transitions.copy_(torch.tensor([0.0, 0.0, 8.0, 0.0, 8.0]))
    x = torch.randint(1, 200, (8, 10))
    wm = torch.ones(8, 10, dtype=torch.long)
    wm[:, 0] = wm[:, -1] = 0
    preds = m.predict("ner", input_ids=x, attention_mask=torch.ones_like(x), word_mask=wm)
    assert all(len(p) == 8 and _valid([LABELS[t] for t in p]) for p in preds)
    # The loss is over valid sequences only: the normaliser of the constrained CRF excludes paths
    # through forbidden moves, so with everything else equal its loss is lower than pytorch-crf's.
    labels = torch.full((8, 10), -100)
    labels[:, 1:-1] = 0
    loss = m(task="ner", input_ids=x, attention_mask=torch.ones_like(x), labels=labels, word_mask=wm).loss
    em = h.classifier(m.bert(x, torch.ones_like(x), None, task="ner").last_hidden_state)
    plain = -h.crf(em[:, 1:-1], labels[:, 1:-1], reduction=CRF_LOSS_REDUCTIONS[h.loss_reduction])
    assert torch.isfinite(loss) and float(loss) < float(plain) - 1.0


def test_label_list_must_fit_num_labels():
    with pytest.raises(ValueError, match="labels"):
        TokenCRFHead(SkillNetBertConfig.preset("tiny"), 3, 0.0, labels=["O", "B-X"])
