"""A task of a SkillNet model as a stock transformers model: export/flatten.py flattens a task's skills into
one FFN per layer, exactly; what cannot be flattened (MoE, PALs, per-skill LayerNorm over several skills) is
refused with a one-line reason. These tests build tiny random models in-process; test_plain_deploy.py loads
real exports in an interpreter that cannot import the project."""

from __future__ import annotations

import pytest
import torch
from skillnet.export.flatten import NotFlattenable, plain_bart, plain_bert
from skillnet.model.bart import SkillNetBartConfig, SkillNetBartForConditionalGeneration
from skillnet.model.config import DEFAULT_TASKS, SkillNetBertConfig
from skillnet.model.heads import SkillNetBertForMultiTask, SkillNetBertForPreTraining

HEADS = {"sentiment": {"type": "classification", "num_labels": 2, "labels": ["neg", "pos"]},
         "ner": {"type": "token_crf", "num_labels": 3, "labels": ["O", "B-PER", "I-PER"]},
         "qa_match": {"type": "matching"}, "mrc": {"type": "span"}, "nli": {"type": "regression"}}
TASKS = {**DEFAULT_TASKS, "qa_match": ["s1", "s3", "s5"]}
STOCK = {"sentiment": "BertForSequenceClassification", "ner": "BertForTokenClassification",
         "qa_match": "BertForSequenceClassification", "mrc": "BertForQuestionAnswering",
         "nli": "BertForSequenceClassification"}


def _bert(**kw) -> SkillNetBertForMultiTask:
    torch.manual_seed(0)
    return SkillNetBertForMultiTask(SkillNetBertConfig.preset("tiny", **{"task_heads": HEADS, "tasks": TASKS, **kw})).eval()


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, 5000, (3, 12), generator=g)
    am = torch.ones_like(ids)
    am[1, 8:] = 0
    return ids, am


@torch.no_grad()
def _pair(m: SkillNetBertForMultiTask, plain: torch.nn.Module, task: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(sparse, plain) outputs of `task` at the positions that mean something, in one layout."""
    ids, am = _inputs()
    out = plain(input_ids=ids, attention_mask=am)
    if task == "qa_match":  # the sparse head scores a group [G, C]; the plain model one row each
        return m(task=task, input_ids=ids[None], attention_mask=am[None]).logits[0], out.logits[:, 0]
    ref = m(task=task, input_ids=ids, attention_mask=am).logits
    if task == "mrc":
        return ref[am.bool()], torch.stack([out.start_logits, out.end_logits], -1)[am.bool()]
    if task == "ner":
        return ref[am.bool()], out.logits[am.bool()]
    return (ref, out.logits[:, 0]) if task == "nli" else (ref, out.logits)


@pytest.mark.parametrize("variant", [{}, {"skill_layers": "top:1"}, {"router": "learned"}, {"ffn_impl": "loop"}],
                         ids=["task_map", "top_layers_padded", "learned_map", "loop"])
def test_every_head_flattens_exactly(variant):
    m = _bert(**variant)
    for task in HEADS:
        p = plain_bert(m, task)
        assert type(p.model).__name__ == STOCK[task]
        assert type(p.model).__module__.startswith("transformers.")
        ref, got = _pair(m, p.model, task)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
        assert torch.equal(got.argmax(-1), ref.argmax(-1)) if got.dim() > 1 else got.argmax() == ref.argmax()
    p = plain_bert(m, "ner")
    k = len(p.mixture)
    assert [w for _, w in p.mixture] == [1 / k] * k
    if variant.get("skill_layers") == "top:1":  # the dense layer is zero-padded to the skill layer's width
        assert p.widths == [128, 128 * k] and p.model.config.intermediate_size == 128 * k


def test_learned_map_flattens_the_skills_over_its_threshold():
    m = _bert(router="learned")
    learned = m.bert.router.task_skills(m.bert)["sentiment"]
    p = plain_bert(m, "sentiment")
    assert [m.config.skill_names[i] for i, _ in p.mixture] == sorted(learned, key=m.config.skill_index)


def test_dense_joint_and_features_and_mlm():
    torch.manual_seed(0)
    cfg = SkillNetBertConfig.preset("tiny", task_heads=HEADS, tasks={t: ["shared"] for t in TASKS}, router="dense",
                                    skills=[{"name": "shared", "description": ""}], generic_skill=None)
    m = SkillNetBertForMultiTask(cfg).eval()
    ref, got = _pair(m, plain_bert(m, "sentiment").model, "sentiment")
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    ids, am = _inputs()
    feats = plain_bert(m, "ner", features=True).model
    assert type(feats).__name__ == "BertModel"
    with torch.no_grad():
        want = m.bert(ids, am, task="ner")
        out = feats(input_ids=ids, attention_mask=am)
    torch.testing.assert_close(out.last_hidden_state[am.bool()], want.last_hidden_state[am.bool()], rtol=0, atol=1e-5)
    torch.testing.assert_close(out.pooler_output, want.pooler_output, rtol=0, atol=1e-5)
    torch.manual_seed(0)
    pt = SkillNetBertForPreTraining(SkillNetBertConfig.preset("tiny")).eval()
    mlm = plain_bert(pt, "mlm").model
    assert type(mlm).__name__ == "BertForMaskedLM"
    with torch.no_grad():
        torch.testing.assert_close(mlm(input_ids=ids, attention_mask=am).logits[am.bool()],
                                   pt(ids, am, task="mlm").logits[am.bool()], rtol=0, atol=1e-5)


def test_per_skill_layernorm_flattens_one_skill_and_refuses_several():
    m = _bert(skill_layernorm="per_skill", generic_skill=None)
    m.add_task("solo", ["s4"], {"type": "classification", "num_labels": 2})
    m.eval()  # the new head too
    m.config.set_task("sentiment", ["s1", "s4"])
    ref, got = _pair(m, plain_bert(m, "solo").model, "solo")
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    with pytest.raises(NotFlattenable, match="per_skill.*averages 2 LayerNorm outputs.*trust_remote_code"):
        plain_bert(m, "sentiment")


def test_moe_and_pals_refuse_with_one_line_reason():
    with pytest.raises(NotFlattenable, match=r"MoE.*per token.*trust_remote_code") as e:
        plain_bert(_bert(router="topk"), "sentiment")
    assert "\n" not in str(e.value)
    pals = _bert(router="dense", skills=[{"name": "shared", "description": ""}], generic_skill=None,
                 tasks={t: ["shared"] for t in TASKS}, pals_dim=12, pals_heads=2)
    with pytest.raises(NotFlattenable, match=r"PALs add a projected attention.*trust_remote_code") as e:
        plain_bert(pals, "sentiment")
    assert "\n" not in str(e.value)
    torch.manual_seed(0)
    moe_bart = SkillNetBartForConditionalGeneration(SkillNetBartConfig.preset("tiny", router="topk")).eval()
    with pytest.raises(NotFlattenable, match="per token"):
        plain_bart(moe_bart, "story_generation")


def test_cli_refuses_moe_in_one_line_and_writes_nothing(tmp_path, capsys):
    from skillnet.pretrain.export import main

    _bert(router="topk").save_pretrained(str(tmp_path / "moe"))
    capsys.readouterr()
    assert main(["--plain", "--checkpoint", str(tmp_path / "moe"), "--task", "sentiment",
                 "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: router='topk' (MoE)") and "\n" not in err
    assert not (tmp_path / "out").exists()
    with pytest.raises(SystemExit):
        main(["--plain", "--checkpoint", str(tmp_path / "moe"), "--out", str(tmp_path / "out")])  # no --task


@pytest.mark.parametrize("variant", [{}, {"skill_layernorm": "per_skill", "generic_skill": None}],
                         ids=["every_other", "per_skill_one_skill"])
def test_bart_flattens_exactly_beams_included(variant):
    torch.manual_seed(0)
    m = SkillNetBartForConditionalGeneration(SkillNetBartConfig.preset("tiny", **variant)).eval()
    task = "story_generation" if variant else "dialogue_generation"
    p = plain_bart(m, task)
    assert type(p.model).__name__ == "BartForConditionalGeneration"
    k = len(m.config.skill_ids(task))
    assert p.widths == [64 * k, 64, 64 * k, 64] and p.model.config.encoder_ffn_dim == 64 * k
    ids, am = _inputs()
    dec = ids[:, :5]
    with torch.no_grad():
        ref = m(input_ids=ids, attention_mask=am, decoder_input_ids=dec, task=task).logits
        got = p.model(input_ids=ids, attention_mask=am, decoder_input_ids=dec).logits
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
        a = m.generate(input_ids=ids, attention_mask=am, task=task, num_beams=3, max_new_tokens=8)
        b = p.model.generate(input_ids=ids, attention_mask=am, num_beams=3, max_new_tokens=8)
    assert a.tolist() == b.tolist()


@pytest.mark.parametrize("task", ["qa_match", "sentiment"])
def test_cli_measures_a_task_without_its_run_on_probe_sentences(tmp_path, task):
    """A SkillNet folder without its fine-tuning run (no test records to measure on): the equality check runs on
    fixed sentences, as groups of candidates for a matching task (they were fed as flat rows, which the
    matching head refuses: the export failed)."""
    import json

    from skillnet.pretrain.export import main

    _bert().save_pretrained(str(tmp_path / "sparse"))
    assert main(["--plain", "--checkpoint", str(tmp_path / "sparse"), "--task", task, "--out", str(tmp_path / "out")]) == 0
    check = json.loads((tmp_path / "out" / "plain_export.json").read_text(encoding="utf-8"))["equality"]
    assert check["compared"] > 0 and check["max_abs_diff"] < 1e-4 and check["argmax_equal"]


def test_the_onnx_lines_of_a_matching_card_score_a_group(tmp_path):
    """The card's ONNX lines for a matching task feed (question, candidate) pairs and read one score per pair,
    close to the plain model's (int8)."""
    import re

    from skillnet.pretrain.export import main
    from transformers import AutoTokenizer, BertForSequenceClassification

    _bert().save_pretrained(str(tmp_path / "sparse"))
    folder = tmp_path / "out"
    assert main(["--plain", "--checkpoint", str(tmp_path / "sparse"), "--task", "qa_match", "--onnx",
                 "--out", str(folder)]) == 0
    card = (folder / "README.md").read_text(encoding="utf-8")
    onnx_lines = re.search(r"## ONNX.*?```python\n(.*?)```", card, re.S).group(1)
    ns = {"folder": str(folder), "tok": AutoTokenizer.from_pretrained(str(folder))}
    exec(onnx_lines, ns)
    enc = ns["tok"]([ns["question"]] * len(ns["candidates"]), ns["candidates"], return_tensors="pt", padding=True,
                    truncation=True)
    with torch.no_grad():
        want = BertForSequenceClassification.from_pretrained(str(folder)).eval()(**enc).logits[:, 0]
    assert ns["scores"].shape == (2,) and torch.allclose(torch.from_numpy(ns["scores"]), want, atol=0.05)


def test_the_card_of_a_sentence_pair_task_feeds_a_pair():
    """A task of sentence pairs (the held-back answer selection) is served with both texts: the card's line
    gave it one text, which the model never saw alone."""
    from skillnet.export.plain import _usage

    pair = "\n".join(_usage({"class": "BertForSequenceClassification", "head": "classification", "kind": "pair"}))
    single = "\n".join(_usage({"class": "BertForSequenceClassification", "head": "classification", "kind": "single"}))
    assert '"text_pair": ' in pair and "text_pair" not in single
