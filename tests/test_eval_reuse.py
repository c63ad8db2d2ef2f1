"""What a fine-tuning run does not compute twice: the selected checkpoint's dev scores (measured when it was
saved) and the lexical baselines (the same for every run on the same data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from skillnet.data_prep.tokenizer import load_tokenizer
from skillnet.finetune import run as run_cli
from skillnet.finetune import tasks as tasks_mod
from skillnet.finetune.config import FinetuneConfig
from skillnet.finetune.predict import Predictor
from skillnet.finetune.tasks import TaskData

FIX = Path(__file__).resolve().parent / "fixtures" / "finetune"


def _task(name: str, typ: str, fixture: str, **extra: object) -> dict:
    return {"name": name, "type": typ, "skills": ["s1", "s7"], "max_seq_len": 32, **extra,
            **{split: str(FIX / f"{fixture}_{split}.jsonl") for split in ("train", "dev", "test")}}


def test_final_dev_scores_are_the_selected_checkpoints_without_a_second_dev_pass(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = {"tasks": [_task("sent", "classification", "sent"), _task("ner", "ner", "ner")],
           "output_dir": str(tmp_path / "run"),
           "train": {"max_steps": 6, "batch_size": 4, "eval_batch_size": 8, "lr": 1e-3, "eval_every": 2,
                     "log_every": 2, "seed": 0, "warmup_ratio": 0.0, "lexical_baselines": False}}
    (tmp_path / "c.json").write_text(json.dumps(cfg), encoding="utf-8")
    dev_passes: list[str] = []
    predict_split = TaskData.predict_split

    def counted(self: TaskData, model, split, bs, **kw):  # noqa: ANN001, ANN202
        if split == "dev":
            dev_passes.append(self.name)
        return predict_split(self, model, split, bs, **kw)

    monkeypatch.setattr(TaskData, "predict_split", counted)
    assert run_cli.main(["--config", str(tmp_path / "c.json"), "--no-tensorboard", "--no-progress"]) == 0
    assert sorted(dev_passes) == ["ner"] * 3 + ["sent"] * 3  # one per evaluation (steps 2, 4, 6), none after
    monkeypatch.setattr(TaskData, "predict_split", predict_split)

    results = json.loads((tmp_path / "run" / "results.json").read_text(encoding="utf-8"))["tasks"]
    # the reported dev scores are those of the saved best checkpoint, predicted afresh
    best = Predictor(tmp_path / "run" / "best")
    ft = FinetuneConfig.from_dict(cfg)
    for t in ft.tasks:
        d = TaskData(t, ft, best.tok)
        assert results[t.name]["dev"] == pytest.approx(d.score("dev", d.predict_split(best.model, "dev", 8)))


def test_a_lexical_baseline_is_fit_once_for_the_same_data(monkeypatch: pytest.MonkeyPatch) -> None:
    tok = load_tokenizer(None)
    tasks_mod._LEXICAL_SCORES.clear()
    fits: list[int] = []

    def data(**extra: object) -> TaskData:
        ft = FinetuneConfig.from_dict({"tasks": [_task("sent", "classification", "sent", **extra)]})
        return TaskData(ft.tasks[0], ft, tok)

    codec = type(data().codec)
    lexical = codec.lexical

    def counted(self, *a, **kw):  # noqa: ANN001, ANN002, ANN003, ANN202
        fits.append(1)
        return lexical(self, *a, **kw)

    monkeypatch.setattr(codec, "lexical", counted)
    first = data().lexical_baseline("test")
    assert first is not None and len(fits) == 1
    # another run on the same data and settings (another TaskData, other skills): no second fit, same scores
    assert data(skills=["s2", "s7"]).lexical_baseline("test") == first and len(fits) == 1
    assert data().lexical_baseline("dev") is not None and len(fits) == 2  # another split
    fewer = data(max_train_examples=5)
    assert fewer.lexical_baseline("test") is not None and len(fits) == 3  # other training records
    tasks_mod._LEXICAL_SCORES.clear()
    assert data().lexical_baseline("test") == first and len(fits) == 4  # the cached scores are the fitted ones
