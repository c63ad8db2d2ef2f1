"""Deployment bench: a reproduction's tasks as stock transformers models (``export --plain``) against the sparse model.

For the first seed's SkillNet-NLU export of a reproduction, every task is exported with ``export --plain`` (each
export measures its own equality on the task's test set, and a CRF task the agreement of argmax with Viterbi
and both entity F1s); the first seed's SkillNet-NLG export gives its default task. Then, arms interleaved
(sparse, plain, sparse, plain, ...) so machine load hits both alike, median of the per-repetition ratios:

* BERT: forward throughput of one classification task at each ``--batches`` size and ``--seq`` tokens, on the
  reproduction's model size and on each preset of ``--presets`` (random weights, the export's tasks): the sparse
  model, the plain model, and its ONNX fp32 and dynamic int8 sessions (``export --plain --onnx``, ONNX Runtime
  on the CPU); every task's export also scores sparse, plain, ONNX fp32 and int8 on its test set;
* BART: generation time of the default task (its own decoding settings) on three fixed inputs: the sparse
  model, the plain model (its layers without skills zero-padded to the skill layers' FFN width), the same
  weights trimmed back to each layer's own width (``trim_padding``: exact, the cheaper form), and the ONNX fp32
  and int8 graphs (``export --plain --onnx``: encoder and decoder, decoded by ``ort/seq2seq.py``); at each
  ``--presets`` shape the torch arms with random weights and a fixed number of generated tokens. The default
  task's export also checks ONNX generation token for token and scores ONNX fp32 and int8 on its test set.

``plain_over_sparse``, ``onnx_over_sparse`` and ``int8_over_sparse`` are each arm's throughput over the sparse
model's at the worst measured BERT configuration; ``plain_over_sparse_generate``, ``trimmed_over_sparse_generate``,
``onnx_over_sparse_generate`` and ``int8_over_sparse_generate`` the same for BART generation, and
``padded_over_trimmed_generate`` the padded plain model's throughput over the trimmed one's (what the zero padding
costs); ``int8_score_drop`` is the sparse model's test score minus the int8 model's, per task (the task's metric).

    python bench/deploy.py --run runs/reproduce-quick                   # table
    python bench/deploy.py --run runs/reproduce-quick --json --write    # + JSON last line, docs/deploy.md section
    python bench/deploy.py --presets full,base                           # + full-profile and base shapes (minutes)
"""

from __future__ import annotations

import argparse
import copy
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


def _config(cls: Any, name: str, part: str, keep: dict[str, Any]) -> Any:
    """`cls` at a model preset's shape (tiny, small, base, large) or at a reproduction profile's (quick, full:
    its `part`, bert or bart, on the tiny preset's vocabulary and positions)."""
    from skillnet.experiments.profiles import PROFILES

    if name in cls.presets:
        return cls.preset(name, **keep)
    if name in PROFILES and getattr(PROFILES[name], part):
        return cls.preset("tiny", **getattr(PROFILES[name], part), **keep)
    raise SystemExit(f"error: --presets {name}: neither a preset ({', '.join(cls.presets)}) nor a profile with its own "
                     f"sizes ({', '.join(k for k, v in PROFILES.items() if getattr(v, part))})")


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
    from skillnet.export.flatten import plain_bert

    plain = plain_bert(model, task).model
    arms: dict[str, Any] = {"plain": plain}
    if onnx_dir is not None:
        from skillnet.export.onnx_graphs import OrtModel, export_onnx

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


def bart_speed(sparse: Any, arms: dict[str, Any], task: str, sources: list[str], tok: Any, warmup: int, reps: int,
               **settings: Any) -> dict[str, Any]:
    """Generation time of the sparse model and each arm on `sources` (one batch), arms interleaved. `arms`:
    torch models (``generate``) or `OrtSeq2Seq` runners (numpy in and out). Ratios are throughput over the
    sparse model's, and ``padded_over_trimmed_generate`` the padded plain model's over the trimmed one's: what
    the zero padding costs."""
    enc = tok(sources, return_tensors="pt", padding=True, truncation=True)
    enc = {k: v for k, v in enc.items() if k != "token_type_ids"}
    gen = arms["plain"].generation_config
    fns = {"sparse": _timed(lambda: sparse.generate(**enc, task=task, generation_config=gen, **settings))}
    for k, m in arms.items():
        if isinstance(m, torch.nn.Module):
            fns[k] = _timed(lambda m=m: m.generate(**enc, generation_config=gen, **settings))
        else:
            fns[k] = _timed(lambda m=m: m.generate(enc["input_ids"].numpy(), enc["attention_mask"].numpy(), **settings))
    t = interleaved(fns, warmup, reps)
    out: dict[str, Any] = {"batch": len(sources), "sparse_ms": 1e3 * min(t["sparse"]), **settings}
    for k in arms:
        out.update(paired_ratio(t["sparse"], t[k], f"{'onnx' if k == 'fp32' else k}_over_sparse_generate"))
    out.update(paired_ratio(t["trimmed"], t["plain"], "padded_over_trimmed_generate"))
    return out


def bart_arms(plain: Any, widths: list[int], ort_dir: Path | None, gen: dict[str, Any]) -> dict[str, Any]:
    """The plain (zero-padded) model, the same with each layer at its own width, and the ONNX runners."""
    from skillnet.export.onnx_graphs import trim_padding

    arms: dict[str, Any] = {"plain": plain, "trimmed": trim_padding(plain, widths)}
    if ort_dir is not None:
        from skillnet.export.onnx_seq2seq import OrtSeq2Seq

        arms.update({k: OrtSeq2Seq(ort_dir, int8=k == "int8", generation_config=gen) for k in ("fp32", "int8")})
    return arms


# Generated tokens at the presets' random weights: fixed (min_length above the limit, so no EOS ends a row
# early), so every arm decodes the same number of steps.
_PRESET_NEW_TOKENS = 32


def run(args: argparse.Namespace) -> dict[str, Any]:
    from skillnet.export.plain import export_plain
    from skillnet.finetune.predict import task_source
    from skillnet.model import SkillNetBertConfig, SkillNetBertForMultiTask
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    nlu, nlg = (Path(args.nlu), Path(args.nlg)) if args.nlu else _exports(Path(args.run))
    tmp = Path(tempfile.mkdtemp(prefix="deploy_bench_"))
    cfg = json.loads((nlu / "config.json").read_text(encoding="utf-8"))
    tasks = {}
    for task in cfg["task_heads"]:
        export_plain(nlu, tmp / task, task, onnx=args.onnx, task_loader=task_source)
        tasks[task] = json.loads((tmp / task / "plain_export.json").read_text(encoding="utf-8"))
    sizes: dict[str, Any] = {"reproduction": SkillNetBertForMultiTask.from_pretrained(str(nlu)).eval()}
    for p in args.presets:
        torch.manual_seed(0)
        keep = {k: cfg[k] for k in ("skills", "tasks", "generic_skill", "task_heads", "skill_layers")}
        sizes[p] = SkillNetBertForMultiTask(_config(SkillNetBertConfig, p, "bert", keep)).eval()
    task = next(t for t, h in cfg["task_heads"].items() if h["type"] == "classification")
    tok = AutoTokenizer.from_pretrained(str(nlu))
    speed = {name: bert_speed(m, task, args.batches, args.seq, args.warmup, args.reps,
                              tmp / f"onnx_{name}" if args.onnx else None, tok) for name, m in sizes.items()}
    gen_task = json.loads((nlg / "config.json").read_text(encoding="utf-8"))["default_task"]
    export_plain(nlg, tmp / "nlg", gen_task, onnx=args.onnx, task_loader=task_source)
    nlg_facts = json.loads((tmp / "nlg" / "plain_export.json").read_text(encoding="utf-8"))
    from skillnet.export.flatten import plain_bart as flatten_bart
    from skillnet.export.onnx_graphs import ORT_DIR
    from skillnet.export.plain import load_source
    from skillnet.model import SkillNetBartConfig, SkillNetBartForConditionalGeneration

    sparse_bart, _ = load_source(nlg, task_source)
    plain = AutoModelForSeq2SeqLM.from_pretrained(str(tmp / "nlg")).eval()
    gen_tok = AutoTokenizer.from_pretrained(str(tmp / "nlg"))
    sources = [nlg_facts.get("prefix", "") + s for s in ("今天天气很好，我们去公园散步。", "他跑得非常快", "我想喝一杯茶水")]
    arms = bart_arms(plain, nlg_facts["ffn_widths"], tmp / "nlg" / ORT_DIR if args.onnx else None,
                     plain.generation_config.to_dict())
    gen_speed = {"reproduction": bart_speed(sparse_bart, arms, gen_task, sources, gen_tok, args.warmup, args.reps)}
    gen_speed["reproduction"]["ffn_widths"] = nlg_facts["ffn_widths"]
    bcfg = json.loads((nlg / "config.json").read_text(encoding="utf-8"))
    for p in args.presets:  # random weights at the preset's shapes, the export's skills and tasks; torch arms only
        torch.manual_seed(0)
        keep = {k: bcfg[k] for k in ("skills", "tasks", "generic_skill", "skill_layers")}
        big = SkillNetBartForConditionalGeneration(_config(SkillNetBartConfig, p, "bart", keep)).eval()
        flat = flatten_bart(big, gen_task)
        flat.model.generation_config = copy.deepcopy(plain.generation_config)
        gen_speed[p] = bart_speed(big, bart_arms(flat.model, flat.widths, None, {}), gen_task, sources, gen_tok,
                                  args.warmup, args.reps, max_new_tokens=_PRESET_NEW_TOKENS,
                                  min_length=_PRESET_NEW_TOKENS + 2, num_beams=1)
        gen_speed[p]["ffn_widths"] = flat.widths
    rows = [r for rs in speed.values() for r in rs]
    worst = {k: min(r[k] for r in rows) for k in ("plain_over_sparse", "onnx_over_sparse", "int8_over_sparse")
             if k in rows[0]}
    gen_keys = [k for k in gen_speed["reproduction"] if k.endswith("_generate")]
    worst.update({k: min(g[k] for g in gen_speed.values() if k in g) for k in gen_keys})
    every = {**tasks, gen_task: nlg_facts}
    drops = {t: f["onnx"]["int8_score_drop"] for t, f in every.items() if "int8_score_drop" in f.get("onnx", {})}
    gen_onnx = nlg_facts.get("onnx") or {}
    return {**worst, **({"int8_score_drop": drops} if args.onnx else {}),
            "onnx_max_abs_diff": max((f["onnx"]["fp32"]["max_abs_diff"] for f in every.values() if "onnx" in f),
                                     default=None),
            **({"onnx_generate_equal": {f"{'greedy' if n == 1 else f'beams{n}'}": f"{e}/{gen_onnx['inputs']}"
                                        for n, e in zip(gen_onnx["decoders"], gen_onnx["fp32"]["generate_equal"])}}
               if gen_onnx else {}),
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
    gx = g.get("onnx") or {}
    gsc = gx.get("scores")
    rows.append((f"`{res['generate_task']}`", g["class"], ", ".join(s["name"] for s in g["skills"]), g["measured_on"],
                 f"{g['equality']['max_abs_diff']:.1e}",
                 f"beams {g['equality']['beam_equal']}/{g['equality']['inputs']} equal",
                 f"{gx['fp32']['max_abs_diff']:.1e}" if gx else "-",
                 f"{gx['metric']} {gsc['sparse']:.2f} / - / {gsc['fp32']:.2f} / {gsc['int8']:.2f}"
                 if isinstance(gsc, dict) else "-",
                 f"{gx['int8_score_drop']:.2f}" if "int8_score_drop" in gx else "-"))
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
    gens = res["generate_speed"]
    garms = [k for k in ("plain", "trimmed", "onnx", "int8") if any(f"{k}_over_sparse_generate" in r for r in gens.values())]
    gen_rows = [(size, r["batch"], "task's config" if "max_new_tokens" not in r else f"greedy, {r['max_new_tokens']} tokens",
                 f"{r['sparse_ms']:.1f}", *(ratio(r, f"{a}_over_sparse_generate") if f"{a}_over_sparse_generate" in r
                                            else "-" for a in garms), ratio(r, "padded_over_trimmed_generate"))
                for size, r in gens.items()]
    out += [f"### Speed (task `{res['speed_task']}` forward)", "",
            md_table(["model size", "batch", "tokens", "sparse ms (best)",
                      *(f"{a} / sparse throughput (range)" for a in arms)], speed_rows), "",
            f"### Generation (task `{res['generate_task']}`)", "",
            "`plain` is the stock folder (layers without skills zero-padded to the skill layers' FFN width), `trimmed` the "
            "same weights with each layer at its own width (`trim_padding`, exact), `onnx`/`int8` the ONNX graphs (traced "
            "from the trimmed form; decoder without past key values) decoded by `ort/seq2seq.py`. `padded / trimmed` is "
            "what the zero padding costs in throughput (below 1: slower). The presets' rows use random weights and "
            "torch arms only.", "",
            md_table(["model size", "batch", "decoding", "sparse ms (best)",
                      *(f"{a} / sparse throughput (range)" for a in garms), "padded / trimmed throughput (range)"],
                     gen_rows), ""]
    gx = res["generation"].get("onnx")
    if gx:
        dec = ", ".join(f"{'greedy search' if n == 1 else f'beam search ({n} beams)'} {e}/{gx['inputs']} (int8 {i}/{gx['inputs']})"
                        for n, e, i in zip(gx["decoders"], gx["fp32"]["generate_equal"], gx["int8"]["generate_equal"]))
        out += [f"ONNX fp32 generation gives the sparse model's tokens on the test inputs ({res['generation']['measured_on']}): "
                f"{dec}.", ""]
    out += ["Worst measured: " + ", ".join(f"`{k}` = {res[k]}" for k in (
        "plain_over_sparse", "onnx_over_sparse", "int8_over_sparse", "plain_over_sparse_generate",
        "trimmed_over_sparse_generate", "onnx_over_sparse_generate", "int8_over_sparse_generate",
        "padded_over_trimmed_generate") if k in res) + "."]
    return "\n".join(out)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/deploy.py", description=__doc__.split("\n\n")[0],
                                epilog=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", default="runs/reproduce-quick", help="a reproduction's output folder (default: %(default)s)")
    p.add_argument("--nlu", help="a SkillNet-NLU export instead of the run's first seed (with --nlg)")
    p.add_argument("--nlg", help="a SkillNet-NLG export instead of the run's first seed (with --nlu)")
    p.add_argument("--presets", type=lambda s: [x for x in s.split(",") if x], default=[],
                   help="also time BERT and BART generation at these shapes, comma-separated: model presets (base) or "
                        "reproduction profiles (full) (default: none)")
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
    # the measurements survive a failure to render them
    Path(tempfile.gettempdir(), "deploy_bench_result.json").write_text(json.dumps(res, default=str), encoding="utf-8")
    body = render(res, args)
    print(body)
    if args.write:
        write_section(DOC, "deploy", body)
    if args.json:
        keys = ("plain_over_sparse", "onnx_over_sparse", "int8_over_sparse", "int8_score_drop", "plain_over_sparse_generate",
                "trimmed_over_sparse_generate", "onnx_over_sparse_generate", "int8_over_sparse_generate",
                "padded_over_trimmed_generate", "max_abs_diff", "onnx_max_abs_diff", "argmax_equal", "beam_equal",
                "onnx_generate_equal", "crf")
        print(json.dumps({k: res[k] for k in keys if k in res}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
