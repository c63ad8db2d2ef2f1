"""GPU readiness (V100 fp16, A100 bf16). Marked `gpu`: they run where CUDA is present and are reported
as skipped ("needs CUDA") elsewhere, e.g. on the CPU-only CI. `scripts/gpu_check.sh` runs them plus
the benches on a GPU machine and prints one summary."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from tests.fixtures.pretrain.helpers import REPO, build_shards, free_port, subprocess_env, task_losses

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (not run on a CPU-only machine)"),
]
DTYPES = [torch.float16, torch.bfloat16]


def _bf16_ok(dtype: torch.dtype) -> None:
    if dtype is torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip("this GPU has no bf16 (V100)")


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("mode", ["autocast", "lowp_params"])
def test_fused_skill_ffn_matches_loop_under_autocast(dtype, k, mode):
    """Autocast (fp32 weights), and weights stored in the low precision as DeepSpeed's bf16/fp16 engines
    keep them: the fused path's output and gradients match the loop's."""
    import contextlib

    from skillnet.model.skill_ffn import SkillFFN, SkillRouting

    _bf16_ok(dtype)
    torch.manual_seed(0)
    fused = SkillFFN(256, 1024, 7, impl="fused").cuda()
    loop = SkillFFN(256, 1024, 7, impl="loop").cuda()
    loop.load_state_dict(fused.state_dict())
    x = torch.randn(4, 64, 256, device="cuda")
    if mode == "lowp_params":
        fused, loop, x = fused.to(dtype), loop.to(dtype), x.to(dtype)
    route = SkillRouting.uniform(list(range(7 - k, 7)))
    outs, grads = [], []
    for m in (fused, loop):
        xi = x.clone().requires_grad_(True)
        ctx = torch.autocast("cuda", dtype=dtype) if mode == "autocast" else contextlib.nullcontext()
        with ctx:
            y = m(xi, route)
        assert y.dtype == dtype
        y.float().square().mean().backward()
        outs.append(y.float())
        grads.append([xi.grad] + [p.grad for p in m.parameters() if p.grad is not None])
    tol = {"atol": 2e-2, "rtol": 2e-2} if dtype is torch.bfloat16 else {"atol": 2e-3, "rtol": 2e-3}
    torch.testing.assert_close(outs[0], outs[1], **tol)
    assert len(grads[0]) == len(grads[1]) == 1 + 4 * k  # inactive skills have no gradient
    for a, b in zip(*grads):
        torch.testing.assert_close(a.float(), b.float(), **tol)


def _deepspeed(script: str, args: list[str], timeout: int = 900) -> subprocess.CompletedProcess[str]:
    cmd = ["deepspeed", "--num_gpus", "1", "--master_port", str(free_port()), script, *args]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout, env=subprocess_env())
    assert r.returncode == 0, f"{' '.join(cmd)}:\n{r.stdout[-3000:]}\n{r.stderr[-4000:]}"
    return r


def test_masked_adamw_fp16_overflow_step_changes_nothing(tmp_path):
    _deepspeed("tests/fixtures/gpu/fp16_overflow.py", [str(tmp_path)])
    rep = json.loads((tmp_path / "report.json").read_text())
    assert rep["skipped"] == 1, rep
    assert rep["scale_after"] < rep["scale_before"], rep  # dynamic loss scaling backed off
    assert rep["unchanged"], "an overflow step moved a master weight or an Adam moment"
    assert rep["steps_after"] == rep["steps_before"], rep


@pytest.mark.parametrize("config", ["v100_fp16.json", "a100_bf16.json"])
def test_one_zero2_pretraining_step_on_one_gpu(tmp_path, config):
    if config.startswith("a100"):
        _bf16_ok(torch.bfloat16)
    shards = build_shards(tmp_path)
    out = tmp_path / "pt"
    _deepspeed("pretrain/run.py", ["--ds_config", f"ds_configs/{config}", "--shards", str(shards),
                                   "--preset", "tiny", "--max_seq_len", "64", "--max_steps", "3",
                                   "--log_every", "1",
                                   "--output_dir", str(out), "--no_progress"])
    log = [json.loads(x) for x in (out / "log.jsonl").read_text().splitlines()]
    losses = [v for r in log if r.get("split") == "train" for v in task_losses(r).values()]
    assert losses and all(loss == loss and loss < 1e4 for loss in losses), losses


# ---- SkillNet-BART generation ------------------------------------------------------------------------
_BART_TASK, _BART_OTHER = "text_summarization", "dialogue_generation"  # 2 skills / 4 skills


def _random_skillnet_bart(skill_layernorm: str):
    """A tiny SkillNet-BART with a skill bank in every layer, skills all different (random init, a large
    init_std so that the text depends on the input and on the skills)."""
    from skillnet.model import SkillNetBartConfig, SkillNetBartForConditionalGeneration

    torch.manual_seed(0)
    cfg = SkillNetBartConfig(
        vocab_size=128, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
        decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
        pad_token_id=0, bos_token_id=101, eos_token_id=102, decoder_start_token_id=102,
        forced_eos_token_id=102, scale_embedding=True, init_std=0.3, skill_layers="all",
        skill_layernorm=skill_layernorm,
    )
    return SkillNetBartForConditionalGeneration(cfg).cuda().eval()


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp16", "bf16"])
@pytest.mark.parametrize("skill_layernorm", ["shared", "per_skill"])
def test_skill_sparse_bart_beam_search_under_autocast(dtype, skill_layernorm):
    """Beam search (4 beams, SkillNet's default) in half precision: it runs, has the requested shape and
    finite scores, keeps each row's skills, and, as on CPU, skills the task does not use take no part:
    scrambling them leaves sequences and scores bit-identical, scrambling a used one does not."""
    from skillnet.model import skill_parameters

    _bf16_ok(dtype)
    sk = _random_skillnet_bart(skill_layernorm)
    g = torch.Generator().manual_seed(1)
    x = torch.randint(1, 100, (3, 12), generator=g)
    mask = torch.ones_like(x)
    x[2, 7:], mask[2, 7:] = 0, 0  # one right-padded row
    x, mask = x.cuda(), mask.cuda()
    new = 10
    kw = dict(attention_mask=mask, max_new_tokens=new, min_new_tokens=new, no_repeat_ngram_size=1,
              output_scores=True, return_dict_in_generate=True)

    def run(**how):
        with torch.inference_mode(), torch.autocast("cuda", dtype=dtype):
            return sk.generate(x, **kw, **how)

    ref = run(task=_BART_TASK)
    assert ref.sequences.shape == (3, new + 1) and ref.sequences.device.type == "cuda"
    assert ref.sequences.min() >= 0 and ref.sequences.max() < sk.config.vocab_size
    assert len(ref.scores) == new and all(s.shape == (3 * 4, sk.config.vocab_size) for s in ref.scores)
    assert not any(s.isnan().any() for s in ref.scores)
    assert torch.isfinite(ref.sequences_scores).all()
    # Per-row tasks survive beam expansion in half precision too (shape and finiteness; exact per-row
    # equality with single-task runs is not expected: other batch shapes take other kernels).
    mixed = run(task=[_BART_TASK, _BART_OTHER, _BART_TASK])
    assert mixed.sequences.shape == (3, new + 1) and torch.isfinite(mixed.sequences_scores).all()

    used = set(sk.config.task_skill_names(_BART_TASK))
    params = skill_parameters(sk)
    with torch.no_grad():
        for name in params:
            if name not in used:
                for p in params[name]:
                    p.normal_(0, 1.0)
    again = run(task=_BART_TASK)
    assert torch.equal(again.sequences, ref.sequences)
    assert all(torch.equal(a, b) for a, b in zip(again.scores, ref.scores))
    with torch.no_grad():
        for p in params["non_open_end"]:  # one of the task's own skills
            p.normal_(0, 1.0)
    changed = run(task=_BART_TASK)
    assert not all(torch.equal(a, b) for a, b in zip(changed.scores, ref.scores))


# ---- the sync-free sparse optimizer ------------------------------------------------------------------
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_masked_adamw_device_kernel_matches_the_count_path(dtype):
    """The CUDA path (a Triton kernel when Triton is there) on a ZeRO-like flat tensor with zero slices:
    untouched elements bit-identical, updated ones as the count path (torch's fused kernel) updates them,
    and found_inf=1 changes nothing."""
    from skillnet.training.optim import MaskedAdamW

    torch.manual_seed(0)
    n = 3_000_000
    g = torch.randn(n, device="cuda", dtype=dtype)
    g[100_000:1_700_000] = 0
    g[2_000_000:2_000_013] = 0
    ps = [torch.nn.Parameter(torch.randn(n, device="cuda", dtype=dtype)) for _ in range(2)]
    ps[1].data.copy_(ps[0].data)
    opts = [MaskedAdamW([{"params": [p], "check_zeros": True}], lr=1e-3, weight_decay=0.01, impl=impl)
            for p, impl in zip(ps, ("count", "device"))]
    zero = g == 0
    for _ in range(3):
        before = ps[1].detach().clone()
        for p, o in zip(ps, opts):
            p.grad = g.clone()
            o.step()
        assert torch.equal(ps[1].detach()[zero], before[zero])
        tol = {"rtol": 1e-5, "atol": 1e-6} if dtype is torch.float32 else {"rtol": 1e-2, "atol": 1e-2}
        torch.testing.assert_close(ps[1].detach(), ps[0].detach(), **tol)
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opts[1].state[ps[1]][key], opts[0].state[ps[0]][key], **tol)
    snap = [ps[1].detach().clone(), opts[1].state[ps[1]]["exp_avg"].clone()]
    ps[1].grad = g.clone()
    opts[1].step(found_inf=torch.ones((), device="cuda"))
    assert torch.equal(ps[1].detach(), snap[0]) and torch.equal(opts[1].state[ps[1]]["exp_avg"], snap[1])


def test_plain_training_step_on_cuda_waits_for_nothing(tmp_path):
    """The trainer on a GPU, plain PyTorch: a step without logging issues its work and returns before the
    GPU has finished it (nothing synchronises), and the logged figures match the CPU run's arithmetic."""
    from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining, skill_parameters
    from skillnet.pretrain.objectives import ObjectiveSampler, PretrainBatchSource
    from skillnet.pretrain.synthetic import SyntheticPretrainingDataset
    from skillnet.training import SkillStatistics, TrainConfig, Trainer

    torch.manual_seed(0)
    ds = SyntheticPretrainingDataset(4096, max_seq_len=512)
    model = SkillNetBertForPreTraining(SkillNetBertConfig.preset("base"))  # the GPU outlasts the host's launches
    source = PretrainBatchSource(ds, ObjectiveSampler(seed=0), 32, 1, workers=2, pin_memory=True)
    cfg = TrainConfig(output_dir=str(tmp_path), max_steps=12, log_every=6, micro_batch_size=32, grad_accum=1,
                      progress=False, tensorboard=False)
    tr = Trainer(model, source, cfg, callbacks=[SkillStatistics(skill_parameters(model))])
    for _ in range(3):  # warm-up (allocator, kernels)
        tr.train_step(reduce=False)
    torch.cuda.synchronize()
    ev = torch.cuda.Event()
    tr.train_step(reduce=False)
    ev.record()
    assert not ev.query(), "a step returned only after the GPU had finished it: something synchronised"
    tr.train()
    log = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines() if '"train"' in x]
    assert log and all(task_losses(r) and all(v == v for v in task_losses(r).values()) and r["tokens_per_s"] > 0
                       for r in log), log


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_an_mlm_step_with_the_loaders_positions_never_synchronises(dtype):
    """The loader hands the MLM head its predicted positions: the forward of an MLM batch issues no
    synchronising CUDA call (a boolean-mask selection waits for the device to count the positions)."""
    from skillnet.model import SkillNetBertConfig, SkillNetBertForPreTraining
    from skillnet.pretrain.objectives import ObjectiveSampler, PretrainBatchSource
    from skillnet.pretrain.synthetic import SyntheticPretrainingDataset

    _bf16_ok(dtype)
    torch.manual_seed(0)
    src = PretrainBatchSource(SyntheticPretrainingDataset(256, max_seq_len=128), ObjectiveSampler(seed=0), 8, 1)
    batch = next(b for b in src if b.task == "mlm").to("cuda")
    model = SkillNetBertForPreTraining(SkillNetBertConfig.preset("small")).cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.autocast("cuda", dtype=dtype):
            out = model(task="mlm", **batch.tensors)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    out.loss.backward()
    assert torch.isfinite(out.loss).item() and out.metrics["mlm_count"] == batch.tensors["mlm_positions"].numel()
