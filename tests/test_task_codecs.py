"""Task types are codecs in a registry (finetune/task_types/): a task type defined here, outside the package, is
one class and one `register` call, and the command line then trains, evaluates, exports and predicts it."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from skillnet.finetune import predict as predict_cli
from skillnet.finetune import task_types
from skillnet.finetune.cli import main as finetune_main
from skillnet.finetune.config import ConfigError, FinetuneConfig
from skillnet.finetune.task_types.base import Encoded, TaskCodec, bert_inputs, pair, piece_ids

FIX = Path(__file__).resolve().parent / "fixtures" / "finetune"
TOY = "toy_reversed"
CALLS: Counter[str] = Counter()


class ReversedTextCodec(TaskCodec):
    """A classification of single texts read backwards, scored by its own metric (``hits``)."""

    name = TOY
    head = "classification"
    kinds = ("single",)
    metrics = ("hits",)
    metric = "hits"
    labelled = True

    def encode(self, td: Any, recs: list[dict[str, Any]], split: str) -> tuple[list[Encoded], int]:
        CALLS["encode"] += 1
        feats = []
        for r, ids in zip(recs, piece_ids(td.tok, [r["text"][::-1] for r in recs])):
            e = pair(td.tok, ids, None, td.max_len)
            e.extra["label"] = r.get("label_id", -1)
            feats.append(e)
        return feats, sum(f.extra["truncated"] for f in feats)

    def collate(self, td: Any, feats: list[Encoded], with_labels: bool) -> dict[str, torch.Tensor]:
        CALLS["collate"] += 1
        batch = bert_inputs(td.tok, feats)
        if with_labels:
            batch["labels"] = torch.tensor([f.extra["label"] for f in feats], dtype=torch.long)
        return batch

    def decode(self, td: Any, model: Any, feats: list[Encoded], batch: dict[str, torch.Tensor]) -> list[Any]:
        CALLS["decode"] += 1
        return [td.label_list[int(i)] for i in model.predict(td.name, **batch)]

    def score(self, td: Any, recs: list[dict[str, Any]], preds: list[Any]) -> dict[str, float]:
        CALLS["score"] += 1
        return {"hits": 100.0 * sum(r["label"] == p for r, p in zip(recs, preds)) / len(recs)}

    def trivial(self, td: Any, recs: list[dict[str, Any]]) -> list[Any]:
        CALLS["trivial"] += 1
        return [td.label_list[0]] * len(recs)

    def present(self, rec: dict[str, Any], pred: Any) -> Any:
        return {"toy_label": pred}


@pytest.fixture
def toy_type():
    CALLS.clear()
    task_types.register(ReversedTextCodec())
    yield TOY
    task_types._CODECS.pop(TOY, None)  # the registry as it was


def _config(out: Path, typ: str) -> dict[str, Any]:
    task = {"name": "toy", "type": typ, "skills": ["s1", "s7"], "max_seq_len": 16,
            **{split: str(FIX / f"sent_{split}.jsonl") for split in ("train", "dev", "test")}}
    return {"tasks": [task], "output_dir": str(out),
            "train": {"max_steps": 4, "batch_size": 4, "eval_batch_size": 8, "lr": 1e-3, "eval_every": 2,
                      "log_every": 2, "seed": 0, "warmup_ratio": 0.0}}


def test_an_unregistered_type_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match=rf"unknown type '{TOY}'"):
        FinetuneConfig.from_dict(_config(tmp_path, TOY))


def test_a_type_registered_from_outside_trains_through_the_cli(tmp_path, toy_type):
    cfg_file = tmp_path / "toy.json"
    cfg_file.write_text(json.dumps(_config(tmp_path / "run", toy_type)), encoding="utf-8")
    rc = finetune_main(["--config", str(cfg_file), "--no-tensorboard", "--no-progress"])
    assert rc == 0
    res = json.loads((tmp_path / "run" / "results.json").read_text(encoding="utf-8"))["tasks"]["toy"]
    assert res["type"] == toy_type and res["metric"] == "hits"
    for key in ("dev", "test", "trivial_dev", "trivial_test"):
        assert set(res[key]) == {"hits"} and 0.0 <= res[key]["hits"] <= 100.0
    # every hook of the codec served the run: nothing was handled by a built-in type
    assert all(CALLS[k] > 0 for k in ("encode", "collate", "decode", "score", "trivial")), CALLS

    meta = json.loads((tmp_path / "run" / "export" / "finetune_tasks.json").read_text(encoding="utf-8"))
    assert meta["tasks"]["toy"]["type"] == toy_type
    inp, outp = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"text": "这家店很好"}, ensure_ascii=False) + "\n", encoding="utf-8")
    assert predict_cli.main(["--model", str(tmp_path / "run" / "export"), "--task", "toy", "--input", str(inp),
                             "--output", str(outp), "--no-progress"]) == 0
    pred = json.loads(outp.read_text(encoding="utf-8"))["prediction"]
    assert pred["toy_label"] in meta["tasks"]["toy"]["labels"]


def test_the_registry_refuses_a_second_codec_of_a_type(toy_type):
    with pytest.raises(ValueError, match="already registered"):
        task_types.register(ReversedTextCodec())
    assert task_types.codec_for(toy_type).name == toy_type
    assert {"classification", "regression", "ner", "span", "matching", "generation"} <= set(task_types.task_types())
