"""Generation and training speed: SkillNet-BART vs HF BartForConditionalGeneration at equal activated FFN width.

A task with k active skills runs, in each skill layer, the average of k FFNs of width f: the FLOPs of one
FFN of width k*f. The dense twin is therefore an HF ``BartForConditionalGeneration`` of the same size
whose skill layers (the same layer ids, encoder and decoder) have ``fc1``/``fc2`` of width k*f and whose
other layers keep width f; both models do the same matmul FLOPs. SkillNet-BART is built from a random
dense BART of width f by `skillnet_bart_from_dense` (shared LayerNorm, fused skill FFN: the defaults),
and is driven as a user drives it: ``task=<name>`` (one task per batch) for a k that a task of the config
has, ``skill_ids=`` otherwise.

Two measurements per (size, k), SkillNet and dense interleaved in one run so machine load hits both alike,
CPU fp32 by default, warm-up first, median of the repetitions:

* generate: beam search with ``num_beams=4``, ``early_stopping=True``, the same inputs (right-padded,
  varied lengths) and ``min_new_tokens = max_new_tokens``, so neither side can stop early; tokens/s =
  batch x new tokens / time.
* train: forward + backward + optimizer step on one fixed batch whose sources and targets are right-padded
  (lengths spread over [len/2, len] on each side); tokens/s = real (source + target) tokens / time.
  SkillNet steps `MaskedAdamW` as the trainer ships it, dense steps ``torch.optim.AdamW`` with
  ``fused=True`` (the kernel MaskedAdamW uses on fully-active tensors), both with the trainer's parameter
  groups; the "(opt)" columns are the optimizer part of each step. A third arm runs SkillNet on the same
  samples packed as fine-tuning feeds them (training/packing.py): ``train_packed_over_dense`` is how far
  ahead of HF on its padded batch packing puts SkillNet-BART, on the same real tokens.

``generate_over_dense`` and ``train_over_dense`` are SkillNet tokens/s over dense tokens/s at the worst
measured (size, k) (targets >= 0.9 and >= 0.95): the median of the per-repetition ratios (each compares
two calls made under the same load), with their ``*_min``/``*_max`` at that (size, k). On a machine shared with other jobs, wall time with several torch threads is
dominated by threads waiting for each other (a thread descheduled mid-op stalls the rest);
``--threads 1 --clock cpu`` then measures the work itself. ``--profile`` prints torch profiler tables of
one generate call of each model at the largest k, to show where a gap comes from.

    python bench/generate.py                       # small preset, the config's task skill counts, table
    python bench/generate.py --json                # table, then one JSON line (last line)
    python bench/generate.py --sizes small,base    # + BART-base sizes (d 768, 6+6 layers, ffn 3072): ~8 GB RAM, minutes more
    python bench/generate.py --threads 1 --clock cpu   # on a busy shared machine: CPU time, one thread
    python bench/generate.py --device cuda --dtype fp16   # on a GPU, under autocast
    python bench/generate.py --write               # also rewrite its section of docs/speed.md
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from skillnet.experiments.benchdoc import interleaved, machine_line, md_table, paired_ratio, write_section  # noqa: E402
from skillnet.model import BART_PRESETS, SkillNetBartConfig, skillnet_bart_from_dense  # noqa: E402
from skillnet.model.attention import PACK_ROW_FACTOR  # noqa: E402
from skillnet.training.optim import MaskedAdamW, build_param_groups  # noqa: E402
from skillnet.training.packing import pack_where_it_pays  # noqa: E402
from torch import nn  # noqa: E402
from transformers import BartConfig, BartForConditionalGeneration, GenerationConfig  # noqa: E402

# "base" is BART-base's shape (d 768, 6+6 layers, 12 heads, FFN 3072) with the bert-base-chinese vocab.
SIZES: dict[str, dict[str, Any]] = {
    "tiny": BART_PRESETS["tiny"],
    "small": BART_PRESETS["small"],
    "base": {
        **BART_PRESETS["small"], "d_model": 768, "encoder_layers": 6, "decoder_layers": 6,
        "encoder_attention_heads": 12, "decoder_attention_heads": 12, "encoder_ffn_dim": 3072,
        "decoder_ffn_dim": 3072, "max_position_embeddings": 1024,
    },
}
DTYPES = {"fp32": None, "fp16": torch.float16, "bf16": torch.bfloat16}
FIRST_ID = 104  # above bert-base-chinese's [PAD]/[unused*]/[UNK]/[CLS]/[SEP]/[MASK]


@dataclass(frozen=True)
class Shape:
    batch: int  # rows per generate call / training step
    src_len: int  # longest source; the others are right-padded to it
    new_tokens: int  # generated tokens per row (min = max)
    tgt_len: int  # training target length


@dataclass
class Row:
    size: str
    k: int
    skills: str  # the task name (or skill ids) SkillNet ran with
    ffn_width: int  # activated width k*f of a skill layer
    gen_skill_ms: float
    gen_dense_ms: float
    gen_skill_tok_s: float
    gen_dense_tok_s: float
    generate_over_dense: float
    train_skill_ms: float
    train_dense_ms: float
    train_skill_opt_ms: float  # the optimizer-step part of train_skill_ms
    train_dense_opt_ms: float
    train_skill_tok_s: float
    train_dense_tok_s: float
    train_over_dense: float
    train_packed_tok_s: float  # SkillNet on the same samples packed
    train_packed_over_dense: float
    # Range of the per-repetition ratios (the ratios above are their medians).
    generate_over_dense_min: float
    generate_over_dense_max: float
    train_over_dense_min: float
    train_over_dense_max: float
    train_packed_over_dense_min: float
    train_packed_over_dense_max: float


# ---- models ------------------------------------------------------------------------------------------
def skill_choice(cfg: SkillNetBartConfig, k: int) -> tuple[str, dict[str, Any]]:
    """How SkillNet runs k skills: the first task of the config with k skills, else the generic skill
    and the first k-1 others as ``skill_ids``."""
    for task in cfg.tasks:
        if len(cfg.skill_ids(task)) == k:
            return task, {"task": task}
    if not 1 <= k <= cfg.num_skills:
        raise SystemExit(f"error: --ks: k={k} is outside 1..{cfg.num_skills} (the config's skills)")
    generic = cfg.skill_index(cfg.generic_skill) if cfg.generic_skill else cfg.num_skills - 1
    ids = sorted([i for i in range(cfg.num_skills) if i != generic][: k - 1] + [generic])
    return f"skill_ids={ids}", {"skill_ids": ids}


def dense_twin(dense: BartForConditionalGeneration, cfg: SkillNetBartConfig, k: int) -> BartForConditionalGeneration:
    """`dense` with the FFN of every skill layer widened to k*f (fresh weights): HF's layer just calls
    ``self.fc1``/``self.fc2``, so this is the dense model of the same activated FLOPs."""
    twin = copy.deepcopy(dense)
    stacks = ((twin.model.encoder, cfg.encoder_skill_layer_ids(), cfg.encoder_ffn_dim),
              (twin.model.decoder, cfg.decoder_skill_layer_ids(), cfg.decoder_ffn_dim))
    for stack, layer_ids, f in stacks:
        for i in layer_ids:
            layer = stack.layers[i]
            layer.fc1, layer.fc2 = nn.Linear(cfg.d_model, k * f), nn.Linear(k * f, cfg.d_model)
            for lin in (layer.fc1, layer.fc2):
                nn.init.normal_(lin.weight, std=cfg.init_std)
                nn.init.zeros_(lin.bias)
    return twin


def make_inputs(shape: Shape, vocab: int, pad: int, device: str) -> dict[str, torch.Tensor]:
    """Right-padded sources of lengths spread over [src_len/2, src_len], and target labels."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(FIRST_ID, vocab, (shape.batch, shape.src_len), generator=g)
    lengths = torch.linspace(shape.src_len, max(1, shape.src_len // 2), shape.batch).round().long()
    mask = (torch.arange(shape.src_len)[None, :] < lengths[:, None]).long()
    ids = ids.masked_fill(mask == 0, pad)
    labels = torch.randint(FIRST_ID, vocab, (shape.batch, shape.tgt_len), generator=g)
    tgt_lengths = torch.linspace(max(1, shape.tgt_len // 2), shape.tgt_len, shape.batch).round().long()
    labels = labels.masked_fill(torch.arange(shape.tgt_len)[None, :] >= tgt_lengths[:, None], -100)
    return {"input_ids": ids.to(device), "attention_mask": mask.to(device), "labels": labels.to(device)}


# ---- timing ------------------------------------------------------------------------------------------
CLOCKS: dict[str, Callable[[], float]] = {"wall": time.perf_counter, "cpu": time.process_time}


@dataclass(frozen=True)
class Where:
    """Device, autocast dtype (None: fp32, no autocast) and the clock the timings read."""

    device: str = "cpu"
    dtype: torch.dtype | None = None
    clock: Callable[[], float] = time.perf_counter

    def sync(self) -> None:
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.split(":")[0], dtype=self.dtype)


def timed_generate(model: nn.Module, inputs: dict[str, torch.Tensor], gen: GenerationConfig,
                   choice: dict[str, Any], where: Where) -> tuple[float, torch.Tensor]:
    where.sync()
    t0 = where.clock()
    with torch.inference_mode(), where.autocast():
        out = model.generate(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"],
                             generation_config=gen, **choice)
    where.sync()
    return where.clock() - t0, out


def timed_train_step(model: nn.Module, opt: torch.optim.Optimizer, inputs: dict[str, torch.Tensor],
                     choice: dict[str, Any], where: Where) -> tuple[float, float]:
    """(whole step, optimizer part) in seconds."""
    where.sync()
    t0 = where.clock()
    opt.zero_grad(set_to_none=True)
    with where.autocast():
        loss = model(**inputs, **choice).loss
    loss.float().backward()
    where.sync()
    t1 = where.clock()
    opt.step()
    where.sync()
    t2 = where.clock()
    return t2 - t0, t2 - t1


def profile_generate(models: dict[str, nn.Module], inputs: dict[str, torch.Tensor], gen: GenerationConfig,
                     choices: dict[str, dict[str, Any]], where: Where, rows: int = 18) -> None:
    from torch.profiler import ProfilerActivity, profile

    for name, model in models.items():
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            timed_generate(model, inputs, gen, choices[name], where)
        print(f"\n== profile: {name} generate, top ops by self CPU time")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows))


# ---- bench -------------------------------------------------------------------------------------------
def measure_k(size: str, k: int, skill: nn.Module, s_opt: torch.optim.Optimizer, dense: nn.Module,
              inputs: dict[str, torch.Tensor], gen: GenerationConfig, shape: Shape, warmup: int, reps: int,
              where: Where, profile: bool) -> Row:
    """SkillNet running k skills against the dense twin of width k*f, generation then training."""
    cfg: SkillNetBartConfig = skill.config
    label, choice = skill_choice(cfg, k)
    twin = dense_twin(dense, cfg, k).to(where.device)
    # torch's fused AdamW: the kernel MaskedAdamW runs on fully-active tensors, so the optimizer parts
    # differ only by SkillNet's masking work (and the skills it skips).
    d_opt = torch.optim.AdamW(build_param_groups(twin, 0.01), lr=1e-5, fused=True)
    src = {n: v for n, v in inputs.items() if n != "labels"}
    runs = {"skill": (skill, s_opt, choice), "dense": (twin, d_opt, {})}
    # As fine-tuning packs a task's batch: rows up to PACK_ROW_FACTOR times its source and target limits.
    factor = PACK_ROW_FACTOR
    packed = pack_where_it_pays({k: v.cpu() for k, v in inputs.items()}, cfg.pad_token_id,
                                decoder_start_id=cfg.decoder_start_token_id,
                                row_len=factor * inputs["input_ids"].shape[1],
                                decoder_row_len=factor * inputs["labels"].shape[1])
    packed = {k: v.to(where.device) for k, v in packed.items()}
    outs: dict[str, torch.Tensor] = {}

    def gen_fn(name: str) -> Callable[[], float]:
        model, _, ch = runs[name]

        def run() -> float:
            dt, outs[name] = timed_generate(model, src, gen, ch, where)
            return dt
        return run

    def train_fn(name: str) -> Callable[[], tuple[float, float]]:
        model, opt, ch = runs["skill" if name == "packed" else name]
        return lambda: timed_train_step(model, opt, packed if name == "packed" else inputs, ch, where)

    skill.eval()
    twin.eval()
    g = interleaved({name: gen_fn(name) for name in runs}, warmup, reps)
    # Both ran the full length (min_new_tokens = max_new_tokens): the same work.
    assert outs["skill"].shape == outs["dense"].shape, (outs["skill"].shape, outs["dense"].shape)
    if profile:
        profile_generate({"SkillNet-BART": skill, "dense twin": twin}, src, gen,
                         {"SkillNet-BART": choice, "dense twin": {}}, where)
    skill.train()
    twin.train()
    t = interleaved({name: train_fn(name) for name in (*runs, "packed")}, warmup, reps)

    gen_tokens = shape.batch * shape.new_tokens
    train_tokens = int(inputs["attention_mask"].sum()) + int((inputs["labels"] != -100).sum())
    t_p = statistics.median(x for x, _ in t["packed"])
    g_s, g_d = statistics.median(g["skill"]), statistics.median(g["dense"])
    t_s = statistics.median(x for x, _ in t["skill"])
    t_d = statistics.median(x for x, _ in t["dense"])
    return Row(
        size=size, k=k, skills=label, ffn_width=k * cfg.encoder_ffn_dim,
        gen_skill_ms=g_s * 1e3, gen_dense_ms=g_d * 1e3,
        gen_skill_tok_s=gen_tokens / g_s, gen_dense_tok_s=gen_tokens / g_d,
        train_skill_ms=t_s * 1e3, train_dense_ms=t_d * 1e3,
        train_skill_opt_ms=statistics.median(o for _, o in t["skill"]) * 1e3,
        train_dense_opt_ms=statistics.median(o for _, o in t["dense"]) * 1e3,
        train_skill_tok_s=train_tokens / t_s, train_dense_tok_s=train_tokens / t_d,
        **paired_ratio(g["dense"], g["skill"], "generate_over_dense"),
        **paired_ratio([x for x, _ in t["dense"]], [x for x, _ in t["skill"]], "train_over_dense"),
        train_packed_tok_s=train_tokens / t_p,
        **paired_ratio([x for x, _ in t["dense"]], [x for x, _ in t["packed"]], "train_packed_over_dense"),
    )


def bench_size(size: str, ks: list[int] | None, shape: Shape, warmup: int, reps: int, where: Where,
               profile: bool) -> list[Row]:
    torch.manual_seed(0)
    dense = BartForConditionalGeneration(BartConfig(**SIZES[size])).to(where.device)
    skill = skillnet_bart_from_dense(dense).to(where.device)
    cfg: SkillNetBartConfig = skill.config
    if ks is None:  # the skill counts of the config's tasks
        ks = sorted({len(cfg.skill_ids(t)) for t in cfg.tasks})
    inputs = make_inputs(shape, cfg.vocab_size, cfg.pad_token_id, where.device)
    gen = GenerationConfig(
        num_beams=4, early_stopping=True, max_new_tokens=shape.new_tokens, min_new_tokens=shape.new_tokens,
        do_sample=False, bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.pad_token_id, decoder_start_token_id=cfg.decoder_start_token_id,
        forced_eos_token_id=cfg.forced_eos_token_id,
    )
    # As the trainer builds it; one optimizer across k, so skills already stepped keep their moments.
    s_opt = MaskedAdamW(build_param_groups(skill, 0.01), lr=1e-5)
    rows = []
    for k in ks:
        rows.append(measure_k(size, k, skill, s_opt, dense, inputs, gen, shape, warmup, reps, where,
                              profile and k == ks[-1]))
        print(format_row(rows[-1]), flush=True)
    return rows


HEADER = (f"{'size':6} {'k':>2} {'skills':26} {'width':>6} | {'gen ms':>8} {'dense':>8} {'tok/s':>7} "
          f"{'dense':>7} {'ratio':>6} | {'train ms':>8} {'(opt)':>6} {'dense':>8} {'(opt)':>6} {'tok/s':>7} "
          f"{'dense':>7} {'ratio':>6} | {'packed':>7} {'ratio':>6}")


def format_row(r: Row) -> str:
    return (f"{r.size:6} {r.k:>2} {r.skills:26} {r.ffn_width:>6} | {r.gen_skill_ms:8.1f} {r.gen_dense_ms:8.1f} "
            f"{r.gen_skill_tok_s:7.1f} {r.gen_dense_tok_s:7.1f} {r.generate_over_dense:6.3f} | "
            f"{r.train_skill_ms:8.1f} {r.train_skill_opt_ms:6.1f} {r.train_dense_ms:8.1f} "
            f"{r.train_dense_opt_ms:6.1f} {r.train_skill_tok_s:7.0f} {r.train_dense_tok_s:7.0f} "
            f"{r.train_over_dense:6.3f} | {r.train_packed_tok_s:7.0f} {r.train_packed_over_dense:6.3f}")


def _positive(text: str) -> int:
    v = int(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {v}")
    return v


DOC = "docs/speed.md"


def doc_section(rows: list[Row], args: argparse.Namespace, result: dict[str, Any]) -> str:
    ks = "tasks" if args.ks is None else ",".join(map(str, args.ks))
    cmd = (f"python bench/generate.py --sizes {args.sizes} --ks {ks} --batch {args.batch} --src-len {args.src_len} "
           f"--new-tokens {args.new_tokens} --tgt-len {args.tgt_len} --reps {args.reps} --threads {args.threads} "
           f"--clock {args.clock} --device {args.device} --dtype {args.dtype} --write")

    def rng(r: Row, key: str) -> str:
        return f"{getattr(r, key):.3f} ({getattr(r, key + '_min'):.3f}-{getattr(r, key + '_max'):.3f})"

    table = md_table(
        ["size", "k", "skills", "FFN width", "generate tok/s SkillNet / dense", "generate ratio (min-max)",
         "train tok/s SkillNet / dense", "train ratio (min-max)", "train tok/s SkillNet packed",
         "packed / dense (min-max)"],
        [(r.size, r.k, r.skills, r.ffn_width, f"{r.gen_skill_tok_s:.1f} / {r.gen_dense_tok_s:.1f}",
          rng(r, "generate_over_dense"), f"{r.train_skill_tok_s:.0f} / {r.train_dense_tok_s:.0f}",
          rng(r, "train_over_dense"), f"{r.train_packed_tok_s:.0f}", rng(r, "train_packed_over_dense"))
         for r in rows])
    return "\n\n".join([
        f"`{cmd}` (beam 4; dense twin = HF `BartForConditionalGeneration` of the same activated width). "
        f"{machine_line()}",
        table,
        f"Throughput ratios, higher is faster. Worst: `generate_over_dense` **{result['generate_over_dense']:.3f}** "
        f"({result['worst_generate']}, target >= 0.9), `train_over_dense` **{result['train_over_dense']:.3f}** "
        f"({result['worst_train']}, target >= 0.95); with its rows packed SkillNet-BART trains "
        f"`train_packed_over_dense` **{result['train_packed_over_dense']:.3f}** times HF's real tokens/s on the "
        f"padded batch ({result['worst_packed']}). Real tokens: sources and targets right-padded, lengths spread "
        "over [len/2, len].",
    ])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="small", help=f"comma-separated subset of {','.join(SIZES)} (default: %(default)s)")
    p.add_argument("--ks", default="tasks",
                   help="active skill counts to measure, e.g. 1,2,3; 'tasks' = the skill counts of the "
                        "config's tasks (default: %(default)s)")
    p.add_argument("--batch", type=_positive, default=8, help="rows per generate call and training step (default: %(default)s)")
    p.add_argument("--src_len", "--src-len", type=_positive, default=64,
                   help="longest source; rows are right-padded, shortest half as long (default: %(default)s)")
    p.add_argument("--new_tokens", "--new-tokens", type=_positive, default=32,
                   help="generated tokens per row, min = max (default: %(default)s)")
    p.add_argument("--tgt_len", "--tgt-len", type=_positive, default=32, help="training target length (default: %(default)s)")
    p.add_argument("--reps", type=_positive, default=5, help="timed repetitions per model, median reported (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls per model first (default: %(default)s)")
    p.add_argument("--threads", type=_positive, default=torch.get_num_threads(),
                   help="torch intra-op threads (default: %(default)s, what torch found on this machine)")
    p.add_argument("--device", default="cpu", help="cpu or cuda (default: %(default)s)")
    p.add_argument("--dtype", default="fp32", choices=list(DTYPES),
                   help="fp32, or fp16/bf16 under autocast (GPU) (default: %(default)s)")
    p.add_argument("--clock", default="wall", choices=list(CLOCKS),
                   help="wall: elapsed time; cpu: this process's CPU time, which load from other processes "
                        "barely disturbs (use with --threads 1 on a shared machine; CPU only) "
                        "(default: %(default)s)")
    p.add_argument("--profile", action="store_true", help="print torch profiler tables of one generate call per model at the largest k")
    p.add_argument("--write", nargs="?", const=DOC, metavar="MD",
                   help=f"rewrite the 'generate' section of this Markdown file (default: {DOC})")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = p.parse_args(argv)
    bad = [s for s in args.sizes.split(",") if s not in SIZES]
    if bad:
        p.error(f"--sizes: unknown {','.join(bad)}; valid: {','.join(SIZES)}")
    if args.ks != "tasks":
        try:
            args.ks = [int(k) for k in args.ks.split(",")]
        except ValueError:
            p.error(f"--ks: expected 'tasks' or comma-separated integers, got {args.ks!r}")
    else:
        args.ks = None
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        p.error("--device cuda but CUDA is not available")
    if args.device.startswith("cuda") and args.clock == "cpu":
        p.error("--clock cpu measures host CPU time: use --clock wall with --device cuda")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    shape = Shape(args.batch, args.src_len, args.new_tokens, args.tgt_len)
    where = Where(args.device, DTYPES[args.dtype], CLOCKS[args.clock])
    print(f"torch {torch.__version__}, {args.device} {args.dtype}, {torch.get_num_threads()} threads, "
          f"{args.clock} clock, "
          f"median of {args.reps} (after {args.warmup} warm-up); batch {shape.batch}, source <= {shape.src_len}, "
          f"generate: 4 beams x {shape.new_tokens} new tokens; train: target {shape.tgt_len}, fwd+bwd+optimizer")
    print("ratio = SkillNet tokens/s / dense tokens/s (> 1: SkillNet faster); width = activated FFN width k*f")
    print(HEADER)
    rows: list[Row] = []
    for size in args.sizes.split(","):
        rows += bench_size(size, args.ks, shape, args.warmup, args.reps, where, args.profile)
    worst_gen = min(rows, key=lambda r: r.generate_over_dense)
    worst_train = min(rows, key=lambda r: r.train_over_dense)
    worst_packed = min(rows, key=lambda r: r.train_packed_over_dense)
    result = {
        "generate_over_dense": round(worst_gen.generate_over_dense, 3),
        "train_over_dense": round(worst_train.train_over_dense, 3),
        "worst_generate": f"{worst_gen.size} k={worst_gen.k}",
        "worst_train": f"{worst_train.size} k={worst_train.k}",
        "train_packed_over_dense": round(worst_packed.train_packed_over_dense, 3),
        "worst_packed": f"{worst_packed.size} k={worst_packed.k}",
        "generate_over_dense_min": worst_gen.generate_over_dense_min,
        "generate_over_dense_max": worst_gen.generate_over_dense_max,
        "train_over_dense_min": worst_train.train_over_dense_min,
        "train_over_dense_max": worst_train.train_over_dense_max,
        "device": args.device,
        "dtype": args.dtype,
        "clock": args.clock,
        "threads": torch.get_num_threads(),
        "shape": asdict(shape),
        "reps": args.reps,
        "rows": [{k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(r).items()} for r in rows],
    }
    print(f"per-repetition range at the worst (size, k): generate {result['generate_over_dense_min']:.3f}-"
          f"{result['generate_over_dense_max']:.3f}, train {result['train_over_dense_min']:.3f}-"
          f"{result['train_over_dense_max']:.3f}")
    print(f"worst: generate_over_dense = {result['generate_over_dense']:.3f} ({result['worst_generate']}, "
          f"target >= 0.9), train_over_dense = {result['train_over_dense']:.3f} ({result['worst_train']}, "
          f"target >= 0.95)")
    if args.write:
        write_section(args.write, "generate", doc_section(rows, args, result))
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
