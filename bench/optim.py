"""Sparse-update optimizer speed: ``MaskedAdamW.step`` vs ``torch.optim.AdamW(fused=True)``.

The gradients are those of one real MLM step of SkillNet-BERT (2 of 7 skills active), in two layouts:

* ``none``: plain PyTorch. Parameters of inactive skills have ``grad is None``; both optimizers skip
  them. This is the issue's target: ``masked_over_fused`` <= 1.3.
* ``flat``: ZeRO-1/2. Each param group is one flat fp32 tensor, of which a rank steps its 1/``--world``
  partition; inactive parameters are zero-filled slices. Fused AdamW updates every element (that is the
  bug MaskedAdamW exists for), MaskedAdamW skips the zero slices: ``masked_over_fused_flat``.

Only ``step()`` is timed. Both optimizers run interleaved in one process (so machine load hits them
alike) on their own copy of the parameters with the same gradients; one warm-up step creates the
moments, then ``--reps`` steps of each. A ratio is the median of the per-repetition ratios (each one
compares two steps taken under the same load), with ``_min``/``_max``.

    python bench/optim.py                     # table (preset base, batch 16 x seq 128)
    python bench/optim.py --json              # table, then one JSON object (last line)
    python bench/optim.py --preset small --reps 5
    python bench/optim.py --threads 1         # steadier on a loaded machine (no waits for a busy core)
    python bench/optim.py --write             # also rewrite its section of docs/speed.md
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from skillnet.experiments.benchdoc import machine_line, md_table, paired_ratio, write_section  # noqa: E402
from skillnet.model import PRESETS, SkillNetBertConfig, SkillNetBertForPreTraining  # noqa: E402
from skillnet.training.optim import MaskedAdamW, build_param_groups  # noqa: E402
from torch import nn  # noqa: E402

# bench/ holds scripts, not an installed package: the sibling script is loaded from its file.
_spec = importlib.util.spec_from_file_location("bench_pretrain", Path(__file__).with_name("pretrain.py"))
_bench_pretrain = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_bench_pretrain)
make_batch = _bench_pretrain.make_batch

Groups = list[dict[str, Any]]
HYPER: dict[str, Any] = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-6)


def mlm_gradients(preset: str, batch: int, seq: int) -> tuple[Groups, int]:
    """Param groups (as the trainer builds them) holding one MLM step's gradients; and the param count."""
    torch.manual_seed(0)
    cfg = SkillNetBertConfig.preset(preset, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = SkillNetBertForPreTraining(cfg)
    model(task="mlm", **make_batch("mlm", batch, seq, cfg.vocab_size, seed=1)).loss.backward()
    return build_param_groups(model, weight_decay=0.01), sum(p.numel() for p in model.parameters())


def copy_groups(groups: Groups) -> Groups:
    """Own parameter copies with the *same* gradient tensors (neither optimizer writes a gradient).

    A parameter without a gradient is shared: neither optimizer touches it, so one copy is enough.
    """
    out = []
    for g in groups:
        params = []
        for p in g["params"]:
            if p.grad is None:
                params.append(p)
                continue
            q = nn.Parameter(p.detach().clone())
            q.grad = p.grad
            params.append(q)
        out.append({**g, "params": params})
    return out


def flat_groups(groups: Groups, world: int) -> Groups:
    """Rank 0's ZeRO-1/2 partition of every group: flat fp32 params, zero-filled gradients of unused ones."""
    out = []
    for g in groups:
        n = sum(p.numel() for p in g["params"])
        part = -(-n // world)  # DeepSpeed pads the flat group to a multiple of the world size
        p_flat = torch.cat([p.detach().reshape(-1) for p in g["params"]])[:part].clone()
        g_flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in g["params"]]
        )[:part].clone()
        q = nn.Parameter(p_flat)
        q.grad = g_flat
        # the trainer turns the exact-zero check on for every group under ZeRO
        out.append({**g, "params": [q], "check_zeros": True})
    return out


def time_pair(make_groups: Any, reps: int) -> tuple[list[float], list[float], int, bool]:
    """Seconds of each timed step of (MaskedAdamW, fused AdamW), interleaved; elements with a gradient;
    and whether both made the same update wherever the gradient is nonzero (a fast path that skipped
    work would show here, not in the times)."""
    masked = MaskedAdamW(make_groups(), **HYPER)
    fused = torch.optim.AdamW(make_groups(), fused=True, **HYPER)
    n_grad = sum(p.numel() for g in masked.param_groups for p in g["params"] if p.grad is not None)
    times: dict[str, list[float]] = {"masked": [], "fused": []}
    for rep in range(reps + 1):  # step 0 creates the moments (warm-up)
        for name, opt in (("masked", masked), ("fused", fused)):
            t0 = time.perf_counter()
            opt.step()
            if rep:
                times[name].append(time.perf_counter() - t0)
    agree = all(
        torch.allclose(p[p.grad.ne(0)], q[q.grad.ne(0)], rtol=1e-5, atol=1e-7)
        for gm, gf in zip(masked.param_groups, fused.param_groups)
        for p, q in zip(gm["params"], gf["params"])
        if p.grad is not None
    )
    return times["masked"], times["fused"], n_grad, agree


DOC = "docs/speed.md"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="base", choices=sorted(PRESETS), help="model size (default: base)")
    p.add_argument("--batch", type=int, default=16, help="MLM batch size (default: 16)")
    p.add_argument("--seq", type=int, default=128, help="sequence length (default: 128)")
    p.add_argument("--reps", type=int, default=7, help="timed steps per optimizer and case (default: 7)")
    p.add_argument("--world", type=int, default=2, help="ranks the flat case partitions over (default: 2)")
    p.add_argument(
        "--threads", type=int, default=0, help="torch threads (default: 0 = torch's default, one per core)"
    )
    p.add_argument("--write", nargs="?", const=DOC, metavar="MD",
                   help=f"rewrite the 'optim' section of this Markdown file (default: {DOC})")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = p.parse_args(argv)
    if args.reps < 1 or args.world < 1:
        p.error("--reps and --world must be >= 1")
    if args.threads:
        torch.set_num_threads(args.threads)

    groups, n_params = mlm_gradients(args.preset, args.batch, args.seq)
    rows = []
    for case, make in (
        ("none", lambda: copy_groups(groups)),
        ("flat", lambda: flat_groups(groups, args.world)),
    ):
        t_masked, t_fused, n_grad, agree = time_pair(make, args.reps)
        key = "masked_over_fused" if case == "none" else "masked_over_fused_flat"
        rows.append((case, n_grad, statistics.median(t_masked), statistics.median(t_fused), agree,
                     paired_ratio(t_masked, t_fused, key)))
        gc.collect()  # the other case's copies (GBs at preset base) go before the next one is built

    load = os.getloadavg()[0]  # ratios on a shared machine mean little under load: say how loaded it was
    print(
        f"optimizer step on one MLM step's gradients, preset={args.preset} ({n_params / 1e6:.0f}M params), "
        f"batch {args.batch} x seq {args.seq}, CPU fp32, {torch.get_num_threads()} threads, "
        f"median of {args.reps}; flat = rank 0 of {args.world}; load average {load:.1f}"
    )
    print(
        f"{'gradients':<10}{'elements':>14}{'MaskedAdamW ms':>16}{'fused AdamW ms':>16}{'ratio':>8}"
        f"{'same update':>13}"
    )
    for case, n_grad, tm, tf, agree, ratio in rows:
        r = next(iter(ratio.values()))
        print(f"{case:<10}{n_grad:>14,}{tm * 1e3:>16.1f}{tf * 1e3:>16.1f}{r:>8.2f}{str(agree):>13}")
    (_, _, tm, tf, agree, ratio), (_, _, tm_flat, tf_flat, agree_flat, ratio_flat) = rows
    result = {
        **ratio,
        **ratio_flat,
        "masked_ms": round(tm * 1e3, 1),
        "fused_ms": round(tf * 1e3, 1),
        "masked_flat_ms": round(tm_flat * 1e3, 1),
        "fused_flat_ms": round(tf_flat * 1e3, 1),
        "same_update": agree and agree_flat,
        "preset": args.preset,
        "batch": args.batch,
        "seq": args.seq,
        "world": args.world,
        "threads": torch.get_num_threads(),
        "load_avg_1min": round(load, 2),
    }
    print(f"masked_over_fused = {result['masked_over_fused']:.3f} ({result['masked_over_fused_min']:.3f}-"
          f"{result['masked_over_fused_max']:.3f}) on None gradients (target <= 1.3)")
    if args.write:
        body = "\n\n".join([
            f"`python bench/optim.py --preset {args.preset} --batch {args.batch} --seq {args.seq} --reps {args.reps} "
            f"--world {args.world} --write` ({n_params / 1e6:.0f}M parameters; only `step()` is timed). "
            f"{machine_line()}",
            md_table(["gradients", "elements with a gradient", "MaskedAdamW ms (median)", "fused AdamW ms (median)",
                      "ratio: median (min-max)", "same update"],
                     [(case, f"{n:,}", f"{a * 1e3:.1f}", f"{b * 1e3:.1f}",
                       "{:.3f} ({:.3f}-{:.3f})".format(*rt.values()), ok)
                      for case, n, a, b, ok, rt in rows]),
            "`none` = plain PyTorch (`masked_over_fused`, target <= 1.3); `flat` = one rank's ZeRO-1/2 "
            "partition with zero-filled inactive slices (`masked_over_fused_flat`).",
        ])
        write_section(args.write, "optim", body)
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
