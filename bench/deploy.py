"""Deployment bench: a reproduction's tasks as stock transformers models (``export --plain``) against the sparse model.

For the first seed's SkillNet-NLU export of a reproduction, every task is exported with ``export --plain`` (each
export measures its own equality on the task's test set, and a CRF task the agreement of argmax with Viterbi
and both entity F1s); the first seed's SkillNet-NLG export gives its default task. Then, arms interleaved
(sparse, plain, sparse, plain, ...) so machine load hits both alike, median of the per-repetition ratios:

* BERT: forward throughput of one classification task at each ``--batches`` size and ``--seq`` tokens, on the
  reproduction's model size and on each preset of ``--presets`` (random weights, the export's tasks): the sparse
  model, the plain model, and its ONNX fp32 and dynamic int8 sessions (``export --plain --onnx``, ONNX Runtime
  on the CPU); every task's export also scores sparse, plain, ONNX fp32 and int8 on its test set;
* BART: beam-search generation time of the default task on its test inputs (the plain model runs the
  zero-padded layers at the skill layers' width, so it may be slower: this says by how much).

``plain_over_sparse``, ``onnx_over_sparse`` and ``int8_over_sparse`` are each arm's throughput over the sparse
model's at the worst measured BERT configuration, ``plain_over_sparse_generate`` the same for BART generation, and
``int8_score_drop`` the sparse model's test score minus the int8 model's, per task (the task's metric).

    python bench/deploy.py --run runs/reproduce-quick                   # table
    python bench/deploy.py --run runs/reproduce-quick --json --write    # + JSON last line, docs/deploy.md section
    python bench/deploy.py --presets base                                # + BERT-base shapes (minutes on a CPU)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from skillnet.experiments.benchdoc import interleaved, machine_line, md_table, paired_ratio, write_section  # noqa: E402

DOC = Path(__file__).resolve().parent.parent / "docs" / "deploy.md"


def _exports(run: Path) -> tuple[Path, Path]:
    """The first seed's SkillNet exports of a reproduction (NLU, NLG)."""
    nlu, nlg = (run / "compare" / f"{s}_main" / "skillnet" / "seed0" / "export" for s in ("nlu", "nlg"))
    for p in (nlu, nlg):
        if not (p / "config.json").is_file():
            raise SystemExit(f"error: {p}: no SkillNet export (run the reproduction first, or pass --nlu/--nlg)")
    return nlu, nlg


def _timed(fn: Any) -> Any:
    def run() -> float:
        t0 = time.perf_counter()
        with torch.inference_mode():
            fn()
        return time.perf_counter() - t0
    return run


def bert_speed(model: Any, task: str, batches: list[int], seq: int, warmup: int, reps: int, onnx_dir: Path | None,
               tok: Any) -> list[dict[str, Any]]:
    """Forward time of the sparse model, the plain model and (with `onnx_dir`) its ONNX fp32 and int8 sessions."""
    from skillnet.model.plain import plain_bert

    plain = plain_bert(model, task).model
    arms: dict[str, Any] = {"plain": plain}
    if onnx_dir is not None:
        from skillnet.pretrain.plain_onnx import OrtModel, export_onnx

        onnx_dir.mkdir(parents=True, exist_ok=True)
        arms.update({k: OrtModel(p) for k, p in export_onnx(plain, onnx_dir, tok).items()})
    rows = []
    for b in batches:
        g = torch.Generator().manual_seed(b)
        ids = torch.randint(104, model.config.vocab_size, (b, seq), generator=g)
        x = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
        fns = {"sparse": _timed(lambda x=x: model(task=task, **x))}
        fns.update({k: _timed(lambda m=m, x=x: m(**x)) for k, m in arms.items()})
        t = interleaved(fns, warmup, reps)
        row: dict[str, Any] = {"batch": b, "seq": seq, **{f"{k}_ms": 1e3 * min(v) for k, v in t.items()}}
        for k in arms:  # time ratio = throughput ratio
            row.update(paired_ratio(t["sparse"], t[k], f"{'onnx' if k == 'fp32' else k}_over_sparse"))
        rows.append(row)
    return rows


def bart_speed(sparse: Any, plain: Any, task: str, sources: list[str], tok: Any, warmup: int, reps: int
               ) -> dict[str, Any]:
    gen = plain.generation_config
    enc = tok(sources, return_tensors="pt", padding=True, truncation=True)
    enc = {k: v for k, v in enc.items() if k != "token_type_ids"}
    t = interleaved({"sparse": _timed(lambda: sparse.generate(**enc, task=task, generation_config=gen)),
                     "plain": _timed(lambda: plain.generate(**enc, generation_config=gen))}, warmup, reps)
    return {"batch": len(sources), **paired_ratio(t["sparse"], t["plain"], "plain_over_sparse_generate")}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from skillnet.model import SkillNetBertConfig, SkillNetBertForMultiTask
    from skillnet.pretrain.plain_export import export_plain
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    nlu, nlg = (Path(args.nlu), Path(args.nlg)) if args.nlu else _exports(Path(args.run))
    tmp = Path(tempfile.mkdtemp(prefix="deploy_bench_"))
    cfg = json.loads((nlu / "config.json").read_text(encoding="utf-8"))
    tasks = {}
    for task in cfg["task_heads"]:
        export_plain(nlu, tmp / task, task, onnx=args.onnx)
        tasks[task] = json.loads((tmp / task / "plain_export.json").read_text(encoding="utf-8"))
    sizes: dict[str, Any] = {"reproduction": SkillNetBertForMultiTask.from_pretrained(str(nlu)).eval()}
    for p in args.presets:
        torch.manual_seed(0)
        keep = {k: cfg[k] for k in ("skills", "tasks", "generic_skill", "task_heads", "skill_layers")}
        sizes[p] = SkillNetBertForMultiTask(SkillNetBertConfig.preset(p, **keep)).eval()
    task = next(t for t, h in cfg["task_heads"].items() if h["type"] == "classification")
    tok = AutoTokenizer.from_pretrained(str(nlu))
    speed = {name: bert_speed(m, task, args.batches, args.seq, args.warmup, args.reps,
                              tmp / f"onnx_{name}" if args.onnx else None, tok) for name, m in sizes.items()}
    gen_task = json.loads((nlg / "config.json").read_text(encoding="utf-8"))["default_task"]
    export_plain(nlg, tmp / "nlg", gen_task)
    nlg_facts = json.loads((tmp / "nlg" / "plain_export.json").read_text(encoding="utf-8"))
    from skillnet.pretrain.plain_export import _load_source

    sparse_bart, _ = _load_source(nlg)
    plain_bart = AutoModelForSeq2SeqLM.from_pretrained(str(tmp / "nlg")).eval()
    gen_tok = AutoTokenizer.from_pretrained(str(tmp / "nlg"))
    sources = [nlg_facts.get("prefix", "") + s for s in ("今天天气很好，我们去公园散步。", "他跑得非常快", "我想喝一杯茶水")]
    gen_speed = bart_speed(sparse_bart, plain_bart, gen_task, sources, gen_tok, args.warmup, args.reps)
    rows = [r for rs in speed.values() for r in rs]
    worst = {k: min(r[k] for r in rows) for k in ("plain_over_sparse", "onnx_over_sparse", "int8_over_sparse")
             if k in rows[0]}
    drops = {t: f["onnx"]["int8_score_drop"] for t, f in tasks.items() if "int8_score_drop" in f.get("onnx", {})}
    return {**worst, **({"int8_score_drop": drops} if args.onnx else {}),
            "onnx_max_abs_diff": max((f["onnx"]["fp32"]["max_abs_diff"] for f in tasks.values() if "onnx" in f),
                                     default=None),
            "plain_over_sparse_generate": gen_speed["plain_over_sparse_generate"],
            "max_abs_diff": max(f["equality"]["max_abs_diff"] for f in [*tasks.values(), nlg_facts]),
            "argmax_equal": all(f["equality"]["argmax_equal"] for f in tasks.values()),
            "beam_equal": f"{nlg_facts['equality']['beam_equal']}/{nlg_facts['equality']['inputs']}",
            "crf": {t: f["crf"] for t, f in tasks.items() if f.get("crf")},
            "tasks": tasks, "generation": nlg_facts, "bert_speed": speed, "generate_speed": gen_speed,
            "speed_task": task, "generate_task": gen_task, "sources": {"nlu": nlu.name, "nlg": nlg.name}}


def render(res: dict[str, Any], args: argparse.Namespace) -> str:
    def onnx_cols(f: dict[str, Any]) -> tuple[str, str, str]:
        ox = f.get("onnx") or {}
        if not ox:
            return "-", "-", "-"
        sc = ox.get("scores")
        score = (f"{ox['metric']} {sc['sparse']:.2f} / {sc['plain']:.2f} / {sc['fp32']:.2f} / {sc['int8']:.2f}"
                 if isinstance(sc, dict) else "-")
        return f"{ox['fp32']['max_abs_diff']:.1e}", score, f"{ox['int8_score_drop']:.2f}" if "int8_score_drop" in ox else "-"

    rows = [(f"`{t}`", f["class"], ", ".join(s["name"] for s in f["skills"]), f["measured_on"],
             f"{f['equality']['max_abs_diff']:.1e}", "yes" if f["equality"]["argmax_equal"] else "**no**", *onnx_cols(f))
            for t, f in res["tasks"].items()]
    g = res["generation"]
    rows.append((f"`{res['generate_task']}`", g["class"], ", ".join(s["name"] for s in g["skills"]), g["measured_on"],
                 f"{g['equality']['max_abs_diff']:.1e}",
                 f"beams {g['equality']['beam_equal']}/{g['equality']['inputs']} equal", "-", "-", "-"))
    out = [machine_line(), "", f"`python bench/deploy.py {' '.join(args.argv)}`", "",
           "### Equality (each export's own measurement)", "",
           md_table(["task", "stock class", "merged skills", "measured on", "max abs logit diff (fp32)", "argmax equal",
                     "ONNX fp32 max abs diff", "test score: sparse / plain / ONNX fp32 / int8", "int8 score drop"],
                    rows), ""]
    for t, c in res["crf"].items():
        out += [f"### CRF `{t}`", "",
                f"On {c['sentences']} sentences: argmax equals the Viterbi path for {100 * c['sentence_agreement']:.1f}% "
                f"of sentences ({100 * c['token_agreement']:.1f}% of tokens); entity F1 {c['viterbi_f1']:.2f} with "
                f"Viterbi, {c['argmax_f1']:.2f} with argmax"
                + (f": **argmax loses {c['viterbi_f1'] - c['argmax_f1']:.2f} points, decode with Viterbi**."
                   if c["argmax_loses_over_1_point"] else "."), ""]
    arms = [k for k in ("plain", "onnx", "int8") if f"{k}_over_sparse" in next(iter(res["bert_speed"].values()))[0]]

    def ratio(r: dict[str, Any], k: str) -> str:
        return f"{r[k]:.2f} ({r[k + '_min']:.2f}-{r[k + '_max']:.2f})"

    speed_rows = [(size, r["batch"], r["seq"], f"{r['sparse_ms']:.1f}",
                   *(ratio(r, f"{a}_over_sparse") for a in arms)) for size, rs in res["bert_speed"].items() for r in rs]
    gs = res["generate_speed"]
    out += [f"### Speed (task `{res['speed_task']}` forward; `{res['generate_task']}` beam search)", "",
            md_table(["model size", "batch", "tokens", "sparse ms (best)",
                      *(f"{a} / sparse throughput (range)" for a in arms)], speed_rows), "",
            f"Generation ({gs['batch']} inputs, the export's generation config): plain / sparse throughput "
            f"{gs['plain_over_sparse_generate']:.2f} ({gs['plain_over_sparse_generate_min']:.2f}-"
            f"{gs['plain_over_sparse_generate_max']:.2f}).", "",
            "Worst measured: " + ", ".join(f"`{k}` = {res[k]}" for k in (
                "plain_over_sparse", "onnx_over_sparse", "int8_over_sparse", "plain_over_sparse_generate") if k in res)
            + "."]
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/deploy.py", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/reproduce-quick", help="a reproduction's output folder (default: %(default)s)")
    p.add_argument("--nlu", help="a SkillNet-NLU export instead of the run's first seed (with --nlg)")
    p.add_argument("--nlg", help="a SkillNet-NLG export instead of the run's first seed (with --nlu)")
    p.add_argument("--presets", type=lambda s: [x for x in s.split(",") if x], default=[],
                   help="also time BERT at these presets' shapes, comma-separated, e.g. base (default: none)")
    p.add_argument("--batches", type=lambda s: [int(x) for x in s.split(",")], default=[1, 32],
                   help="BERT batch sizes (default: 1,32)")
    p.add_argument("--seq", type=int, default=128, help="BERT tokens per row (default: %(default)s)")
    p.add_argument("--warmup", type=int, default=1, help="untimed calls of each arm first (default: %(default)s)")
    p.add_argument("--reps", type=int, default=5, help="timed rounds, arms interleaved (default: %(default)s)")
    p.add_argument("--no-onnx", dest="onnx", action="store_false",
                   help="skip the ONNX fp32 / int8 arms (they need the deploy extra)")
    p.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    p.add_argument("--json", action="store_true", help="print one JSON line last")
    p.add_argument("--write", action="store_true", help=f"rewrite the bench section of {DOC.name}")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    if bool(args.nlu) != bool(args.nlg):
        raise SystemExit("error: --nlu and --nlg go together")
    args.argv = [a for a in argv if a not in ("--json", "--write")]
    if args.threads:
        torch.set_num_threads(args.threads)
    res = run(args)
    body = render(res, args)
    print(body)
    if args.write:
        write_section(DOC, "deploy", body)
    if args.json:
        keys = ("plain_over_sparse", "onnx_over_sparse", "int8_over_sparse", "int8_score_drop", "plain_over_sparse_generate",
                "max_abs_diff", "onnx_max_abs_diff", "argmax_equal", "beam_equal", "crf")
        print(json.dumps({k: res[k] for k in keys if k in res}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
