"""The summary of scripts/gpu_check.sh: every measured figure next to its target, from the files in OUT.

    python scripts/gpu_summary.py runs/gpu_check [--steps 60 --seq 512]

A part that did not run (or failed before writing its JSON) is reported as "not run" with the file it
looked for; nothing is inferred.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _load(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text().strip().splitlines()[-1])
    except (OSError, ValueError, IndexError):
        return None


def _mark(ok: bool) -> str:
    return "ok" if ok else "MISSED"


def _flops_per_token(preset: str, seq: int) -> float:
    """Matmul FLOPs (forward + backward) per padded token of the 50/50 MLM/NSP mix, as bench/pretrain.py
    counts them (15% of tokens predicted)."""
    spec = importlib.util.spec_from_file_location("bench_pretrain", REPO / "bench" / "pretrain.py")
    bp = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(bp)
    from skillnet.model import PRESETS, SkillNetBertConfig  # noqa: PLC0415

    pre = PRESETS[preset]
    cfg = SkillNetBertConfig.preset(preset)
    H, L, F, V = pre["hidden_size"], pre["num_hidden_layers"], pre["intermediate_size"], pre["vocab_size"]
    total = sum(bp.step_flops(H, L, V, len(cfg.task_skill_names(o)) * F, 1, seq, o, int(0.15 * seq))
                for o in ("mlm", "nsp"))
    return total / (2 * seq)


def pipeline_figures(out: Path, name: str = "pipeline") -> dict[str, Any] | None:
    log = out / name / "log.jsonl"
    if not log.is_file():
        return None
    recs = [json.loads(x) for x in log.read_text().splitlines() if '"train"' in x]
    start = next((json.loads(x) for x in (out / f"{name}.txt").read_text().splitlines()
                  if x.startswith('{"event": "start"')), None)
    if len(recs) < 3 or start is None:
        return None
    # The first windows hold the warm-up (kernel selection, allocator, first batches, compilation); a
    # profiled window is slower by the profiler's own cost: neither is counted.
    # gpu_check.sh profiles the last five steps, so a profiled run's last window holds the profiler and its
    # trace export.
    prof = (out / name / "profile").is_dir()
    later = [r for r in recs[2:] if not (prof and r is recs[-1])] or recs[-1:]
    sec = statistics.mean(r["seconds_per_step"] for r in later)
    return {"micro": start["micro_batch_size"] * start["grad_accum"], "seconds_per_step": sec,
            "tokens_per_s": statistics.mean(r["tokens_per_s"] for r in later), "windows": len(later),
            "steps": recs[-1]["step"]}


def _memory_line(out: Path, name: str, ds_json: str, preset: str, seq: int, micro: int) -> list[str]:
    """The arm's measured peak of allocated GPU memory (rank 0's end event) against experiments/memory.py's
    prediction for the same DeepSpeed JSON, preset, micro-batch and sequence on one GPU."""
    end = next((json.loads(x) for x in (out / f"{name}.txt").read_text().splitlines()
                if x.startswith('{"event": "end"')), None)
    if not end or "peak_device_bytes" not in end:
        return []
    from skillnet.experiments.memory import deepspeed_setup, predict  # noqa: PLC0415

    pred = predict(deepspeed_setup(REPO / ds_json, "bert", preset, seq, micro_batch=micro, world_size=1,
                                   device="cuda"))["peak"]
    got = end["peak_device_bytes"]
    return [f"  peak GPU memory {got / 2**30:.2f} GiB; memory model {pred / 2**30:.2f} GiB (measured / predicted "
            f"{got / pred:.2f}; target 0.85-1.15: {_mark(0.85 <= got / pred <= 1.15)})"]


def _profile_lines(out: Path, name: str) -> list[str]:
    summary = out / name / "profile" / "summary_rank0.txt"
    if not summary.is_file():
        return []
    return ["  profile: " + x for x in summary.read_text().splitlines()[:2]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="the folder gpu_check.sh wrote")
    ap.add_argument("--steps", type=int, default=60, help="pipeline steps run (default: %(default)s)")
    ap.add_argument("--seq", type=int, default=512, help="pipeline sequence length (default: %(default)s)")
    ap.add_argument("--preset", default="base", help="pipeline preset (default: %(default)s)")
    ap.add_argument("--ds-config", default="ds_configs/a100_bf16.json",
                    help="the pipeline arms' DeepSpeed JSON, for the memory model (default: %(default)s)")
    a = ap.parse_args(argv)
    out: Path = a.out
    lines = ["== summary (targets from the GPU-speed issue)"]
    pt = out / "pytest.txt"
    lines.append(f"gpu tests: {pt.read_text().strip().splitlines()[-1] if pt.is_file() else 'not run'}")
    for dt in ("fp16", "bf16"):
        d = _load(out / f"bench_skill_ffn_{dt}.json")
        if d:
            for i, (name, s) in enumerate(d["per_shape"].items()):
                per_k = ", ".join(f"k={r['k']} {r['fused_over_dense']:.2f}" for r in s["rows"])
                worst = max(r["fused_over_dense"] for r in s["rows"])
                rated = f" (target <= 1.10: {_mark(worst <= 1.10)})" if i == 0 else " (not rated: see bench/skill_ffn.py)"
                gf = max(r["dense_gflops"] for r in s["rows"]) / 1e3
                lines.append(f"skill FFN {dt} {name} ({s['tokens']} tokens): fused/dense worst {worst:.3f} [{per_k}]; "
                             f"dense up to {gf:.0f} TFLOP/s{rated}")
        g = _load(out / f"bench_generate_{dt}.json")
        if g:
            ok = g["generate_over_dense"] >= 0.95 and g["train_over_dense"] >= 0.95
            lines.append(f"SkillNet-BART {dt}: generate/dense {g['generate_over_dense']:.3f} ({g['worst_generate']}), "
                         f"train/dense {g['train_over_dense']:.3f} ({g['worst_train']}) (target >= 0.95: {_mark(ok)})")
    b = _load(out / "bench_pretrain.json")
    if b:
        lines.append(
            f"pre-training step, {b['preset']} seq {b['seq']} batch {b['batch']} {b['dtype']} on {b['device']}: "
            f"SkillNet+MaskedAdamW / dense+fused AdamW {b['skillnet_over_dense']:.3f} (target >= 0.95: "
            f"{_mark(b['skillnet_over_dense'] >= 0.95)}); model step alone {b.get('model_step_over_dense', float('nan')):.3f}")
        if "mfu_datasheet" in b:
            lines.append(f"  MFU vs the datasheet's {b['datasheet_tflops']:.0f} TFLOP/s: SkillNet {b['mfu_datasheet']:.3f} "
                         f"(target >= 0.40: {_mark(b['mfu_datasheet'] >= 0.40)}), dense {b['mfu_dense_datasheet']:.3f}; "
                         f"vs a measured {b['matmul_peak_gflops'] / 1e3:.0f} TFLOP/s matmul: {b['mfu']:.3f}")
        if "optimizer_ms" in b:
            o = b["optimizer_ms"]
            ok = b["masked_over_fused_mlm"] <= 1.1 and b["masked_over_fused_nsp"] <= 1.1
            lines.append(f"  optimizer step alone: MaskedAdamW MLM {o['masked_mlm']:.2f} ms, NSP {o['masked_nsp']:.2f} ms; "
                         f"fused AdamW {o['fused_mlm']:.2f} / {o['fused_nsp']:.2f} ms; ratio MLM "
                         f"{b['masked_over_fused_mlm']:.2f}, NSP {b['masked_over_fused_nsp']:.2f} (target <= 1.1: {_mark(ok)})")
    else:
        lines.append("pre-training step bench: not run")
    arms = {"pipeline": "SkillNet", "pipeline_compile": "SkillNet --compile",
            "pipeline_json": "SkillNet --zero_comm json", "pipeline_dense": "dense BERT"}
    figs = {n: pipeline_figures(out, n) for n in arms}
    for name, label in arms.items():
        p = figs[name]
        if p is None:
            lines.append(f"{name}: not run (no {out / name / 'log.jsonl'} with three logged windows)")
            continue
        padded = p["micro"] * a.seq / p["seconds_per_step"]
        p["padded"] = padded
        lines.append(f"{name} ({label}; deepspeed pretrain/run.py, {p['steps']} steps, micro {p['micro']} x seq "
                     f"{a.seq}): {padded:,.0f} padded tokens/s ({p['tokens_per_s']:,.0f} non-padding), "
                     f"{p['seconds_per_step'] * 1e3:.0f} ms/step over {p['windows']} windows")
        lines += _profile_lines(out, name)
        if name != "pipeline_dense":
            lines += _memory_line(out, name, a.ds_config, a.preset, a.seq, p["micro"])
        if name == "pipeline_dense":
            for other in ("pipeline", "pipeline_compile", "pipeline_json"):
                if figs[other]:
                    lines.append(f"  {other} / dense pipeline: {figs[other]['padded'] / padded:.3f}")
            continue
        if b and "dense_step_tokens_per_s" in b:
            r = padded / b["dense_step_tokens_per_s"]
            lines.append(f"  / dense model step alone ({b['dense_step_tokens_per_s']:,.0f} tokens/s): {r:.3f} "
                         f"(target >= 0.85: {_mark(r >= 0.85)})")
        if b and "datasheet_tflops" in b:
            mfu = padded * _flops_per_token(a.preset, a.seq) / (b["datasheet_tflops"] * 1e12)
            lines.append(f"  MFU vs the datasheet: {mfu:.3f} (target >= 0.40: {_mark(mfu >= 0.40)})")
    lines += corpus_lines(out, a.preset, a.seq, b.get("datasheet_tflops") if b else None)
    print("\n".join(lines))
    return 0


def real_flops_per_token(shards: Path, preset: str, seq: int, samples: int = 2048) -> float:
    """Matmul FLOPs (forward + backward) per real token of the 50/50 MLM/NSP mix on these shards, counted as
    the model computes packed rows on a GPU: each sample's own tokens, attention over its own length (the
    variable-length kernel), the MLM head at the masked positions."""
    import numpy as np  # noqa: PLC0415
    from skillnet.experiments.benchdoc import encoder_step_flops  # noqa: PLC0415
    from skillnet.model import SkillNetBertConfig  # noqa: PLC0415
    from skillnet.pretrain.dataset import PretrainingDataset  # noqa: PLC0415

    cfg = SkillNetBertConfig.preset(preset)
    ds = PretrainingDataset(shards, max_seq_len=seq, verify="size")
    idx = np.random.default_rng(0).permutation(len(ds))[:samples].tolist()
    flops = tokens = 0.0
    for o in ("mlm", "nsp"):
        b = ds.batch(idx, 0, o)
        lens = b["attention_mask"].sum(1)
        masked = int((b["labels"] != -100).sum()) if o == "mlm" else 0
        W = len(cfg.task_skill_names(o)) * cfg.intermediate_size
        flops += encoder_step_flops(cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size, W, int(lens.sum()),
                                    int((lens**2).sum()), o, masked, len(idx))
        tokens += float(lens.sum())
    return flops / tokens


def corpus_lines(out: Path, preset: str, seq: int, datasheet_tflops: float | None) -> list[str]:
    """The packaged-corpus arms: real tokens/s, the real share of the rows, and MFU on real tokens."""
    arms = {"corpus_packed": "packed rows", "corpus_unpacked": "--no-packing", "v100_fp16": "ds_configs/v100_fp16.json"}
    lines: list[str] = []
    per_token = None
    if (out / "shards" / "manifest.json").is_file():
        per_token = real_flops_per_token(out / "shards", preset, seq)
    for name, label in arms.items():
        p = pipeline_figures(out, name)
        if p is None:
            lines.append(f"{name}: not run (no {out / name / 'log.jsonl'} with three logged windows)")
            continue
        recs = [json.loads(x) for x in (out / name / "log.jsonl").read_text().splitlines() if '"train"' in x]
        shares = [r["real_token_share"] for r in recs[2:] or recs[-1:] if "real_token_share" in r]
        share = f"{statistics.mean(shares):.1%}" if shares else "n/a"
        line = (f"{name} ({label}, packaged corpus, seq {seq}): {p['tokens_per_s']:,.0f} real tokens/s, real share "
                f"{share}, {p['seconds_per_step'] * 1e3:.0f} ms/step")
        if per_token and datasheet_tflops and name != "v100_fp16":
            mfu = p["tokens_per_s"] * per_token / (datasheet_tflops * 1e12)
            line += f"; real-token MFU {mfu:.3f} (target >= 0.40: {_mark(mfu >= 0.40)})"
        lines.append(line)
    return lines


if __name__ == "__main__":
    sys.exit(main())
