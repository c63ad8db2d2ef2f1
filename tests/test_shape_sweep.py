"""bench/shape_sweep.py: its FLOP count is torch's own count of the model's matmuls, and its shapes parse
or fail with the option's name (the sweep itself is a measurement, run by hand: docs/model.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_shape_sweep", REPO / "bench" / "shape_sweep.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("layers,skills,seq", [(1, 1, 16), (2, 3, 24)])
def test_flops_per_step_matches_torchs_flop_counter(layers: int, skills: int, seq: int) -> None:
    # The loop implementation: torch's counter does not see the fused path's in-place addmm_ (the same
    # FLOPs, accumulated into one output), so it would undercount k > 1.
    from skillnet.model import SkillNetBertConfig, SkillNetBertModel
    from torch.utils.flop_counter import FlopCounterMode

    bench = _bench_module()
    d, batch = 64, 4
    cfg = SkillNetBertConfig.preset("tiny", vocab_size=50, hidden_size=d, num_hidden_layers=layers,
                                    num_attention_heads=2, intermediate_size=2 * d, max_position_embeddings=32,
                                    ffn_impl="loop")
    model = SkillNetBertModel(cfg, add_pooling_layer=False)
    x = torch.randint(5, 50, (batch, seq))
    with FlopCounterMode(display=False) as fc:
        out = model(x, torch.ones_like(x), skill_ids=list(range(skills)))
        out.last_hidden_state.square().sum().backward()
    want = bench.flops_per_step(d, layers, [{"seq": seq, "skills": skills, "seqs": 1, "share": 1.0}], batch)
    assert fc.get_total_flops() == pytest.approx(want, rel=0.02)


def test_a_mix_of_tasks_is_weighted_by_share() -> None:
    bench = _bench_module()
    a = {"seq": 32, "skills": 2, "seqs": 1}
    b = {"seq": 64, "skills": 4, "seqs": 3}
    mixed = bench.flops_per_step(128, 2, [{**a, "share": 0.25}, {**b, "share": 0.75}], 8)
    alone = [bench.flops_per_step(128, 2, [{**t, "share": 1.0}], 8) for t in (a, b)]
    assert mixed == pytest.approx(0.25 * alone[0] + 0.75 * alone[1])


def test_shapes_parse_or_name_the_problem() -> None:
    bench = _bench_module()
    assert bench.parse_shapes("128x2,256X4") == [(128, 2), (256, 4)]
    for bad in ("128", "128x0", "100x2", "ax2"):
        with pytest.raises(ValueError, match="shape"):
            bench.parse_shapes(bad)
