"""#32: a fine-tuning run records each task's max_seq_len and how many dev/test examples it cut, and the
reproduction report states both per task."""

from __future__ import annotations

import json
from pathlib import Path

from skillnet.data_prep.tasks.lengths import record_lengths
from skillnet.data_prep.tokenizer import load_tokenizer
from skillnet.finetune import run as run_cli

FIX = Path(__file__).resolve().parent / "fixtures" / "finetune"


def test_results_record_the_length_and_the_cut_examples(tmp_path: Path) -> None:
    task = {"name": "sent", "type": "classification", "skills": ["s1", "s7"], "max_seq_len": 8,
            **{split: str(FIX / f"sent_{split}.jsonl") for split in ("train", "dev", "test")}}
    cfg = {"tasks": [task], "output_dir": str(tmp_path / "run"),
           "train": {"max_steps": 2, "batch_size": 4, "eval_batch_size": 8, "lr": 1e-3, "eval_every": 2,
                     "log_every": 2, "seed": 0, "warmup_ratio": 0.0, "lexical_baselines": False}}
    (tmp_path / "c.json").write_text(json.dumps(cfg), encoding="utf-8")
    assert run_cli.main(["--config", str(tmp_path / "c.json"), "--no-tensorboard", "--no-progress"]) == 0
    res = json.loads((tmp_path / "run" / "results.json").read_text(encoding="utf-8"))["tasks"]["sent"]
    tok = load_tokenizer()
    for split in ("dev", "test"):
        recs = [json.loads(line) for line in (FIX / f"sent_{split}.jsonl").read_text(encoding="utf-8").splitlines()]
        longer = sum(n > 8 for n in record_lengths("single", recs, tok))
        assert res[f"{split}_truncated"] == longer
    assert res["max_seq_len"] == 8 and res["test_truncated"] > 0


def test_the_report_states_each_tasks_length_and_cut_share(tmp_path: Path) -> None:
    from skillnet.experiments.report_nlu import baselines
    from skillnet.finetune.document import Document

    run_dir = tmp_path / "nlu_main"
    tasks = {"sentiment": {"metric": "accuracy", "trivial_test": {"accuracy": 50.0}, "test_examples": 1000,
                           "max_seq_len": 128, "test_truncated": 150},
             "domain": {"metric": "accuracy", "trivial_test": {"accuracy": 20.0}, "test_examples": 1000,
                        "max_seq_len": 24, "test_truncated": 3}}
    (run_dir / "skillnet" / "seed0").mkdir(parents=True)
    (run_dir / "skillnet" / "seed0" / "results.json").write_text(json.dumps({"tasks": tasks}), encoding="utf-8")
    nlu = {"tasks": ["sentiment", "domain"],
           "methods": {"skillnet": {"tasks": {"sentiment": {"mean": 70.0}, "domain": {"mean": 90.0}}}}}
    doc, findings = Document(), []
    baselines(doc, nlu, run_dir, findings)
    md = doc.markdown()
    row = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in md.splitlines()
           if line.startswith("|")}
    assert row["max_seq_len"] == ["128", "24"]
    assert row["test examples cut"] == ["15.0%", "0.3%"]
    cut = [f for f in findings if "cut" in f.lower()]
    assert len(cut) == 1 and "sentiment" in cut[0] and "15.0%" in cut[0] and "domain" not in cut[0]
