"""Multi-task generation on SkillNet-BART through the same fine-tuning config, entry point, trainer and
exports as the NLU tasks (issue: SkillNet-NLG, item 3 and 6)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from skillnet.data_prep.tokenizer import default_vocab_path
from skillnet.finetune import run as run_cli
from skillnet.finetune.build import build_model
from skillnet.finetune.config import ConfigError, FinetuneConfig
from skillnet.model.hub import save_tokenizer
from transformers import AutoTokenizer, BartConfig, BartForConditionalGeneration

from tests.fixtures.pretrain.helpers import REPO, subprocess_env

FIX = Path(__file__).resolve().parent / "fixtures" / "finetune"


def gen_config(out: Path, **kw) -> dict:
    def task(name: str, skills: list[str], **extra) -> dict:
        return {"name": name, "type": "generation", "skills": skills, "train": str(FIX / f"gen_{name}_train.jsonl"),
                "dev": str(FIX / f"gen_{name}_dev.jsonl"), "max_seq_len": 32, "max_target_len": 24, **extra}

    d = {
        "model": {"preset": "tiny"},
        "tasks": [task("fix", ["non_open_end", "general"], metric="f0.5", num_beams=2),
                  task("qa", ["open_end", "question", "general"])],
        "sampler": {"kind": "temperature"},
        "train": {"max_steps": 6, "batch_size": 4, "eval_batch_size": 8, "lr": 1e-3, "eval_every": 3,
                  "log_every": 3, "warmup_ratio": 0.0, "seed": 0},
        "output_dir": str(out),
    }
    d.update(kw)
    return d


@pytest.mark.slow  # keeps make test-fast under 3 min (measured 9-30 s on 2 loaded cores)
def test_generation_tasks_train_evaluate_export_and_predict(tmp_path):
    out = tmp_path / "gen"
    res = run_cli.run(FinetuneConfig.from_dict(gen_config(out)), tensorboard=False, progress=False)
    assert set(res) == {"fix", "qa"}
    assert res["fix"]["metric"] == "f0.5" and res["qa"]["metric"] == "rouge_l"
    assert set(res["qa"]["dev"]) == {"rouge_l", "bleu_2", "bleu_4", "f0.5", "distinct", "repetition",
                                        "char_accuracy"}
    assert res["fix"]["trivial_dev"]["f0.5"] == 100.0  # copying the source is right on a dev set with no errors
    # the task selected on F0.5 reports the detection scores beside it, in results.json too (issue 49)
    on_disk = json.loads((out / "results.json").read_text(encoding="utf-8"))["tasks"]["fix"]["dev"]
    assert {"det_f0.5", "det_p", "det_r", "sent_det_f1", "sent_cor_f1"} <= set(on_disk)
    samples = json.loads((out / "samples.json").read_text(encoding="utf-8"))
    assert set(samples) == {"fix", "qa"} and samples["qa"][0]["source"] == "理赔要多久"
    assert set(samples["qa"][0]) == {"source", "reference", "output"}
    meta = json.loads((out / "export" / "finetune_tasks.json").read_text())["tasks"]
    assert meta["qa"]["prefix"] == "qa: " and meta["fix"]["num_beams"] == 2 and meta["qa"]["max_target_len"] == 24
    cfg = json.loads((out / "export" / "config.json").read_text())
    assert cfg["model_type"] == "skillnet-bart" and cfg["tasks"]["fix"] == ["non_open_end", "general"]
    assert AutoTokenizer.from_pretrained(str(out / "export"))("北京")["input_ids"] == [101, 1266, 776, 102]
    # predict: JSONL in, generated text out
    inp = tmp_path / "in.jsonl"
    inp.write_text('{"task": "qa", "source": "保险可以退吗"}\n{"task": "fix", "source": "我今天很高心"}\n',
                   encoding="utf-8")
    r = subprocess.run([sys.executable, "-m", "skillnet.finetune.predict", "--model", str(out / "export"),
                        "--input", str(inp), "--output", str(tmp_path / "o.jsonl"), "--no-progress"],
                       cwd=REPO, capture_output=True, text=True, env=subprocess_env(), timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [json.loads(x) for x in (tmp_path / "o.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [x["task"] for x in rows] == ["qa", "fix"] and all(isinstance(x["prediction"], str) for x in rows)


def test_generation_starts_from_a_dense_bart_with_every_skill_a_copy(tmp_path):
    torch.manual_seed(0)
    dense = BartForConditionalGeneration(BartConfig(
        vocab_size=21128, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=101, eos_token_id=102, decoder_start_token_id=102))
    dense.save_pretrained(str(tmp_path / "bart"))
    save_tokenizer(tmp_path / "bart", default_vocab_path())
    cfg = FinetuneConfig.from_dict(gen_config(tmp_path / "ft", model={"init": str(tmp_path / "bart")}))
    data = run_cli.load_task_data(cfg, __import__("skillnet.data_prep.tokenizer", fromlist=["x"]).load_tokenizer(None))
    model, _ = build_model(cfg, data)
    model.eval()
    ids = torch.randint(200, 8000, (2, 9))
    labels = torch.randint(200, 8000, (2, 5))
    with torch.no_grad():
        want = dense.eval()(input_ids=ids, labels=labels).logits
        for task in ("fix", "qa"):
            torch.testing.assert_close(model(input_ids=ids, labels=labels, task=task).logits, want, atol=1e-4, rtol=0)


def test_label_smoothing_is_the_smoothed_cross_entropy_of_the_targets():
    from skillnet.training.batch import Batch

    torch.manual_seed(0)
    logits = torch.randn(2, 4, 11)
    labels = torch.tensor([[1, 2, 3, -100], [4, 5, -100, -100]])
    out = type("Out", (), {"logits": logits})()
    got = run_cli.label_smoothed_loss(0.1)(Batch("t", {"labels": labels}), out)
    keep = labels != -100
    lp = logits[keep].log_softmax(-1)
    nll = -lp.gather(1, labels[keep][:, None]).squeeze(1)
    want = (0.9 * nll + 0.1 * (-lp.mean(-1))).mean()
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("method", ["dense_joint", "task_specific"])
@pytest.mark.slow  # measured 17 and 6 s
def test_baselines_run_on_bart(tmp_path, method):
    out = tmp_path / method
    res = run_cli.run(FinetuneConfig.from_dict(gen_config(out, method=method)), tensorboard=False, progress=False)
    assert set(res) == {"fix", "qa"}
    sub = out / "fix" / "export" if method == "task_specific" else out / "export"
    cfg = json.loads((sub / "config.json").read_text())
    assert [s["name"] for s in cfg["skills"]] == ["shared"]


def test_generation_config_errors():
    d = gen_config(Path("x"))
    d["tasks"].append({"name": "sent", "type": "classification", "skills": ["s1", "s7"],
                       "train": str(FIX / "sent_train.jsonl")})
    with pytest.raises(ConfigError, match="generation tasks .* put them in separate configs"):
        FinetuneConfig.from_dict(d)
    with pytest.raises(ConfigError, match="'learnable' is not available for BART"):
        FinetuneConfig.from_dict(gen_config(Path("x"), method="learnable"))
    with pytest.raises(ConfigError, match="model.arch: 'bert' does not fit the tasks"):
        FinetuneConfig.from_dict(gen_config(Path("x"), model={"arch": "bert"}))
    bad = gen_config(Path("x"))
    bad["tasks"][0]["skills"] = ["s1"]
    cfg = FinetuneConfig.from_dict(bad)
    with pytest.raises(ConfigError, match="unknown skill 's1'"):
        cfg.check_model()


@pytest.mark.slow  # measured 28 s
def test_adapting_a_generation_export_to_a_new_task_keeps_the_old_ones(tmp_path):
    first = gen_config(tmp_path / "mt")
    first["tasks"] = first["tasks"][:1]  # fix only
    run_cli.run(FinetuneConfig.from_dict(first), tensorboard=False, progress=False)
    new = gen_config(tmp_path / "adapt", model={"init": str(tmp_path / "mt" / "export")},
                     new_skills=[{"name": "new_task", "tasks": ["qa"]}])
    new["tasks"] = new["tasks"][1:]  # qa only, a new task for that model
    res = run_cli.run(FinetuneConfig.from_dict(new), tensorboard=False, progress=False)
    assert set(res) == {"qa"}
    meta = json.loads((tmp_path / "adapt" / "export" / "finetune_tasks.json").read_text())["tasks"]
    assert set(meta) == {"fix", "qa"}  # the model can still run the task it learnt before
    cfg = json.loads((tmp_path / "adapt" / "export" / "config.json").read_text())
    assert "new_task" in cfg["tasks"]["qa"] and "new_task" not in cfg["tasks"]["fix"]
