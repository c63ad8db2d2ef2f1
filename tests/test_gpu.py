"""GPU readiness (V100 fp16, A100 bf16). Marked `gpu`: they run where CUDA is present and are reported
as skipped ("needs CUDA") elsewhere, e.g. on the CPU-only CI. `scripts/gpu_check.sh` runs them plus
the benches on a GPU machine and prints one summary."""

from __future__ import annotations

import json
import subprocess

import pytest
import torch

from tests.fixtures.pretrain.helpers import REPO, build_shards, free_port, subprocess_env

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
def test_fused_skill_ffn_matches_loop_under_autocast(dtype, k):
    from skillnet.model.skill_ffn import SkillFFN, SkillRouting

    _bf16_ok(dtype)
    torch.manual_seed(0)
    fused = SkillFFN(256, 1024, 7, impl="fused").cuda()
    loop = SkillFFN(256, 1024, 7, impl="loop").cuda()
    loop.load_state_dict(fused.state_dict())
    route = SkillRouting.uniform(list(range(7 - k, 7)))
    x = torch.randn(4, 64, 256, device="cuda")
    outs, grads = [], []
    for m in (fused, loop):
        xi = x.clone().requires_grad_(True)
        with torch.autocast("cuda", dtype=dtype):
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
    losses = [r["loss"] for r in log if r.get("split") == "train"]
    assert losses and all(loss == loss and loss < 1e4 for loss in losses), losses
