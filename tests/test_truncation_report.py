"""#32: a fine-tuning run records each task's max_seq_len and how many dev/test examples it cut, and the
reproduction report states both per task."""

from __future__ import annotations

import json
import random
from pathlib import Path

from skillnet.data_prep.tasks.lengths import record_lengths
from skillnet.data_prep.tokenizer import load_tokenizer
from skillnet.finetune.cli import main as finetune_main
from skillnet.finetune.task_types.base import cut_texts, pair, piece_ids

FIX = Path(__file__).resolve().parent / "fixtures" / "finetune"


def _results_of_one_task(tmp_path: Path, task: dict, fixture: str, steps: int, batch: int, lexical: bool) -> dict:
    """Fine-tune `task` on the fixture files `fixture`_{train,dev,test}.jsonl for `steps`; its results.json entry."""
    task = {**task, **{split: str(FIX / f"{fixture}_{split}.jsonl") for split in ("train", "dev", "test")}}
    cfg = {"tasks": [task], "output_dir": str(tmp_path / "run"),
           "train": {"max_steps": steps, "batch_size": batch, "eval_batch_size": 8, "lr": 1e-3, "eval_every": steps,
                     "log_every": steps, "seed": 0, "warmup_ratio": 0.0, "lexical_baselines": lexical}}
    (tmp_path / "c.json").write_text(json.dumps(cfg), encoding="utf-8")
    assert finetune_main(["--config", str(tmp_path / "c.json"), "--no-tensorboard", "--no-progress"]) == 0
    return json.loads((tmp_path / "run" / "results.json").read_text(encoding="utf-8"))["tasks"][task["name"]]


def test_results_record_the_length_and_the_cut_examples(tmp_path: Path) -> None:
    res = _results_of_one_task(tmp_path, {"name": "sent", "type": "classification", "skills": ["s1", "s7"],
                                          "max_seq_len": 8}, "sent", steps=2, batch=4, lexical=False)
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


def test_cut_texts_keep_the_pieces_the_model_reads() -> None:
    """The lexical baseline on cut inputs reads what ``pair`` keeps: the longest-first cut, back in characters."""
    tok = load_tokenizer()
    a, b = "保险公司的年金什么时候可以领取2024年", "年金一般在退休后按月领取，具体时间以合同约定为准。" * 3
    for L in (6, 12, 20, 40, 200):
        for x, y in ((a, b), (b, a), (a, None)):
            want = pair(tok, *piece_ids(tok, [x]), piece_ids(tok, [y])[0] if y is not None else None, L)
            cx, cy = cut_texts(tok, x, y, L)
            got = pair(tok, *piece_ids(tok, [cx]), piece_ids(tok, [cy])[0] if cy is not None else None, 10_000)
            assert got.input_ids == want.input_ids, (L, cx, cy)
            assert x.startswith(cx) and (y is None or y.startswith(cy))
            assert (cx, cy) == (x, y) or want.extra["truncated"]


def test_a_cut_task_records_the_lexical_baseline_on_what_the_model_reads(tmp_path: Path) -> None:
    """Where max_seq_len cuts test examples, results.json also holds the TF-IDF baseline fit and scored on the
    cut texts, and the report sets it beside the whole-text baseline."""
    from skillnet.experiments.report_nlu import baselines
    from skillnet.finetune.document import Document

    res = _results_of_one_task(tmp_path, {"name": "match", "type": "matching", "skills": ["s1", "s7"],
                                          "max_seq_len": 12, "num_negatives": 2}, "match", steps=1, batch=2,
                               lexical=True)
    assert res["test_truncated"] > 0
    whole, cut = res["lexical_test"]["top1_accuracy"], res["lexical_cut_test"]["top1_accuracy"]
    assert 0.0 <= cut <= 100.0 and "top1_accuracy" in res["lexical_cut_test"]

    run_dir = tmp_path / "nlu_main" / "skillnet" / "seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "results.json").write_text(json.dumps({"tasks": {"match": res}}), encoding="utf-8")
    nlu = {"tasks": ["match"], "methods": {"skillnet": {"tasks": {"match": {"mean": 40.0}}}}}
    doc, findings = Document(), []
    baselines(doc, nlu, tmp_path / "nlu_main", findings)
    row = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in doc.markdown().splitlines()
           if line.startswith("|")}
    assert row["TF-IDF"] == [f"{whole:.1f}"] and row["TF-IDF, cut"] == [f"{cut:.1f}"]
    assert any(f"TF-IDF scores {whole:.1f} on the whole examples and {cut:.1f}" in f for f in findings)


def test_a_pair_is_cut_as_the_fast_tokenizer_cuts_it() -> None:
    """A plain export's tokenizer cuts a pair with truncation=True (the Rust tokenizers' longest-first): the
    project must keep the same pieces, or the exported model reads other tokens than the one it was trained as.
    Where both texts exceed half the budget the two differed by one piece (the odd one went to `a` here)."""
    from skillnet.finetune.task_types.base import kept_lengths
    from tokenizers import Tokenizer

    hf = Tokenizer.from_str(load_tokenizer().backend.to_str())
    rng = random.Random(0)
    for _ in range(500):
        L, na, nb = rng.randint(8, 140), rng.randint(0, 160), rng.randint(1, 160)
        hf.enable_truncation(max_length=L, strategy="longest_first")
        enc = hf.encode("我" * na, "你" * nb)
        ka = enc.type_ids.count(0) - 2 if enc.type_ids else 0  # [CLS] a [SEP] carry type 0
        kb = enc.type_ids.count(1) - 1  # b [SEP]
        assert kept_lengths(na, nb, L) == (ka, kb), (L, na, nb)
