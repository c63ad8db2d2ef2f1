"""Initialisation sweep: how the init std decides whether a small SkillNet model learns at all.

Two probes, each trained from scratch for a fixed number of steps per std, CPU fp32, one seed:

* BART copy: SkillNet-BART (d_model ``--width``, 2+2 layers, the 21,128-token vocabulary, tied
  embeddings as shipped) learns to copy random Chinese character strings of 8-16 characters. Reported:
  greedy exact match on 64 held-out strings, and how many distinct outputs those 64 inputs produced.
  A model stuck at the init plateau answers every input with the same text.
* BERT MLM: SkillNet-BERT (hidden ``--width``, 2 layers) on the packaged Chinese text (People's Daily
  1998-01 + insuranceqa answers) in the compact vocab of the CPU profiles (the entries the text uses),
  ``--bert-seq``-token windows, 15% of tokens masked. Reported: masked-token accuracy on held-out
  windows, beside the accuracy of always predicting the most frequent token.

The std values are given directly (``--stds``) and the width rule of the configs (std = d^-0.5 below
d = 768, the papers' 0.02 from 768 up) is marked in the table.

    python bench/init_sweep.py                     # both probes, width 128, four stds (~15 min on 2 cores)
    python bench/init_sweep.py --json              # table, then one JSON object (last line)
    python bench/init_sweep.py --write             # also rewrite its sections of docs/model.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from skillnet.experiments.benchdoc import machine_line, md_table, write_section  # noqa: E402
from skillnet.model import (  # noqa: E402
    SkillNetBartConfig,
    SkillNetBartForConditionalGeneration,
    SkillNetBertConfig,
    SkillNetBertForPreTraining,
)
from skillnet.model.config import width_init_std  # noqa: E402

DOC = "docs/model.md"
CJK = (670, 7992)  # the single CJK characters of the bert-base-chinese vocab
PAD, CLS, SEP, MASK = 0, 101, 102, 103


def _step(model: torch.nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor, step: int, steps: int,
          lr: float) -> float:
    """One AdamW step at the schedule's lr (10% linear warm-up, then constant), gradients clipped to 1."""
    for group in opt.param_groups:
        group["lr"] = lr * min(1.0, (step + 1) / max(1, steps // 10))
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss.item()


def bart_copy(width: int, std: float, steps: int, lr: float, seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    cfg = SkillNetBartConfig.preset(
        "tiny", d_model=width, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=2 * width, decoder_ffn_dim=2 * width,
        dropout=0.0, attention_dropout=0.0, init_std=std,
    )
    model = SkillNetBartForConditionalGeneration(cfg)
    task = next(iter(cfg.tasks))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(seed + 1)

    def batch(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        lens = torch.randint(8, 17, (n,), generator=g)
        x = torch.full((n, 18), PAD)
        for i, n_i in enumerate(lens.tolist()):
            x[i, 0] = CLS
            x[i, 1:n_i + 1] = torch.randint(*CJK, (n_i,), generator=g)
            x[i, n_i + 1] = SEP
        return x, x.ne(PAD).long()

    test_x, test_m = batch(64)
    t0 = time.perf_counter()
    model.train()
    loss = float("nan")
    for step in range(steps):
        x, m = batch(16)
        out = model(input_ids=x, attention_mask=m, labels=x.masked_fill(m.eq(0), -100), task=task)
        loss = _step(model, opt, out.loss, step, steps, lr)
    train_s = time.perf_counter() - t0
    model.eval()
    with torch.inference_mode():
        gen = model.generate(input_ids=test_x, attention_mask=test_m, task=task, num_beams=1, do_sample=False,
                             max_new_tokens=20)
    outs, exact = [], 0
    for row, src in zip(gen.tolist(), test_x.tolist()):
        toks = [t for t in row[1:] if t != PAD]  # drop the decoder start
        want = [t for t in src if t != PAD]
        exact += toks[: len(want)] == want and (len(toks) == len(want) or toks[len(want)] in (SEP, PAD))
        outs.append(tuple(toks))
    return {"loss": round(loss, 3), "exact_match": round(exact / len(outs), 3), "distinct": len(set(outs)),
            "n": len(outs), "train_s": round(train_s, 1)}


def _mlm_windows(seq: int, n_train: int, n_test: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Train and test windows of the packaged text in the compact vocab of the CPU profiles (the special
    block, then the entries the text uses: `data_prep vocab`'s rule), and that vocab's size."""
    from skillnet.data_prep.sample_corpus import packaged_chinese_docs
    from skillnet.data_prep.tokenizer import load_tokenizer

    docs = packaged_chinese_docs()
    tok = load_tokenizer()
    need = (n_train + n_test) * (seq - 2)
    ids: list[int] = []
    for start in range(0, len(docs), 2000):
        for chunk in tok.encode_batch(docs[start:start + 2000]):
            ids += chunk
        if len(ids) > need:
            break
    if len(ids) < need:
        raise SystemExit(f"error: the packaged text has {len(ids):,} tokens, fewer than the {need:,} asked for")
    body = torch.tensor(ids[:need]).view(-1, seq - 2)
    keep = torch.cat([torch.arange(MASK + 1), body.unique()[body.unique() > MASK]])
    remap = torch.full((tok.vocab_size,), -1, dtype=torch.long)
    remap[keep] = torch.arange(len(keep))
    body = remap[body]
    x = torch.cat([torch.full((len(body), 1), CLS), body, torch.full((len(body), 1), SEP)], dim=1)
    return x[:n_train], x[n_train:], len(keep)


def _mask(x: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    pick = (torch.rand(x.shape, generator=g) < 0.15) & x.ne(CLS) & x.ne(SEP)
    return x.masked_fill(pick, MASK), x.masked_fill(~pick, -100)


def bert_mlm(width: int, std: float, steps: int, lr: float, data: tuple[torch.Tensor, torch.Tensor, int],
             batch: int, seed: int = 0) -> dict[str, Any]:
    torch.manual_seed(seed)
    train, test, vocab = data
    cfg = SkillNetBertConfig.preset(
        "tiny", vocab_size=vocab, hidden_size=width, num_hidden_layers=2, num_attention_heads=4, intermediate_size=2 * width,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, initializer_range=std,
    )
    model = SkillNetBertForPreTraining(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    g = torch.Generator().manual_seed(seed + 1)
    t0 = time.perf_counter()
    model.train()
    loss = float("nan")
    for step in range(steps):
        rows = torch.randint(0, len(train), (batch,), generator=g)
        x, labels = _mask(train[rows], g)
        out = model(task="mlm", input_ids=x, attention_mask=torch.ones_like(x),
                    token_type_ids=torch.zeros_like(x), labels=labels)
        loss = _step(model, opt, out.loss, step, steps, lr)
    train_s = time.perf_counter() - t0
    model.eval()
    gt = torch.Generator().manual_seed(1234)
    x, labels = _mask(test, gt)
    with torch.inference_mode():
        out = model(task="mlm", input_ids=x, attention_mask=torch.ones_like(x), token_type_ids=torch.zeros_like(x),
                    labels=labels)
    acc = out.metrics["mlm_correct"] / out.metrics["mlm_count"]
    return {"loss": round(loss, 3), "masked_acc": round(acc, 4), "train_s": round(train_s, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--width", type=int, default=128, help="d_model / hidden size (default: %(default)s)")
    p.add_argument("--stds", default="0.02,0.044,0.125",
                   help="comma-separated init stds; the width rule's value is added (default: %(default)s)")
    p.add_argument("--bart-steps", type=int, default=600, help="copy-task steps per std (default: %(default)s)")
    p.add_argument("--bert-steps", type=int, default=1000, help="MLM steps per std (default: %(default)s)")
    p.add_argument("--bert-batch", type=int, default=32, help="MLM batch (default: %(default)s)")
    p.add_argument("--bert-seq", type=int, default=128, help="MLM window length (default: %(default)s)")
    p.add_argument("--lr", type=float, default=1e-3, help="peak AdamW lr, 10%% warm-up (default: %(default)s)")
    p.add_argument("--probes", default="bart,bert", help="subset of bart,bert (default: %(default)s)")
    p.add_argument("--write", nargs="?", const=DOC, metavar="MD",
                   help=f"rewrite the 'init_sweep_bart'/'init_sweep_bert' sections of this Markdown file (default: {DOC})")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    args = p.parse_args(argv)
    rule = width_init_std(args.width)
    try:
        stds = sorted({float(s) for s in args.stds.split(",")} | {round(rule, 4)})
    except ValueError:
        p.error(f"--stds: expected comma-separated numbers, got {args.stds!r}")
    probes = set(args.probes.split(","))
    if not probes <= {"bart", "bert"}:
        p.error(f"--probes: unknown {','.join(sorted(probes - {'bart', 'bert'}))}")
    print(f"width {args.width}; the config rule gives std {rule:.4f}; lr {args.lr}; CPU fp32, "
          f"{torch.get_num_threads()} threads", flush=True)
    data = _mlm_windows(args.bert_seq, 4000, 200) if "bert" in probes else None
    if data is not None:
        print(f"BERT MLM: windows of {args.bert_seq} tokens in a compact vocab of {data[2]:,} entries", flush=True)
        flat = data[1][:, 1:-1].reshape(-1)
        majority = flat.bincount().max().item() / flat.numel()
        print(f"BERT MLM: most-frequent-token accuracy on the held-out windows {majority:.4f}", flush=True)
    rows = []
    for std in stds:
        row: dict[str, Any] = {"std": std, "rule": abs(std - round(rule, 4)) < 1e-9}
        if "bart" in probes:
            row["bart"] = bart_copy(args.width, std, args.bart_steps, args.lr)
        if "bert" in probes:
            row["bert"] = bert_mlm(args.width, std, args.bert_steps, args.lr, data, args.bert_batch)
        rows.append(row)
        print(json.dumps(row), flush=True)
    result: dict[str, Any] = {"width": args.width, "rule_std": round(rule, 4), "lr": args.lr,
                              "bart_steps": args.bart_steps, "bert_steps": args.bert_steps, "rows": rows}
    if data is not None:
        result["mlm_majority_acc"] = round(majority, 4)
    if args.write:
        # One section per probe, so a run of one probe rewrites its own table only.
        cmd = (f"`python bench/init_sweep.py --width {args.width} --stds {args.stds} --bart-steps {args.bart_steps} "
               f"--bert-steps {args.bert_steps} --lr {args.lr} --probes {args.probes} --write` (one seed; AdamW, "
               f"10% warm-up). {machine_line()}")
        name = {True: " (rule)", False: ""}
        if "bart" in probes:
            table = md_table(
                ["init std", f"loss after {args.bart_steps} steps", "exact match (64 held out)", "distinct outputs of 64"],
                [(f"{r['std']:g}{name[r['rule']]}", r["bart"]["loss"], r["bart"]["exact_match"], r["bart"]["distinct"])
                 for r in rows])
            write_section(args.write, "init_sweep_bart", f"BART copy, width {args.width}, batch 16. {cmd}\n\n{table}")
        if "bert" in probes:
            cmd = cmd.replace("--write`", f"--bert-batch {args.bert_batch} --bert-seq {args.bert_seq} --write`")
            table = md_table(
                ["init std", f"loss after {args.bert_steps} steps", "masked-token accuracy"],
                [(f"{r['std']:g}{name[r['rule']]}", r["bert"]["loss"], r["bert"]["masked_acc"]) for r in rows])
            write_section(args.write, "init_sweep_bert",
                          f"BERT MLM, width {args.width}, batch {args.bert_batch} x {args.bert_seq} tokens, the "
                          f"compact vocab of the text ({data[2]:,} entries). {cmd}\n\n{table}\n\nAlways predicting the most frequent "
                          f"token scores {majority:.4f} masked-token accuracy on the same held-out windows.")
    if args.json:
        print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
