"""``export --plain`` folders served by plain transformers: each task type of the reproduction (sentiment,
NER, qa_match, span; MLM; a generation task) is exported from a real fine-tuning (or pre-training) export, loaded
by the stock Auto classes without ``trust_remote_code`` in an interpreter that cannot import the project, and
checked against the sparse model: logits within 1e-5 in fp32, the same argmax, the same beam output, and the
card's Viterbi lines giving ``predict``'s NER tags.

``SKILLNET_PLAIN_PYTHON=/path/to/venv/bin/python`` runs the loading side in another interpreter (a venv with
only torch + transformers), as tests/test_hf_pipelines.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from tests.test_hf_pipelines import FIX, run_plain_many

pytestmark = pytest.mark.slow  # a pre-training, two fine-tuning runs, seven exports and a plain interpreter

ATOL = 1e-5


@pytest.fixture(scope="module")
def ft4(tmp_path_factory) -> Path:
    """A tiny fine-tuning run with one task of each BERT head type: classification, CRF tagging, matching, span."""
    from skillnet.finetune import run as run_cli
    from skillnet.finetune.config import FinetuneConfig

    from tests.test_finetune_e2e import _task, tiny_config

    out = tmp_path_factory.mktemp("ft4") / "run"
    d = tiny_config(out)
    d["tasks"].append(_task("mrc", "span", "mrc", ["s2", "s3", "s5", "s7"]))
    run_cli.run(FinetuneConfig.from_dict(d), tensorboard=False, progress=False)
    return out


def _records(name: str) -> list[dict]:
    return [json.loads(x) for x in (FIX / name).read_text(encoding="utf-8").splitlines() if x.strip()]


@pytest.fixture(scope="module")
def exports(tmp_path_factory, ft4, pt_export, gen_run) -> dict[str, Path]:
    from skillnet.pretrain.export import main

    tmp = tmp_path_factory.mktemp("plain_exports")
    jobs = {"sentiment": (ft4 / "export", []), "ner": (ft4 / "export", []), "qa_match": (ft4 / "export", []),
            "mrc": (ft4 / "export", []), "mlm": (pt_export, []), "fix": (gen_run / "export", []),
            "features": (ft4 / "export", ["--features"])}
    out = {}
    for name, (src, extra) in jobs.items():
        task = "ner" if name == "features" else name
        assert main(["--plain", "--checkpoint", str(src), "--task", task, "--out", str(tmp / name), *extra]) == 0
        out[name] = tmp / name
    return out


def _bert_inputs(name: str, tok) -> dict[str, torch.Tensor]:
    if name == "qa_match":
        r = _records("match_test.jsonl")[0]
        return dict(tok([r["question"]] * len(r["candidates"]), r["candidates"], return_tensors="pt", padding=True))
    if name == "mrc":
        rs = _records("mrc_dev.jsonl")[:3]
        return dict(tok([r["question"] for r in rs], [r["context"] for r in rs], return_tensors="pt", padding=True))
    texts = [r.get("text") or "".join(r.get("tokens", [])) for r in _records("sent_test.jsonl" if name == "sentiment"
                                                                              else "ner_test.jsonl")][:4]
    return dict(tok(texts, return_tensors="pt", padding=True))


_LOAD = r"""
import transformers, glob
cls = getattr(transformers, {cls!r})
assert not glob.glob(folder + "/*.py"), "a plain export carries no code"
model, info = cls.from_pretrained(folder, output_loading_info=True)
res["info"] = {{k: sorted(map(str, v)) for k, v in info.items() if k in ("missing_keys", "unexpected_keys", "mismatched_keys")}}
res["class"], res["id2label"] = type(model).__name__, {{str(k): v for k, v in model.config.id2label.items()}}
tok = AutoTokenizer.from_pretrained(folder)
res["max_len"] = tok.model_max_length
inputs = {{k: torch.tensor(v) for k, v in {inputs!r}.items()}}
with torch.no_grad():
    o = model(**inputs)
res["out"] = {{k: o[k].tolist() for k in ("logits", "start_logits", "end_logits", "last_hidden_state") if k in o}}
"""

_CLASSES = {"sentiment": "BertForSequenceClassification", "ner": "BertForTokenClassification",
            "qa_match": "BertForSequenceClassification", "mrc": "BertForQuestionAnswering", "mlm": "BertForMaskedLM",
            "features": "BertModel"}


def _card_code(folder: Path) -> list[str]:
    card = (folder / "README.md").read_text(encoding="utf-8")
    return re.search(r"```python\n(.*?)```", card, re.S).group(1).strip().splitlines()


@pytest.fixture(scope="module")
def plain(exports) -> dict[str, dict]:
    from transformers import AutoTokenizer

    jobs, inputs = [], {}
    for name, cls in _CLASSES.items():
        inputs[name] = _bert_inputs(name, AutoTokenizer.from_pretrained(str(exports[name])))
        body = _LOAD.format(cls=cls, inputs={k: v.tolist() for k, v in inputs[name].items()})
        jobs.append((name, exports[name], body))
    # NER: the card's own lines (load, Viterbi), then its last lines once per test sentence.
    code = _card_code(exports["ner"])
    at = next(i for i, line in enumerate(code) if line.startswith("words = "))
    per_sentence = "\n".join(code[at + 1:]).replace("print(viterbi(", "tags.append(viterbi(")
    sentences = [r["tokens"] for r in _records("ner_test.jsonl")]
    jobs.append(("ner_card", exports["ner"], "\n".join(code[1:at]) + f"""
tags = []
for words in {sentences!r}:
{chr(10).join('    ' + line for line in per_sentence.splitlines())}
res["tags"] = tags
"""))
    # qa_match: the card's lines on pairs longer than the task's max_seq_len (40), scored per group.
    code = _card_code(exports["qa_match"])
    at = next(i for i, line in enumerate(code) if line.startswith("question, candidates = "))
    jobs.append(("qa_match_long", exports["qa_match"], "\n".join(code[1:at]) + f"""
res["scores"] = []
for question, candidates in {[(r["question"], r["candidates"]) for r in _long_matching()]!r}:
{chr(10).join('    ' + line for line in code[at + 1:])}
    res["scores"].append(scores.detach().tolist())
"""))
    srcs = ["fix: " + r["source"] for r in _records("gen_fix_dev.jsonl")]
    jobs.append(("fix", exports["fix"], f"""
from transformers import AutoModelForSeq2SeqLM
model, info = AutoModelForSeq2SeqLM.from_pretrained(folder, output_loading_info=True)
res["info"] = {{k: sorted(map(str, v)) for k, v in info.items() if k in ("missing_keys", "unexpected_keys")}}
tok = AutoTokenizer.from_pretrained(folder)
res["ids"] = [model.generate(**tok(s, return_tensors="pt"))[0].tolist() for s in {srcs!r}]
res["text"] = ["".join(t.removeprefix("##") for t in tok.convert_ids_to_tokens(i, skip_special_tokens=True))
               for i in res["ids"]]  # the card's decoding
"""))
    res = run_plain_many(jobs)
    res["_inputs"] = inputs
    return res


def _long_matching() -> list[dict]:
    """match_test's groups with every candidate repeated until each pair is longer than the task's 40 tokens."""
    return [{"question": r["question"], "candidates": [c * 8 for c in r["candidates"]]}
            for r in _records("match_test.jsonl")[:3]]


@torch.no_grad()
def _sparse(name: str, folder: Path, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The sparse model's outputs for the same inputs, in the stock class's layout."""
    from skillnet.model import SkillNetBertForMultiTask, SkillNetBertForPreTraining

    if name == "mlm":
        m = SkillNetBertForPreTraining.from_pretrained(str(folder)).eval()
        return {"logits": m(**inputs, task="mlm").logits}
    m = SkillNetBertForMultiTask.from_pretrained(str(folder)).eval()
    if name == "features":
        return {"last_hidden_state": m.bert(**inputs, task="ner").last_hidden_state}
    if name == "qa_match":
        return {"logits": m(task=name, **{k: v[None] for k, v in inputs.items()}).logits.view(-1, 1)}
    out = m(task=name, **inputs).logits
    return {"start_logits": out[..., 0], "end_logits": out[..., 1]} if name == "mrc" else {"logits": out}


@pytest.mark.parametrize("name", list(_CLASSES))
def test_plain_export_equals_sparse_model(name, ft4, pt_export, exports, plain):
    src = pt_export if name == "mlm" else ft4 / "export"
    res, inputs = plain[name], plain["_inputs"][name]
    assert res["class"] == _CLASSES[name]
    assert res["info"] == {"missing_keys": [], "unexpected_keys": [], "mismatched_keys": []}
    cfg = json.loads((exports[name] / "config.json").read_text())
    assert cfg["model_type"] == "bert" and "auto_map" not in cfg
    # a task's inputs are cut where its fine-tuning cut them (tiny_config: 32, qa_match 40); span reads windows
    want_len = {"sentiment": 32, "ner": 32, "qa_match": 40}.get(name, cfg["max_position_embeddings"])
    assert res["max_len"] == want_len
    want = _sparse(name, src, inputs)
    am = inputs["attention_mask"].bool()
    for key, ref in want.items():
        got = torch.tensor(res["out"][key])
        if got.dim() >= 2 and got.shape[:2] == am.shape:  # per token: the positions that are not padding
            got, ref = got[am], ref[am]
        torch.testing.assert_close(got, ref, rtol=0, atol=ATOL)
        if key != "last_hidden_state":
            assert torch.equal(got.argmax(-1), ref.argmax(-1)) if got.shape[-1] > 1 else torch.equal(
                got.argmax(0), ref.argmax(0))  # matching: the best candidate
    facts = json.loads((exports[name] / "plain_export.json").read_text())
    assert facts["equality"]["max_abs_diff"] <= ATOL and facts["equality"]["argmax_equal"]
    card = (exports[name] / "README.md").read_text(encoding="utf-8")
    assert f"{facts['equality']['max_abs_diff']:.2e}" in card
    assert all(f"`{s['name']}`" in card for s in facts["skills"])


def test_labels_of_classification_and_ner(plain, ft4):
    from skillnet.finetune.predict import Predictor

    pred = Predictor(ft4 / "export")
    for name in ("sentiment", "ner"):
        assert plain[name]["id2label"] == {str(i): x for i, x in enumerate(pred.tasks[name].label_list)}
    sentiment = plain["sentiment"]["out"]["logits"]
    texts = [r["text"] for r in _records("sent_test.jsonl")][:4]
    want = pred.predict("sentiment", [{"text": t} for t in texts])
    got = [plain["sentiment"]["id2label"][str(i)] for i in torch.tensor(sentiment).argmax(-1).tolist()]
    assert got == want


def test_card_lines_cut_long_pairs_as_predict_does(plain, ft4, exports):
    """A plain tokenizer cut at the model's positions (128) fed the whole of a long pair, while predict cuts it at
    the task's max_seq_len: the card's lines scored other inputs than the sparse model did."""
    from skillnet.finetune.predict import Predictor

    recs = _long_matching()
    want = Predictor(ft4 / "export").predict("qa_match", recs)
    for got, w in zip(plain["qa_match_long"]["scores"], want):
        torch.testing.assert_close(torch.tensor(got), torch.tensor(w["scores"]), rtol=0, atol=ATOL)
    facts = json.loads((exports["qa_match"] / "plain_export.json").read_text())
    assert facts["model_max_length"] == facts["task_max_seq_len"] == 40
    assert "`model_max_length` is 40" in (exports["qa_match"] / "README.md").read_text(encoding="utf-8")


def test_card_viterbi_lines_reproduce_predict(plain, ft4, exports):
    from skillnet.finetune.predict import Predictor

    recs = _records("ner_test.jsonl")
    want = [p["tags"] for p in Predictor(ft4 / "export").predict("ner", [{"tokens": r["tokens"]} for r in recs])]
    assert plain["ner_card"]["tags"] == want
    crf = json.loads((exports["ner"] / "plain_export.json").read_text())["crf"]
    assert crf["sentences"] == len(recs) and 0.0 <= crf["sentence_agreement"] <= 1.0
    card = (exports["ner"] / "README.md").read_text(encoding="utf-8")
    assert f"entity F1 {crf['viterbi_f1']:.2f} with Viterbi, {crf['argmax_f1']:.2f} with argmax" in card
    assert ("loses" in card) == crf["argmax_loses_over_1_point"]


def test_bart_beam_output_equals_sparse_token_for_token(plain, gen_run, exports):
    from skillnet.finetune.predict import Predictor
    from transformers import AutoTokenizer, GenerationConfig

    res = plain["fix"]
    assert res["info"] == {"missing_keys": [], "unexpected_keys": []}
    folder = gen_run / "export"
    pred = Predictor(folder)
    gen = GenerationConfig.from_pretrained(str(exports["fix"]))
    assert gen.num_beams == 2 and gen.max_new_tokens == 24  # the task's settings (gen_config: fix)
    tok = AutoTokenizer.from_pretrained(str(exports["fix"]))
    srcs = [r["source"] for r in _records("gen_fix_dev.jsonl")]
    with torch.no_grad():
        want = [pred.model.generate(**tok("fix: " + s, return_tensors="pt"), task="fix", generation_config=gen)[0].tolist()
                for s in srcs]
    assert res["ids"] == want
    # the project's text, but for the space it puts between two Latin words
    assert res["text"] == [t.replace(" ", "") for t in pred.predict("fix", [{"source": s} for s in srcs])]
    facts = json.loads((exports["fix"] / "plain_export.json").read_text())
    assert facts["equality"]["beam_equal"] == facts["equality"]["inputs"] == len(srcs)
    assert facts["prefix"] == "fix: " and "fix: " in (exports["fix"] / "README.md").read_text(encoding="utf-8")


@pytest.mark.parametrize("task", ["sentiment", "ner"])
def test_onnx_fp32_within_1e4_and_int8_score_drop_reported(task, ft4, tmp_path):
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from skillnet.export.onnx_graphs import OrtModel
    from skillnet.pretrain.export import main

    out = tmp_path / task
    assert main(["--plain", "--onnx", "--checkpoint", str(ft4 / "export"), "--task", task, "--out", str(out)]) == 0
    ox = json.loads((out / "plain_export.json").read_text())["onnx"]
    assert ox["fp32"]["max_abs_diff"] <= 1e-4 and ox["fp32"]["argmax_equal"]
    assert ox["int8"]["max_abs_diff"] > 0  # quantised: not the same numbers
    sc = ox["scores"]
    assert sc["plain"] == sc["sparse"] == sc["fp32"]  # the same predictions, so the same score
    assert ox["int8_score_drop"] == sc["sparse"] - sc["int8"]
    assert f"int8 drop {ox['int8_score_drop']:.4f}" in (out / "README.md").read_text(encoding="utf-8")
    # the session runs on its own (no torch model behind it) and returns the class's outputs
    from transformers import AutoTokenizer

    got = OrtModel(out / "model.onnx")(**dict(AutoTokenizer.from_pretrained(str(out))(["今天天气很好"], return_tensors="pt")))
    assert got.logits.shape[-1] == len(json.loads((out / "config.json").read_text())["id2label"])
