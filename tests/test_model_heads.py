import pytest
import torch
from skillnet.model import SkillNetBertConfig, SkillNetBertForMultiTask, SkillNetBertForPreTraining
from skillnet.model.heads import _pack_left

HEADS = {
    "sentiment": {"type": "classification", "num_labels": 2},
    "nli": {"type": "classification", "num_labels": 3},
    "similarity": {"type": "regression"},
    "ner": {"type": "token_crf", "num_labels": 7},
    "mrc": {"type": "span", "max_answer_len": 4},
    "text_classification": {"type": "matching"},
}


@pytest.fixture(scope="module")
def model() -> SkillNetBertForMultiTask:
    torch.manual_seed(0)
    return SkillNetBertForMultiTask(SkillNetBertConfig.preset("tiny", task_heads=HEADS)).eval()


def _x(b=3, t=8):
    return torch.randint(1, 200, (b, t)), torch.ones(b, t, dtype=torch.long)


def test_each_head_trains_and_predicts(model):
    x, am = _x()
    cases = {
        "sentiment": dict(labels=torch.tensor([0, 1, 1])),
        "nli": dict(labels=torch.tensor([0, 2, 1]), token_type_ids=torch.tensor([[0] * 4 + [1] * 4] * 3)),
        "similarity": dict(labels=torch.tensor([0.1, 0.5, 0.9])),
        "ner": dict(labels=torch.tensor([[-100, 0, 1, 2, 0, -100, -100, -100]] * 3)),
        "mrc": dict(start_positions=torch.tensor([1, 2, 3]), end_positions=torch.tensor([2, 2, 5])),
    }
    for task, kw in cases.items():
        out = model(task=task, input_ids=x, attention_mask=am, **kw)
        assert out.loss.ndim == 0 and torch.isfinite(out.loss), task
        out.loss.backward()
        preds = model.predict(
            task,
            input_ids=x,
            attention_mask=am,
            **{k: v for k, v in kw.items() if k == "token_type_ids"},
            **({"word_mask": kw["labels"] != -100} if task == "ner" else {}),
        )
        assert len(preds) == 3, task
    assert all(
        len(p) == 4
        for p in model.predict(
            "ner", input_ids=x, attention_mask=am, word_mask=cases["ner"]["labels"] != -100
        )
    )
    for s, e in model.predict("mrc", input_ids=x, attention_mask=am):
        assert 0 <= e - s < 4


def test_matching_groups(model):
    x = torch.randint(1, 200, (2, 4, 6))
    cm = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    out = model(task="text_classification", input_ids=x, candidate_mask=cm, labels=torch.tensor([3, 1]))
    assert out.logits.shape == (2, 4) and torch.isfinite(out.loss)
    assert all(p < 2 for p in model.predict("text_classification", input_ids=x, candidate_mask=cm)[1:])
    with pytest.raises(ValueError, match="matching task"):
        model(task="text_classification", input_ids=x[0])


def test_unknown_task_error_lists_heads(model):
    x, am = _x()
    with pytest.raises(KeyError, match="tasks with heads: sentiment"):
        model(task="ocr", input_ids=x)


def test_pack_left_moves_words_to_front():
    valid = torch.tensor([[False, True, False, True], [True, True, True, False]])
    vals = torch.tensor([[9, 1, 9, 2], [3, 4, 5, 9]])
    mask, packed = _pack_left(valid, vals)
    assert mask.tolist() == [[True, True, False, False], [True, True, True, False]]
    assert packed[0, :2].tolist() == [1, 2] and packed[1, :3].tolist() == [3, 4, 5]


@pytest.mark.slow  # measured 62 s
def test_crf_decode_follows_transitions():
    torch.manual_seed(0)
    m = SkillNetBertForMultiTask(
        SkillNetBertConfig.preset("tiny", task_heads={"ner": {"type": "token_crf", "num_labels": 3}})
    )
    x, am = _x(2, 6)
    labels = torch.tensor([[-100, 1, 2, 2, 0, -100]] * 2)
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(60):
        opt.zero_grad()
        m(task="ner", input_ids=x, attention_mask=am, labels=labels).loss.backward()
        opt.step()
    assert (
        m.eval().predict("ner", input_ids=x, attention_mask=am, word_mask=labels != -100)
        == [[1, 2, 2, 0]] * 2
    )


def test_pretraining_objectives_use_their_skills():
    torch.manual_seed(0)
    p = SkillNetBertForPreTraining(SkillNetBertConfig.preset("tiny"))
    x, am = _x(4, 10)
    labels = torch.full_like(x, -100)
    labels[:, 2] = x[:, 2]
    out = p(task="mlm", input_ids=x, attention_mask=am, labels=labels)
    out.loss.backward()
    assert out.metrics["mlm_count"] == 4
    grads = {n for n, q in p.named_parameters() if q.grad is not None}
    assert any(".skills.1." in n for n in grads) and not any(".skills.0." in n for n in grads)
    assert not any(n.startswith("cls.seq_relationship") for n in grads)
    p.zero_grad(set_to_none=True)
    out = p(task="nsp", input_ids=x, attention_mask=am, next_sentence_label=torch.tensor([0, 1, 0, 1]))
    out.loss.backward()
    grads = {n for n, q in p.named_parameters() if q.grad is not None}
    assert any(".skills.0." in n for n in grads) and not any(".skills.1." in n for n in grads)
    with pytest.raises(ValueError, match="'mlm' or 'nsp'"):
        p(task="ner", input_ids=x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_task_matches_the_models_mode_and_dtype(dtype):
    """A task added to a model in eval mode (serving, adding a task to a loaded export) must not run its
    new head and PALs in training mode (dropout on every prediction), and a model cast to bf16 must not
    get an fp32 head (a dtype error at the first forward)."""
    torch.manual_seed(0)
    m = SkillNetBertForMultiTask(SkillNetBertConfig.preset(
        "tiny", task_heads={"sentiment": HEADS["sentiment"]}, pals_dim=12, hidden_dropout_prob=0.5)).to(dtype).eval()
    m.add_task("topic", ["s4"], {"type": "classification", "num_labels": 3})
    assert [n for n, mod in m.named_modules() if mod.training] == []
    assert {p.dtype for p in m.parameters()} == {dtype}
    x, am = _x()
    with torch.no_grad():
        a, b = (m(task="topic", input_ids=x, attention_mask=am).logits for _ in range(2))
    assert torch.equal(a, b)
    m.train()
    m.add_task("intent", ["s4"], {"type": "classification", "num_labels": 2})
    assert m.heads["intent"].training
