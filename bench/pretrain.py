"""Pre-training step speed: SkillNet-BERT vs HF BertForPreTraining at equal activated FLOPs, and MFU.

For each objective the dense baseline is an HF ``BertForPreTraining`` whose FFN width equals the
activated skill width (MLM: 2 skills -> 2 x intermediate; NSP: 3 skills -> 3 x intermediate), so both
do the same matmul FLOPs. Both run the same head work: SkillNet computes MLM logits only at masked
positions, so the HF model's own ``cls.predictions`` is applied at the same positions (its ``forward``
would project every token onto the vocabulary). A step = forward + backward + optimizer step
(SkillNet: MaskedAdamW as shipped; dense: torch AdamW), CPU fp32, models interleaved so machine load
hits them alike. ``skillnet_over_dense`` = dense time / SkillNet time for the 50/50 MLM/NSP mix (> 1
means SkillNet is faster): the median of the per-repetition ratios, with ``_min``/``_max``. ``mfu`` =
SkillNet's achieved matmul FLOP/s in its fastest repetition over the measured fp32 matmul peak of this
machine (``matmul_peak_gflops``: best of a 2048^3 ``torch.mm`` sampled between repetitions, so MFU
compares best step against best matmul under the same load).

    python bench/pretrain.py                    # table
    python bench/pretrain.py --json             # table, then one JSON line (last line)
    python bench/pretrain.py --write            # also rewrite its section of docs/pretrain.md
    python bench/pretrain.py --preset base --seq 512 --batch 8
    python bench/pretrain.py --device cuda --dtype bf16 --preset base --seq 512 --batch 32 --json   # GPU

On a GPU (``--device cuda``, ``--dtype fp16|bf16`` under autocast) the steps are timed between device
synchronisations, the dense model steps with torch's fused AdamW, the peak is a bf16/fp16 8192^3 matmul and
``mfu_datasheet`` compares against the card's datasheet dense peak (``datasheet_tflops``). ``--split``
(default on a GPU) also times the model step alone (forward + backward: ``model_step_over_dense``,
``dense_step_tokens_per_s``) and the optimizer step alone after each objective's backward
(``optimizer_ms``: MaskedAdamW as the trainer builds it, and torch's fused AdamW on the same gradients;
``masked_over_fused_mlm``/``_nsp``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import contextlib  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from skillnet.experiments.benchdoc import (  # noqa: E402
    encoder_step_flops,
    machine_line,
    md_table,
    paired_ratio,
    write_section,
)
from skillnet.model import PRESETS, SkillNetBertConfig, SkillNetBertForPreTraining  # noqa: E402
from skillnet.training.optim import MaskedAdamW, build_param_groups  # noqa: E402
from transformers import BertConfig, BertForPreTraining  # noqa: E402

DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
# Dense (no sparsity) tensor-core peaks from the vendors' datasheets, TFLOP/s, for fp16/bf16 (V100: fp16).
DATASHEET_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0, "V100": 125.0, "L40S": 362.1, "A10": 125.0}


def datasheet_tflops(device: str, dtype: str) -> float | None:
    if not device.startswith("cuda") or dtype == "fp32":
        return None
    name = torch.cuda.get_device_name(0)
    return next((v for k, v in DATASHEET_TFLOPS.items() if k in name), None)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_peak_gflops(n: int = 2048, reps: int = 5, device: str = "cpu", dtype: torch.dtype | None = None) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype or torch.float32)
    b = torch.randn(n, n, device=device, dtype=dtype or torch.float32)
    torch.mm(a, b)
    best = float("inf")
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def make_batch(objective: str, B: int, T: int, V: int, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(104, V, (B, T), generator=g)
    batch = {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "token_type_ids": torch.zeros_like(ids),
    }
    batch["token_type_ids"][:, T // 2 :] = 1
    if objective == "mlm":
        pick = torch.rand(B, T, generator=g) < 0.15
        batch["labels"] = torch.where(pick, ids, torch.full_like(ids, -100))
    else:
        batch["next_sentence_label"] = torch.randint(0, 2, (B,), generator=g)
    return batch


def dense_loss(model: BertForPreTraining, objective: str, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    out = model.bert(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        token_type_ids=batch["token_type_ids"],
    )
    if objective == "mlm":
        labels = batch["labels"]
        sel = labels.ne(-100)
        logits = model.cls.predictions(out.last_hidden_state[sel])
        return F.cross_entropy(logits, labels[sel])
    return F.cross_entropy(model.cls.seq_relationship(out.pooler_output), batch["next_sentence_label"])


def step_flops(H: int, L: int, V: int, W: int, B: int, T: int, objective: str, masked: int) -> float:
    """Matmul FLOPs of forward + backward (3 x forward) for one step of B full rows; W = activated FFN width."""
    return encoder_step_flops(H, L, V, W, B * T, B * T * T, objective, masked, B)


DOC = "docs/pretrain.md"


def optimizer_split(skill: torch.nn.Module, s_opt: MaskedAdamW, dense: dict[str, torch.nn.Module],
                    batches: dict[str, dict[str, torch.Tensor]], autocast: Any, dev: str, reps: int) -> dict[str, Any]:
    """The optimizer step alone after one backward of each objective: MaskedAdamW (as shipped) and torch's
    fused AdamW (CUDA; plain AdamW on a CPU) stepping the same SkillNet gradients, interleaved."""
    fused = {"fused": True} if dev.startswith("cuda") else {}
    ref = torch.optim.AdamW([p for p in skill.parameters() if p.requires_grad], lr=1e-4, weight_decay=0.01, **fused)
    out: dict[str, list[float]] = {}
    for o in ("mlm", "nsp"):
        s_opt.zero_grad(set_to_none=True)
        with autocast():
            loss = skill(task=o, **batches[o]).loss
        loss.backward()
        grads = {p: p.grad.clone() for p in skill.parameters() if p.grad is not None}
        for rep in range(reps + 2):
            for name, opt in (("masked", s_opt), ("fused", ref)):
                for p in skill.parameters():
                    p.grad = grads.get(p)
                sync(dev)
                t0 = time.perf_counter()
                opt.step()
                sync(dev)
                if rep >= 2:
                    out.setdefault(f"{name}_{o}", []).append(time.perf_counter() - t0)
    ms = {k: min(v) * 1e3 for k, v in out.items()}
    del ref
    return {"optimizer_ms": {k: round(v, 3) for k, v in ms.items()},
            "masked_over_fused_mlm": round(ms["masked_mlm"] / ms["fused_mlm"], 3),
            "masked_over_fused_nsp": round(ms["masked_nsp"] / ms["fused_nsp"], 3)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="small", choices=sorted(PRESETS), help="model size (default: %(default)s)")
    p.add_argument("--seq", type=int, default=128, help="sequence length (default: %(default)s)")
    p.add_argument("--batch", type=int, default=16, help="batch size (default: %(default)s)")
    p.add_argument(
        "--reps", type=int, default=8,
        help="timed steps per model and objective, interleaved, after 2 warm-up (default: %(default)s)"
    )
    p.add_argument(
        "--peak_size", type=int, default=2048,
        help="side of the square matmul that measures the peak (default: %(default)s)"
    )
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES),
                   help="fp32, or fp16/bf16 under autocast (GPU) (default: %(default)s)")
    p.add_argument("--split", action=argparse.BooleanOptionalAction, default=None,
                   help="also time the model step alone and the optimizer step alone (default: on a GPU)")
    p.add_argument("--write", nargs="?", const=DOC, metavar="MD",
                   help=f"rewrite the 'pretrain' section of this Markdown file (default: {DOC})")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = p.parse_args(argv)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    dev, amp = args.device, DTYPES[args.dtype]
    if dev.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available")
    split = args.split if args.split is not None else dev.startswith("cuda")
    if dev.startswith("cuda") and args.peak_size == 2048:
        args.peak_size = 8192  # a 2048^3 product does not fill a data-centre GPU
    torch.manual_seed(0)
    pre = PRESETS[args.preset]
    H, L, F_skill, V = (
        pre["hidden_size"],
        pre["num_hidden_layers"],
        pre["intermediate_size"],
        pre["vocab_size"],
    )
    B, T = args.batch, args.seq

    cfg = SkillNetBertConfig.preset(args.preset, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    skill = SkillNetBertForPreTraining(cfg).to(dev)
    s_opt = MaskedAdamW(build_param_groups(skill, 0.01), lr=1e-4)
    k = {o: len(cfg.task_skill_names(o)) for o in ("mlm", "nsp")}
    dense, d_opt = {}, {}
    for o in ("mlm", "nsp"):
        dc = BertConfig(
            vocab_size=V,
            hidden_size=H,
            num_hidden_layers=L,
            num_attention_heads=pre["num_attention_heads"],
            intermediate_size=k[o] * F_skill,
            max_position_embeddings=pre["max_position_embeddings"],
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        dense[o] = BertForPreTraining(dc).to(dev)
        fused = {"fused": True} if dev.startswith("cuda") else {}
        d_opt[o] = torch.optim.AdamW(dense[o].parameters(), lr=1e-4, weight_decay=0.01, **fused)
    batches = {o: {k_: v.to(dev) for k_, v in make_batch(o, B, T, V, seed=1).items()} for o in ("mlm", "nsp")}
    masked = int(batches["mlm"]["labels"].ne(-100).sum())

    def autocast() -> contextlib.AbstractContextManager:
        return torch.autocast(dev.split(":")[0], dtype=amp) if amp is not None else contextlib.nullcontext()

    def run_skill(o: str, with_opt: bool = True) -> float:
        sync(dev)
        t0 = time.perf_counter()
        s_opt.zero_grad(set_to_none=True)
        with autocast():
            loss = skill(task=o, **batches[o]).loss
        loss.backward()
        if with_opt:
            s_opt.step()
        sync(dev)
        return time.perf_counter() - t0

    def run_dense(o: str, with_opt: bool = True) -> float:
        sync(dev)
        t0 = time.perf_counter()
        d_opt[o].zero_grad(set_to_none=True)
        with autocast():
            loss = dense_loss(dense[o], o, batches[o])
        loss.backward()
        if with_opt:
            d_opt[o].step()
        sync(dev)
        return time.perf_counter() - t0

    times: dict[tuple[str, str], list[float]] = {}
    peaks: list[float] = []
    for rep in range(args.reps + 2):
        # The peak is sampled between repetitions too, so it sees the same machine load as the steps.
        peaks.append(matmul_peak_gflops(args.peak_size, reps=1, device=dev, dtype=amp))
        for o in ("mlm", "nsp"):
            for name, fn in (("skillnet", run_skill), ("dense", run_dense)):
                dt = fn(o)
                if rep >= 2:
                    times.setdefault((name, o), []).append(dt)
                if split and rep >= 2:
                    times.setdefault((name + "_model", o), []).append(fn(o, with_opt=False))
    # min over repetitions: the least-disturbed time (shared machines); the median is printed too.
    med = {key: min(v) for key, v in times.items()}
    median = {key: statistics.median(v) for key, v in times.items()}
    peak = max([*peaks, matmul_peak_gflops(args.peak_size, device=dev, dtype=amp)])

    rows = []
    for o in ("mlm", "nsp"):
        fl = step_flops(H, L, V, k[o] * F_skill, B, T, o, masked)
        for name in ("skillnet", "dense"):
            t = med[(name, o)]
            rows.append((name, o, k[o] * F_skill, B * T / t, fl / t / 1e9, t * 1e3, median[(name, o)] * 1e3))
    t_skill = med[("skillnet", "mlm")] + med[("skillnet", "nsp")]
    t_dense = med[("dense", "mlm")] + med[("dense", "nsp")]
    flops_mix = step_flops(H, L, V, k["mlm"] * F_skill, B, T, "mlm", masked) + step_flops(
        H, L, V, k["nsp"] * F_skill, B, T, "nsp", masked
    )
    skill_gflops = flops_mix / t_skill / 1e9
    dense_gflops = flops_mix / t_dense / 1e9
    paired = paired_ratio(
        [a + b for a, b in zip(times[("dense", "mlm")], times[("dense", "nsp")])],
        [a + b for a, b in zip(times[("skillnet", "mlm")], times[("skillnet", "nsp")])],
        "skillnet_over_dense",
    )
    result: dict[str, Any] = {
        **paired,
        "mfu": round(skill_gflops / peak, 4),
        "mfu_dense": round(dense_gflops / peak, 4),
        "matmul_peak_gflops": round(peak, 1),
        "skillnet_tokens_per_s": round(2 * B * T / t_skill, 1),
        "dense_tokens_per_s": round(2 * B * T / t_dense, 1),
        "preset": args.preset,
        "batch": B,
        "seq": T,
        "threads": torch.get_num_threads(),
        "device": torch.cuda.get_device_name(0) if dev.startswith("cuda") else "cpu",
        "dtype": args.dtype,
    }
    sheet = datasheet_tflops(dev, args.dtype)
    if sheet:
        result["datasheet_tflops"] = sheet
        result["mfu_datasheet"] = round(skill_gflops / (sheet * 1e3), 4)
        result["mfu_dense_datasheet"] = round(dense_gflops / (sheet * 1e3), 4)
    if split:
        tm_skill = med[("skillnet_model", "mlm")] + med[("skillnet_model", "nsp")]
        tm_dense = med[("dense_model", "mlm")] + med[("dense_model", "nsp")]
        result.update(paired_ratio(
            [a + b for a, b in zip(times[("dense_model", "mlm")], times[("dense_model", "nsp")])],
            [a + b for a, b in zip(times[("skillnet_model", "mlm")], times[("skillnet_model", "nsp")])],
            "model_step_over_dense",
        ))
        result["skillnet_step_tokens_per_s"] = round(2 * B * T / tm_skill, 1)
        result["dense_step_tokens_per_s"] = round(2 * B * T / tm_dense, 1)
        result.update(optimizer_split(skill, s_opt, dense, batches, autocast, dev, args.reps))
    where = f"{result['device']} {args.dtype}" if dev != "cpu" else "CPU fp32"
    print(
        f"pre-training step (fwd+bwd+optimizer), preset={args.preset} (H={H}, L={L}, skill FFN={F_skill}, V={V}), "
        f"batch {B} x seq {T}, {where}, {torch.get_num_threads()} threads, best and median of {args.reps}"
    )
    print(
        f"{'model':<10}{'objective':<11}{'FFN width':>10}{'tokens/s':>12}{'GFLOP/s':>10}{'ms/step':>10}{'median ms':>11}"
    )
    for name, o, w, tps, gf, ms, med_ms in rows:
        print(f"{name:<10}{o:<11}{w:>10}{tps:>12.0f}{gf:>10.1f}{ms:>10.1f}{med_ms:>11.1f}")
    print(
        f"50/50 mix: SkillNet {result['skillnet_tokens_per_s']:.0f} tok/s vs dense {result['dense_tokens_per_s']:.0f} "
        f"tok/s (fastest repetitions); skillnet_over_dense = {result['skillnet_over_dense']:.3f} "
        f"(median of per-repetition ratios, {paired['skillnet_over_dense_min']:.3f}-"
        f"{paired['skillnet_over_dense_max']:.3f}; target >= 0.9)"
    )
    print(
        f"matmul peak {peak:.1f} GFLOP/s; MFU SkillNet {result['mfu']:.3f}, dense {result['mfu_dense']:.3f}"
        + (f"; against the datasheet's {sheet:.0f} TFLOP/s: SkillNet {result['mfu_datasheet']:.3f}, dense "
           f"{result['mfu_dense_datasheet']:.3f}" if sheet else "")
    )
    if split:
        print(f"model step alone (fwd+bwd): SkillNet {result['skillnet_step_tokens_per_s']:.0f} tok/s, dense "
              f"{result['dense_step_tokens_per_s']:.0f} tok/s, model_step_over_dense {result['model_step_over_dense']:.3f}")
        print("optimizer step alone (ms): " + ", ".join(f"{k_} {v:.2f}" for k_, v in result["optimizer_ms"].items())
              + f"; masked/fused: MLM {result['masked_over_fused_mlm']:.2f}, NSP {result['masked_over_fused_nsp']:.2f}")
    if args.write:
        body = "\n\n".join([
            f"`python bench/pretrain.py --preset {args.preset} --seq {T} --batch {B} --reps {args.reps} --write` "
            f"(preset `{args.preset}`: H {H}, {L} layers, skill FFN {F_skill}, vocab {V:,}; forward + backward + "
            f"optimizer step; dense = HF `BertForPreTraining` with the activated FFN width). {machine_line()}",
            md_table(["model", "objective", "FFN width", "tokens/s (best)", "GFLOP/s", "ms/step (best)",
                      "ms/step (median)"],
                     [(n, o, w, f"{tps:,.0f}", f"{gf:.1f}", f"{ms:.1f}", f"{mm:.1f}")
                      for n, o, w, tps, gf, ms, mm in rows]),
            md_table(["figure (JSON key)", "measured", "target"], [
                ("`skillnet_over_dense` (dense time / SkillNet time, 50/50 mix; median, min-max of "
                 f"{args.reps} paired repetitions)",
                 f"**{paired['skillnet_over_dense']:.3f}** ({paired['skillnet_over_dense_min']:.3f}-"
                 f"{paired['skillnet_over_dense_max']:.3f})", ">= 0.9"),
                ("`mfu` (SkillNet, fastest repetition, over `matmul_peak_gflops`)",
                 f"**{result['mfu']:.3f}** (dense {result['mfu_dense']:.3f}; peak {peak:.1f} GFLOP/s)", ""),
            ]),
        ])
        write_section(args.write, "pretrain", body)
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
