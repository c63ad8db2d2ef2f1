"""#32 defect 3: the MLM floor is measured on held-out text, against the baseline that copies the input.

A model on the unigram plateau that copies the unchanged tenth of the predicted tokens scores ~0.14 on its
training batches; the old floor (0.10 over the training log) passed a 1k-step BERT at 0.124."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from skillnet.data_prep.__main__ import main as data_prep_main
from skillnet.experiments.profiles import PROFILES
from skillnet.experiments.runner import Runner, check_floor


def test_sample_corpus_holds_out_every_nth_document(tmp_path: Path) -> None:
    from skillnet.data_prep.sample_corpus import packaged_chinese_docs

    corpus, held = tmp_path / "c.txt", tmp_path / "h.txt"
    assert data_prep_main(["sample-corpus", "--out", str(corpus), "--max-docs", "500", "--held-out", str(held),
                           "--held-out-every", "50"]) == 0
    train = corpus.read_text(encoding="utf-8").splitlines()
    out = held.read_text(encoding="utf-8").splitlines()
    docs = packaged_chinese_docs()[:500]
    assert len(out) == 10 and len(train) == 490
    assert out == docs[49::50] and not set(out) & set(train)
    assert sorted(train + out) == sorted(docs)


class _Guesser(torch.nn.Module):
    """A 'model' with no context: at each position, all its mass on `guess(input_ids)`."""

    def __init__(self, vocab: int, guess: Callable[[torch.Tensor], torch.Tensor]) -> None:
        super().__init__()
        self.config = SimpleNamespace()
        self.vocab, self.guess = vocab, guess

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                token_type_ids: torch.Tensor | None = None) -> SimpleNamespace:
        return SimpleNamespace(prediction_logits=torch.nn.functional.one_hot(self.guess(input_ids), self.vocab).float())


def test_heldout_measures_the_copy_baseline_exactly(default_shards: Path) -> None:
    from skillnet.pretrain.dataset import PretrainingDataset
    from skillnet.pretrain.heldout import heldout_mlm, most_frequent_token

    ds = PretrainingDataset(default_shards, max_seq_len=32)
    top = most_frequent_token(default_shards)
    copy = heldout_mlm(_Guesser(ds.vocab_size, lambda x: x), ds, unigram=top, batch_size=8)
    assert copy["masked"] > 50 and copy["model_acc"] == copy["copy_acc"]
    # BERT's 80/10/10 rule: about a tenth of the predicted tokens are left as they are
    assert 0.03 < copy["copy_acc"] < 0.25
    blind = _Guesser(ds.vocab_size, lambda x: torch.where(x == ds.mask_id, torch.full_like(x, top), x))
    both = heldout_mlm(blind, ds, unigram=top, batch_size=8)
    assert both["model_acc"] == both["baseline_acc"] >= both["copy_acc"]


def _pt_run(run: Path, train_acc: float, heldout: dict | None) -> None:
    run.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"step": i + 1, "mlm/acc": train_acc, "split": "train"}) for i in range(3)]
    (run / "log.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if heldout is not None:
        (run / "heldout_mlm.json").write_text(json.dumps(heldout), encoding="utf-8")


def test_a_bert_that_does_not_beat_copying_on_heldout_text_stops_the_full_profile(tmp_path: Path) -> None:
    r = Runner(tmp_path / "out", PROFILES["full"])
    r.stage = "dense_pt"
    # the 1k-step BERT: 0.124 on its training batches passed the old floor of 0.10
    _pt_run(tmp_path / "pt", 0.124, {"model_acc": 0.125, "copy_acc": 0.10, "baseline_acc": 0.138, "masked": 10000})
    with pytest.raises(RuntimeError, match=r"held-out .*0\.125.*below"):
        check_floor(r, tmp_path / "pt")


def test_the_floor_is_the_heldout_baseline_plus_a_margin(tmp_path: Path) -> None:
    r = Runner(tmp_path / "out", PROFILES["full"])
    r.stage = "sparse_pt"
    # a training log below the old floor does not matter: the held-out text decides
    _pt_run(tmp_path / "pt", 0.05, {"model_acc": 0.21, "copy_acc": 0.10, "baseline_acc": 0.138, "masked": 10000})
    rec = check_floor(r, tmp_path / "pt")
    assert rec["floor_passed"] and rec["floor_value"] == pytest.approx(0.21)
    assert 0.138 + 0.01 <= rec["floor"] <= 0.138 + 0.05
    # fewer masked tokens, a noisier baseline: the margin grows
    _pt_run(tmp_path / "pt2", 0.05, {"model_acc": 0.21, "copy_acc": 0.10, "baseline_acc": 0.138, "masked": 500})
    assert check_floor(r, tmp_path / "pt2")["floor"] > rec["floor"]


def test_a_missing_heldout_measurement_fails_the_floor(tmp_path: Path) -> None:
    r = Runner(tmp_path / "out", PROFILES["full"])
    r.stage = "dense_pt"
    _pt_run(tmp_path / "pt", 0.5, None)
    with pytest.raises(RuntimeError, match="missing"):
        check_floor(r, tmp_path / "pt")


def test_the_report_shows_the_heldout_baseline_beside_the_floor(tmp_path: Path) -> None:
    from skillnet.experiments.report import build
    from skillnet.experiments.stages import PARTS, STAGES

    r = Runner(tmp_path, PROFILES["full"])
    r.stage = "dense_pt"
    _pt_run(tmp_path / "pt", 0.124, {"model_acc": 0.125, "copy_acc": 0.10, "baseline_acc": 0.138, "masked": 10000})
    r.p = PROFILES["quick"]  # records without stopping
    info = check_floor(r, tmp_path / "pt")
    (tmp_path / "stages" / "dense_pt.json").write_text(json.dumps({"seconds": 1.0, "commands": [], "info": info}))
    _, _, names = PARTS["nlu"]
    path, _ = build(tmp_path, PROFILES["full"], [s for s in STAGES if s.name in names], tmp_path / "r.md", "t",
                    PARTS["nlu"][1])
    row = next(line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("| dense_pt | `held"))
    assert "0.125" in row and "0.138 (10,000 masked tokens)" in row and "below the floor" in row
