"""The one FLOPs / GPU-hours estimator: what a reproduction profile (``--estimate``, docs/scale.md) and the
paper's pre-training recipe (``bench/projection.py``, docs/gpu.md) would cost on GPUs.

Nothing here runs on a GPU. FLOPs come two ways, which `tests/test_reproduce.py` checks against each other:

- counted: torch's ``FlopCounterMode`` over a forward + backward of the real model (`counted_flops_per_token`);
- from the sizes (`bert_flops_per_token`, `bart_flops_per_pair`), for whole profiles: forward + backward =
  3 x forward, 2 FLOPs per multiply-add, sequences at their maximum length (an upper bound).

How many FFNs a task runs is not written here per method: `activated_ffns` builds each method's model
(``finetune.methods``, tiny sizes) and asks ``model.counts.activated_parameters``, so a method's router
decides (a top-2 MoE runs 2 FFNs per token, SkillNet a task's skills, a dense model 1, a learned map the
cells its random start switches on: about 3/4 of them).
Throughput is an assumption: a data-sheet peak and a model FLOPs utilisation (MFU).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

from skillnet.experiments.nlg import NLG_FORMATS, NLG_LENGTHS, gen_tasks, nlg_test_cap, nlg_train_tasks
from skillnet.experiments.nlu import NLU_TASKS, NLU_TYPICAL_LEN
from skillnet.experiments.profiles import LOSS_SCALE_METHODS, Profile

# Dense tensor-core peaks from the data sheets (SXM parts), FLOP/s.
GPU_PEAKS = {"V100 fp16": 125e12, "A100 bf16": 312e12}
# A model FLOPs utilisation typical of BERT/BART training with mixed precision.
ASSUMED_MFU = 0.30


# ------------------------------------------------------------------------------------------- from the sizes
def bert_flops_per_token(c: dict[str, Any], seq: int, k: float, mlm: bool = False) -> float:
    """Training FLOPs per token (forward + backward = 3 x forward, 2 FLOPs per multiply-add): attention
    projections 4d^2 and k skill FFNs 2*d*f per layer, attention scores 4*seq*d per layer, and the MLM
    decoder d*V on BERT's 15% masked positions."""
    d, f, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    fwd = 2 * L * (4 * d * d + k * 2 * d * f) + L * 4 * seq * d + (2 * 0.15 * d * V if mlm else 0)
    return 3 * fwd


def bart_flops_per_pair(c: dict[str, Any], src: int, tgt: int, k: float) -> float:
    """Training FLOPs of one (source, target) pair: encoder layers over src tokens, decoder layers (self and
    cross attention) over tgt tokens, the LM head over tgt; skills in every other layer (width k*f there)."""
    d, f, V = c["d_model"], c["encoder_ffn_dim"], c["vocab_size"]
    Le, Ld = c["encoder_layers"], c["decoder_layers"]

    def ffn(layers: int) -> float:
        skill_layers = (layers + 1) // 2
        return 2 * 2 * d * f * (skill_layers * k + (layers - skill_layers))

    enc = src * (2 * Le * 4 * d * d + ffn(Le) + Le * 4 * src * d)
    dec = tgt * (2 * Ld * 8 * d * d + ffn(Ld) + Ld * 4 * (tgt + src) * d + 2 * d * V)
    return 3 * (enc + dec)


# ------------------------------------------------------------------------------------------- counted
def counted_flops_per_token(task: str, seq: int, batch: int = 2, preset: str = "base",
                            **overrides: Any) -> float:
    """FLOPs per token of one pre-training step of SkillNet-BERT (`task`: "mlm" or "nsp"), counted by
    FlopCounterMode on a forward + backward on the CPU (per token they do not depend on the batch)."""
    import torch
    from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining
    from torch.utils.flop_counter import FlopCounterMode

    torch.manual_seed(0)
    config = SkillNetBertConfig.preset(preset, **overrides)
    model = SkillNetBertForPreTraining(config)
    ids = torch.randint(5, config.vocab_size, (batch, seq))
    kw: dict[str, Any] = {"task": task, "input_ids": ids, "attention_mask": torch.ones_like(ids)}
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


# ------------------------------------------------------------------------------------------- activated FFNs
def ffns_per_task(model: Any, tasks: Sequence[str]) -> dict[str, float]:
    """How many FFNs (of one skill's size) a forward pass of each task runs, per skill layer:
    ``activated_parameters`` less the shared parameters and the task's own ones, over one skill's size."""
    from skillnet.model.counts import activated_parameters, count_parameters

    c = count_parameters(model)
    size = max(c["skills"].values())
    return {t: (activated_parameters(model, t) - c["shared"] - c["heads"].get(t, 0)) / size for t in tasks}


@cache
def activated_ffns(arch: str, method: str, seeds: tuple[int, ...] = (0,)) -> float:
    """FFNs per token per skill layer of `method`, averaged over the reproduction's tasks of `arch` (the NLU
    tasks for "bert", the generation tasks for "bart") and over `seeds`. The method's model is built as
    fine-tuning builds each seed's (`finetune.methods`, same seeds) from a tiny reference with those tasks:
    the count depends on the task map and the router, not on the sizes."""
    import torch
    from skillnet.finetune.methods import METHODS
    from skillnet.model.spec import model_family

    a = model_family(arch)
    tasks = ({n: t["skills"] for n, (_, _, t) in NLU_TASKS.items()} if arch == "bert"
             else {n: list(gen_tasks()[n].skills) for n in NLG_FORMATS})
    per_seed = []
    for seed in seeds:
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            ref = a.load("task_model")(a.load("config").preset("tiny"))
            for name, skills in tasks.items():
                if a.task_heads:
                    ref.add_task(name, skills, {"type": "classification", "num_labels": 2})
                else:
                    ref.config.set_task(name, skills)
            torch.manual_seed(seed + 7919)  # as finetune.run draws what a method adds (a learned map starts there)
            model = METHODS[method].build(ref)
        per_seed.append(statistics.fmean(ffns_per_task(model, list(tasks)).values()))
    return statistics.fmean(per_seed)


def pretrain_ffns() -> float:
    """FFNs per token of sparse pre-training: its objectives' skills (config task map), equal shares."""
    import torch
    from skillnet.model.spec import model_family

    bert = model_family("bert")
    with torch.random.fork_rng():
        model = bert.load("pretraining_model")(bert.load("config").preset("tiny"))
    # the objectives run equal shares of the steps (the objective sampler's default)
    return statistics.fmean(ffns_per_task(model, list(bert.objectives)).values())


def _method(row: str) -> str:
    """The method of a compare row (``LABEL=METHOD`` or ``METHOD``)."""
    return row.split("=")[-1]


# ------------------------------------------------------------------------------------------- a profile
def estimate(p: Profile) -> list[dict[str, Any]]:
    """FLOPs of every stage of profile `p` from its sizes, steps and batches (sequences counted at their
    maximum length: an upper bound), then GPU-hours at each assumed peak and MFU."""
    from skillnet.experiments.tune import search
    from skillnet.model import SkillNetBartConfig, SkillNetBertConfig

    bert = SkillNetBertConfig.preset("base" if not p.bert else "tiny", **p.bert).to_dict()
    bart = SkillNetBartConfig.preset("base" if not p.bart else "tiny", **p.bart).to_dict()
    seq_nlu = sum(min(p.nlu_seq_len.get(n, NLU_TYPICAL_LEN[n]), bert["max_position_embeddings"])
                  * (1 + t.get("num_negatives", 0)) for n, (_, _, t) in NLU_TASKS.items()) / len(NLU_TASKS)
    src_tgt = [NLG_LENGTHS[n] for n in NLG_FORMATS]
    src, tgt = (sum(a for a, _ in src_tgt) / len(src_tgt), sum(b for _, b in src_tgt) / len(src_tgt))

    # Every row of a table trains the joint run's steps in all (the budget rule, profiles.BUDGET_RULE: a
    # task-specific model trains its task's sampling share of them).
    def nlu_runs(rows: list[str], seeds: list[int], steps: int) -> float:
        return sum(steps * p.nlu_batch * seq_nlu
                   * bert_flops_per_token(bert, int(seq_nlu), activated_ffns("bert", _method(r), tuple(seeds)))
                   for r in rows for _ in seeds)

    def nlg_runs(rows: list[str], seeds: list[int], steps: int) -> float:
        return sum(steps * p.nlg_batch
                   * bart_flops_per_pair(bart, int(src), int(tgt), activated_ffns("bart", _method(r), tuple(seeds)))
                   for r in rows for _ in seeds)

    pt_tokens = p.pt_batch * p.ranks * p.pt_seq
    flops = {
        "dense_pt": p.dense_pt_steps * pt_tokens * bert_flops_per_token(bert, p.pt_seq, 1, mlm=True),
        # one continuation of pt_dense per seed, sparse and its dense control (experiments/nlu.py)
        "sparse_pt": len(p.seeds) * p.sparse_pt_steps * pt_tokens
        * bert_flops_per_token(bert, p.pt_seq, pretrain_ffns(), mlm=True),
        "dense_ctrl_pt": len(p.seeds) * p.sparse_pt_steps * pt_tokens * bert_flops_per_token(bert, p.pt_seq, 1, mlm=True),
        "nlu_loss_scale": nlu_runs(LOSS_SCALE_METHODS * len(p.loss_scale_arms), p.seeds,
                                   p.loss_scale_steps or p.nlu_steps),
        # the lr search (experiments/tune.py): every main-table row at every grid lr, one seed
        "nlu_tune": nlu_runs(p.nlu_methods * len(p.nlu_lr_grid), p.seeds[:1], search(p, "nlu").steps),
        "nlu_main": nlu_runs(p.nlu_methods, p.seeds, p.nlu_steps),
        "nlu_ablate": nlu_runs(["skillnet"] * (1 + len(p.ablate)), p.side_seeds, p.nlu_side_steps or p.nlu_steps),
        "nlu_alpha": nlu_runs(["skillnet"] * len(p.alphas), p.side_seeds, p.nlu_side_steps or p.nlu_steps),
        "nlu_adapt": nlu_runs(["skillnet"] * 3 + ["task_specific"], p.seeds, p.adapt_steps),
        "bart_pt": p.bart_pt_steps * (p.bart_pt_batch or p.pt_batch) * p.ranks
        * bart_flops_per_pair(bart, p.pt_seq, p.pt_seq, 1),
        "nlg_tune": nlg_runs(p.nlg_methods * len(p.nlg_lr_grid), p.seeds[:1], search(p, "nlg").steps),
        "nlg_main": nlg_runs(p.nlg_methods, p.seeds, p.nlg_steps),
        "nlg_temp": nlg_runs(["skillnet"] * len(p.temperatures), p.side_seeds, p.nlg_steps),
        "nlg_adapt": nlg_runs(["skillnet", "skillnet", "task_specific"], p.seeds, p.nlg_adapt_steps or p.adapt_steps),
    }
    return [{"stage": name, "pflop": v / 1e15, **{gpu: v / (peak * ASSUMED_MFU) / 3600 for gpu, peak in GPU_PEAKS.items()}}
            for name, v in flops.items()]


def _num(v: float) -> str:
    return f"{v:,.0f}" if v >= 100 else f"{v:.3g}"


def write_estimate(p: Profile, path: Path | None) -> str:
    """The estimate of profile `p` as Markdown, written to `path` if given: its 'estimate' section when the
    file exists (docs/scale.md also holds the memory model's section), else the whole new file."""
    rows = estimate(p)
    gpus = list(GPU_PEAKS)
    lines = [f"## Expected time of the `{p.name}` profile on GPUs", "",
             f"Written by `python scripts/reproduce.py --profile {p.name} --estimate --write {path or '-'}`. Nothing "
             "here ran on a GPU: training FLOPs are counted from the model sizes, steps and batches of the profile "
             "(forward + backward = 3 x forward; sequences at their maximum length, so an upper bound), then "
             "divided by an assumed throughput.", "",
             "- Assumed peaks: " + ", ".join(f"{g} {v / 1e12:g} TFLOP/s" for g, v in GPU_PEAKS.items())
             + f"; assumed MFU {ASSUMED_MFU:.0%} (mixed-precision BERT/BART training typically reaches 30-50%).",
             "- Not included: beam-search evaluation of the generation runs, data loading stalls, checkpoint writes.",
             f"- Pre-training stages run on {p.ranks} GPUs (`--gpus`); their wall time is the GPU-hours divided by "
             "that. Fine-tuning runs are independent: their wall time is the GPU-hours divided by the number of "
             "runs in flight.", "",
             "| stage | PFLOP | " + " | ".join(f"{g} GPU-hours" for g in gpus) + " |",
             "|---|---|" + "---|" * len(gpus)]
    for r in rows:
        lines.append(f"| {r['stage']} | {_num(r['pflop'])} | " + " | ".join(_num(r[g]) for g in gpus) + " |")
    lines.append("| **total** | " + f"{_num(sum(r['pflop'] for r in rows))} | "
                 + " | ".join(f"**{_num(sum(r[g] for r in rows))}**" for g in gpus) + " |")
    if p.ds_config.startswith("ds_configs/cpu"):  # a CPU profile: also its wall time where it is meant to run
        lines += ["", *cpu_lines(p)]
    text = "\n".join(lines) + "\n"
    if path is not None and path.is_file():
        from skillnet.experiments.benchdoc import write_section

        write_section(path, "estimate", text)
    elif path is not None:
        path.write_text(text, encoding="utf-8")
    return text


# ------------------------------------------------------------------------------------------- CPU wall time
# The committed full reproduction (docs/report.md: 2026-11-27, 2 cores, rows not yet packed) measured every
# stage's wall time. Beside it, the work each stage did then, in the unit its time scales with: optimizer steps
# summed over its runs, read from that report's commands and settings (a task-specific row's task models by their
# own steps: then 1,200 per NLU task and 400 per NLG task, not yet their share). None: a data stage, whose time
# does not depend on the steps.
MEASURED_CPU: dict[str, tuple[float, float | None]] = {  # stage -> (seconds then, work then)
    "corpus": (4, None), "nlu_tasks": (23, None), "nlg_tasks": (18, None), "vocab": (77, None), "shards": (6, None),
    "dense_pt": (19.2 * 60, 4000),
    "sparse_pt": (4.8 * 60, 500),  # one run (launch, export and held-out check included)
    "nlu_main": (126.0 * 60, 3 * (7 * 2400 + 5 * 1200)),  # 3 seeds x (7 joint rows + 5 task models)
    "nlu_ablate": (19.3 * 60, 1 * 8 * 1200),
    "nlu_alpha": (10.2 * 60, 1 * 3 * 1200),
    "nlu_adapt": (9.1 * 60, 3 * 4 * 600),
    "bart_pt": (31.8 * 60, 1600),
    "nlg_main": (71.4 * 60, 3 * (3 * 800 + 4 * 400)),
    "nlg_temp": (19.4 * 60, 1 * 3 * 800),
    "nlg_adapt": (7.4 * 60, 3 * 3 * 600),
}
# Stages that the committed run did not have, priced at the cost per unit of a measured one: the dense control at
# the sparse run's (a dense step is the cheaper, so an upper bound), the loss-scale study at Table 3's.
PRICED_AS = {"dense_ctrl_pt": "sparse_pt", "nlu_loss_scale": "nlu_main", "nlu_tune": "nlu_main",
             "nlg_tune": "nlg_main"}
# NLG test examples those runs decoded per task (nlg_eval 50; csc its whole test half, 334 sentences).
MEASURED_NLG_TEST = {"nlg_eval": 50, "csc": 334}
# What packed rows (every stage's default since 2026-12-02) gain per step over those unpacked times, measured on
# the same 2 cores: BERT pre-training 0.29 -> 0.15 s per step (the full profile's dense run, experiments/profiles.py);
# the rest real tokens/s packed over unpacked at 128 tokens (docs/speed.md, bench/packing.py, 2026-12-02): BART
# denoising 1.65, generation fine-tuning 1.48, NER fine-tuning 1.36 (the least of the NLU tasks' gains, as the
# CRF costs the same in either layout). Data stages and beam search (one source per row) gain nothing.
PACKED_SPEEDUP = {"dense_pt": 0.29 / 0.15, "sparse_pt": 0.29 / 0.15, "bart_pt": 1.65,
                  **dict.fromkeys(("nlu_main", "nlu_ablate", "nlu_alpha", "nlu_adapt"), 1.36),
                  **dict.fromkeys(("nlg_main", "nlg_temp", "nlg_adapt"), 1.48)}
# Beam-4 decoding of one test example by the full profile's BART (d_model 128, 2+2 layers), one thread, each
# generation task at its full target length (an untrained model's worst case): 0.10-0.16 s, 0.13 s on average
# (measured 2026-12-07 on the 2-core machine, shared). Test is decoded once per run.
DECODE_S_PER_EXAMPLE = 0.13


def cpu_work(p: Profile) -> dict[str, float]:
    """Each stage's work under profile `p`, in MEASURED_CPU's unit: optimizer steps summed over its runs (every
    row of a table trains the joint run's steps in all: the budget rule)."""
    side = p.nlu_side_steps or p.nlu_steps
    return {
        "dense_pt": p.dense_pt_steps,
        "sparse_pt": len(p.seeds) * p.sparse_pt_steps,
        "dense_ctrl_pt": len(p.seeds) * p.sparse_pt_steps,
        "nlu_loss_scale": len(p.seeds) * len(p.loss_scale_arms) * len(LOSS_SCALE_METHODS)
        * (p.loss_scale_steps or p.nlu_steps),
        # the lr search: every row of the main table at every lr of the grid, one seed (profiles.Profile)
        "nlu_tune": len(p.nlu_lr_grid) * len(p.nlu_methods) * (p.nlu_tune_steps or side),
        "nlu_main": len(p.seeds) * len(p.nlu_methods) * p.nlu_steps,
        "nlu_ablate": len(p.side_seeds) * (1 + len(p.ablate)) * side,
        "nlu_alpha": len(p.side_seeds) * len(p.alphas) * side,
        "nlu_adapt": len(p.seeds) * 4 * p.adapt_steps,
        "bart_pt": p.bart_pt_steps,
        "nlg_tune": len(p.nlg_lr_grid) * len(p.nlg_methods) * (p.nlg_tune_steps or p.nlg_steps),
        "nlg_main": len(p.seeds) * len(p.nlg_methods) * p.nlg_steps,
        "nlg_temp": len(p.side_seeds) * len(p.temperatures) * p.nlg_steps,
        "nlg_adapt": len(p.seeds) * 3 * (p.nlg_adapt_steps or p.adapt_steps),
    }


def extra_test_decoding(p: Profile) -> dict[str, float]:
    """Seconds of beam search on test examples that profile `p` decodes beyond what the measured run decoded
    (per NLG stage, on p.jobs runs at once); a task tested on its whole split both times adds nothing."""
    def more(tasks: list[str]) -> int:
        then = {t: MEASURED_NLG_TEST.get(t, MEASURED_NLG_TEST["nlg_eval"]) for t in tasks}
        now = {t: nlg_test_cap(p, t) for t in tasks}
        return sum(max(0, n - then[t]) for t, n in now.items() if n is not None)

    train, new = nlg_train_tasks(), [n for n, i in gen_tasks().items() if i.held_out and n in NLG_FORMATS]
    runs = {"nlg_main": (len(p.seeds) * len(p.nlg_methods), train), "nlg_temp": (len(p.side_seeds)
            * len(p.temperatures), train), "nlg_adapt": (len(p.seeds) * 3, new)}
    return {st: n * more(tasks) * DECODE_S_PER_EXAMPLE / max(1, p.jobs) for st, (n, tasks) in runs.items()}


def cpu_estimate(p: Profile, packed: bool = True) -> dict[str, float | None]:
    """Each stage's wall time (seconds) on the 2 cores of the committed run, for profile `p`: its measured time
    scaled by its work now over its work then, divided by what packed rows gain per step (PACKED_SPEEDUP; not
    with `packed=False`: the unpacked times scaled, an upper bound), plus the test decoding it adds. None: a
    stage neither measured nor priced (a new one: add it to PRICED_AS)."""
    work, decode = cpu_work(p), extra_test_decoding(p)
    out: dict[str, float | None] = {}
    from skillnet.experiments.stages import STAGES

    for st in (s.name for s in STAGES):
        like = PRICED_AS.get(st, st)
        sec, then = MEASURED_CPU.get(like, (None, None))
        if sec is None:
            out[st] = None
        elif then is None:
            out[st] = sec
        else:
            gain = PACKED_SPEEDUP.get(like, 1.0) if packed else 1.0
            out[st] = sec * work[st] / then / gain + decode.get(st, 0.0)
    return out


def cpu_lines(p: Profile) -> list[str]:
    """Markdown of `cpu_estimate`: each stage's estimated wall time on 2 cores, packed and as an upper bound."""
    packed, bound = cpu_estimate(p), cpu_estimate(p, packed=False)

    def minutes(v: float | None) -> str:
        return "-" if v is None else f"{v / 60:.1f}"

    unpriced = [st for st, v in packed.items() if v is None]
    lines = [f"## Expected wall time of the `{p.name}` profile on 2 CPU cores", "",
             "Each stage's wall time in the committed reproduction (docs/report.md, 2026-11-27), times its optimizer "
             "steps summed over its runs now over then, divided by what packed rows gain per step (measured since), "
             "plus the beam search of the test examples added since (`experiments/estimate.py`: MEASURED_CPU, "
             "PACKED_SPEEDUP, DECODE_S_PER_EXAMPLE). *Upper bound*: without the packing gain." + (
                 f" Not priced (no measured stage to scale): {', '.join(unpriced)}." if unpriced else ""), "",
             "| stage | minutes | upper bound |", "|---|---|---|"]
    lines += [f"| {st} | {minutes(v)} | {minutes(bound[st])} |" for st, v in packed.items()]
    total = (sum(v for v in packed.values() if v), sum(v for v in bound.values() if v))
    return lines + [f"| **total** | **{total[0] / 3600:.1f} h** | {total[1] / 3600:.1f} h |"]


# ------------------------------------------------------------------------------------------- the paper's recipe
# §B of the SkillNet-NLU paper: 100k steps, global batch 10,240 sequences of 512 tokens, 32 V100.
RECIPE = {"steps": 100_000, "batch": 10_240, "seq": 512, "gpus": 32}


def project_days(fpt: float, mfu: float, peak: float, recipe: dict[str, int]) -> float:
    """Days for `recipe` at `fpt` FLOPs per token on GPUs of `peak` FLOP/s at the given MFU."""
    tokens = recipe["steps"] * recipe["batch"] * recipe["seq"]
    return tokens * fpt / (recipe["gpus"] * peak * mfu) / 86400


def projection(mfus: Sequence[float], mlm_share: float, recipe: dict[str, int] = RECIPE) -> dict[str, Any]:
    """The paper's pre-training recipe on GPUs from FLOPs counted on SkillNet-BERT-base: per-token FLOPs of
    an MLM and an NSP step, their mix, and the projected days per (GPU, MFU); with its Markdown (docs/gpu.md)."""
    seq = recipe["seq"]
    mlm, nsp = counted_flops_per_token("mlm", seq), counted_flops_per_token("nsp", seq)
    fpt = mlm_share * mlm + (1 - mlm_share) * nsp
    rows = [(gpu, peak, mfu, project_days(fpt, mfu, peak, recipe)) for gpu, peak in GPU_PEAKS.items() for mfu in mfus]
    tokens = recipe["steps"] * recipe["batch"] * recipe["seq"]
    lines = [
        "# Projected pre-training time on GPUs",
        "",
        "Written by `python bench/projection.py --write docs/gpu.md`. Nothing here ran on a GPU: FLOPs are "
        "counted on the real model (torch `FlopCounterMode`, forward + backward, CPU), the throughput is an "
        "assumption.",
        "",
        f"- Recipe (the SkillNet-NLU paper §B): {recipe['steps']:,} steps × {recipe['batch']:,} sequences × {seq} tokens "
        f"= {tokens:.3e} tokens on {recipe['gpus']} GPUs.",
        f"- Model: preset `base` (BERT-base with 7 skills per layer). Counted FLOPs per token (fwd + bwd): "
        f"MLM step (s2, s7; decoder on the 15% masked positions) {mlm / 1e9:.3f} GFLOP, NSP step (s1, s3, s7) "
        f"{nsp / 1e9:.3f} GFLOP; mixed {mlm_share:.0%} MLM: {fpt / 1e9:.3f} GFLOP per token.",
        "- Assumed peaks: " + ", ".join(f"{k} {v / 1e12:g} TFLOP/s" for k, v in GPU_PEAKS.items()) + " (dense tensor "
        "cores, data-sheet values).",
        f"- Assumed MFU: {', '.join(f'{m:.0%}' for m in mfus)} (BERT pre-training with mixed precision and "
        "ZeRO-2 typically reaches 30-50% of peak; not measured here).",
        "- Not included: data loading stalls, checkpoint writes, evaluation, restarts after preemption.",
        "",
        "| GPU | peak TFLOP/s | MFU | projected days | projected hours |",
        "|---|---|---|---|---|",
    ] + [f"| {g} | {p / 1e12:g} | {m:.0%} | {d:.2f} | {d * 24:.0f} |" for g, p, m, d in rows]
    return {"flops_per_token_mlm": mlm, "flops_per_token_nsp": nsp, "flops_per_token": fpt,
            "projection_days": {f"{g} mfu={m}": d for g, _, m, d in rows}, "markdown": "\n".join(lines) + "\n"}
