"""The CRF loss's scale is a task setting (issue 49, item 2): head {"loss_reduction": "token_mean" |
"sentence_mean"}. sentence_mean is the sequence NLL averaged over sentences, so its loss and every gradient are
token_mean's times the batch's mean words per sentence; the default stays token_mean."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from skillnet.finetune.config import ConfigError, FinetuneConfig
from skillnet.model import SkillNetBertConfig
from skillnet.model.heads import TokenCRFHead, build_head

from tests.test_finetune_e2e import tiny_config

LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]


def _loss_and_grads(reduction: str | None) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    cfg = SkillNetBertConfig.preset("tiny")
    spec = {"type": "token_crf", "num_labels": len(LABELS), "labels": LABELS, "dropout": 0.0}
    if reduction is not None:
        spec["loss_reduction"] = reduction
    torch.manual_seed(0)
    head = build_head(cfg, spec)
    hidden = torch.randn(3, 9, cfg.hidden_size, requires_grad=True)
    # words per sentence: 7, 3, 5 (position 0 and the last are [CLS] / [SEP] / padding, out of the chain)
    lengths = [7, 3, 5]
    word_mask = torch.zeros(3, 9, dtype=torch.long)
    for i, n in enumerate(lengths):
        word_mask[i, 1:1 + n] = 1
    labels = torch.randint(0, 1, (3, 9))  # all "O": a valid IOB2 sequence
    labels[word_mask == 0] = -100
    out = head(SimpleNamespace(last_hidden_state=hidden), {"word_mask": word_mask, "labels": labels})
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in head.named_parameters()}
    return out.loss.detach(), grads, hidden.grad.clone()


def test_sentence_mean_is_token_mean_times_the_mean_words_per_sentence():
    words_per_sentence = (7 + 3 + 5) / 3
    tok_loss, tok_grads, tok_hidden = _loss_and_grads("token_mean")
    sen_loss, sen_grads, sen_hidden = _loss_and_grads("sentence_mean")
    torch.testing.assert_close(sen_loss, tok_loss * words_per_sentence)
    for name, g in tok_grads.items():
        torch.testing.assert_close(sen_grads[name], g * words_per_sentence, msg=name)
    # the encoder's gradient, what the tasks share in joint training, scales the same
    torch.testing.assert_close(sen_hidden, tok_hidden * words_per_sentence)
    # the default is the loss-scale study's choice: sentence_mean
    default_loss, _, _ = _loss_and_grads(None)
    torch.testing.assert_close(default_loss, sen_loss)


def test_a_bad_reduction_is_refused():
    with pytest.raises(ValueError, match="loss_reduction 'sum'"):
        TokenCRFHead(SkillNetBertConfig.preset("tiny"), 3, 0.0, loss_reduction="sum")


def test_the_reduction_is_a_task_head_option_of_the_config(tmp_path):
    d = tiny_config(tmp_path)
    ner = next(t for t in d["tasks"] if t["name"] == "ner")
    ner["head"] = {"loss_reduction": "sentence_mean"}
    cfg = FinetuneConfig.from_dict(json.loads(json.dumps(d)))
    assert FinetuneConfig.from_dict(cfg.to_dict()).tasks[1].head == {"loss_reduction": "sentence_mean"}  # round trip
    ner["head"] = {"loss_reduction": "per_word"}
    with pytest.raises(ConfigError, match="loss_reduction must be one of token_mean, sentence_mean, got 'per_word'"):
        FinetuneConfig.from_dict(d)
    sent = next(t for t in d["tasks"] if t["name"] == "sentiment")
    ner["head"], sent["head"] = {}, {"loss_reduction": "sentence_mean"}  # not a classification option
    with pytest.raises(ConfigError, match="unknown option"):
        FinetuneConfig.from_dict(d)


def test_the_built_model_trains_ner_with_the_configured_reduction(tmp_path):
    from skillnet.data_prep.tokenizer import load_tokenizer
    from skillnet.finetune import run as run_cli
    from skillnet.finetune.build import build_model

    d = tiny_config(tmp_path)
    next(t for t in d["tasks"] if t["name"] == "ner")["head"] = {"loss_reduction": "token_mean"}
    cfg = FinetuneConfig.from_dict(d)
    model, _ = build_model(cfg, run_cli.load_task_data(cfg, load_tokenizer(None)))
    assert model.heads["ner"].loss_reduction == "token_mean"
    assert model.config.task_heads["ner"]["loss_reduction"] == "token_mean"  # exports keep it
    # without the option: the default the loss-scale study chose, a loss per sentence as every other head's
    del next(t for t in d["tasks"] if t["name"] == "ner")["head"]
    cfg = FinetuneConfig.from_dict(d)
    model, _ = build_model(cfg, run_cli.load_task_data(cfg, load_tokenizer(None)))
    assert model.heads["ner"].loss_reduction == "sentence_mean"


def test_the_loss_scale_study_runs_at_tiny_size_and_writes_its_table(tmp_path, capsys):
    """experiments/loss_scale.py: one compare per reduction (the NER head's option set in its config), a table
    of NER test F1 and the average per method and reduction, and paired differences from the first."""
    from skillnet.experiments import loss_scale

    d = tiny_config(tmp_path / "unused")
    d["train"].update(max_steps=4, eval_every=2, log_every=2)
    cfg = tmp_path / "cfg.json"
    cfg.write_text(json.dumps(d), encoding="utf-8")
    out = tmp_path / "study"
    assert loss_scale.main(["--config", str(cfg), "--seeds", "0", "1", "--out", str(out), "--threads", "1"]) == 0
    for red in ("token_mean", "sentence_mean"):
        ran = json.loads((out / "configs" / f"{red}.json").read_text())
        assert next(t for t in ran["tasks"] if t["name"] == "ner")["head"] == {"loss_reduction": red}
        assert json.loads((out / red / "comparison.json").read_text())["seeds"] == [0, 1]
    res = json.loads((out / "loss_scale.json").read_text())
    assert res["reference"] == "token_mean" and set(res["scores"]) == {"dense_joint", "skillnet", "task_specific"}
    assert res["winner"] in ("token_mean", "sentence_mean") and res["decision"]["split"] == "dev"  # decided on dev
    assert len(res["scores"]["skillnet"]["sentence_mean"]["ner"]["values"]) == 2
    md = (out / "loss_scale.md").read_text()
    assert "| method | NER loss | ner (f1) | average (all tasks) | runs |" in md
    assert "`sentence_mean` minus `token_mean`" in md
    # the NER dev curve of every run, read from its log: two evaluations of two seeds per method and arm
    per_seed = res["dev_curves"]["skillnet"]["sentence_mean"]["ner"]
    assert len(per_seed) == 2 and all([s for s, _ in c] == [2, 4] for c in per_seed)
    # the task-specific NER model trains its share of the 4 steps (1) and is evaluated at its own last step
    assert "| method | NER loss | task | step 1 | step 2 | step 4 | flat |" in md
    # a config without an NER task: one error line
    d["tasks"] = [t for t in d["tasks"] if t["type"] != "ner"]
    cfg.write_text(json.dumps(d), encoding="utf-8")
    with pytest.raises(SystemExit):
        loss_scale.main(["--config", str(cfg), "--out", str(tmp_path / "none")])
    assert "no task of type ner" in capsys.readouterr().err


def test_the_study_reuses_table_3_only_at_the_same_seeds_and_steps(tmp_path):
    from skillnet.experiments import loss_scale

    main = tmp_path / "nlu_main"
    main.mkdir()
    rows = {m: {"steps": 2400} for m in ("dense_joint", "skillnet", "moe")}
    (main / "comparison.json").write_text(json.dumps({"seeds": [0, 1, 2], "methods": rows}))
    assert loss_scale.reusable(main, ["dense_joint", "skillnet"], [0, 1, 2], 2400) is not None
    assert loss_scale.reusable(main, ["dense_joint", "skillnet"], [0, 1], 2400) is None
    assert loss_scale.reusable(main, ["dense_joint", "skillnet"], [0, 1, 2], 4800) is None
    assert loss_scale.reusable(main, ["pals"], [0, 1, 2], 2400) is None
    cfg = {"tasks": [{"name": "ner", "type": "ner"}, {"name": "s", "type": "classification"}]}
    assert loss_scale.config_reduction(cfg) == "sentence_mean"  # the head's default
    assert loss_scale.config_reduction(loss_scale.with_reduction(cfg, "sentence_mean")) == "sentence_mean"


def test_a_dev_curve_is_flat_when_its_last_step_moves_less_than_the_seed_spread():
    from skillnet.experiments.loss_scale import flattened

    def seeds(*per_step: tuple[int, list[float]]) -> list[list[list[float]]]:  # {step: per-seed} -> per-seed curves
        return [[[s, v[k]] for s, v in per_step if k < len(v)] for k in range(max(len(v) for _, v in per_step))]

    assert flattened(seeds((600, [40.0, 44.0]), (1200, [50.0, 52.0]), (1800, [51.0, 53.0]))) is True  # 1.0 < 1.4
    assert flattened(seeds((600, [40.0, 44.0]), (1200, [50.0, 52.0]), (1800, [55.0, 57.0]))) is False  # moved 5.0
    assert flattened(seeds((1200, [50.0, 52.0]))) is None and flattened(seeds((600, [1.0]), (1200, [2.0]))) is None
    # a seed cut short: the last two steps every seed reached decide (1200 -> 1800 here, not 1800 -> 2400)
    assert flattened(seeds((1200, [50.0, 52.0]), (1800, [51.0, 53.0]), (2400, [60.0]))) is True


def test_the_reproduction_runs_the_study_as_a_stage_and_its_report_shows_it(tmp_path):
    """Stage nlu_loss_scale runs the study before Table 3 (its own config at loss_scale_steps); the report's NLU
    part renders the study's loss_scale.json: scores per method and arm, the paired differences, the dev curves."""
    from skillnet.experiments.profiles import PROFILES
    from skillnet.experiments.report import build
    from skillnet.experiments.stages import PARTS, STAGES

    names = [s.name for s in STAGES]
    assert names.index("sparse_pt") < names.index("nlu_loss_scale") < names.index("nlu_main")
    assert "nlu_loss_scale" in PARTS["nlu"][2] and "nlu_loss_scale" not in PARTS["nlg"][2]
    ms = {"values": [50.0, 52.0], "mean": 51.0, "std": 1.4}
    study = {"seeds": [0, 1], "ner_tasks": ["ner"], "steps": 2400, "command": "python -m skillnet.experiments.loss_scale X",
             "sources": {"token_mean": "`token_mean/`", "sentence_mean": "`sentence_mean/`"}, "reference": "token_mean",
             "scores": {"skillnet": {a: {"ner": ms, "average": ms} for a in ("token_mean", "sentence_mean")}},
             "differences": {"skillnet": {"sentence_mean": {"ner": {"diff": 3.0, "p": 0.04},
                                                            "average": {"diff": 1.0, "p": 0.3}}}},
             "dev_curves": {"skillnet": {"token_mean": {"ner": [[[600, 40.0], [1200, 50.0]], [[600, 42.0], [1200, 52.0]]]}}}}
    (tmp_path / "loss_scale").mkdir()
    (tmp_path / "loss_scale" / "loss_scale.json").write_text(json.dumps(study))
    stages = [s for s in STAGES if s.name == "nlu_loss_scale"]
    report = tmp_path / "r.md"
    build(tmp_path, PROFILES["quick"], stages, report, "t", ("nlu",))
    md = report.read_text()
    section = md.split("## SkillNet-NLU: the NER loss's scale in joint training")[1].split("\n## ")[0]
    assert "Every run trains 2,400 steps." in section and "python -m skillnet.experiments.loss_scale X" in section
    assert "| skillnet | `sentence_mean` | 51.0 ± 1.4 | 51.0 ± 1.4 | `sentence_mean/` |" in section
    assert "`sentence_mean` minus `token_mean`" in section
    assert "| skillnet | `token_mean` | ner | 41.0 ± 1.4 | 51.0 ± 1.4 | no, rising |" in section
