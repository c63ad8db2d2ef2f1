"""Exports work wherever a transformers model works: one test per use (docs/hf.md), each run in
a subprocess whose import path cannot see this project, each checked against the project's own output.

Rows: fill-mask pipeline, AutoModelForMaskedLM, feature-extraction / AutoModel without task=,
text-classification, token-classification (CRF decode), truncation, model card; plus the QA class and the
SkillNet-BART text2text pipeline (a custom pipeline: transformers 5 has none for text2text).

``SKILLNET_PLAIN_PYTHON=/path/to/venv/bin/python`` runs the loading side in another interpreter, e.g. a venv
with only torch, transformers and safetensors (no torchcrf, no project dependencies).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow  # ~30 s: a pre-training, two fine-tuning runs and a plain interpreter

REPO = Path(__file__).resolve().parents[1]
FIX = REPO / "tests" / "fixtures" / "finetune"

def run_plain_many(jobs: list[tuple[str, Path, str]]) -> dict[str, dict]:
    """Run every (name, folder, body) job in one interpreter that cannot import this project (hf_check's
    runner: it proves the project is gone and that nothing of it was loaded); returns {name: the job's res}.
    ``SKILLNET_PLAIN_PYTHON`` names another interpreter (a venv with only torch + transformers)."""
    from skillnet.experiments.hf_check import run_plain_jobs

    py = os.environ.get("SKILLNET_PLAIN_PYTHON") or sys.executable
    res = run_plain_jobs(py, [(folder, None, body) for _, folder, body in jobs])
    return {name: r for (name, _, _), r in zip(jobs, res)}


def run_plain(folder: Path, body: str) -> dict:
    return run_plain_many([("job", folder, body)])["job"]


@pytest.fixture(scope="module")
def ft_run(tmp_path_factory) -> Path:
    from skillnet.finetune import run as run_cli
    from skillnet.finetune.config import FinetuneConfig

    from tests.test_finetune_e2e import _task, tiny_config

    tmp = tmp_path_factory.mktemp("ft")
    out = tmp / "run"
    # A second classification task with labels of its own, for task= in the text-classification pipeline.
    for split in ("train", "dev"):
        rows = [json.loads(x) for x in (FIX / f"sent_{split}.jsonl").read_text(encoding="utf-8").splitlines()]
        (tmp / f"length_{split}.jsonl").write_text("".join(
            json.dumps({"text": r["text"], "label": "long" if len(r["text"]) >= 7 else "short"}, ensure_ascii=False)
            + "\n" for r in rows), encoding="utf-8")
    d = tiny_config(out)
    d["tasks"] = [_task("sentiment", "classification", "sent", ["s1", "s4", "s7"]),
                  _task("ner", "ner", "ner", ["s2", "s7"]), _task("mrc", "span", "mrc", ["s2", "s3", "s5", "s7"]),
                  {**_task("length", "classification", "sent", ["s3", "s7"]),
                   "train": str(tmp / "length_train.jsonl"), "dev": str(tmp / "length_dev.jsonl")}]
    d["tasks"][-1].pop("test", None)
    run_cli.run(FinetuneConfig.from_dict(d), tensorboard=False, progress=False)
    return out


def _mlm_reference(folder: Path, text: str) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    from skillnet.model import SkillNetBertForPreTraining
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    m = SkillNetBertForPreTraining.from_pretrained(str(folder)).eval()
    ids = tok(text, return_tensors="pt")
    with torch.no_grad():
        logits = m(**ids, task="mlm").logits
        hidden = m.bert(**ids, task="mlm").last_hidden_state
    return ids["input_ids"][0].tolist(), logits[0], hidden[0]


def _sent_texts() -> list[str]:
    return [json.loads(x)["text"] for x in (FIX / "sent_dev.jsonl").read_text(encoding="utf-8").splitlines()[:6]]


def _ner_records() -> list[dict]:
    return [{"tokens": json.loads(x)["tokens"]} for x in (FIX / "ner_dev.jsonl").read_text(encoding="utf-8").splitlines()]


def _gen_sources() -> list[str]:
    return [json.loads(x)["source"] for x in (FIX / "gen_fix_dev.jsonl").read_text(encoding="utf-8").splitlines()[:3]]


@pytest.fixture(scope="module")
def plain(pt_export, ft_run, gen_run) -> dict[str, dict]:
    """Every row's loading side, run in one interpreter that cannot see the project."""
    ft, texts = ft_run / "export", ["".join(r["tokens"]) for r in _ner_records()]
    jobs = [
        ("fill_mask", pt_export, r"""
fill = pipeline("fill-mask", model=folder, trust_remote_code=True)
res["top"] = [(r["token"], r["token_str"]) for r in fill("今天天气很[MASK]。", top_k=3)]
"""),
        ("auto_mlm", pt_export, r"""
from transformers import AutoModelForMaskedLM
tok = AutoTokenizer.from_pretrained(folder)
m = AutoModelForMaskedLM.from_pretrained(folder, trust_remote_code=True).eval()
with torch.no_grad():
    res["logits"] = m(**tok("我爱北京天安门", return_tensors="pt")).logits[0].tolist()
res["class"] = type(m).__name__
"""),
        ("features", pt_export, r"""
fe = pipeline("feature-extraction", model=folder, trust_remote_code=True)
res["pipe"] = fe("我爱北京天安门")[0]
tok = AutoTokenizer.from_pretrained(folder)
m = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
with torch.no_grad():
    res["auto"] = m(**tok("我爱北京天安门", return_tensors="pt")).last_hidden_state[0].tolist()
    res["nsp_differs"] = not torch.allclose(m(**tok("我爱北京天安门", return_tensors="pt"), task="nsp")
                                            .last_hidden_state[0], torch.tensor(res["auto"]))
"""),
        ("text_classification", ft, f"""
clf = pipeline("text-classification", model=folder, trust_remote_code=True)
res["labels"] = [r["label"] for r in clf({_sent_texts()!r})]
"""),
        ("task_choice", ft, f"""
clf = pipeline("text-classification", model=folder, trust_remote_code=True)
res["per_call"] = [r["label"] for r in clf({_sent_texts()!r}, task="length")]
res["default_after"] = [r["label"] for r in clf({_sent_texts()!r})]
named = pipeline("text-classification", model=folder, trust_remote_code=True, task_name="length")
res["per_pipeline"] = [r["label"] for r in named({_sent_texts()!r})]
res["errors"] = []
for bad in ("ner", "nope"):
    try:
        clf("很好", task=bad)
    except ValueError as e:
        res["errors"].append(str(e))
"""),
        ("features_task", pt_export, r"""
fe = pipeline("feature-extraction", model=folder, trust_remote_code=True)
res["nsp"] = fe("我爱北京天安门", task="nsp")[0]
"""),
        ("token_classification", ft, f"""
ner = pipeline("token-classification", model=folder, trust_remote_code=True, aggregation_strategy="simple")
res["ents"] = [[(e["entity_group"], e["start"], e["end"], e["word"].replace(" ", "")) for e in row]
               for row in ner({texts!r})]
"""),
        ("qa", ft, r"""
from transformers import AutoModelForQuestionAnswering
tok = AutoTokenizer.from_pretrained(folder)
qa = AutoModelForQuestionAnswering.from_pretrained(folder, trust_remote_code=True).eval()
with torch.no_grad():
    o = qa(**tok("谁在上海", "王五在上海工作", return_tensors="pt"))
res["start"], res["end"] = o.start_logits[0].tolist(), o.end_logits[0].tolist()
"""),
        ("truncation", pt_export, r"""
tok = AutoTokenizer.from_pretrained(folder)
m = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
enc = tok("好" * 2000, truncation=True, return_tensors="pt")
with torch.no_grad():
    res["shape"] = list(m(**enc, task="mlm").last_hidden_state.shape)
res["max"] = tok.model_max_length
"""),
        ("text2text", gen_run / "export", f"""
gen = pipeline("text2text-generation", model=folder, trust_remote_code=True)
res["out"] = [gen(s)[0]["generated_text"] for s in {_gen_sources()!r}]
with torch.no_grad():  # [UNK] becomes by far the most likely token everywhere
    gen.model.final_logits_bias[0, gen.tokenizer.unk_token_id] = 50.0
res["unk_biased"] = [gen(s)[0]["generated_text"] for s in {_gen_sources()!r}]
res["unk_plain"] = gen.tokenizer.decode(gen.model.generate(**gen.tokenizer({_gen_sources()[0]!r}, return_tensors="pt",
                                                                           return_token_type_ids=False),
                                                           suppress_tokens=[])[0])
"""),
    ]
    return run_plain_many(jobs)


def test_fill_mask_pipeline(pt_export, plain):
    ids, logits, _ = _mlm_reference(pt_export, "今天天气很[MASK]。")
    pos = ids.index(103)
    assert [t for t, _ in plain["fill_mask"]["top"]] == logits[pos].topk(3).indices.tolist()


def test_auto_model_for_masked_lm(pt_export, plain):
    _, logits, _ = _mlm_reference(pt_export, "我爱北京天安门")
    res = plain["auto_mlm"]
    assert res["class"] == "SkillNetBertForMaskedLM"
    torch.testing.assert_close(torch.tensor(res["logits"]), logits, rtol=1e-4, atol=1e-4)


def test_feature_extraction_and_auto_model_without_task(pt_export, plain):
    _, _, hidden = _mlm_reference(pt_export, "我爱北京天安门")
    assert json.loads((pt_export / "config.json").read_text())["default_task"] == "mlm"
    res = plain["features"]
    torch.testing.assert_close(torch.tensor(res["pipe"]), hidden, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.tensor(res["auto"]), hidden, rtol=1e-4, atol=1e-4)
    assert res["nsp_differs"]  # task= still picks another task's skills


def test_text_classification_matches_predict(ft_run, plain):
    from skillnet.finetune.predict import Predictor

    folder = ft_run / "export"
    want = Predictor(folder).predict("sentiment", [{"text": t} for t in _sent_texts()])
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["default_task"] == "sentiment" and set(cfg["label2id"]) == {"pos", "neg"}
    assert plain["text_classification"]["labels"] == want


def test_task_picks_the_head_of_a_standard_pipeline(ft_run, pt_export, plain):
    """task= per call, or task_name= per pipeline, runs that task with its labels; a task the pipeline cannot
    run is an error naming those it can (not an answer with the default task's labels)."""
    from skillnet.finetune.predict import Predictor
    from skillnet.model import SkillNetBertForPreTraining
    from transformers import AutoTokenizer

    pred = Predictor(ft_run / "export")
    res = plain["task_choice"]
    want = pred.predict("length", [{"text": t} for t in _sent_texts()])
    assert set(want) <= {"long", "short"}
    assert res["per_call"] == want and res["per_pipeline"] == want
    assert res["default_after"] == pred.predict("sentiment", [{"text": t} for t in _sent_texts()])
    assert len(res["errors"]) == 2, res["errors"]
    assert all("text-classification" in e and "length" in e and "sentiment" in e for e in res["errors"]), res["errors"]
    assert "'ner'" in res["errors"][0] and "'nope'" in res["errors"][1]
    tok = AutoTokenizer.from_pretrained(str(pt_export))
    m = SkillNetBertForPreTraining.from_pretrained(str(pt_export)).eval()
    with torch.no_grad():
        want_nsp = m.bert(**tok("我爱北京天安门", return_tensors="pt"), task="nsp").last_hidden_state[0]
    torch.testing.assert_close(torch.tensor(plain["features_task"]["nsp"]), want_nsp, rtol=1e-4, atol=1e-4)


def test_token_classification_entities_match_predict(ft_run, plain):
    from skillnet.finetune.predict import Predictor

    want = [[(e["type"], e["start"], e["end"], e["text"]) for e in p["entities"]]
            for p in Predictor(ft_run / "export").predict("ner", _ner_records())]
    assert any(want), "the tiny model tags no entity: the comparison would be empty"
    assert [[tuple(e) for e in row] for row in plain["token_classification"]["ents"]] == want


def test_question_answering_class_serves_the_span_task(ft_run, plain):
    from skillnet.model import SkillNetBertForMultiTask
    from transformers import AutoTokenizer

    folder = ft_run / "export"
    tok = AutoTokenizer.from_pretrained(str(folder))
    m = SkillNetBertForMultiTask.from_pretrained(str(folder)).eval()
    enc = tok("谁在上海", "王五在上海工作", return_tensors="pt")
    with torch.no_grad():
        want = m(task="mrc", **enc).logits[0]
    res = plain["qa"]
    torch.testing.assert_close(torch.tensor(res["start"]), want[:, 0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.tensor(res["end"]), want[:, 1], rtol=1e-4, atol=1e-4)


def test_truncation_fits_the_model(pt_export, plain):
    cfg = json.loads((pt_export / "config.json").read_text())
    res = plain["truncation"]
    assert res["max"] == cfg["max_position_embeddings"]
    assert res["shape"][1] == cfg["max_position_embeddings"]


def test_model_card_and_no_absolute_paths(pt_export, ft_run):
    from skillnet.export.card import absolute_paths

    card = (ft_run / "export" / "README.md").read_text(encoding="utf-8")
    results = json.loads((ft_run / "results.json").read_text())
    params = json.loads((ft_run / "params.json").read_text())
    assert "SkillNet-BERT" in card and "**Default task:** `sentiment`" in card
    assert "| `ner` | ner | s2, s7 |" in card
    assert f"({params['total']:,})" in card and f"({params['tasks']['ner']['activated']:,})" in card
    r = results["tasks"]["sentiment"]
    dev = (r.get("final") or r)["dev"][r["metric"]]  # export/ holds the last step: its card shows its own scores
    assert f"{dev:.4f}" in card and "sent_train.jsonl" in card
    assert 'pipeline("text-classification"' in card
    pt_card = (pt_export / "README.md").read_text(encoding="utf-8")
    assert "**Default task:** `mlm`" in pt_card and 'pipeline("fill-mask"' in pt_card
    for folder in (pt_export, ft_run / "export", ft_run / "best"):
        assert absolute_paths(folder) == {}, folder


def test_text2text_pipeline_matches_generate(gen_run, plain):
    from skillnet.finetune.predict import Predictor

    folder = gen_run / "export"
    want = Predictor(folder).predict("fix", [{"source": s} for s in _gen_sources()])
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["default_task"] == "fix" and cfg["task_prefixes"]["fix"] == "fix: "
    assert plain["text2text"]["out"] == want


def test_text2text_pipeline_never_emits_unk(gen_run, plain):
    """The export's generation_config suppresses [UNK] as the project's own decoding does, so a plain
    transformers user gets the same text (a small model's most likely token is often [UNK])."""
    assert "[UNK]" in plain["text2text"]["unk_plain"]  # the bias works when nothing suppresses it
    assert all(out and "[UNK]" not in out for out in plain["text2text"]["unk_biased"])
    gen = json.loads((gen_run / "export" / "generation_config.json").read_text())
    from transformers import AutoTokenizer

    assert gen["suppress_tokens"] == [AutoTokenizer.from_pretrained(gen_run / "export").unk_token_id]


def test_the_unk_id_is_read_as_the_tokenizer_reads_the_vocab(tmp_path):
    """The vocab holds tokens (\\u2028, \\x1c) that splitlines() breaks on: they must not shift the id."""
    from skillnet.export.card import _unk_id
    from skillnet.model.hub import save_tokenizer

    vocab = tmp_path / "src" / "vocab.txt"
    vocab.parent.mkdir()
    vocab.write_text("[PAD]\n\u2028\n\x1c\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n", encoding="utf-8")
    (tmp_path / "export").mkdir()
    save_tokenizer(tmp_path / "export", vocab)
    assert _unk_id(tmp_path / "export") == 3
    assert _unk_id(tmp_path / "missing") is None


def test_export_task_picks_the_default_and_no_default_keeps_the_error(ft_run, tmp_path):
    from skillnet.model import SkillNetBertConfig, SkillNetBertModel
    from skillnet.pretrain.export import main
    from transformers import AutoModel

    assert main(["--checkpoint", str(ft_run / "export"), "--out", str(tmp_path / "ner"), "--task", "ner"]) == 0
    cfg = json.loads((tmp_path / "ner" / "config.json").read_text())
    assert cfg["default_task"] == "ner" and cfg["id2label"]["0"] == "O"
    assert "**Default task:** `ner`" in (tmp_path / "ner" / "README.md").read_text(encoding="utf-8")
    m = AutoModel.from_pretrained(str(tmp_path / "ner")).eval()
    ids = torch.tensor([[101, 4374, 758, 102]])
    with torch.no_grad():
        torch.testing.assert_close(m(ids).last_hidden_state, m(ids, task="ner").last_hidden_state)
    assert main(["--checkpoint", str(ft_run / "export"), "--out", str(tmp_path / "x"), "--task", "nope"]) == 2
    plain = SkillNetBertModel(SkillNetBertConfig.preset("tiny")).eval()  # no default task
    with pytest.raises(ValueError, match="pass exactly one of task="):
        plain(ids)
