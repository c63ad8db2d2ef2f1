"""scripts/gpu_summary.py reads the pipeline arms' logs as gpu_check.sh writes them (CPU: no GPU needed)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def summary():  # noqa: ANN201
    spec = importlib.util.spec_from_file_location("gpu_summary", REPO / "scripts" / "gpu_summary.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def _arm(out: Path, name: str, window_ms: list[float], profiled: bool) -> None:
    (out / name).mkdir(parents=True)
    recs = [{"step": 10 * (i + 1), "tokens_per_s": 1e3 / ms, "seconds_per_step": ms / 1e3, "split": "train"}
            for i, ms in enumerate(window_ms)]
    (out / name / "log.jsonl").write_text("\n".join(json.dumps(r) for r in recs) + "\n")
    (out / f"{name}.txt").write_text('{"event": "start", "micro_batch_size": 64, "grad_accum": 1}\n')
    if profiled:
        (out / name / "profile").mkdir()


@pytest.mark.parametrize("profiled", [False, True])
def test_pipeline_windows_leave_out_the_warm_up_and_the_profiled_end(summary, tmp_path: Path, profiled: bool) -> None:
    """gpu_check.sh profiles a run's last five steps: their window (profiler, trace export) is not counted,
    nor are the first two (warm-up)."""
    _arm(tmp_path, "pipeline", [900, 300, 100, 110, 120, 1000 if profiled else 130], profiled)
    fig = summary.pipeline_figures(tmp_path, "pipeline")
    want = [100, 110, 120] + ([] if profiled else [130])
    assert fig["windows"] == len(want)
    assert fig["seconds_per_step"] == pytest.approx(sum(want) / len(want) / 1e3)
    assert fig["micro"] == 64 and fig["steps"] == 60


def test_gpu_check_on_a_cpu_checks_the_set_up_then_stops(tmp_path: Path) -> None:
    """On a machine without CUDA the script still checks its set-up and names the parts it would run, then
    stops with one line and exit 1 (it runs nothing that needs a GPU)."""
    import os
    import subprocess

    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present: the script would run its parts")
    r = subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh")], capture_output=True, text=True,
                       env={**os.environ, "GPU_CHECK_OUT": str(tmp_path)}, timeout=300)
    assert r.returncode == 1, r.stdout + r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("set-up: ") and lines[1].startswith("parts: tests skill_ffn")
    assert lines[-1].startswith("no CUDA device: stopping here")
    assert (tmp_path / "setup.txt").is_file()


def test_corpus_arms_report_mfu_on_real_tokens(summary, tmp_path: Path, default_shards: Path) -> None:
    """The packaged-corpus arms: real tokens/s times the FLOPs per real token (each sample's own tokens and
    attention length, the MLM head at its masked positions) over the datasheet peak."""
    import shutil

    from skillnet.experiments.benchdoc import encoder_step_flops
    from skillnet.model import SkillNetBertConfig
    from skillnet.pretrain.dataset import PretrainingDataset

    shutil.copytree(default_shards, tmp_path / "shards")
    _arm(tmp_path, "corpus_packed", [100, 100, 100, 100], profiled=False)
    per_token = summary.real_flops_per_token(tmp_path / "shards", "tiny", 64, samples=16)
    cfg = SkillNetBertConfig.preset("tiny")
    ds = PretrainingDataset(tmp_path / "shards", max_seq_len=64, verify="size")
    import numpy as np

    idx = np.random.default_rng(0).permutation(len(ds))[:16].tolist()
    flops = tokens = 0.0
    for o in ("mlm", "nsp"):
        b = ds.batch(idx, 0, o)
        lens = b["attention_mask"].sum(1)
        masked = int((b["labels"] != -100).sum()) if o == "mlm" else 0
        flops += encoder_step_flops(64, 2, cfg.vocab_size, len(cfg.task_skill_names(o)) * 128, int(lens.sum()),
                                    int((lens**2).sum()), o, masked, 16)
        tokens += float(lens.sum())
    assert per_token == pytest.approx(flops / tokens)
    lines = summary.corpus_lines(tmp_path, "tiny", 64, 989.4)
    packed = next(x for x in lines if x.startswith("corpus_packed"))
    mfu = 10 * summary.real_flops_per_token(tmp_path / "shards", "tiny", 64) / 989.4e12  # _arm: 10 tokens/s
    assert f"real-token MFU {mfu:.3f}" in packed and "10 real tokens/s" in packed and "real share n/a" in packed
    assert any(x.startswith("corpus_unpacked: not run") for x in lines)
