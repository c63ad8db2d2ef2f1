"""Memory per rank of a SkillNet training step: what fits on which GPU (docs/scale.md).

    python -m skillnet.experiments.memory                         # the tables for V100/A100 cards
    python -m skillnet.experiments.memory --write docs/scale.md   # ... and its section of docs/scale.md
    python -m skillnet.experiments.memory --arch bert --preset base --dtype fp16 --zero 2 --world-size 32 \\
        --micro-batch 32 --seq-len 512 --objective mlm [--gradient-checkpointing]   # one prediction

Nothing here allocates the model: parameter counts come from the real model built on the ``meta`` device
(``model.counts``), and which FFNs a token runs from the config's router. The bytes per rank are

- model states as DeepSpeed keeps them: parameters in the compute dtype; with ZeRO >= 1 an fp32 copy of
  the rank's partition (DeepSpeed clones it also in fp32) and its two Adam moments; gradients (all of them
  under ZeRO 0/1, the rank's partition under ZeRO 2/3, plus its fp32 cast in mixed precision); the reduce
  bucket(s) and, at the optimizer step, the all-gather bucket. ZeRO-3 keeps 1/N of the parameters plus the
  gathered layer and the prefetch bucket. ``offload`` moves the fp32 copy, moments and fp32 gradients to host
  memory (reported apart). Plain PyTorch (``--zero none``, one process): gradients exist only for the
  parameters the step used, and MaskedAdamW's moments only for parameters that ever had one;
- activations, derived per layer from what autograd saves for the backward pass (listed in
  `bert_layer` / `bart_layer`): [B, T, D] tensors, the k*f-wide skill FFN activations of the k skills a token
  runs, dropout masks (bool on a GPU, the compute dtype on a CPU), LayerNorm statistics, and the attention
  probabilities [B, H, T, T] when attention runs in the math path (SkillNet-BERT on a CPU; elsewhere the fused
  kernel keeps its output and a log-sum-exp instead). BERT's MLM logits exist at the masked
  positions only (``heads.py``), BART's LM logits at every target token;
- a backward sweep from the top block down: the activations not yet released plus the gradients produced so
  far plus the block's own temporaries (gradients of its largest tensors, and with activation checkpointing
  its recomputed activations). The peak is the largest point of the sweep or of the optimizer step.

Not modelled: the caching allocator's fragmentation, NCCL's buffers and DeepSpeed's other small buffers,
which `CUDA_RESERVE` stands for in the fit check. `tests/test_memory_model.py` checks the activations
against autograd's saved tensors and the whole peak against a measured CPU training step.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import asdict, dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

GiB = 1 << 30
DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
# Usable capacity of each card (data sheet, in GiB), and what the fit check keeps free for the CUDA context,
# cuBLAS workspaces, NCCL buffers and allocator fragmentation: an assumption, not a measurement.
GPUS = {"V100-16GB": 16, "V100-32GB": 32, "A100-40GB": 40, "A100-80GB": 80}
CUDA_RESERVE = 1.0 * GiB
MLM_PROBABILITY = 0.15  # BERT masks this share of the tokens; the MLM decoder runs on them only
PAPER_JSON = "ds_configs/paper_v100x32.json"


@dataclass(frozen=True)
class Setup:
    """One training configuration. ``zero`` None is plain PyTorch in one process."""

    arch: str = "bert"  # "bert" (SkillNetBertForPreTraining) | "bart" (SkillNetBartForConditionalGeneration)
    preset: str = "base"
    objective: str | None = None  # the task whose skills run; None: the one with the most skills
    dtype: str = "fp16"
    zero: int | None = 2
    offload: bool = False  # zero_optimization.offload_optimizer.device == "cpu"
    world_size: int = 1
    micro_batch: int = 8
    seq_len: int = 128  # BART: source and target length each
    checkpointing: bool = False
    device: str = "cuda"  # "cuda": fused attention, bool dropout masks; "cpu": dtype masks, BERT math attention
    reduce_bucket: int = 500_000_000  # elements (DeepSpeed's default)
    allgather_bucket: int = 500_000_000
    prefetch_bucket: int = 50_000_000  # ZeRO-3
    max_live_parameters: int = 1_000_000_000  # ZeRO-3: stage3_max_live_parameters (DeepSpeed's default)
    max_reuse_distance: int = 1_000_000_000  # ZeRO-3: stage3_max_reuse_distance (DeepSpeed's default)
    overlap_comm: bool = False
    trained_objectives: tuple[str, ...] | None = None  # plain PyTorch: tasks whose parameters have moments
    # Rank 0 of pretrain/run.py (SkillNet-BERT): its SkillStatistics callback keeps every skill's start weights
    # in fp32 host memory for skill_drift (not under ZeRO-3). Measured at BERT-base on 2 CPU ranks
    # (bench/real_size.py): rank 0 peaked 1.6 GB above rank 1, the size of that copy.
    drift_reference: bool = False

    @property
    def a(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def mixed(self) -> bool:
        return self.dtype != "fp32"


# ------------------------------------------------------------------------------------------------ the model
@cache
def _model(arch: str, preset: str) -> Any:
    """The real model on the meta device: sizes and counts, no memory."""
    import torch
    from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining
    from skillnet.model.bart import SkillNetBartConfig, SkillNetBartForConditionalGeneration

    with torch.device("meta"):
        if arch == "bert":
            return SkillNetBertForPreTraining(SkillNetBertConfig.preset(preset))
        return SkillNetBartForConditionalGeneration(SkillNetBartConfig.preset(preset))


def objectives(arch: str, preset: str) -> list[str]:
    """The tasks a prediction may run: pre-training's objectives (BERT), the NLG tasks (BART)."""
    return ["mlm", "nsp"] if arch == "bert" else list(_model(arch, preset).config.tasks)


def skills_per_token(arch: str, preset: str, task: str) -> int:
    """How many FFNs a token of `task` runs in a skill layer (the config's router decides)."""
    from skillnet.model.registry import build_router

    return build_router(_model(arch, preset).config).activated(task)[1]


@cache
def counts(arch: str, preset: str) -> dict[str, Any]:
    """Parameter counts (``model.counts``) and the sizes the activation terms need."""
    from skillnet.model.counts import activated_parameters, count_parameters

    m = _model(arch, preset)
    c = m.config
    out: dict[str, Any] = dict(count_parameters(m))
    out["activated"] = {t: activated_parameters(m, t) for t in objectives(arch, preset)}
    out["largest_layer"] = max(sum(p.numel() for p in layer.parameters()) for layer in _layers(m))
    out["largest_param"] = max(p.numel() for p in m.parameters())
    if arch == "bert":
        out.update(D=c.hidden_size, H=c.num_attention_heads, f=c.intermediate_size, V=c.vocab_size,
                   skill_layers=c.skill_layer_ids(), layers=c.num_hidden_layers,
                   p_hidden=c.hidden_dropout_prob, p_attn=c.attention_probs_dropout_prob, p_act=0.0)
    else:
        out.update(D=c.d_model, H=c.encoder_attention_heads, f=c.encoder_ffn_dim, V=c.vocab_size,
                   skill_layers=c.encoder_skill_layer_ids(), dec_skill_layers=c.decoder_skill_layer_ids(),
                   layers=c.encoder_layers, dec_layers=c.decoder_layers, p_hidden=c.dropout,
                   p_attn=c.attention_dropout, p_act=float(c.activation_dropout or 0.0))
    out["per_layer_params"] = [sum(p.numel() for p in layer.parameters()) for layer in _layers(m)]
    out["num_skills"] = c.num_skills
    # embedding parameters besides the word embeddings (tied to the output layer: their gradient comes first)
    out["emb_rest"] = sum(p.numel() for n, p in m.named_parameters() if "embed" in n and "word_embeddings" not in n
                          and "embed_tokens" not in n and n != "model.shared.weight")
    return out


def _layers(m: Any) -> list[Any]:
    if hasattr(m, "bert"):
        return list(m.bert.encoder.layer)
    return [*m.model.encoder.layers, *m.model.decoder.layers]


# ------------------------------------------------------------------------------------------------ activations
def _attention(s: Setup, c: dict, B: int, Tq: int, Tk: int) -> tuple[int, int]:
    """(saved, backward temporaries) of one attention block beyond its input: q, k, v, the output that feeds
    the out-projection, the dropout mask after it, and the attention core: probabilities [B, H, Tq, Tk] (and
    with attention dropout their mask and the dropped copy) in the math path, or the fused kernel's output
    and log-sum-exp."""
    a, D, H = s.a, c["D"], c["H"]
    m = _mask_bytes(s)
    saved = a * D * (B * Tq + 2 * B * Tk) + a * B * Tq * D + m * B * Tq * D * (c["p_hidden"] > 0)
    scores = B * H * Tq * Tk
    # The math path runs on a CPU when SDPA gets a mask: SkillNet-BERT always passes its additive mask. SkillNet-
    # BART runs HF's SDPA attention, which drops an all-ones mask (full-length rows, as modelled here) and uses
    # is_causal in the decoder, so a CPU runs the fused kernel there too: a BART-base forward at sequence 512 kept
    # no [B, H, T, T] tensor, and bench/real_size.py's BART-base runs at 512 peaked ~0.5 GB below a model
    # that counted the probabilities.
    if s.device == "cpu" and s.arch == "bert":
        saved += a * scores + (m + a) * scores * (c["p_attn"] > 0)
        temp = 2 * a * scores  # gradients of the probabilities and of the scores
    else:
        saved += a * B * Tq * D + 4 * B * H * Tq
        temp = 0
    return saved, temp + a * D * (2 * B * Tq + 2 * B * Tk)  # + gradients of q, k, v and of the input


def _mask_bytes(s: Setup) -> int:
    # A GPU's fused dropout keeps a bool mask; on a CPU the mask is a tensor of the compute dtype.
    return 1 if s.device == "cuda" else s.a


def _ffn(s: Setup, c: dict, N: int, k: int, skill: bool) -> tuple[int, int]:
    """(saved, temporaries) of one FFN over N tokens with k FFNs of width f per token: its input, the
    pre-activation and activation [N, k*f] (the fused skill path; a dense layer alike), BART's activation
    dropout mask (bool in the fused skill path), the output's dropout mask."""
    a, D, f = s.a, c["D"], c["f"]
    width = N * k * f
    saved = a * N * D + 2 * a * width + _mask_bytes(s) * N * D * (c["p_hidden"] > 0)
    if c["p_act"] > 0:
        saved += (1 if skill else _mask_bytes(s)) * width
    return saved, 2 * a * width + 2 * a * N * D  # gradients of the activation and pre-activation, of x


def _layernorm(s: Setup, N: int, D: int) -> int:
    return s.a * N * D + 2 * 4 * N  # its input and fp32 mean / rstd


@dataclass
class Block:
    """A piece of the backward sweep: what it keeps for backward, the gradients its backward writes, and the
    temporaries its backward needs on top."""

    name: str
    saved: int
    grads: int
    temp: int


def bert_layer(s: Setup, c: dict, i: int, k: int) -> tuple[int, int]:
    B, T, D = s.micro_batch, s.seq_len, c["D"]
    N = B * T
    attn, attn_t = _attention(s, c, B, T, T)
    ffn, ffn_t = _ffn(s, c, N, k if i in c["skill_layers"] else 1, i in c["skill_layers"])
    # + the layer input (what the q/k/v projections keep); each LayerNorm keeps its input, the FFN the output
    return s.a * N * D + attn + ffn + 2 * _layernorm(s, N, D), max(attn_t, ffn_t)


def bart_layer(s: Setup, c: dict, i: int, k: int, decoder: bool) -> tuple[int, int]:
    B, T, D = s.micro_batch, s.seq_len, c["D"]
    N = B * T
    layers = c["dec_skill_layers"] if decoder else c["skill_layers"]
    attn, attn_t = _attention(s, c, B, T, T)
    ffn, ffn_t = _ffn(s, c, N, k if i in layers else 1, i in layers)
    saved = s.a * N * D + attn + _layernorm(s, N, D) + ffn + _layernorm(s, N, D)
    if decoder:  # cross attention: its q input and its own core; k and v of the encoder output
        cross, cross_t = _attention(s, c, B, T, T)
        saved += s.a * N * D + cross + _layernorm(s, N, D)
        attn_t = max(attn_t, cross_t)
    return saved, max(attn_t, ffn_t)


def blocks(s: Setup, task: str) -> list[Block]:
    """The backward sweep's blocks, top (loss) first."""
    c = counts(s.arch, s.preset)
    a, D, V, B, T = s.a, c["D"], c["V"], s.micro_batch, s.seq_len
    N = B * T
    k = skills_per_token(s.arch, s.preset, task)
    # one skill's parameters in one layer (a skill bank of BART spans both stacks' skill layers)
    n_skill_layers = len(c["skill_layers"]) + len(c.get("dec_skill_layers", []))
    active_skill_layer = max(c["skills"].values(), default=0) // max(n_skill_layers, 1)
    layer_grads = c["per_layer_params"]
    out: list[Block] = []
    if s.arch == "bert":
        if task == "mlm":
            M = math.ceil(MLM_PROBABILITY * N)
            # selected rows, transform dense + GELU + LayerNorm, decoder input; logits (returned) and log-softmax
            head_saved = N + 8 * M + 3 * a * M * D + _layernorm(s, M, D) + 2 * a * M * V
            head_temp = 2 * a * M * V
            head_grads = V * D + D * D + 3 * D + V  # the decoder is tied to the word embeddings
        else:
            head_saved, head_temp, head_grads = 0, 0, 0
        # pooler (it runs for both objectives): its input is a view of the last hidden state, kept whole
        head_saved += a * N * D + a * B * D
        head_grads += D * D + D + (2 * D + 2 if task == "nsp" else 0)
        out.append(Block("heads", head_saved, head_grads, head_temp))
        for i in reversed(range(c["layers"])):
            saved, temp = bert_layer(s, c, i, k)
            grads = layer_grads[i] - (c["num_skills"] - k) * active_skill_layer * (i in c["skill_layers"])
            out.append(Block(f"layer {i}", saved, grads, temp))
        # embeddings: word and token-type ids, the sum (LayerNorm input) and its dropout mask
        out.append(Block("embeddings", 16 * N + _layernorm(s, N, D) + _mask_bytes(s) * N * D,
                         c["emb_rest"] + (0 if task == "mlm" else V * D), a * N * D))
    else:
        # LM logits at every target token (returned) and their log-softmax; the decoder's last LayerNorm output
        out.append(Block("lm head", 2 * a * N * V + a * N * D, V * D, 2 * a * N * V))
        per_enc = len(c["per_layer_params"]) - c["dec_layers"]
        for i in reversed(range(c["dec_layers"])):
            saved, temp = bart_layer(s, c, i, k, decoder=True)
            sk = i in c["dec_skill_layers"]
            out.append(Block(f"decoder {i}", saved, _layer_grads(c, per_enc + i, k, sk, active_skill_layer), temp))
        for i in reversed(range(c["layers"])):
            saved, temp = bart_layer(s, c, i, k, decoder=False)
            sk = i in c["skill_layers"]
            out.append(Block(f"encoder {i}", saved, _layer_grads(c, i, k, sk, active_skill_layer), temp))
        out.append(Block("embeddings", 2 * (8 * N + _layernorm(s, N, D) + _mask_bytes(s) * N * D), c["emb_rest"],
                         a * N * D))
    if s.checkpointing:
        out = [_checkpointed(b, s, N, D) if b.name.startswith(("layer", "encoder", "decoder")) else b for b in out]
    return out


def _layer_grads(c: dict, idx: int, k: int, skill: bool, per_skill: int) -> int:
    return c["per_layer_params"][idx] - (c["num_skills"] - k) * per_skill * skill


def _checkpointed(b: Block, s: Setup, N: int, D: int) -> Block:
    """A checkpointed layer keeps its input (and the additive mask); its backward recomputes the rest."""
    kept = s.a * N * D + s.a * s.micro_batch * s.seq_len
    return Block(b.name, kept, b.grads, b.temp + b.saved)


# ------------------------------------------------------------------------------------------------ model states
def model_states(s: Setup) -> dict[str, int]:
    """Bytes per rank of parameters, gradients, fp32 master copy and Adam moments, and buckets; with
    offload, ``host`` holds what moved to host memory."""
    c = counts(s.arch, s.preset)
    P, N, a = c["total"], s.world_size, s.a
    part = math.ceil(P / N)
    st: dict[str, int] = {}
    if s.zero is None:
        if s.mixed:
            raise ValueError("plain PyTorch (--zero none) is modelled in fp32 only")
        tasks = s.trained_objectives or tuple(objectives(s.arch, s.preset))
        trained = _union_activated(s, tasks)
        st.update(params=4 * P, master=0, moments=8 * trained, grads=0, grads32=0, buckets=0, step_temp=0)
        return _with_drift_reference(s, st, c)
    st["params"] = a * (part if s.zero == 3 else P)
    if s.zero == 3:
        st["params"] += a * (c["largest_layer"] + s.prefetch_bucket)
    st["master"] = 4 * (part if s.zero >= 1 else P) if (s.zero >= 1 or s.mixed) else 0
    st["moments"] = 8 * (part if s.zero >= 1 else P)
    st["grads"] = a * (part if s.zero >= 2 else P)
    st["grads32"] = 4 * (part if s.zero >= 1 else P) if s.mixed else 0
    # ZeRO-1/2 reduce gradients through a bucket (two with overlap_comm); ZeRO-3 too
    st["buckets"] = a * min(s.reduce_bucket, P) * (2 if s.overlap_comm else 1) if s.zero >= 1 else 0
    st["step_temp"] = a * min(s.allgather_bucket, P) if s.zero in (1, 2) else 0
    if s.offload:
        # Host memory: the fp32 master partition and moments, the fp32 gradient partition (the fp32 cast of a
        # mixed-precision run, else its own buffer: offload_gradient_dict), the updated partition in the compute
        # dtype before it goes back to the device (param_buffer_of_bit16_for_cpu_offload_groups) and two staging
        # buffers of the largest parameter (temp_grad_buffer_for_{cpu,gpu}_offload). Each one is a tensor that
        # DeepSpeed's ZeRO-2 offload engine held at BERT-base on 2 CPU ranks (bench/real_size.py).
        st["host"] = (st.pop("master") + st.pop("moments") + max(st.pop("grads32"), 4 * part) + a * part
                      + 2 * a * c["largest_param"])
        st.update(master=0, moments=0, grads32=0)
    return _with_drift_reference(s, st, c)


def _with_drift_reference(s: Setup, st: dict[str, int], c: dict[str, Any]) -> dict[str, int]:
    if s.drift_reference and s.zero != 3:
        # host memory: on a GPU the callback moves the copy to the device only while it takes under 1/8 of the
        # free memory (training/skill_stats.py), so it never decides whether a step fits
        st["host"] = st.get("host", 0) + 4 * sum(c["skills"].values())
    return st


def _union_activated(s: Setup, tasks: tuple[str, ...]) -> int:
    """Parameters that any of `tasks` uses (shared ones, their skills and heads): what has Adam moments."""
    from skillnet.model.registry import build_router

    m = _model(s.arch, s.preset)
    c = counts(s.arch, s.preset)
    router = build_router(m.config)
    skills = {m.config.skill_names[i] for t in tasks for i in router.activated(t)[0]}
    return c["shared"] + sum(c["skills"][n] for n in skills) + sum(c["heads"].get(t, 0) for t in tasks)


# ------------------------------------------------------------------------------------------------ the peak
def predict(s: Setup) -> dict[str, Any]:
    """Peak bytes per rank of one training step, with its parts, for the objective with the largest peak
    (``s.objective`` if given)."""
    tasks = [s.objective] if s.objective else objectives(s.arch, s.preset)
    return max((_predict_task(s, t) for t in tasks), key=lambda r: r["peak"])


def _predict_task(s: Setup, task: str) -> dict[str, Any]:
    st = model_states(s)
    static = st["params"] + st["master"] + st["moments"] + st["grads"] + st["grads32"]
    bl = blocks(s, task)
    acts = sum(b.saved for b in bl)
    # Plain PyTorch allocates each gradient when its block's backward runs (and frees them all after the
    # step); so does DeepSpeed's fp32 ZeRO-1/2 (`lazy`): its gradients are the parameters' own .grad tensors,
    # made as the backward reaches them and freed after the step (stage_1_and_2.py, the path where the gradient
    # accumulation dtype is the compute dtype). Measured at BERT-base on 2 CPU ranks (bench/real_size.py): the
    # resident set after a step is the parameters, master copy and moments only, and at sequence 512 the peak
    # (top of the backward) sits one gradient partition below the static count. A rank holds at most its
    # partition of them: the worst rank is the one whose partition the backward fills first. Mixed precision
    # (a flat fp32 partition buffer), offload and ZeRO-3 keep their buffers in the model states.
    lazy = s.zero in (1, 2) and not s.mixed and not s.offload
    per_block_grads = s.zero is None or lazy
    cap = st["grads"] if lazy else math.inf
    gbytes = 4 if s.zero is None else s.a
    live, grads, sweep, at = acts, 0, 0, ""
    for b in bl:
        here = live + min(grads + b.grads * gbytes, cap) * per_block_grads + b.temp
        if here > sweep:
            sweep, at = here, b.name
        live -= b.saved
        grads += b.grads * gbytes
    fwd_bwd = static - (st["grads"] if lazy else 0) + st["buckets"] + sweep + _zero3_retained(s, task)
    # At the step, fp32 ZeRO-1/2 flattens the partition's gradients into one new tensor for the optimizer while
    # the per-parameter ones still exist: a second partition (measured: BERT-base at sequence 128 peaks there).
    step = static + (grads if s.zero is None else 0) + st["step_temp"] + (st["grads"] if lazy else 0)
    peak = max(fwd_bwd, step)
    return {"task": task, "skills_per_token": skills_per_token(s.arch, s.preset, task), "peak": peak,
            "states": st, "activations": acts, "backward_peak_at": at if fwd_bwd >= step else "optimizer step",
            "sweep": sweep, "step": step, "host": st.get("host", 0)}


def _zero3_retained(s: Setup, task: str) -> int:
    """ZeRO-3: gathered parameters beyond the one layer `model_states` counts. Once the first step has recorded
    the order in which modules fetch their parameters, DeepSpeed keeps a gathered parameter until its next use
    when that use is within ``stage3_max_reuse_distance`` elements, up to ``stage3_max_live_parameters``: with
    the defaults (1e9 each, more than a base model has) every parameter the forward gathered is still gathered
    when the backward starts, i.e. all the parameters the task activates. Measured at BERT-base on 2 CPU ranks
    (bench/real_size.py): the first step (no trace yet) peaked 360-850 MB below the later ones."""
    if s.zero != 3:
        return 0
    c = counts(s.arch, s.preset)
    used = c["activated"][task]
    if s.max_reuse_distance < used:  # a parameter is released before its backward use: the eager minimum
        return 0
    return s.a * max(min(s.max_live_parameters, used) - c["largest_layer"], 0)


def deepspeed_setup(path: str | Path, arch: str = "bert", preset: str = "base", seq_len: int = 512,
                    **kw: Any) -> Setup:
    """The Setup a DeepSpeed JSON describes: dtype, ZeRO stage, offload, buckets, micro-batch and the world
    size its train_batch_size implies."""
    ds = json.loads(Path(path).read_text())
    z = ds.get("zero_optimization") or {}
    dtype = "fp16" if (ds.get("fp16") or {}).get("enabled") else "bf16" if (ds.get("bf16") or {}).get("enabled") else "fp32"
    micro, accum = int(ds["train_micro_batch_size_per_gpu"]), int(ds.get("gradient_accumulation_steps", 1))
    world = int(ds["train_batch_size"]) // (micro * accum) if "train_batch_size" in ds else 1
    off = ((z.get("offload_optimizer") or {}).get("device") or "none") != "none"
    # as the training runs derive it: an activation_checkpointing section turns checkpointing on
    from skillnet.training.activation_checkpointing import resolve_activation_checkpointing

    ckpt = resolve_activation_checkpointing(None, ds, str(path)).enabled
    # as the trainer runs it: on one rank ZeRO-1/2 reduce without overlap (TrainConfig.zero_comm)
    from skillnet.training.config import TrainConfig, single_rank_comm_off

    overlap = bool(z.get("overlap_comm")) and not single_rank_comm_off(ds, TrainConfig(), kw.get("world_size", world))
    base = dict(arch=arch, preset=preset, dtype=dtype, zero=int(z.get("stage", 0)), offload=off, world_size=world,
                micro_batch=micro, seq_len=seq_len, reduce_bucket=int(z.get("reduce_bucket_size", 5e8)),
                allgather_bucket=int(z.get("allgather_bucket_size", 5e8)), overlap_comm=overlap,
                prefetch_bucket=int(z.get("stage3_prefetch_bucket_size", 5e7)),
                max_live_parameters=int(z.get("stage3_max_live_parameters", 1e9)),
                max_reuse_distance=int(z.get("stage3_max_reuse_distance", 1e9)),
                checkpointing=ckpt)
    return Setup(**{**base, **kw})


MICRO_BATCH_LIMIT = 4096  # the search stops here


def largest_micro_batch(s: Setup, capacity: float, limit: int = MICRO_BATCH_LIMIT) -> int:
    """The largest micro-batch whose predicted peak plus `CUDA_RESERVE` fits in `capacity` bytes (0: none)."""
    def fits(b: int) -> bool:
        return predict(replace(s, micro_batch=b))["peak"] + CUDA_RESERVE <= capacity

    if not fits(1):
        return 0
    lo, hi = 1, 2
    while hi <= limit and fits(hi):
        lo, hi = hi, hi * 2
    hi = min(hi, limit + 1)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


# ------------------------------------------------------------------------------------------------ measured
def proc_bytes(key: str, path: str = "/proc/self/status") -> int:
    """A ``kB`` field of a /proc file in bytes (VmRSS, VmHWM, RssShmem of /proc/self/status; MemAvailable of
    /proc/meminfo); 0 if absent."""
    for line in Path(path).read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    return 0


# ------------------------------------------------------------------------------------------------ the report
def _gb(n: float) -> str:
    return f"{n / GiB:.1f}"


def gpu_tables(json_path: str | Path = PAPER_JSON) -> str:
    """docs/scale.md's memory section: the paper recipe per card, then the largest micro-batches."""
    paper = deepspeed_setup(json_path)
    r = predict(paper)
    st = r["states"]
    lines = [
        "## Memory per GPU",
        "",
        "Written by `python -m skillnet.experiments.memory --write docs/scale.md` (a model, not a measurement: "
        "see `experiments/memory.py` for what it counts; `tests/test_memory_model.py` checks it against a "
        "measured CPU training step, and `bench/real_size.py` against BERT-base and BART-base runs through "
        "DeepSpeed on 2 CPU ranks, in the section below). A card fits when the predicted peak plus "
        f"{CUDA_RESERVE / GiB:.1f} GiB (CUDA context, NCCL and allocator slack: assumed) is within its capacity.",
        "",
        f"**The paper recipe** (`{json_path}`: BERT-base with 7 skills per layer, {paper.dtype}, ZeRO-{paper.zero}, "
        f"{paper.world_size} ranks, micro-batch {paper.micro_batch} x sequence {paper.seq_len}): predicted peak "
        f"{_gb(r['peak'])} GiB per GPU (objective {r['task']}, {r['skills_per_token']} skills per token; parameters "
        f"{_gb(st['params'])}, gradients {_gb(st['grads'] + st['grads32'])}, fp32 copy and Adam moments "
        f"{_gb(st['master'] + st['moments'])}, buckets {_gb(st['buckets'])}, activations {_gb(r['activations'])} GiB).",
        "",
        "| card | paper recipe fits | largest micro-batch: BERT-base seq 128 | seq 128, checkpointing | seq 512 | "
        "seq 512, checkpointing | BART-base seq 128 | ckpt | seq 512 | ckpt | BART-large seq 128 | ckpt | seq 512 | ckpt |",
        "|---|---|" + "---|" * 12,
    ]
    models = [("bert", "base"), ("bart", "base"), ("bart", "large")]
    for card, cap in GPUS.items():
        capacity = cap * GiB
        fits = "yes" if r["peak"] + CUDA_RESERVE <= capacity else "no"
        cells = [card, f"{fits} ({_gb(r['peak'])} GiB)"]
        for arch, preset in models:
            for seq in (128, 512):
                for ckpt in (False, True):
                    s = replace(paper, arch=arch, preset=preset, seq_len=seq, checkpointing=ckpt)
                    n = largest_micro_batch(s, capacity)
                    cells.append(f">= {n}" if n == MICRO_BATCH_LIMIT else str(n))
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        f"Micro-batches use the paper recipe's settings ({paper.dtype}, ZeRO-{paper.zero}, {paper.world_size} ranks, "
        "its bucket sizes) for every model; BERT takes the larger of its MLM and NSP steps, SkillNet-BART the NLG "
        "task with the most skills (sequence = source and target length). 0: not even one sequence fits.",
    ]
    return "\n".join(lines) + "\n"


def build_parser() -> argparse.ArgumentParser:
    from skillnet.common.cli import Parser

    p = Parser("skillnet.experiments.memory", description=__doc__)
    p.add_argument("--arch", choices=["bert", "bart"],
                   help="one prediction for this model (without it: the GPU tables of docs/scale.md)")
    p.add_argument("--preset", default="base", help="model/config.py PRESETS or model/bart.py BART_PRESETS")
    p.add_argument("--objective", help="task whose skills run (default: the one with the largest peak)")
    p.add_argument("--ds-config", help="take dtype, ZeRO stage, offload, buckets, micro-batch, world size and "
                                       "activation checkpointing from this DeepSpeed JSON")
    p.add_argument("--dtype", choices=list(DTYPE_BYTES), default="fp16", help="compute dtype")
    p.add_argument("--zero", choices=["none", "0", "1", "2", "3"], default="2",
                   help="ZeRO stage; none: plain PyTorch in one process (fp32)")
    p.add_argument("--offload", action="store_true", help="optimizer offloaded to host memory")
    p.add_argument("--world-size", type=int, default=1, help="data-parallel ranks")
    p.add_argument("--micro-batch", type=int, default=8, help="sequences per rank and micro-step")
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence (BART: source and target each)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="activation checkpointing of every layer")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cuda: fused attention and bool dropout masks; cpu: masks in the dtype, math attention for BERT")
    p.add_argument("--json", action="store_true", help="print the prediction as JSON")
    p.add_argument("--write", metavar="PATH", help="write the GPU tables into PATH's 'memory' section")
    return p


def main(argv: list[str] | None = None) -> int:
    a = build_parser().parse_args(argv)
    if a.arch is None:
        text = gpu_tables()
        print(text, end="")
        if a.write:
            from skillnet.experiments.benchdoc import write_section

            write_section(a.write, "memory", text)
        return 0
    if a.ds_config:
        flag = {"checkpointing": True} if a.gradient_checkpointing else {}  # else the JSON's section decides
        s = deepspeed_setup(a.ds_config, a.arch, a.preset, a.seq_len, objective=a.objective, device=a.device, **flag)
    else:
        s = Setup(arch=a.arch, preset=a.preset, objective=a.objective, dtype=a.dtype,
                  zero=None if a.zero == "none" else int(a.zero), offload=a.offload, world_size=a.world_size,
                  micro_batch=a.micro_batch, seq_len=a.seq_len, checkpointing=a.gradient_checkpointing,
                  device=a.device)
    r = predict(s)
    if a.json:
        print(json.dumps({"setup": asdict(s), **r}, indent=2))
        return 0
    st = r["states"]
    print(f"{s.arch} {s.preset}, {s.dtype}, ZeRO {s.zero if s.zero is not None else 'none (plain PyTorch)'}"
          f"{' + offload' if s.offload else ''}, {s.world_size} ranks, micro-batch {s.micro_batch} x {s.seq_len}, "
          f"checkpointing {'on' if s.checkpointing else 'off'}; objective {r['task']} ({r['skills_per_token']} skills)")
    for k, v in st.items():
        print(f"  {k:<11} {_gb(v):>8} GiB")
    print(f"  activations {_gb(r['activations']):>8} GiB (kept for backward)")
    print(f"  peak        {_gb(r['peak']):>8} GiB per rank (at {r['backward_peak_at']})")
    for card, cap in GPUS.items():
        print(f"  {card}: {'fits' if r['peak'] + CUDA_RESERVE <= cap * GiB else 'does not fit'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
