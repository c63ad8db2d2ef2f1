"""What a fine-tuning run does not compute twice: the selected checkpoint's dev scores (measured when it was
saved) and the lexical baselines (the same for every run on the same data)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from skillnet.data_prep.tokenizer import load_tokenizer
from skillnet.finetune import tasks as tasks_mod
from skillnet.finetune.cli import main as finetune_main
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
    assert finetune_main(["--config", str(tmp_path / "c.json"), "--no-tensorboard", "--no-progress"]) == 0
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


def test_a_resumed_run_that_did_not_save_the_best_checkpoint_predicts_dev_again(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """After a crash, `best` on disk may hold a later step than the checkpoint the run resumed from: the dev
    scores in the resumed evaluator's state belong to an older checkpoint, so they are not reported."""
    from types import SimpleNamespace

    import torch
    from skillnet.finetune import evaluation
    from skillnet.finetune.config import TrainConfig

    class Task:
        cfg = SimpleNamespace(type="classification", metric="accuracy")
        records = {"dev": [None], "test": [None]}
        num_train, max_len, truncated = 1, 8, {"dev": 0, "test": 0}
        codec = SimpleNamespace(shows_samples=False)

        def predict_split(self, model, split, bs, progress=False):  # noqa: ANN001, ANN201
            return split

        def score(self, split, preds):  # noqa: ANN001, ANN201
            return {"accuracy": 11.0 if split == "dev" else 22.0}

        def trivial_baseline(self, split):  # noqa: ANN001, ANN201
            return {"accuracy": 0.0}

    cfg = SimpleNamespace(train=TrainConfig(lexical_baselines=False))
    source = SimpleNamespace(target_mix=dict, realised_mix=dict)
    ev = evaluation.DevEvaluator(cfg, {"t": Task()}, source, out=tmp_path, vocab=None, is_main=True)  # type: ignore[arg-type]
    saved = {"best": {}, "best_step": {}, "best_mean": 99.0, "best_mean_step": 100, "bad_evals": 0, "history": [],
             "best_mean_ok": True, "best_mean_scores": {"t": {"accuracy": 99.0}}}
    ev.load_state_dict(saved)
    (tmp_path / "best").mkdir()  # written by the crashed process, at a step the saved state does not know
    monkeypatch.setattr(evaluation, "load_weights", lambda model, path: None)
    model = torch.nn.Linear(1, 1)
    model.config = SimpleNamespace(task_skill_names=lambda name: ["s7"])  # type: ignore[assignment]
    res = evaluation.final_scores(model, cfg, {"t": Task()}, tmp_path, ev, progress=False)  # type: ignore[arg-type]
    assert res["t"]["dev"] == {"accuracy": 11.0} and res["t"]["test"] == {"accuracy": 22.0}


def test_the_matching_candidate_cap_is_part_of_the_lexical_key() -> None:
    tok = load_tokenizer(None)
    tasks_mod._LEXICAL_SCORES.clear()

    def data(**extra: object) -> TaskData:
        ft = FinetuneConfig.from_dict({"tasks": [_task("match", "matching", "match", num_negatives=2, **extra)]})
        return TaskData(ft.tasks[0], ft, tok)

    assert data()._lexical_key("test", False) != data(head={"max_candidates": 2})._lexical_key("test", False)
    assert data()._lexical_key("test", False) == data(skills=["s2", "s7"])._lexical_key("test", False)
