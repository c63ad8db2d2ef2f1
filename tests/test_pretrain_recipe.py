"""`--recipe paper` and the start log of pretrain/run.py.

The paper's settings (Appendix B) are a named recipe usable with any ZeRO config, and every run prints
its effective optimizer, schedule, sequence length and steps with the source of each value.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from skillnet.pretrain import run as run_mod
from skillnet.pretrain.recipes import RECIPES, ds_config_settings

from tests.fixtures.pretrain.helpers import REPO


def _start_event(stdout: str) -> dict:
    return next(json.loads(x) for x in stdout.splitlines() if x.startswith('{"event": "start"'))


def _line(stdout: str, label: str) -> str:
    return next(x for x in stdout.splitlines() if x.strip().startswith(label))


def test_recipe_paper_is_applied_and_the_start_log_names_each_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    argv = ["--synthetic", "64", "--synthetic_vocab", "1024", "--recipe", "paper", "--preset", "tiny"]
    argv += ["--max_seq_len", "16", "--max_steps", "2", "--micro_batch_size", "2", "--log_every", "1"]
    argv += ["--output_dir", str(out), "--no_progress", "--no_tensorboard"]
    assert run_mod.main(argv) == 0
    stdout = capsys.readouterr().out
    assert "lr 3e-05 [recipe paper]" in _line(stdout, "optimizer")
    assert "betas (0.9, 0.98) [recipe paper]" in _line(stdout, "optimizer")
    assert "eps 1e-06 [recipe paper]" in _line(stdout, "optimizer")
    assert "warmup 10000 steps [recipe paper]" in _line(stdout, "schedule")
    assert "decay to 0 at step 2 [= max_steps]" in _line(stdout, "schedule")
    assert "16 tokens [flag]" in _line(stdout, "sequence")
    assert "2 [flag]" in _line(stdout, "steps")
    assert "preset tiny [flag]" in _line(stdout, "model")
    assert "10240" in _line(stdout, "batch")  # the paper's global batch is named, not silently dropped
    assert "never reaches its peak" in stdout  # 10k warmup steps in a 2-step run
    settings = _start_event(stdout)["settings"]
    assert settings["lr"] == {"value": 3e-05, "source": "recipe paper"}
    assert settings["max_steps"] == {"value": 2, "source": "flag"}
    assert settings["max_grad_norm"] == {"value": 1.0, "source": "default"}
    # Applied, not only printed: step 1 trains at 3e-5 x 1/10000 (linear warmup).
    first = json.loads((out / "log.jsonl").read_text().splitlines()[0])
    assert first["lr"] == pytest.approx(3e-5 / 10_000)


@pytest.mark.parametrize("ds_config", ["zero1.json", "zero2.json", "zero3.json", "zero2_offload.json"])
def test_recipe_works_with_any_zero_config(ds_config: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["--synthetic", "64", "--ds_config", str(REPO / "ds_configs" / ds_config), "--recipe", "paper"]
    assert run_mod.main([*argv, "--dry_run"]) == 0
    stdout = capsys.readouterr().out
    assert "lr 3e-05 [recipe paper]" in _line(stdout, "optimizer")
    assert "grad clip 1.0 [ds_config]" in _line(stdout, "optimizer")
    assert "warmup 10000 steps [recipe paper]" in _line(stdout, "schedule")
    assert "decay to 0 at step 100000 [= max_steps]" in _line(stdout, "schedule")
    assert "512 tokens [recipe paper]" in _line(stdout, "sequence")
    assert "100000 [recipe paper]" in _line(stdout, "steps")
    assert "8 micro [ds_config]" in _line(stdout, "batch")


def test_defaults_under_a_zero_config_are_announced(capsys: pytest.CaptureFixture[str]) -> None:
    """The issue's case: any JSON but paper_v100x32.json ran on the command-line defaults without a word."""
    argv = ["--synthetic", "64", "--ds_config", str(REPO / "ds_configs" / "zero2.json"), "--dry_run"]
    assert run_mod.main(argv) == 0
    stdout = capsys.readouterr().out
    assert "lr 0.0001 [default]" in _line(stdout, "optimizer")
    assert "warmup 0 steps [default]" in _line(stdout, "schedule")
    assert "128 tokens [default]" in _line(stdout, "sequence")
    assert "100 [default]" in _line(stdout, "steps")


def test_json_settings_win_over_the_recipe_and_contradicting_flags_are_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ds = json.loads((REPO / "ds_configs" / "zero2.json").read_text())
    ds["optimizer"] = {"type": "AdamW", "params": {"lr": 2e-4, "betas": [0.9, 0.999]}}
    ds["scheduler"] = {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 50, "total_num_steps": 400}}
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps(ds))
    base = ["--synthetic", "64", "--ds_config", str(cfg), "--recipe", "paper", "--dry_run"]
    assert run_mod.main([*base, "--max_steps", "300"]) == 0
    stdout = capsys.readouterr().out
    assert "lr 0.0002 [ds_config]" in _line(stdout, "optimizer")
    assert "betas (0.9, 0.999) [ds_config]" in _line(stdout, "optimizer")
    assert "eps 1e-06 [recipe paper]" in _line(stdout, "optimizer")
    assert "warmup 50 steps [ds_config]" in _line(stdout, "schedule")
    assert "decay to 0 at step 400 [ds_config]" in _line(stdout, "schedule")
    assert "300 [flag]" in _line(stdout, "steps")  # stopping before the JSON's total_num_steps is allowed
    assert run_mod.main([*base, "--lr", "1e-3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and "lr=0.0002" in err[0] and "--lr 0.001" in err[0]


def test_paper_json_agrees_with_the_recipe() -> None:
    """ds_configs/paper_v100x32.json keeps its optimizer/scheduler sections: they must not drift."""
    ds = json.loads((REPO / "ds_configs" / "paper_v100x32.json").read_text())
    recipe = RECIPES["paper"]
    in_json = ds_config_settings(ds)
    assert {"lr", "betas", "eps", "weight_decay", "warmup_steps", "max_steps"} <= set(in_json)
    for name, value in in_json.items():
        assert recipe.settings.get(name, value) == value, name
    assert ds["train_batch_size"] == recipe.global_batch


def test_init_from_dense_reports_the_checkpoint_as_the_model_s_source(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A dense BERT of hidden 96 and 3 layers is trained at its own shape; the start log, the start event and
    run_args.json say so, instead of naming the default preset that played no part."""
    from transformers import BertConfig, BertForPreTraining

    dense = tmp_path / "dense"
    BertForPreTraining(BertConfig(vocab_size=1024, hidden_size=96, num_hidden_layers=3, num_attention_heads=4,
                                  intermediate_size=192, max_position_embeddings=64)).save_pretrained(str(dense))
    out = tmp_path / "run"
    argv = ["--synthetic", "64", "--synthetic_vocab", "1024", "--init_from_dense", str(dense), "--max_seq_len", "16"]
    argv += ["--max_steps", "1", "--micro_batch_size", "2", "--output_dir", str(out), "--no_progress", "--no_tensorboard"]
    assert run_mod.main(argv) == 0
    stdout = capsys.readouterr().out
    line = _line(stdout, "model")
    assert "preset" not in line, line
    assert str(dense) in line and "hidden 96" in line and "3 layers" in line, line
    assert _start_event(stdout)["settings"]["preset"] == {"value": None, "source": f"--init-from-dense {dense}"}
    run_args = json.loads((out / "run_args.json").read_text())
    assert run_args["preset"] is None and run_args["init_from_dense"] == str(dense)
