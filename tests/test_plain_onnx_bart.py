"""SkillNet-BART as ONNX: a task's plain BART traced to an encoder and a decoder graph (fp32 and
dynamic int8), decoded by export/onnx_seq2seq.py with numpy and onnxruntime only. The graphs' logits are
within 1e-4 of the sparse model's and greedy and beam search give its tokens; the trimmed form (each layer
at its own FFN width) is exact; ``export --plain --onnx`` measures and writes all of it for a fine-tuned
BART export."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

pytestmark = pytest.mark.slow  # torch.onnx's dynamo exporter traces each graph in 10-30 s on 2 cores

TASK = "dialogue_generation"  # three skills: the skill layers are 3x as wide as the others


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A random tiny SkillNet-BART with EOS made likely (so beams finish at different lengths), its plain
    form and the ONNX graphs of that."""
    from skillnet.export.flatten import plain_bart
    from skillnet.export.onnx_graphs import export_bart_onnx
    from skillnet.model.bart import SkillNetBartConfig, SkillNetBartForConditionalGeneration

    torch.manual_seed(0)
    m = SkillNetBartForConditionalGeneration(SkillNetBartConfig.preset("tiny")).eval()
    m.final_logits_bias[0, m.config.eos_token_id] = 4.5
    flat = plain_bart(m, TASK)
    folder = tmp_path_factory.mktemp("bart_onnx") / "ort"
    paths = export_bart_onnx(flat.model, flat.widths, folder)
    return m, flat, folder, paths


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1000, 5000, (4, 12), generator=g)
    am = torch.ones_like(ids)
    am[1, 8:] = 0
    am[3, 5:] = 0
    return ids, am


def test_trim_padding_is_exact_and_narrows_the_layers_without_skills(tiny):
    from skillnet.export.onnx_graphs import trim_padding

    m, flat, _, _ = tiny
    k = len(m.config.skill_ids(TASK))
    assert flat.widths == [64 * k, 64, 64 * k, 64] and flat.model.config.encoder_ffn_dim == 64 * k
    trimmed = trim_padding(flat.model, flat.widths)
    layers = [*trimmed.model.encoder.layers, *trimmed.model.decoder.layers]
    assert [la.fc1.out_features for la in layers] == flat.widths
    assert flat.model.model.encoder.layers[1].fc1.out_features == 64 * k  # the stock model is left as it was
    ids, am = _inputs()
    with torch.no_grad():
        ref = m(input_ids=ids, attention_mask=am, decoder_input_ids=ids[:, :5], task=TASK).logits
        got = trimmed(input_ids=ids, attention_mask=am, decoder_input_ids=ids[:, :5]).logits
    torch.testing.assert_close(got, ref, rtol=0, atol=1e-5)
    broken = trim_padding(flat.model, flat.widths)
    with torch.no_grad():
        broken.model.encoder.layers[1].fc2.weight[:, -1] = 1.0  # a padded column that is not zero any more
    with pytest.raises(ValueError, match="not zero"):
        trim_padding(broken, [64] * 4)


def test_onnx_logits_within_1e4_and_int8_differs(tiny):
    from skillnet.export.onnx_seq2seq import OrtSeq2Seq

    m, flat, folder, paths = tiny
    assert set(paths) == {"encoder", "decoder", "encoder_int8", "decoder_int8"}
    ids, am = _inputs()
    dec = torch.cat([torch.full((4, 1), m.config.decoder_start_token_id), ids[:, :6]], 1)
    with torch.no_grad():
        ref = m(input_ids=ids, attention_mask=am, decoder_input_ids=dec, task=TASK).logits
    gen = flat.model.generation_config.to_dict()
    for int8, bound in ((False, 1e-4), (True, None)):
        r = OrtSeq2Seq(folder, int8=int8, generation_config=gen)
        got = torch.from_numpy(r.logits(dec.numpy(), r.encode(ids.numpy(), am.numpy()), am.numpy()))
        diff = float((got - ref).abs().max())
        if bound is None:
            assert diff > 1e-4  # quantised: not the same numbers (a test that fp32 graphs were not reused)
        else:
            assert diff <= bound


@pytest.mark.parametrize("settings", [{"num_beams": 1}, {"num_beams": 3}, {"num_beams": 4, "length_penalty": 0.5},
                                      {"num_beams": 2, "early_stopping": False}, {"num_beams": 3, "min_length": 5}],
                         ids=["greedy", "beam3", "beam4_lp", "beam2_not_early", "beam3_min_length"])
def test_onnx_generation_equals_sparse_token_for_token(tiny, settings):
    from skillnet.export.onnx_seq2seq import OrtSeq2Seq

    m, flat, folder, _ = tiny
    r = OrtSeq2Seq(folder, generation_config=flat.model.generation_config.to_dict())
    ids, am = _inputs()
    kw = {"max_new_tokens": 14, "suppress_tokens": [100], **settings}
    with torch.no_grad():
        want = m.generate(input_ids=ids, attention_mask=am, task=TASK, **kw)
    got = r.generate(ids.numpy(), am.numpy(), **kw)
    assert got.tolist() == want.tolist()
    eos = m.config.eos_token_id
    ends = {row.index(eos, 1) if eos in row[1:] else len(row) for row in want.tolist()}
    if settings == {"num_beams": 3}:  # rows finish at different steps: the finishing rules ran
        assert len(ends) > 1
    for i in range(2):  # one row at a time: no padding from the batch
        one = m.generate(input_ids=ids[i:i + 1], attention_mask=am[i:i + 1], task=TASK, **kw)
        assert r.generate(ids[i:i + 1].numpy(), am[i:i + 1].numpy(), **kw).tolist() == one.tolist()


def test_unsupported_settings_are_refused(tiny):
    from skillnet.export.onnx_seq2seq import OrtSeq2Seq

    _, flat, folder, _ = tiny
    r = OrtSeq2Seq(folder, generation_config=flat.model.generation_config.to_dict())
    ids, am = _inputs()
    for bad in ({"do_sample": True}, {"no_repeat_ngram_size": 3}, {"num_return_sequences": 2}):
        with pytest.raises(NotImplementedError, match=next(iter(bad))):
            r.generate(ids.numpy(), am.numpy(), **bad)


def test_export_cli_writes_measures_and_serves_bart_onnx(gen_run, tmp_path):
    """``export --plain --onnx`` of a fine-tuned BART: the graphs beside the stock folder, the measured
    equality and scores in plain_export.json and the card, and ``ort/seq2seq.py`` run on its own."""
    from skillnet.pretrain.export import main

    out = tmp_path / "fix"
    assert main(["--plain", "--onnx", "--checkpoint", str(gen_run / "export"), "--task", "fix", "--out", str(out)]) == 0
    facts = json.loads((out / "plain_export.json").read_text())
    ox = facts["onnx"]
    assert ox["fp32"]["max_abs_diff"] <= 1e-4 and ox["inputs"] > 0
    assert ox["fp32"]["generate_equal"] == [ox["inputs"]] * len(ox["decoders"])
    assert max(ox["decoders"]) > 1  # beam search was checked, whatever the task's own config decodes with
    sc = ox["scores"]
    assert sc["fp32"] == sc["sparse"] and ox["int8_score_drop"] == sc["sparse"] - sc["int8"]
    card = (out / "README.md").read_text(encoding="utf-8")
    assert f"{ox['fp32']['max_abs_diff']:.2e} (fp32)" in card and f"int8 drop {ox['int8_score_drop']:.4f}" in card
    assert not list(out.glob("*.py"))  # the stock folder itself stays code-free; the decoder lives in ort/
    # The card's serving lines in a fresh interpreter; the decoding module needs neither torch nor SkillNet.
    src = "fix: " + json.loads((Path(__file__).parent / "fixtures" / "finetune" / "gen_fix_dev.jsonl").read_text(
        encoding="utf-8").splitlines()[0])["source"]
    code = f"""
import sys, json
sys.path.insert(0, {str(out / 'ort')!r})
from seq2seq import OrtSeq2Seq
assert "torch" not in sys.modules and not any(k.startswith("skillnet") for k in sys.modules)
from tokenizers import Tokenizer
enc = Tokenizer.from_file({str(out / 'tokenizer.json')!r}).encode({src!r})
import numpy as np
ids = OrtSeq2Seq({str(out / 'ort')!r}).generate(np.array([enc.ids]), np.array([enc.attention_mask]))
print(json.dumps([enc.ids, ids.tolist()]))
"""
    src_ids, got = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                             cwd=tmp_path).stdout.strip().splitlines()[-1])
    from skillnet.finetune.predict import Predictor
    from transformers import AutoTokenizer, GenerationConfig

    pred = Predictor(gen_run / "export")
    enc = AutoTokenizer.from_pretrained(str(out))(src, return_tensors="pt")
    assert enc["input_ids"][0].tolist() == src_ids  # tokenizers alone encodes as transformers does
    with torch.no_grad():
        want = pred.model.generate(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"], task="fix",
                                   generation_config=GenerationConfig.from_pretrained(str(out)))
    assert got == want.tolist()
