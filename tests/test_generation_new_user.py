"""The generation path as a new user meets it (issue 50, item 9): the docs' generation example runs on
SkillNet-BART as written, prefixes that a compact vocab turns into [UNK] are named, target cuts are not blamed
on max_seq_len, --new-skill says what it copied, and a task that ends below its trivial baseline is said so."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from skillnet.data_prep.tokenizer import load_tokenizer
from skillnet.finetune.config import FinetuneConfig
from skillnet.finetune.tasks import TaskData

REPO = Path(__file__).resolve().parent.parent


def _jsonl(path: Path, recs: list[dict]) -> str:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs), encoding="utf-8")
    return str(path)


def _gen_cfg(tmp_path: Path, tasks: list[dict], **kw) -> FinetuneConfig:
    d = {"model": {"preset": "tiny"}, "tasks": tasks, "train": {"max_steps": 1, "batch_size": 2},
         "output_dir": str(tmp_path / "out"), **kw}
    return FinetuneConfig.from_dict(d, base_dir=str(tmp_path))


# ---- (c) target cuts are reported at max_target_len, not max_seq_len ----------------------------------------
def test_target_cuts_are_reported_with_their_own_limit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from skillnet.finetune.run import truncation_lines

    long_target = {"source": "短句", "target": "很长的目标句子" * 6}
    long_source = {"source": "很长的源句子" * 6, "target": "短"}
    train = _jsonl(tmp_path / "train.jsonl", [long_target, long_target, long_target, long_source, {"source": "a",
                                                                                                   "target": "b"}])
    cfg = _gen_cfg(tmp_path, [{"name": "summ", "type": "generation", "skills": ["non_open_end"], "train": train,
                               "max_seq_len": 16, "max_target_len": 12}])
    with caplog.at_level(logging.WARNING, logger="finetune"):
        d = TaskData(cfg.tasks[0], cfg, load_tokenizer())
        assert d.cuts == {"train": {"max_seq_len": 1, "max_target_len": 3}}
    logged = [r.getMessage() for r in caplog.records]
    assert "summ/train: 1 of 5 sources truncated at max_seq_len=16" in logged
    assert "summ/train: 3 of 5 targets truncated at max_target_len=12" in logged
    # The score's input-side record (results.json's <split>_truncated) counts source cuts only.
    assert d.truncated == {"train": 1}
    lines = truncation_lines({"summ": d})
    assert lines == ["  summ: sources truncated at max_seq_len=16: train 1 of 5",
                     "  summ: targets truncated at max_target_len=12: train 3 of 5"]


# ---- (e) a task that ends at or below its trivial baseline is said so in the run's last lines ---------------
def test_a_score_below_the_trivial_baseline_is_named_in_the_last_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from skillnet.finetune import run as run_mod
    from skillnet.finetune.evaluation import below_trivial

    fix = REPO / "tests" / "fixtures" / "finetune"
    task = {"name": "fix", "type": "generation", "skills": ["non_open_end"], "metric": "f0.5", "num_beams": 1,
            "train": str(fix / "gen_fix_train.jsonl"), "dev": str(fix / "gen_fix_dev.jsonl"), "max_seq_len": 32,
            "max_target_len": 24}
    cfg = _gen_cfg(tmp_path, [task], train={"max_steps": 2, "batch_size": 4, "eval_batch_size": 8, "lr": 1e-3,
                                            "log_every": 2, "seed": 0, "warmup_ratio": 0.0})
    res = run_mod.run(cfg, tensorboard=False, progress=False)
    # Copying the source is right on this dev set (no errors to fix): two steps of training do not beat it.
    assert res["fix"]["trivial_dev"]["f0.5"] == 100.0 and res["fix"]["dev"]["f0.5"] < 100.0
    last = capsys.readouterr().err.rstrip().splitlines()[-1]
    assert last == (f"[finetune] warning: task 'fix' ends at or below its trivial baseline: dev f0.5 "
                    f"{res['fix']['dev']['f0.5']:.1f}, copy the source scores 100.0")

    # The rule, on results as results.json holds them: test before dev, at-or-below and unscored flagged.
    results = {"cls": {"type": "classification", "metric": "accuracy", "test": {"accuracy": 61.0},
                       "trivial_test": {"accuracy": 60.0}, "dev": {"accuracy": 10.0}, "trivial_dev": {"accuracy": 60.0}},
               "ner": {"type": "ner", "metric": "f1", "test": {"f1": 0.0}, "trivial_test": {"f1": 0.0}},
               "gen": {"type": "generation", "metric": "rouge_l", "dev": {"rouge_l": float("nan")},
                       "trivial_dev": {"rouge_l": 41.1}}}
    assert below_trivial(results) == [
        "warning: task 'ner' ends at or below its trivial baseline: test f1 0.0, all O scores 0.0",
        "warning: task 'gen': its dev rouge_l was not scored (trivial baseline 41.1)"]
