"""`python -m skillnet.pretrain.skill_init RUN`: where each skill of a sparse pre-training run started (a copy
of the --init-from-dense FFN, or random), checked against the run's skill_init.safetensors and, with
--export, the export's copies of s7 (docs/pretrain.md, "Where the skills started")."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from skillnet.export import hf_folder as export_mod
from skillnet.pretrain import run as run_mod
from skillnet.pretrain import skill_init


@pytest.fixture(scope="module")
def sparse_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-step sparse run from a tiny dense BERT (2 layers, both skill layers)."""
    from transformers import BertConfig, BertForPreTraining

    root = tmp_path_factory.mktemp("skill_init")
    torch.manual_seed(1)
    BertForPreTraining(BertConfig(vocab_size=1024, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=64)).save_pretrained(root / "dense")
    argv = ["--synthetic", "64", "--synthetic_vocab", "1024", "--max_seq_len", "16", "--micro_batch_size", "2",
            "--max_steps", "1", "--output_dir", str(root / "run"), "--no_progress", "--no_tensorboard",
            "--init_from_dense", str(root / "dense")]
    assert run_mod.main(argv) == 0
    return root / "run"


def _rows(text: str) -> dict[str, list[str]]:
    """skill -> the columns of its row (split on runs of two spaces or more)."""
    import re

    rows = {}
    for line in text.splitlines():
        cols = re.split(r"\s{2,}", line.strip())
        if re.fullmatch(r"s\d+", cols[0]):
            rows[cols[0]] = cols
    return rows


def test_the_table_says_which_skills_copy_the_dense_ffn_and_that_they_match(
    sparse_run: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert skill_init.main([str(sparse_run)]) == 0
    out = capsys.readouterr().out
    assert "key <skill>/<n>, n = 4*i + j over the 2 skill layers i = layer.0, layer.1" in out
    rows = _rows(out)
    assert sorted(rows) == [f"s{k}" for k in range(1, 8)]
    for s in ("s1", "s2", "s3", "s7"):
        assert rows[s][1].startswith("copy of the dense FFN") and rows[s][2] == "0" and rows[s][3] == "ok (equal)", s
        assert rows[s][4] == "trained"
    for s in ("s4", "s5", "s6"):
        assert rows[s][1] == "random (seed 0)" and float(rows[s][2]) > 0 and rows[s][3] == "ok (differs)", s
        assert rows[s][4] == "copy of s7 (trained)"  # random during pre-training, s7's copy only at export
    assert out.rstrip().endswith("all claims hold")

    # The documented key layout is the file's: s2/5 is layer.1's intermediate.dense.bias, the dense one.
    rep = skill_init.skill_init_report(sparse_run)
    assert rep.keys("s2")["s2/5"] == "layer.1.intermediate.dense.bias"
    dense = load_file(str(sparse_run.parent / "dense" / "model.safetensors"))
    init = load_file(str(sparse_run / "skill_init.safetensors"))
    assert torch.equal(init["s2/5"], dense["bert.encoder.layer.1.intermediate.dense.bias"])


def test_export_copies_are_checked_and_a_changed_weight_is_named(
    sparse_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    hf = export_mod.export(sparse_run, tmp_path / "hf")
    assert skill_init.main([str(sparse_run), "--export", str(hf), "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    by = {s["skill"]: s for s in rep["skills"]}
    assert all(by[s]["export_max_abs_diff"] == 0.0 and by[s]["at_export"] == "copy of s7 (trained)"
               for s in ("s4", "s5", "s6"))
    assert rep["ok"] and rep["keys"]["s1"]["s1/0"] == "layer.0.intermediate.dense.weight"

    # A skill that did not start as the dense FFN (here: one element of s3 changed) fails, by name.
    broken = tmp_path / "broken"
    broken.mkdir()
    for f in ("run_args.json",):
        (broken / f).write_text((sparse_run / f).read_text())
    (broken / "checkpoints").symlink_to(sparse_run / "checkpoints")
    init = load_file(str(sparse_run / "skill_init.safetensors"))
    init["s3/6"] = init["s3/6"].clone()
    init["s3/6"][0, 0] += 0.5
    save_file(init, str(broken / "skill_init.safetensors"))
    dense = str(sparse_run.parent / "dense")
    assert skill_init.main([str(broken), "--dense", dense]) == 1
    rows = _rows(capsys.readouterr().out)
    assert rows["s3"][3] == "MISMATCH (a copy must be equal)" and float(rows["s3"][2]) == pytest.approx(0.5)
    assert rows["s1"][3] == "ok (equal)"


def test_a_run_that_cannot_be_read_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert skill_init.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "run_args.json" in err and err.count("\n") == 1
