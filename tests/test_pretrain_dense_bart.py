"""Dense BERT pre-training (`--dense`) and BART denoising pre-training (`--arch bart`), with their exports.

Dense BERT: a plain BertForPreTraining state dict, exported as an HF folder with the same outputs, which
sparse pre-training (--init_from_dense) and fine-tuning (model.init) take. Denoising: BART text infilling
(mask ratio, Poisson(3) spans, one [MASK] per span, [MASK] insertions for empty spans), sentence
permutation, determinism per (seed, epoch, index). BART: 2-rank ZeRO-2 learns, exports as an HF
BartForConditionalGeneration with the same logits, and SkillNet-BART built from the export matches too.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from skillnet.export import hf_folder as export_mod
from skillnet.pretrain import export as export_cmd
from skillnet.pretrain import run as run_mod
from skillnet.pretrain.dataset import PretrainingDataset
from skillnet.pretrain.denoising import DenoisingDataset, infill, poisson_cdf

from tests.fixtures.pretrain.helpers import build_shards, launch, losses_by_step, read_log


@pytest.fixture(scope="module")
def shards(default_shards: Path) -> Path:
    return default_shards


@pytest.fixture(scope="module")
def long_shards(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Documents of 20-40 sentences: windows of 125 tokens, budgets of ~37 masked tokens."""
    return build_shards(tmp_path_factory.mktemp("pt_shards_long"), n_docs=60, seed=1, sentences=(20, 40))


def _common(shards: Path, out: Path, steps: int) -> list[str]:
    return [
        "--shards", str(shards), "--preset", "tiny", "--max_seq_len", "32", "--micro_batch_size", "4",
        "--max_steps", str(steps), "--lr", "5e-3", "--log_every", "1", "--output_dir", str(out),
        "--no_progress", "--no_tensorboard", "--dump_rank_weights",
    ]  # fmt: skip


# ---- denoising samples -----------------------------------------------------------------------------------
def _bodies(batch: dict[str, torch.Tensor]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(encoder inputs, targets) between [CLS] and [SEP]."""
    src = [r[1 : int(a.sum()) - 1] for r, a in zip(batch["input_ids"].numpy(), batch["attention_mask"].numpy())]
    tgt = [r[1 : int((r != -100).sum()) - 1] for r in batch["labels"].numpy()]
    return src, tgt


def test_denoise_masks_the_ratio_in_poisson_spans_and_targets_the_text(long_shards: Path) -> None:
    ds = DenoisingDataset(long_shards, max_seq_len=128, seed=3)
    mlm = PretrainingDataset(long_shards, max_seq_len=128, seed=3)
    idx = list(range(ds.num_samples))
    masked = tokens = 0
    first_draws, inner_draws = [], []
    for epoch in range(4):
        batch = ds.batch(idx, epoch, "denoise")
        assert batch["input_ids"].shape == batch["labels"].shape == (len(idx), 128)
        assert (batch["input_ids"][:, 0] == ds.cls_id).all() and (batch["labels"][:, 0] == ds.cls_id).all()
        src, tgt = _bodies(batch)
        m = mlm.batch(idx, epoch, "mlm")  # the same windows, read by the MLM path: the original text
        orig = torch.where(m["labels"] >= 0, m["labels"], m["input_ids"]).numpy()
        for b, ex in enumerate(ds.examples(idx, epoch)):
            n = len(ex.text)
            assert np.array_equal(tgt[b], orig[b, 1 : 1 + n]) and np.array_equal(ex.text, tgt[b])
            assert np.array_equal(src[b], ex.source)
            starts, lengths = ex.spans[:, 0], ex.spans[:, 1]
            assert (lengths > 0).all() and (starts[1:] > starts[:-1] + lengths[:-1]).all()  # apart
            # One [MASK] per span plus the insertions; the rest is the text without the spans, in order.
            assert (ex.source == ds.mask_id).sum() == len(lengths) + ex.insertions
            kept = np.delete(ex.permuted, [s + k for s, n_ in ex.spans for k in range(n_)])
            assert np.array_equal(ex.source[ex.source != ds.mask_id], kept)
            # The spans are the non-empty draws, in the order drawn; the empty ones are the insertions.
            assert np.array_equal(lengths, ex.drawn[ex.drawn > 0]) and ex.insertions == (ex.drawn == 0).sum()
            masked, tokens = masked + lengths.sum(), tokens + n
            if n >= 60:  # budget >= 18: the first draw is never cut to the budget, so it is Poisson(3)
                first_draws.append(int(ex.drawn[0]))
            inner_draws += ex.drawn[:-1].tolist()
    assert masked / tokens == pytest.approx(0.3, abs=0.005)
    from scipy import stats

    n = len(first_draws)
    counts = np.bincount(first_draws, minlength=9)
    observed = np.append(counts[:8], counts[8:].sum())  # 0..7 and >= 8
    expected = np.append(stats.poisson.pmf(np.arange(8), 3.0), stats.poisson.sf(7, 3.0)) * n
    assert n > 400 and stats.chisquare(observed, expected).pvalue > 1e-3
    assert np.mean(first_draws) == pytest.approx(3.0, abs=0.2)
    # All draws but the cut last one: Poisson(3) minus a small bias (a long span more often ends the row).
    assert 2.75 < np.mean(inner_draws) < 3.1


def test_infill_edge_cases() -> None:
    cdf = poisson_cdf(3.0)
    assert cdf[-1] > 1 - 1e-12 and np.searchsorted(cdf, 0.0, side="right") == 0  # u=0 gives 0 (e^-3)
    x = np.arange(100, 110)
    same, spans, z, drawn = infill(x, 0, np.array([3, 3]), np.zeros(11), np.zeros(8), 1, 8)
    assert np.array_equal(same, x) and len(spans) == z == len(drawn) == 0
    # Empty spans insert a [MASK]; the last span is cut to the budget.
    out, spans, z, drawn = infill(x, 4, np.array([0, 2, 5, 1]), np.linspace(0, 1, 11), np.linspace(1, 0, 12), 1, 12)
    assert drawn.tolist() == [0, 2, 2] and z == 1 and spans[:, 1].tolist() == [2, 2]
    assert (out == 1).sum() == 3 and len(out) == 10 - 4 + 2 + 1
    # Insertions that would overflow max_len are dropped.
    out, _, z, _ = infill(x, 1, np.array([0, 0, 1]), np.zeros(11), np.zeros(12), 1, 10)
    assert z == 0 and len(out) == 10


def test_denoise_is_a_pure_function_of_seed_epoch_index(shards: Path) -> None:
    ds = DenoisingDataset(shards, max_seq_len=32, seed=5)
    a = ds.batch([3, 7, 11], 2, "denoise")
    again = DenoisingDataset(shards, max_seq_len=32, seed=5).batch([3, 7, 11], 2, "denoise")
    alone = ds.batch([11], 2, "denoise")  # any rank can build any sample
    for k in a:
        assert torch.equal(a[k], again[k]) and torch.equal(a[k][2:], alone[k]), k
    other_epoch = ds.batch([3, 7, 11], 3, "denoise")
    other_seed = DenoisingDataset(shards, max_seq_len=32, seed=6).batch([3, 7, 11], 2, "denoise")
    assert torch.equal(a["labels"], other_epoch["labels"]) and torch.equal(a["labels"], other_seed["labels"])
    assert not torch.equal(a["input_ids"], other_epoch["input_ids"])
    assert not torch.equal(a["input_ids"], other_seed["input_ids"])
    with pytest.raises(ValueError, match="denoise"):
        ds.batch([0], 0, "mlm")


def _sentences(tokens: np.ndarray, end_id: int) -> list[tuple[int, ...]]:
    cuts = np.flatnonzero(tokens == end_id) + 1
    return [tuple(p) for p in np.split(tokens, cuts) if len(p)]


def test_sentence_permutation_keeps_the_sentences(shards: Path) -> None:
    from skillnet.data_prep.tokenizer import load_tokenizer

    end_id = load_tokenizer().token_ids(["。"])[0]
    # Windows of 125 tokens hold whole documents here, so every piece is a whole sentence ending in 。.
    ds = DenoisingDataset(shards, max_seq_len=128, seed=0, mask_ratio=0.0, permute_sentences=True)
    idx = list(range(min(200, ds.num_samples)))
    src, tgt = _bodies(ds.batch(idx, 0, "denoise"))
    moved = 0
    for s, t in zip(src, tgt):
        assert t[-1] == end_id and Counter(_sentences(s, end_id)) == Counter(_sentences(t, end_id))
        moved += not np.array_equal(s, t)
    n_multi = sum(len(_sentences(t, end_id)) > 1 for t in tgt)
    assert moved > 0.5 * n_multi  # most documents of several sentences come out in another order
    # Off: the encoder sees the text in order.
    plain = DenoisingDataset(shards, max_seq_len=128, seed=0, mask_ratio=0.0)
    src, tgt = _bodies(plain.batch(idx, 0, "denoise"))
    assert all(np.array_equal(s, t) for s, t in zip(src, tgt))


def test_bad_mode_settings_end_with_one_error_line(
    shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["--output_dir", str(tmp_path / "o"), "--no_progress", "--dry_run"]
    cases = [
        (["--arch", "bart", "--synthetic", "64"], "--arch bart needs --shards"),
        (["--shards", str(shards), "--objectives", "denoise"], "--arch bert trains mlm, nsp"),
        (["--shards", str(shards), "--permute_sentences"], "options of the denoise objective"),
        (["--shards", str(shards), "--objective_weights", "1"], "1 weights for 2 objectives"),
        (["--arch", "bart", "--shards", str(shards), "--preset", "huge"], "valid presets: tiny, small, base, large"),
        (["--arch", "bart", "--shards", str(shards), "--recipe", "paper"], "BERT recipe"),
    ]
    for argv, message in cases:
        assert run_mod.main([*argv, *out]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.startswith("error: ") and "Traceback" not in err, (argv, err)


def test_help_and_start_log_name_the_modes(shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = run_mod.build_parser().format_help()
    for flag in ("--arch", "--dense", "--objectives", "--mask-ratio", "--poisson-lambda", "--permute-sentences"):
        assert flag in text, flag
    assert "(default 0.3, as BART)" in " ".join(text.split())
    with pytest.raises(SystemExit):
        export_cmd.main(["--help"])
    assert "--dense" in capsys.readouterr().out
    argv = ["--arch", "bart", "--shards", str(shards), "--output_dir", str(tmp_path), "--dry_run"]
    assert run_mod.main(argv) == 0
    mode = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("mode "))
    assert "dense BART" in mode and "sentence permutation off" in mode
    assert run_mod.main(["--synthetic", "64", "--output_dir", str(tmp_path), "--dry_run"]) == 0
    mode = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("mode "))
    assert "SkillNet-BERT" in mode and "objectives mlm + nsp [default], one drawn per step" in mode


# ---- dense BERT -------------------------------------------------------------------------------------------
def test_dense_bert_exports_a_plain_bert_for_sparse_pretraining_and_finetuning(
    shards: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining, skill_parameters
    from transformers import AutoTokenizer, BertForPreTraining

    run = tmp_path / "dense"
    assert run_mod.main([*_common(shards, run, 4), "--dense", "--objectives", "mlm"]) == 0
    stdout = capsys.readouterr().out
    mode = next(x for x in stdout.splitlines() if x.strip().startswith("mode "))
    assert "dense BERT" in mode and "objectives mlm [flag]" in mode
    recs = read_log(run)
    assert len(recs) == 4 and all("mlm/loss" in r and "nsp/loss" not in r for r in recs)
    assert not any(k.startswith("skill_grad_norm") for r in recs for k in r)

    hf_dir = export_mod.export(run, tmp_path / "hf")  # dense, read from the checkpoint's config
    assert json.loads((hf_dir / "config.json").read_text())["model_type"] == "bert"
    assert json.loads((hf_dir / "export_info.json").read_text())["kind"] == "dense-bert"
    hf = BertForPreTraining.from_pretrained(str(hf_dir)).eval()
    trained_state = load_file(str(run / "rank0_weights.safetensors"))
    assert set(trained_state) == set(hf.state_dict())  # a plain BERT state dict, name for name
    cfg = SkillNetBertConfig.from_json_file(str(run / "checkpoints" / "step_00000004" / "model_config.json"))
    trained = SkillNetBertForPreTraining(cfg)
    trained.load_state_dict(trained_state)
    trained.eval()
    data = PretrainingDataset(shards, max_seq_len=32)
    mlm, nsp = data.batch([0, 5, 9, 11], 0, "mlm"), data.batch([1, 2, 3], 0, "nsp")
    with torch.no_grad():
        ours_mlm, ours_nsp = trained(task="mlm", **mlm), trained(task="nsp", **nsp)
        keys = ("input_ids", "attention_mask", "token_type_ids")
        theirs_mlm = hf(**{k: mlm[k] for k in keys}).prediction_logits[mlm["labels"] != -100]
        theirs_nsp = hf(**{k: nsp[k] for k in keys}).seq_relationship_logits
    torch.testing.assert_close(theirs_mlm, ours_mlm.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(theirs_nsp, ours_nsp.logits, rtol=1e-5, atol=1e-5)
    tok = AutoTokenizer.from_pretrained(str(hf_dir))  # the shards' vocab travels with the weights
    assert tok.convert_tokens_to_ids("[MASK]") == data.mask_id and (hf_dir / "vocab.txt").is_file()

    # --init_from_dense of sparse pre-training: s1, s2, s3, s7 start as the exported FFN; it trains.
    args = run_mod.build_parser().parse_args(["--shards", str(shards), "--init_from_dense", str(hf_dir)])
    sparse = run_mod.build_model(args, vocab_size=data.vocab_size)
    ffn = hf.bert.encoder.layer[0].intermediate.dense.weight
    firsts = {name: params[0] for name, params in skill_parameters(sparse).items()}
    for name in ("s1", "s2", "s3", "s7"):
        assert torch.equal(firsts[name].detach(), ffn), name
    assert torch.equal(sparse.bert.embeddings.word_embeddings.weight, hf.bert.embeddings.word_embeddings.weight)
    sparse_run = tmp_path / "sparse"
    assert run_mod.main([*_common(shards, sparse_run, 2), "--init_from_dense", str(hf_dir)]) == 0
    assert sorted(losses_by_step(sparse_run)) == [1, 2]
    # model.init of fine-tuning: a dense HF BERT becomes SkillNet-BERT with every skill a copy of its FFN.
    from skillnet.model.spec import model_family

    bert = model_family("bert")
    mt = bert.load("from_dense")(str(hf_dir), model_class=bert.load("task_model"))
    assert torch.equal(mt.bert.skill_modules("s4")[0].intermediate.dense.weight, ffn)
    with pytest.raises(ValueError, match="not pre-trained with pretrain/run.py --dense"):
        export_mod.export(sparse_run, tmp_path / "hf_sparse", dense=True)


# ---- BART -------------------------------------------------------------------------------------------------
@pytest.mark.slow
def test_bart_denoising_under_zero2_learns_and_exports_a_plain_bart(shards: Path, tmp_path: Path) -> None:
    from skillnet.model import (
        SkillNetBartConfig,
        SkillNetBartForConditionalGeneration,
        skillnet_bart_from_dense,
    )
    from transformers import BartForConditionalGeneration

    run = tmp_path / "bart"
    args = ["--ds_config", "ds_configs/cpu_fp32.json", "--arch", "bart", "--permute_sentences"]
    r = launch("pretrain/run.py", [*args, *_common(shards, run, 16)])
    mode = next(x for x in r.stdout.splitlines() if x.strip().startswith("mode "))
    assert "dense BART" in mode and "mask_ratio 0.3" in mode and "Poisson(3.0)" in mode and "permutation on" in mode
    recs = read_log(run)
    losses = [rec["denoise/loss"] for rec in recs]
    assert len(losses) == 16 and np.mean(losses[-3:]) < np.mean(losses[:3]) - 1.0, losses
    w0, w1 = (load_file(str(run / f"rank{i}_weights.safetensors")) for i in (0, 1))
    assert all(torch.equal(w0[k], w1[k]) for k in w0)  # ZeRO-2 replicas agree

    hf_dir = export_mod.export(run, tmp_path / "hf")  # merges the ZeRO-2 partitions; arch from the config
    hf_cfg = json.loads((hf_dir / "config.json").read_text())
    assert hf_cfg["model_type"] == "bart" and hf_cfg["decoder_start_token_id"] == 102
    hf = BartForConditionalGeneration.from_pretrained(str(hf_dir)).eval()
    cfg = SkillNetBartConfig.from_json_file(str(run / "checkpoints" / "step_00000016" / "model_config.json"))
    trained = SkillNetBartForConditionalGeneration(cfg)
    trained.load_state_dict(w0)
    trained.eval()
    batch = DenoisingDataset(shards, max_seq_len=32).batch([0, 4, 8], 0, "denoise")
    with torch.no_grad():
        ours = trained(task="denoise", **batch)
        theirs = hf(**batch)
        skill = skillnet_bart_from_dense(str(hf_dir)).eval()  # what generation fine-tuning starts from
        converted = skill(task="text_summarization", **batch)
    torch.testing.assert_close(theirs.logits, ours.logits, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(converted.logits, ours.logits, rtol=1e-5, atol=1e-5)
    assert float(theirs.loss) == pytest.approx(float(ours.loss), rel=1e-5)
    assert (hf_dir / "vocab.txt").is_file()
