"""One truncation rule for every served form (issue 57): the SkillNet export's pipelines cut an input where
fine-tuning and ``predict`` cut it (the task's ``max_seq_len``, a generation task's prefix on top), not at the
tokenizer's ``model_max_length`` (the model's positions), so they give ``predict``'s answers on inputs longer
than the task's length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # two tiny fine-tuning runs (gen_run is shared with other files)

FIX = Path(__file__).resolve().parent / "fixtures" / "finetune"


def _long_sources() -> list[str]:
    rows = [json.loads(x)["source"] for x in (FIX / "gen_fix_dev.jsonl").read_text(encoding="utf-8").splitlines()]
    return ["".join(rows[i:] + rows[:i]) * 2 for i in range(len(rows))]


def test_text2text_pipeline_cuts_and_answers_as_predict(gen_run) -> None:
    from skillnet.finetune.predict import Predictor
    from transformers import pipeline

    folder = gen_run / "export"
    pred = Predictor(folder)
    recs = [{"source": s} for s in _long_sources()]
    feats = pred.tasks["fix"].encode_records(recs)
    assert all(f.extra["truncated"] for f in feats)  # every source is longer than the task's 32 tokens
    gen = pipeline("text2text-generation", model=str(folder), trust_remote_code=True)
    assert [gen.preprocess(r["source"])["input_ids"][0].tolist() for r in recs] == [f.input_ids for f in feats]
    assert [gen(r["source"])[0]["generated_text"] for r in recs] == pred.predict("fix", recs)


@pytest.fixture(scope="module")
def clf_run(tmp_path_factory) -> Path:
    from skillnet.finetune import run as run_cli
    from skillnet.finetune.config import FinetuneConfig

    from tests.test_finetune_e2e import _task, tiny_config

    out = tmp_path_factory.mktemp("cut") / "run"
    d = tiny_config(out)
    d["tasks"] = [_task("sentiment", "classification", "sent", ["s1", "s4", "s7"], max_seq_len=12)]
    d["train"].update(max_steps=2, eval_every=2, log_every=2)
    run_cli.run(FinetuneConfig.from_dict(d), tensorboard=False, progress=False)
    return out


def test_text_classification_pipeline_cuts_as_predict(clf_run) -> None:
    from skillnet.finetune.predict import Predictor
    from transformers import pipeline

    folder = clf_run / "export"
    texts = [json.loads(x)["text"] * 4 for x in (FIX / "sent_test.jsonl").read_text(encoding="utf-8").splitlines()]
    pred = Predictor(folder)
    feats = pred.tasks["sentiment"].encode_records([{"text": t} for t in texts])
    assert all(f.extra["truncated"] for f in feats)
    clf = pipeline("text-classification", model=str(folder), trust_remote_code=True)
    pre = clf._sanitize_parameters()[0]
    assert [clf.preprocess(t, **pre)["input_ids"][0].tolist() for t in texts] == [f.input_ids for f in feats]
    assert [r["label"] for r in clf(texts)] == pred.predict("sentiment", [{"text": t} for t in texts])
