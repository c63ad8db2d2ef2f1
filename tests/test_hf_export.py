"""Exports load in plain transformers (issue: fit the ecosystem, points 1-2).

* A fresh subprocess whose import path excludes this project loads an exported folder with
  ``trust_remote_code=True`` through AutoConfig / AutoModel / AutoModelForPreTraining and reproduces the
  saved model's outputs.
* ``AutoTokenizer.from_pretrained`` loads from every kind of export (save_pretrained of a model that came
  from a folder with a tokenizer, skill surgery from a dense BERT, fine-tuning export), offline.
* ``BertModel.from_pretrained(skillnet_dir)`` loads, with random FFNs (documented in docs/finetune.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from skillnet.data_prep.tokenizer import default_vocab_path, load_tokenizer
from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining, skillnet_from_dense
from skillnet.model.hub import save_tokenizer
from transformers import AutoTokenizer, BertConfig, BertForPreTraining, BertModel

from tests.fixtures.pretrain.helpers import subprocess_env

# Runs in a subprocess: drop every path and import hook that would find this project, prove it is gone,
# then load through the Auto classes only.
_LOADER = r"""
import importlib.util, json, sys
sys.meta_path[:] = [f for f in sys.meta_path if "skillnet" not in repr(f).lower()]
sys.path[:] = [p for p in sys.path if not p.startswith(REPO)]
assert importlib.util.find_spec("skillnet") is None, "the project is still importable"
assert importlib.util.find_spec("model") is None
import torch
from transformers import AutoConfig, AutoModel, AutoModelForPreTraining, AutoTokenizer
folder, ids_file, out_file = sys.argv[1:4]
ids = torch.load(ids_file)
cfg = AutoConfig.from_pretrained(folder, trust_remote_code=True)
pt = AutoModelForPreTraining.from_pretrained(folder, trust_remote_code=True).eval()
enc = AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
tok = AutoTokenizer.from_pretrained(folder)
with torch.no_grad():
    res = {"config": type(cfg).__name__, "mlm": pt(ids, task="mlm").logits, "nsp": pt(ids, task="nsp").logits,
           "hidden": enc(ids, task="sentiment").last_hidden_state, "tok": tok("我爱北京")["input_ids"],
           "modules": sorted({m for m in sys.modules if m.split(".")[0] in ("skillnet", "model", "training")})}
torch.save(res, out_file)
"""


def _pretrain_model(vocab: int = 21128) -> SkillNetBertForPreTraining:
    torch.manual_seed(0)
    return SkillNetBertForPreTraining(SkillNetBertConfig.preset("tiny", vocab_size=vocab)).eval()


@pytest.mark.slow  # measured 26 s
def test_export_loads_with_trust_remote_code_without_the_project(tmp_path):
    m = _pretrain_model()
    folder = tmp_path / "export"
    m.save_pretrained(str(folder))
    save_tokenizer(folder, default_vocab_path())
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["auto_map"]["AutoModelForPreTraining"] == "skillnet_heads.SkillNetBertForPreTraining"
    assert cfg["tokenizer_class"] == "BertTokenizer"
    ids = torch.randint(1, 21128, (2, 9))
    torch.save(ids, tmp_path / "ids.pt")
    script = tmp_path / "load.py"
    repo = str(Path(__file__).resolve().parents[1])
    script.write_text(f"REPO = {repo!r}\n" + _LOADER)
    r = subprocess.run([sys.executable, str(script), str(folder), str(tmp_path / "ids.pt"), str(tmp_path / "o.pt")],
                       cwd=tmp_path, capture_output=True, text=True, env={**subprocess_env(), "PYTHONPATH": ""},
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    got = torch.load(tmp_path / "o.pt")
    assert got["config"] == "SkillNetBertConfig" and got["modules"] == []
    with torch.no_grad():
        torch.testing.assert_close(got["mlm"], m(ids, task="mlm").logits)
        torch.testing.assert_close(got["nsp"], m(ids, task="nsp").logits)
        torch.testing.assert_close(got["hidden"], m.bert(ids, task="sentiment").last_hidden_state)
    assert got["tok"] == [101, *load_tokenizer(None).encode_batch(["我爱北京"])[0], 102]


def test_tokenizer_travels_with_every_export(tmp_path):
    # a dense BERT folder with its tokenizer -> skill surgery -> save: the tokenizer comes along
    torch.manual_seed(1)
    dense = BertForPreTraining(BertConfig(vocab_size=21128, hidden_size=64, num_hidden_layers=2,
                                          num_attention_heads=4, intermediate_size=128))
    dense.save_pretrained(str(tmp_path / "dense"))
    save_tokenizer(tmp_path / "dense", default_vocab_path())
    sk = skillnet_from_dense(str(tmp_path / "dense"), model_class=SkillNetBertForPreTraining)
    sk.save_pretrained(str(tmp_path / "sk"))
    # ... and again from that export
    again = SkillNetBertForPreTraining.from_pretrained(str(tmp_path / "sk"))
    again.save_pretrained(str(tmp_path / "sk2"))
    for folder in ("dense", "sk", "sk2"):
        tok = AutoTokenizer.from_pretrained(str(tmp_path / folder))
        assert tok("北京")["input_ids"] == [101, 1266, 776, 102], folder
        assert (tmp_path / folder / "vocab.txt").is_file(), folder  # what the pipeline's own loader reads
    assert json.loads((tmp_path / "sk" / "config.json").read_text())["tokenizer_class"] == "BertTokenizer"


def test_plain_bert_loads_a_skillnet_folder_with_random_ffns(tmp_path):
    m = _pretrain_model()
    m.save_pretrained(str(tmp_path / "sk"))
    bert, info = BertModel.from_pretrained(str(tmp_path / "sk"), output_loading_info=True)
    assert any("intermediate.dense" in k for k in info["missing_keys"])  # the FFNs: freshly initialised
    assert torch.equal(bert.embeddings.word_embeddings.weight, m.bert.embeddings.word_embeddings.weight)


@pytest.mark.slow  # measured 40 s
def test_pretraining_and_finetuning_exports_carry_a_tokenizer(tmp_path):
    from skillnet.export.hf_folder import export
    from skillnet.finetune import run as run_cli
    from skillnet.finetune.config import FinetuneConfig

    from tests.test_finetune_e2e import tiny_config

    pt = tmp_path / "pt"
    r = subprocess.run([sys.executable, "pretrain/run.py", "--synthetic", "64", "--preset", "tiny", "--max_steps", "2",
                        "--output_dir", str(pt), "--no_progress", "--no_tensorboard"],
                       cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True, timeout=600,
                       env=subprocess_env())
    assert r.returncode == 0, r.stderr[-2000:]
    export(pt, tmp_path / "pt_hf")
    d = tiny_config(tmp_path / "ft", model={"init": str(tmp_path / "pt_hf")})
    d["train"]["max_steps"] = 2
    run_cli.run(FinetuneConfig.from_dict(d), tensorboard=False, progress=False)
    for folder in (tmp_path / "pt_hf", tmp_path / "ft" / "export", tmp_path / "ft" / "best"):
        tok = AutoTokenizer.from_pretrained(str(folder))
        assert tok("北京")["input_ids"] == [101, 1266, 776, 102], folder
        assert json.loads((folder / "config.json").read_text())["auto_map"]["AutoModel"] == "skillnet_bert.SkillNetBertModel"
