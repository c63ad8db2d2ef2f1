"""Task samplers: realised frequencies vs the formulas, rank independence, resume."""

from __future__ import annotations

import json
import multiprocessing as mp
from collections import Counter

import pytest
from skillnet.finetune.samplers import (
    AnnealedSampler,
    ProportionalSampler,
    RoundRobinSampler,
    SamplerConfig,
    TemperatureSampler,
    build_sampler,
    uniform,
)

TASKS = ["a", "b", "c", "d"]
SIZES = [1000, 300, 50, 10]
# chi-square critical values at p = 0.001 by degrees of freedom: a correct sampler fails 1 in 1000.
CHI2_CRIT_0001 = {1: 10.83, 2: 13.82, 3: 16.27}


def chi_square(counts: Counter, probs: dict[str, float], n: int) -> float:
    return sum((counts.get(t, 0) - n * p) ** 2 / (n * p) for t, p in probs.items() if p > 0)


def draws(sampler, start: int, stop: int) -> Counter:
    return Counter(sampler.task_at(s) for s in range(start, stop))


def test_uniform_is_uniform_and_deterministic():
    us = [uniform(7, s) for s in range(20000)]
    assert all(0.0 <= u < 1.0 for u in us)
    assert us == [uniform(7, s) for s in range(20000)]
    assert us[:100] != [uniform(8, s) for s in range(100)]
    bins = Counter(int(u * 10) for u in us)
    assert chi_square(bins, {i: 0.1 for i in range(10)}, len(us)) < 27.88  # df=9, p=0.001


@pytest.mark.parametrize("alpha", [1.0, 0.5, 0.0])
def test_proportional_matches_eq3(alpha):
    total = sum(SIZES)
    p = [n / total for n in SIZES]
    q = [pi**alpha / sum(pj**alpha for pj in p) for pi in p]  # Eq. 3 written out
    s = ProportionalSampler(TASKS, SIZES, alpha=alpha, seed=3)
    assert s.probabilities(0) == pytest.approx(q)
    n = 20000
    stat = chi_square(draws(s, 0, n), dict(zip(TASKS, q)), n)
    assert stat < CHI2_CRIT_0001[3], stat


def test_proportional_alpha_zero_is_uniform():
    s = ProportionalSampler(TASKS, SIZES, alpha=0.0)
    assert s.probabilities(0) == pytest.approx([0.25] * 4)


@pytest.mark.parametrize("temperature,cap", [(1.0, 2**21), (4.0, 2**21), (4.0, 100), (1024.0, 2**21)])
def test_temperature_matches_nlg_eq4(temperature, cap):
    d = [min(n, cap) for n in SIZES]
    want = [x ** (1 / temperature) / sum(y ** (1 / temperature) for y in d) for x in d]
    s = TemperatureSampler(TASKS, SIZES, temperature=temperature, size_cap=cap, seed=11)
    assert s.probabilities(0) == pytest.approx(want)
    n = 20000
    assert chi_square(draws(s, 0, n), dict(zip(TASKS, want)), n) < CHI2_CRIT_0001[3]


def test_temperature_one_without_cap_is_natural_and_large_t_near_uniform():
    natural = TemperatureSampler(TASKS, SIZES, temperature=1.0).probabilities(0)
    assert natural == pytest.approx([n / sum(SIZES) for n in SIZES])
    hot = TemperatureSampler(TASKS, SIZES, temperature=1024.0).probabilities(0)
    assert max(hot) - min(hot) < 0.01


def test_annealed_follows_pals_eq6_per_epoch():
    spe, epochs = 8000, 3
    s = AnnealedSampler(TASKS, SIZES, num_epochs=epochs, steps_per_epoch=spe, seed=5)
    for e in range(1, epochs + 1):
        alpha = 1 - 0.8 * (e - 1) / (epochs - 1)
        assert s.alpha_at((e - 1) * spe) == pytest.approx(alpha)
        want = [n**alpha / sum(m**alpha for m in SIZES) for n in SIZES]
        assert s.probabilities((e - 1) * spe + 17) == pytest.approx(want)
        c = draws(s, (e - 1) * spe, e * spe)
        assert chi_square(c, dict(zip(TASKS, want)), spe) < CHI2_CRIT_0001[3], (e, c)
    # past the last epoch alpha stays at its final value 0.2
    assert s.alpha_at(10 * spe) == pytest.approx(0.2)
    # the smallest task gains share as training goes on
    assert s.probabilities(0)[3] < s.probabilities(2 * spe)[3]


def test_round_robin_cycles_exactly():
    s = RoundRobinSampler(TASKS, SIZES)
    seq = [next(s) for _ in range(12)]
    assert seq == TASKS * 3
    cfg = SamplerConfig(kind="round_robin", order=["c", "a", "d", "b"])
    s2 = build_sampler(cfg, dict(zip(TASKS, SIZES)))
    assert [next(s2) for _ in range(5)] == ["c", "a", "d", "b", "c"]


def _sequence_in_process(kind: str, rank: int, q) -> None:
    import os

    os.environ["RANK"] = str(rank)  # a rank must not change the draw
    cfg = SamplerConfig(kind=kind, num_epochs=2, steps_per_epoch=50)
    s = build_sampler(cfg, dict(zip(TASKS, SIZES)), seed=42)
    q.put((rank, [next(s) for _ in range(300)]))


@pytest.mark.parametrize("kind", ["proportional", "temperature", "annealed"])
def test_two_ranks_draw_identical_sequences(kind):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_sequence_in_process, args=(kind, r, q)) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(q.get(timeout=60) for _ in procs)
    for p in procs:
        p.join(timeout=60)
    assert got[0] == got[1]
    assert len(set(got[0])) > 1  # not a degenerate sequence


@pytest.mark.parametrize("kind", ["proportional", "temperature", "annealed", "round_robin"])
def test_resume_continues_the_same_sequence(kind):
    cfg = SamplerConfig(kind=kind, alpha=0.5, num_epochs=3, steps_per_epoch=100)
    sizes = dict(zip(TASKS, SIZES))
    full = build_sampler(cfg, sizes, seed=9)
    straight = [next(full) for _ in range(600)]
    first = build_sampler(cfg, sizes, seed=9)
    head = [next(first) for _ in range(250)]
    state = json.loads(json.dumps(first.state_dict()))  # as it would be stored in a checkpoint
    resumed = build_sampler(cfg, sizes, seed=9)
    resumed.load_state_dict(state)
    tail = [next(resumed) for _ in range(350)]
    assert head + tail == straight


def test_resume_with_a_different_mix_is_refused():
    a = ProportionalSampler(TASKS, SIZES, alpha=1.0)
    b = ProportionalSampler(TASKS, SIZES, alpha=0.5)
    with pytest.raises(ValueError, match="alpha"):
        b.load_state_dict(a.state_dict())
    c = ProportionalSampler(TASKS[:3], SIZES[:3])
    with pytest.raises(ValueError, match="tasks"):
        c.load_state_dict(a.state_dict())


def test_different_seeds_differ_and_config_roundtrips():
    cfg = SamplerConfig(kind="temperature", temperature=2.0, size_cap=500)
    assert SamplerConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
    sizes = dict(zip(TASKS, SIZES))
    s1, s2 = build_sampler(cfg, sizes, seed=1), build_sampler(cfg, sizes, seed=2)
    assert [next(s1) for _ in range(200)] != [next(s2) for _ in range(200)]


def test_bad_configs_give_clear_errors():
    with pytest.raises(ValueError, match="unknown sampler kind"):
        SamplerConfig(kind="zipf")
    with pytest.raises(ValueError, match="unknown sampler option"):
        SamplerConfig.from_dict({"kind": "proportional", "alfa": 1})
    with pytest.raises(ValueError, match="at least one"):
        ProportionalSampler(["a", "b"], [5, 0])
    with pytest.raises(ValueError, match="steps_per_epoch"):
        build_sampler(SamplerConfig(kind="annealed", num_epochs=2), {"a": 3, "b": 4})


def test_target_mix_reports_expected_share():
    s = AnnealedSampler(["x", "y"], [900, 100], num_epochs=2, steps_per_epoch=100)
    mix = s.target_mix(0, 200)
    # half the steps at alpha=1 (0.9/0.1), half at alpha=0.2
    p2 = [900**0.2 / (900**0.2 + 100**0.2), 100**0.2 / (900**0.2 + 100**0.2)]
    assert mix["x"] == pytest.approx((0.9 + p2[0]) / 2, abs=1e-6)
