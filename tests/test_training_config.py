"""DeepSpeed JSON vs launch checks, TrainConfig round trip, LR schedule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from skillnet.training.config import DsConfigError, TrainConfig, load_ds_config, lr_lambda, resolve_ds_config

REPO = Path(__file__).resolve().parents[1]


def test_train_config_round_trips_through_json() -> None:
    cfg = TrainConfig(output_dir="x", max_steps=7, betas=(0.9, 0.98), extra={"a": 1})
    assert TrainConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ValueError, match="unknown keys"):
        TrainConfig.from_dict({"max_step": 3})


def test_batch_size_is_derived_and_checked() -> None:
    ds, cfg = resolve_ds_config(
        {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2}, TrainConfig(), world_size=3
    )
    assert ds["train_batch_size"] == 24 and (cfg.micro_batch_size, cfg.grad_accum) == (4, 2)
    ds, cfg = resolve_ds_config(
        {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 4}, TrainConfig(), 2
    )
    assert cfg.grad_accum == 8
    with pytest.raises(DsConfigError) as e:
        resolve_ds_config(
            {"train_batch_size": 10, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1},
            TrainConfig(),
            2,
            source="my.json",
        )
    msg = str(e.value)
    assert "my.json" in msg and "world_size(2) = 4" in msg and "expects 5 ranks" in msg


def test_cli_values_that_contradict_the_json_are_an_error() -> None:
    with pytest.raises(DsConfigError, match="--grad-accum 3"):
        resolve_ds_config({"gradient_accumulation_steps": 2}, TrainConfig(grad_accum=3), 1)
    ds, cfg = resolve_ds_config({"gradient_accumulation_steps": 2}, TrainConfig(micro_batch_size=5), 1)
    assert ds["train_micro_batch_size_per_gpu"] == 5


@pytest.mark.parametrize("json_name", ["a100_bf16.json", "v100_fp16.json", "zero2.json", "cpu_fp32.json"])
def test_one_rank_turns_zero_communication_off(json_name: str) -> None:
    """One rank under ZeRO-1/2 reduces nothing: overlap_comm and contiguous_gradients off (GPU-speed issue: the
    real pipeline went from 0.90 to 1.00 of the dense step on one H100); several ranks, ZeRO-3, CPU offload
    and zero_comm='json' keep the JSON's values."""
    raw = load_ds_config(REPO / "ds_configs" / json_name)
    raw.pop("train_batch_size", None)
    zero = raw["zero_optimization"]
    for stage in (1, 2):
        raw["zero_optimization"] = {**zero, "stage": stage}
        ds, _ = resolve_ds_config(raw, TrainConfig(), 1)
        assert (ds["zero_optimization"]["overlap_comm"], ds["zero_optimization"]["contiguous_gradients"]) == (
            False, False), stage
        for cfg, world, zo in ((TrainConfig(), 2, {}), (TrainConfig(), 1, {"stage": 3}),
                               (TrainConfig(zero_comm="json"), 1, {}),
                               (TrainConfig(), 1, {"offload_optimizer": {"device": "cpu"}})):
            raw["zero_optimization"] = {**zero, "stage": stage, **zo}
            ds, _ = resolve_ds_config(raw, cfg, world)
            assert ds["zero_optimization"] == raw["zero_optimization"], (stage, world, zo, cfg.zero_comm)
    with pytest.raises(ValueError, match="zero_comm='off'; valid: auto, json"):  # refused where it is set
        TrainConfig(zero_comm="off")


def test_paper_recipe_needs_32_ranks_and_sets_the_optimizer() -> None:
    raw = load_ds_config(REPO / "ds_configs" / "paper_v100x32.json")
    ds, cfg = resolve_ds_config(raw, TrainConfig(), 32)
    assert ds["train_batch_size"] == 10240
    assert (cfg.lr, cfg.betas, cfg.eps) == (3e-5, (0.9, 0.98), 1e-6)
    assert (cfg.warmup_steps, cfg.decay_steps, cfg.schedule) == (10000, 100000, "linear")
    assert "optimizer" not in ds and "scheduler" not in ds and ds["zero_allow_untested_optimizer"]
    with pytest.raises(DsConfigError, match="expects 32 ranks = 4 nodes x 8 GPUs"):
        resolve_ds_config(raw, TrainConfig(), 8)


def test_offload_allows_the_client_optimizer(tmp_path: Path) -> None:
    ds, _ = resolve_ds_config(load_ds_config(REPO / "ds_configs" / "zero2_offload.json"), TrainConfig(), 1)
    assert ds["zero_force_ds_cpu_optimizer"] is False


def test_bad_json_points_at_the_line(tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    p.write_text('{\n  "train_batch_size": 8,\n  oops\n}')
    with pytest.raises(DsConfigError, match=r"bad.json:3:"):
        load_ds_config(p)
    with pytest.raises(DsConfigError, match="not found"):
        load_ds_config(tmp_path / "missing.json")
    with pytest.raises(DsConfigError, match="not supported"):
        resolve_ds_config({"optimizer": {"type": "Lamb"}}, TrainConfig(), 1)


def test_every_shipped_config_is_valid_json_with_a_zero_stage() -> None:
    files = sorted((REPO / "ds_configs").glob("*.json"))
    assert len(files) >= 8
    for f in files:
        d = json.loads(f.read_text())
        assert d["zero_optimization"]["stage"] in (1, 2, 3), f.name


def test_linear_warmup_then_decay() -> None:
    f = lr_lambda(TrainConfig(max_steps=10, warmup_steps=4))
    vals = [f(s) for s in range(10)]
    assert vals[:4] == [0.25, 0.5, 0.75, 1.0]
    assert (
        vals[4] == 1.0 and vals[9] == pytest.approx(1 / 6) and all(a >= b for a, b in zip(vals[3:], vals[4:]))
    )
    g = lr_lambda(TrainConfig(max_steps=10, warmup_steps=2, schedule="constant"))
    assert [g(s) for s in (0, 1, 5, 9)] == [0.5, 1.0, 1.0, 1.0]


def test_resume_on_another_world_size_keeps_the_global_batch() -> None:
    from skillnet.training.config import derive_geometry

    assert derive_geometry(12, 1, 2) == (2, 6)
    assert derive_geometry(12, 3, 2) == (2, 2)
    assert derive_geometry(12, 4, 2) == (1, 3)  # the micro-batch only shrinks: memory per rank never grows
    assert derive_geometry(16, 2, 8) == (8, 1)
    with pytest.raises(DsConfigError, match="3 ranks cannot share"):
        derive_geometry(16, 3, 8)
    raw = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 3}
    ds, cfg = resolve_ds_config(raw, TrainConfig(), 1, global_batch=12)
    assert (ds["train_batch_size"], cfg.micro_batch_size, cfg.grad_accum) == (12, 2, 6)
    again, cfg2 = resolve_ds_config(raw, cfg, 1, global_batch=12)  # the trainer resolves a second time
    assert (cfg2.micro_batch_size, cfg2.grad_accum) == (2, 6)
    with pytest.raises(DsConfigError, match="global batch of 12"):
        resolve_ds_config({**raw, "train_batch_size": 24}, TrainConfig(), 1, global_batch=12)
