"""Skill FFN speed: reference loop vs fused vs a dense FFN of the same activated width (k*f).

The dense FFN of width k*f does exactly the FLOPs of k active skills, so it is the floor the fused path
is measured against. Forward+backward, CPU fp32, all three interleaved in one run so machine load
affects them alike; the median over repetitions is reported.

    python bench/skill_ffn.py            # table
    python bench/skill_ffn.py --json     # table, then one JSON line (last line)
    python bench/skill_ffn.py --device cuda --dtype bf16   # on a GPU, under autocast (A100)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time

import torch
from skillnet.experiments.benchdoc import machine_line, md_table, paired_ratio, write_section
from skillnet.model.skill_ffn import SkillFFN, SkillRouting
from torch import nn

# (hidden, skill FFN width, tokens). "bert-base-pt": the tokens of one pre-training micro-batch of
# ds_configs/a100_bf16.json (64 x 512); at 4096 tokens an H100 finishes the GEMMs sooner than the host issues
# the kernels, so that shape measures launch overhead there (the GFLOP/s column shows it).
SHAPES = {"bert-base-pt": (768, 3072, 32768), "bert-base": (768, 3072, 4096), "small": (256, 1024, 2048)}
DEFAULT_SHAPES = {"cpu": "bert-base,small", "cuda": "bert-base-pt,bert-base,small"}


class DenseFFN(nn.Module):
    def __init__(self, d: int, f: int) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, f), nn.Linear(f, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}


def _step(fn, x: torch.Tensor, params: list[nn.Parameter], dtype: torch.dtype | None) -> float:
    for p in params:
        p.grad = None
    x.grad = None
    cuda = x.device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    ctx = torch.autocast(x.device.type, dtype=dtype) if dtype is not None else contextlib.nullcontext()
    with ctx:
        y = fn(x)
    y.float().backward(torch.ones_like(y, dtype=torch.float32))
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def bench_shape(d: int, f: int, n: int, ks: list[int], reps: int, num_skills: int = 7, device: str = "cpu",
                dtype: torch.dtype | None = None) -> list[dict]:
    torch.manual_seed(0)
    fused = SkillFFN(d, f, num_skills, impl="fused").to(device)
    loop = SkillFFN(d, f, num_skills, impl="loop").to(device)
    loop.load_state_dict(fused.state_dict())
    x = torch.randn(n, d, device=device, requires_grad=True)
    rows = []
    for k in ks:
        dense = DenseFFN(d, k * f).to(device)
        route = SkillRouting.uniform(list(range(num_skills - k, num_skills)))
        runs = {
            "dense": (dense, list(dense.parameters())),
            "fused": (lambda t, m=fused, r=route: m(t, r), list(fused.parameters())),
            "loop": (lambda t, m=loop, r=route: m(t, r), list(loop.parameters())),
        }
        times: dict[str, list[float]] = {name: [] for name in runs}
        for fn, params in runs.values():  # warm-up: allocator, thread pool, first-touch pages
            _step(fn, x, params, dtype)
        for _ in range(reps):
            for name, (fn, params) in runs.items():
                times[name].append(_step(fn, x, params, dtype))
        med = {name: statistics.median(v) for name, v in times.items()}
        flops = 3 * 2 * 2 * n * d * k * f  # fwd (2 GEMMs) + bwd (4 GEMMs)
        rows.append({
            "k": k, "dense_ms": med["dense"] * 1e3, "fused_ms": med["fused"] * 1e3, "loop_ms": med["loop"] * 1e3,
            **paired_ratio(times["fused"], times["dense"], "fused_over_dense"),
            **paired_ratio(times["loop"], times["dense"], "loop_over_dense"),
            "dense_gflops": flops / med["dense"] / 1e9,
        })
    return rows


DOC = "docs/speed.md"


def doc_section(per_shape: dict, args: argparse.Namespace) -> str:
    rows = [(name, r["k"], f"{r['dense_ms']:.1f}", f"{r['fused_ms']:.1f}", f"{r['loop_ms']:.1f}",
             f"{r['fused_over_dense']:.3f} ({r['fused_over_dense_min']:.3f}-{r['fused_over_dense_max']:.3f})",
             f"{r['loop_over_dense']:.3f} ({r['loop_over_dense_min']:.3f}-{r['loop_over_dense_max']:.3f})")
            for name, s in per_shape.items() for r in s["rows"]]
    return "\n\n".join([
        f"`python bench/skill_ffn.py --reps {args.reps} --ks {args.ks} --shapes {args.shapes} --device {args.device} "
        f"--dtype {args.dtype} --write` ({machine_line()})",
        md_table(["shape", "k", "dense ms", "fused ms", "loop ms", "fused/dense (min-max)", "loop/dense (min-max)"],
                 rows),
        "Time ratios, lower is faster; median of the per-repetition ratios. Target: fused/dense <= 1.10 at "
        "every k.",
    ])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    ap.add_argument("--reps", type=int, default=5,
                    help="timed repetitions per method, interleaved (default: %(default)s)")
    ap.add_argument("--ks", default="1,2,3,4", help="numbers of active skills to measure (default: %(default)s)")
    ap.add_argument("--shapes", default=None,
                    help=f"subset of {','.join(SHAPES)} (default: {DEFAULT_SHAPES['cpu']} on a CPU, "
                         f"{DEFAULT_SHAPES['cuda']} on a GPU; the first is the one the JSON's ratios rate)")
    ap.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    ap.add_argument("--dtype", default="fp32", choices=list(DTYPES),
                    help="fp32, or fp16/bf16 under autocast (GPU; bf16 on this CPU is ~85x slower than fp32) "
                         "(default: %(default)s)")
    ap.add_argument("--write", nargs="?", const=DOC, metavar="MD",
                    help=f"rewrite the 'skill_ffn' section of this Markdown file (default: {DOC})")
    args = ap.parse_args()
    if args.shapes is None:
        args.shapes = DEFAULT_SHAPES["cuda" if args.device.startswith("cuda") else "cpu"]
    bad = [s for s in args.shapes.split(",") if s not in SHAPES]
    if bad:
        ap.error(f"--shapes: unknown {','.join(bad)}; valid: {','.join(SHAPES)}")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("error: --device cuda but CUDA is not available")
    ks = [int(k) for k in args.ks.split(",")]
    torch.set_grad_enabled(True)
    per_shape = {}
    print(f"torch {torch.__version__}, {args.device}, threads {torch.get_num_threads()}, {args.dtype}, "
          f"forward+backward, median of {args.reps}")
    print(f"{'shape':10} {'k':>2} {'dense ms':>9} {'fused ms':>9} {'loop ms':>9} {'fused/dense':>11} {'loop/dense':>10} {'GFLOP/s':>8}")
    for name in args.shapes.split(","):
        d, f, n = SHAPES[name]
        rows = bench_shape(d, f, n, ks, args.reps, device=args.device, dtype=DTYPES[args.dtype])
        per_shape[name] = {"d": d, "f": f, "tokens": n, "rows": rows}
        for r in rows:
            print(f"{name:10} {r['k']:>2} {r['dense_ms']:9.1f} {r['fused_ms']:9.1f} {r['loop_ms']:9.1f} "
                  f"{r['fused_over_dense']:11.3f} {r['loop_over_dense']:10.3f} {r['dense_gflops']:8.1f}", flush=True)
    ref = next(iter(per_shape.values()))  # the first listed shape
    worst = max(ref["rows"], key=lambda r: r["fused_over_dense"])
    worst_loop = max(ref["rows"], key=lambda r: r["loop_over_dense"])
    result = {
        "fused_over_dense": worst["fused_over_dense"],
        "fused_over_dense_min": worst["fused_over_dense_min"],
        "fused_over_dense_max": worst["fused_over_dense_max"],
        "loop_over_dense": worst_loop["loop_over_dense"],
        "loop_over_dense_min": worst_loop["loop_over_dense_min"],
        "loop_over_dense_max": worst_loop["loop_over_dense_max"],
        "worst_k": worst["k"],
        "shape": next(iter(per_shape)),
        "device": args.device,
        "dtype": args.dtype,
        "per_shape": per_shape,
    }
    print(f"worst k at {ref['d']}x{ref['f']}: fused/dense = {result['fused_over_dense']:.3f} (target <= 1.10), "
          f"loop/dense = {result['loop_over_dense']:.3f}")
    if args.write:
        write_section(args.write, "skill_ffn", doc_section(per_shape, args))
    if args.json:
        print(json.dumps(result))


if __name__ == "__main__":
    main()
