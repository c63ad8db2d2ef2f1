"""Projected wall time of the paper's pre-training recipe on GPUs, from FLOPs counted on the real model.

FLOPs per token are counted by torch's FlopCounterMode on a forward+backward of SkillNet-BERT-base
(preset ``base``) for one MLM step (skills s2, s7) and one NSP step (s1, s3, s7) at sequence length
512, on the CPU with a small batch (FLOPs per token do not depend on the batch). The projection then
assumes a peak throughput and a model FLOPs utilisation (MFU); every assumption is printed and written.

    python bench/projection.py                      # table
    python bench/projection.py --write docs/gpu.md  # also the doc section (written by this script)
    python bench/projection.py --json               # one JSON object as the last line
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# §B of skillnet-nlu.md: 100k steps, global batch 10,240 sequences of 512 tokens, 32 V100.
RECIPE = {"steps": 100_000, "batch": 10_240, "seq": 512, "gpus": 32}
# Dense fp16/bf16 tensor-core peaks (vendor data sheets, SXM parts).
PEAK_TFLOPS = {"V100 fp16": 125.0, "A100 bf16": 312.0}


def flops_per_token(task: str, seq: int, batch: int = 2) -> float:
    from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining

    torch.manual_seed(0)
    model = SkillNetBertForPreTraining(SkillNetBertConfig.preset("base"))
    ids = torch.randint(5, 21128, (batch, seq))
    kw: dict = {"task": task, "input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if task == "mlm":
        labels = torch.full_like(ids, -100)
        pick = torch.rand(ids.shape) < 0.15  # BERT's masking rate: the decoder runs on these only
        labels[pick] = ids[pick]
        kw["labels"] = labels
    else:
        kw["next_sentence_label"] = torch.zeros(batch, dtype=torch.long)
    counter = FlopCounterMode(display=False)
    with counter:
        model(**kw).loss.backward()
    return counter.get_total_flops() / (batch * seq)


def project(fpt: float, mfu: float, peak_tflops: float, recipe: dict) -> float:
    """Days for the recipe at the given MFU."""
    tokens = recipe["steps"] * recipe["batch"] * recipe["seq"]
    return tokens * fpt / (recipe["gpus"] * peak_tflops * 1e12 * mfu) / 86400


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mfu", type=float, nargs="+", default=[0.3, 0.45],
                    help="assumed model FLOPs utilisations (fraction of peak)")
    ap.add_argument("--mlm-share", type=float, default=0.5,
                    help="share of steps that are MLM (the objective sampler's default is 50/50)")
    ap.add_argument("--write", metavar="MD", help="write the projection as this Markdown file")
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    a = ap.parse_args()
    seq = RECIPE["seq"]
    mlm, nsp = flops_per_token("mlm", seq), flops_per_token("nsp", seq)
    fpt = a.mlm_share * mlm + (1 - a.mlm_share) * nsp
    rows = [(gpu, peak, mfu, project(fpt, mfu, peak, RECIPE)) for gpu, peak in PEAK_TFLOPS.items() for mfu in a.mfu]
    tokens = RECIPE["steps"] * RECIPE["batch"] * RECIPE["seq"]
    lines = [
        "# Projected pre-training time on GPUs",
        "",
        "Written by `python bench/projection.py --write docs/gpu.md`. Nothing here ran on a GPU: FLOPs are "
        "counted on the real model (torch `FlopCounterMode`, forward + backward, CPU), the throughput is an "
        "assumption.",
        "",
        f"- Recipe (skillnet-nlu.md §B): {RECIPE['steps']:,} steps × {RECIPE['batch']:,} sequences × {seq} tokens "
        f"= {tokens:.3e} tokens on {RECIPE['gpus']} GPUs.",
        f"- Model: preset `base` (BERT-base with 7 skills per layer). Counted FLOPs per token (fwd + bwd): "
        f"MLM step (s2, s7; decoder on the 15% masked positions) {mlm / 1e9:.3f} GFLOP, NSP step (s1, s3, s7) "
        f"{nsp / 1e9:.3f} GFLOP; mixed {a.mlm_share:.0%} MLM: {fpt / 1e9:.3f} GFLOP per token.",
        "- Assumed peaks: " + ", ".join(f"{k} {v:g} TFLOP/s" for k, v in PEAK_TFLOPS.items()) + " (dense tensor "
        "cores, data-sheet values).",
        f"- Assumed MFU: {', '.join(f'{m:.0%}' for m in a.mfu)} (BERT pre-training with mixed precision and "
        "ZeRO-2 typically reaches 30-50% of peak; not measured here).",
        "- Not included: data loading stalls, checkpoint writes, evaluation, restarts after preemption.",
        "",
        "| GPU | peak TFLOP/s | MFU | projected days | projected hours |",
        "|---|---|---|---|---|",
    ] + [f"| {g} | {p:g} | {m:.0%} | {d:.2f} | {d * 24:.0f} |" for g, p, m, d in rows]
    text = "\n".join(lines) + "\n"
    print(text)
    if a.write:
        Path(a.write).write_text(text, encoding="utf-8")
    if a.json:
        print(json.dumps({"flops_per_token_mlm": mlm, "flops_per_token_nsp": nsp, "flops_per_token": fpt,
                          "projection_days": {f"{g} mfu={m}": d for g, _, m, d in rows}}))


if __name__ == "__main__":
    main()
